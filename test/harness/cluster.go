package harness

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/test/pgtest"
)

// StartSafekeepers starts n safekeepers, node ids 1 to n, each with the
// extra flags of `safekeeper run` (StartSafekeeper).
func StartSafekeepers(t testing.TB, n int, extra ...string) []*Safekeeper {
	t.Helper()
	sks := make([]*Safekeeper, 0, n)
	for id := uint64(1); id <= uint64(n); id++ {
		sks = append(sks, StartSafekeeper(t, id, extra...))
	}
	return sks
}

// Addrs returns the PostgreSQL-protocol addresses of sks, in order: what a
// proposer's --safekeepers lists.
func Addrs(sks []*Safekeeper) []string {
	addrs := make([]string, len(sks))
	for i, sk := range sks {
		addrs[i] = sk.Addr
	}
	return addrs
}

// ProposerOptions is the command line of a `safekeeper propose`.
type ProposerOptions struct {
	// Name names the process in logs and failures; "proposer" if empty.
	Name string
	// Upstream is --upstream, the primary's connection string.
	Upstream string
	// Safekeepers is --safekeepers.
	Safekeepers []string
	// Tenant and Timeline are --tenant-id and --timeline-id.
	Tenant, Timeline string
	// Slot and ApplicationName are --slot and --application-name; empty
	// leaves propose's default (proposer_<timeline id>).
	Slot, ApplicationName string
	// Create is --create: the proposer creates the timeline if no
	// safekeeper holds it.
	Create bool
	// Debug is --log-level debug.
	Debug bool
	// Args are more flags of propose, after these.
	Args []string
}

// StartProposer starts `safekeeper propose` as o says (StartProcess).
func StartProposer(t testing.TB, o ProposerOptions) *Process {
	t.Helper()
	if o.Name == "" {
		o.Name = "proposer"
	}
	var args []string
	if o.Debug {
		args = append(args, "--log-level", "debug")
	}
	args = append(args, "propose", "--upstream", o.Upstream, "--safekeepers", strings.Join(o.Safekeepers, ","),
		"--tenant-id", o.Tenant, "--timeline-id", o.Timeline)
	if o.Create {
		args = append(args, "--create")
	}
	if o.Slot != "" {
		args = append(args, "--slot", o.Slot)
	}
	if o.ApplicationName != "" {
		args = append(args, "--application-name", o.ApplicationName)
	}
	return StartProcess(t, o.Name, append(args, o.Args...)...)
}

// WaitSyncStandby waits until application_name app streams as pg's
// synchronous standby (pg_stat_replication: state streaming, sync_state
// sync, or quorum under synchronous_standby_names = 'ANY n (...)'),
// failing the test after timeout, or at once if prop (the process behind
// app; nil: none to watch) exits first.
func WaitSyncStandby(t testing.TB, pg *pgtest.Cluster, prop *Process, app string, timeout time.Duration) {
	t.Helper()
	WaitFor(t, timeout, app+" streaming as the synchronous standby", func() bool {
		if prop != nil {
			prop.CheckRunning()
		}
		out, err := pg.Query(context.Background(), "SELECT state || '/' || sync_state FROM pg_stat_replication WHERE application_name = '"+app+"'")
		return err == nil && (out == "streaming/sync" || out == "streaming/quorum")
	})
}

// ClusterOptions shapes StartCluster.
type ClusterOptions struct {
	// Tenant and Timeline name the timeline the proposer streams.
	Tenant, Timeline string
	// PG configures the primary. Its Conf lines come after the cluster's
	// own (synchronous_standby_names = 'proposer', wal_sender_timeout =
	// '20s'), so they win.
	PG pgtest.Options
	// SafekeeperArgs are extra flags of every `safekeeper run`.
	SafekeeperArgs []string
	// ProposerArgs are extra flags of `propose`.
	ProposerArgs []string
	// NoProposer leaves the timeline and the proposer to the test.
	NoProposer bool
}

// Cluster is the pipeline the end-to-end tests run: a PostgreSQL 15
// primary whose synchronous standby is the proposer, and three
// safekeepers holding the timeline.
type Cluster struct {
	PG          *pgtest.Cluster
	Safekeepers []*Safekeeper
	// Proposer is `safekeeper propose --log-level debug` with slot and
	// application_name proposer; nil with ClusterOptions.NoProposer.
	Proposer *Process
}

// StartCluster starts the primary and safekeepers 1, 2 and 3; then, as an
// operator does, creates the timeline on them (CreateTimeline) and starts
// the proposer (without --create), and waits until it streams as the
// primary's synchronous standby.
func StartCluster(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	o.PG.Conf = append([]string{"synchronous_standby_names = 'proposer'", "wal_sender_timeout = '20s'"}, o.PG.Conf...)
	c := &Cluster{PG: pgtest.Start(t, o.PG), Safekeepers: StartSafekeepers(t, 3, o.SafekeeperArgs...)}
	if o.NoProposer {
		return c
	}
	addrs := Addrs(c.Safekeepers)
	CreateTimeline(t, c.PG.ConnString(), addrs, o.Tenant, o.Timeline)
	c.Proposer = StartProposer(t, ProposerOptions{Upstream: c.PG.ConnString(), Safekeepers: addrs, Tenant: o.Tenant, Timeline: o.Timeline,
		Slot: "proposer", ApplicationName: "proposer", Debug: true, Args: o.ProposerArgs})
	WaitSyncStandby(t, c.PG, c.Proposer, "proposer", 90*time.Second)
	return c
}
