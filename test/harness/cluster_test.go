package harness

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/test/pgtest"
)

// TestStartCluster: the primary's synchronous standby is the proposer
// (started with the cluster's flags and the test's own), every safekeeper
// holds the timeline, and TIMELINE_STATUS shows the primary's WAL
// committed there; commits go through, and a hot standby fed by
// safekeeper 1 replays them.
func TestStartCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and the binary")
	}
	const tenant, timeline = "c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1", "c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2"
	c := StartCluster(t, ClusterOptions{Tenant: tenant, Timeline: timeline,
		PG: pgtest.Options{WALSegSizeMB: 1, Conf: []string{"wal_sender_timeout = '30s'"}}, ProposerArgs: []string{"--buffer-size", "1MiB"}})
	if len(c.Safekeepers) != 3 || c.Proposer == nil {
		t.Fatalf("%d safekeepers, proposer %v", len(c.Safekeepers), c.Proposer)
	}
	args := strings.Join(c.Proposer.Args, " ")
	for _, want := range []string{"--log-level debug propose", "--safekeepers " + strings.Join(Addrs(c.Safekeepers), ","),
		"--tenant-id " + tenant, "--timeline-id " + timeline, "--slot proposer", "--application-name proposer", "--buffer-size 1MiB"} {
		if !strings.Contains(args, want) {
			t.Errorf("the proposer runs %q, without %q", args, want)
		}
	}
	if slices.Contains(c.Proposer.Args, "--create") {
		t.Errorf("the proposer runs with --create: %q", args)
	}
	if got := c.PG.Exec(t, "SHOW synchronous_standby_names; SHOW wal_sender_timeout; SELECT sync_state FROM pg_stat_replication WHERE application_name = 'proposer'"); got != "proposer\n30s\nsync" {
		t.Fatalf("the primary: %q, want synchronous_standby_names proposer, the test's wal_sender_timeout, the proposer sync", got)
	}
	for _, sk := range c.Safekeepers {
		resp, err := http.Get("http://" + sk.HTTPAddr + "/v1/tenant/" + tenant + "/timeline/" + timeline)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("safekeeper %d: the timeline answers %s", sk.ID, resp.Status)
		}
	}
	end := c.PG.Exec(t, "SELECT pg_current_wal_flush_lsn()")
	WaitFor(t, 30*time.Second, "safekeeper 3's TIMELINE_STATUS to show the primary's WAL committed", func() bool {
		st := c.Safekeepers[2].TimelineStatus(t, tenant, timeline)
		flush, commit := st["flush_lsn"], st["commit_lsn"]
		return flush != "" && commit != "" && c.PG.Exec(t, "SELECT '"+commit+"'::pg_lsn >= '"+end+"'::pg_lsn AND '"+flush+"'::pg_lsn >= '"+commit+"'::pg_lsn") == "t"
	})
	sb := StartStandby(t, c.PG, c.Safekeepers[0], StandbyOptions{Tenant: tenant, Timeline: timeline})
	c.PG.Exec(t, "CREATE TABLE x(i int); INSERT INTO x VALUES (7)") // waits for the quorum
	sb.WaitReplay(t, c.PG.Exec(t, "SELECT pg_current_wal_flush_lsn()"), 60*time.Second)
	if got := sb.Exec(t, "SELECT i FROM x"); got != "7" {
		t.Fatalf("the standby fed by safekeeper 1: %q, want 7", got)
	}
	if got := c.PG.Exec(t, "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'standby1'"); got != "0" {
		t.Fatalf("the standby streams from the primary (%s walsenders), not from safekeeper 1", got)
	}
	c.Proposer.CheckRunning()
}

// TestSafekeeperConnString: host and port of the listener, the timeline in
// the startup options, quoted as one libpq value.
func TestSafekeeperConnString(t *testing.T) {
	sk := &Safekeeper{Addr: "127.0.0.1:5454"}
	got := sk.ConnString("aa", "bb")
	if want := "host=127.0.0.1 port=5454 user=postgres options='-c tenant_id=aa -c timeline_id=bb'"; got != want {
		t.Fatalf("ConnString = %q, want %q", got, want)
	}
}
