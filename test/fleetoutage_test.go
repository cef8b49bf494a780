package test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/etcdtest"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// etcdOutage is how long TestFleetRidesOutAnEtcdOutage keeps every etcd
// member down: thirty lease TTLs of the safekeepers' (2 s), and long past
// every client's request timeout (5 s), so that whatever waited on etcd
// would have shown. SAFEKEEPER_ETCD_OUTAGE (a Go duration) sets another.
func etcdOutage(t *testing.T) time.Duration {
	d := 60 * time.Second
	if s := os.Getenv("SAFEKEEPER_ETCD_OUTAGE"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil || d < 10*time.Second {
			t.Fatalf("SAFEKEEPER_ETCD_OUTAGE=%q: want a duration of at least 10s", s)
		}
	}
	return d
}

// ackLedger inserts rows 1, 2, ... into table ledger over one connection,
// one synchronous commit each, and records when each was acknowledged.
type ackLedger struct {
	mu   sync.Mutex
	acks []time.Time // acks[i]: row i+1 acknowledged
	err  error
	stop chan struct{}
	done chan struct{}
}

func startLedger(t *testing.T, pg *pgtest.Cluster) *ackLedger {
	t.Helper()
	conn, err := pgconn.Connect(harness.Context(t, 10*time.Second), pg.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	l := &ackLedger{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer conn.Close(context.Background())
		for id := 1; ; id++ {
			select {
			case <-l.stop:
				return
			default:
			}
			// No deadline of its own: a commit that waits is what the
			// test is looking for, and Stop's cancel ends the wait.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			_, err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO ledger VALUES (%d, 'acknowledged')", id)).ReadAll()
			cancel()
			l.mu.Lock()
			if err != nil {
				l.err = fmt.Errorf("ledger row %d: %w", id, err)
				l.mu.Unlock()
				return
			}
			l.acks = append(l.acks, time.Now())
			l.mu.Unlock()
		}
	}()
	t.Cleanup(l.halt)
	return l
}

func (l *ackLedger) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

// count is how many rows are acknowledged.
func (l *ackLedger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acks)
}

// window is how many acknowledgements fell in [from, to] and the longest
// time without one in it (its edges count as acknowledgements).
func (l *ackLedger) window(from, to time.Time) (n int, gap time.Duration, gapAt time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	prev := from
	for _, a := range l.acks {
		if a.Before(from) || a.After(to) {
			continue
		}
		n++
		if d := a.Sub(prev); d > gap {
			gap, gapAt = d, prev.Sub(from)
		}
		prev = a
	}
	if d := to.Sub(prev); d > gap {
		gap, gapAt = d, prev.Sub(from)
	}
	return n, gap, gapAt
}

// aliveLeases reads the lease of each live node's Status key.
func aliveLeases(t *testing.T, ec *clientv3.Client) map[string]clientv3.LeaseID {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := ec.Get(ctx, "/safekeeper/alive/", clientv3.WithPrefix())
	if err != nil {
		return nil
	}
	out := map[string]clientv3.LeaseID{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = clientv3.LeaseID(kv.Lease)
	}
	return out
}

var pgbenchTPS = regexp.MustCompile(`tps = ([0-9.]+)`)

// TestFleetRidesOutAnEtcdOutage: a three-member etcd cluster, three
// safekeepers registered with 2 s leases, a timeline placed through etcd and
// a proposer that found its members there, protecting a primary under
// pgbench and a ledger of single-row commits. Every etcd member is stopped
// for a minute (etcdOutage). Commits go on throughout: acknowledgements
// come during the outage, at least one a second on average, and in its
// last ten seconds, when every lease is long expired and every request to
// etcd has timed out (a commit path that waited on etcd acknowledges
// nothing then; one whose every commit waited out a request's 5 s timeout
// would acknowledge one per 5 s). Meanwhile `timeline create`
// fails (exit 1) naming etcd and its endpoints, and a proposer started
// then waits for etcd and says so. Once the members start again, the
// safekeepers register again without a restart (new leases), the waiting
// proposer reads its members, a new timeline is placed, and every
// acknowledged row is on the primary with every member's flush_lsn at the
// primary's flush LSN. The longest time without an acknowledgement during
// the outage is reported, not asserted (a loaded machine stretches it).
func TestFleetRidesOutAnEtcdOutage(t *testing.T) {
	outage := etcdOutage(t)
	cl := etcdtest.StartCluster(t, 3)
	etcd := cl.Endpoints()
	sks, ec := fleetOf(t, etcd, 3, 3)
	pg := pgtest.Start(t, pgtest.Options{Conf: []string{"wal_sender_timeout = '20s'"}})
	tenant := "f1ee7000000000000000000000000003"
	timeline, waiter, late := "f1ee7000000000000000000000000031", "f1ee7000000000000000000000000032", "f1ee7000000000000000000000000033"
	for _, tl := range []string{timeline, waiter} {
		if code, out, errOut := harness.Run(t, append([]string{"timeline", "create", "--tenant-id", tenant, "--timeline-id", tl,
			"--upstream", pg.ConnString()}, etcdArgs(etcd)...)...); code != 0 {
			t.Fatalf("timeline create %s: exit %d\n%s%s", tl, code, out, errOut)
		}
	}
	prop := harness.StartProcess(t, "proposer", append([]string{"propose", "--upstream", pg.ConnString(), "--tenant-id", tenant,
		"--timeline-id", timeline, "--application-name", "proposer"}, etcdArgs(etcd)...)...)
	pg.Exec(t, "ALTER SYSTEM SET synchronous_standby_names = 'proposer'")
	pg.Exec(t, "SELECT pg_reload_conf()")
	harness.WaitSyncStandby(t, pg, prop, "proposer", 60*time.Second)
	pg.Exec(t, "CREATE TABLE ledger (id int PRIMARY KEY, note text)")
	bench := func(args ...string) []string {
		return append(append([]string{"-h", pg.SocketDir, "-p", strconv.Itoa(pg.Port), "-U", "postgres"}, args...), "postgres")
	}
	pg.Run(t, "pgbench", bench("-i", "-s", "1", "-q")...)

	// Load: pgbench for the outage and a margin either side, and the
	// ledger.
	pgbCtx, pgbCancel := context.WithCancel(context.Background())
	defer pgbCancel()
	pgb := pg.Cmd(pgbCtx, "pgbench", bench("-n", "-c", "2", "-j", "1", "-T", strconv.Itoa(int((outage+8*time.Second)/time.Second)))...)
	var pgbOut strings.Builder
	pgb.Stdout, pgb.Stderr = &pgbOut, &pgbOut
	if err := pgb.Start(); err != nil {
		t.Fatal(err)
	}
	pgbDone := make(chan error, 1)
	go func() { pgbDone <- pgb.Wait() }()
	led := startLedger(t, pg)
	harness.WaitFor(t, 30*time.Second, "100 ledger rows acknowledged before the outage", func() bool { return led.count() >= 100 })
	before := aliveLeases(t, ec.Etcd())
	if len(before) != 3 {
		t.Fatalf("before the outage: %d live safekeepers, want 3: %v", len(before), before)
	}

	// Every etcd member down.
	start := time.Now()
	for _, m := range cl.Members() {
		m.Stop()
	}
	stopped := time.Now()
	t.Logf("all 3 etcd members stopped in %v; down for %v", stopped.Sub(start).Round(time.Millisecond), outage)

	// A placement fails at once, naming etcd.
	newTL := "f1ee7000000000000000000000000034"
	code, out, errOut := harness.Run(t, append([]string{"timeline", "create", "--tenant-id", tenant, "--timeline-id", newTL,
		"--system-id", "7312345678901234567"}, etcdArgs(etcd)...)...)
	if code != 1 || !strings.Contains(errOut, "etcd unavailable") || !strings.Contains(errOut, strings.Join(etcd, ",")) {
		t.Errorf("timeline create with etcd down: exit %d\n%s%s\nwant exit 1 naming etcd unavailable and %s", code, out, errOut, strings.Join(etcd, ","))
	}
	// A proposer started now waits for etcd, and says so.
	wprop := harness.StartProcess(t, "waiter", append([]string{"propose", "--upstream", pg.ConnString(), "--tenant-id", tenant,
		"--timeline-id", waiter, "--application-name", "waiter"}, etcdArgs(etcd)...)...)
	harness.WaitFor(t, 30*time.Second, "the proposer started during the outage to say it waits for etcd", func() bool {
		wprop.CheckRunning()
		return strings.Contains(wprop.Log(), "etcd unavailable; the timeline's members are read once it answers")
	})
	// The outage lasts its time; the processes must live through it.
	harness.WaitFor(t, outage+10*time.Second, fmt.Sprintf("the outage to last %v", outage), func() bool {
		prop.CheckRunning()
		wprop.CheckRunning()
		return time.Since(stopped) >= outage
	})
	restart := time.Now()
	for _, m := range cl.Members() {
		m.Start()
	}
	cl.WaitHealthy()
	t.Logf("etcd healthy again %v after the restart began", time.Since(restart).Round(time.Millisecond))

	n, gap, gapAt := led.window(stopped, restart)
	tail, _, _ := led.window(restart.Add(-10*time.Second), restart)
	t.Logf("during the %v outage: %d ledger commits acknowledged (%.0f/s), %d in its last 10 s; the longest time without one %v, %v into the outage",
		restart.Sub(stopped).Round(time.Millisecond), n, float64(n)/restart.Sub(stopped).Seconds(), tail, gap.Round(time.Millisecond), gapAt.Round(time.Millisecond))
	if n == 0 || tail == 0 {
		t.Errorf("%d commits acknowledged during the outage, %d in its last 10 s: the commit path waits on etcd", n, tail)
	}
	// Fewer than one a second (the ledger alone does hundreds here, and
	// tens on a loaded machine): each commit waits out a request to etcd
	// that times out.
	if float64(n) < outage.Seconds() {
		t.Errorf("%d commits acknowledged in the %v outage, fewer than one a second: commits wait on etcd", n, outage)
	}
	if gap > outage/2 {
		t.Errorf("commits stalled for %v of the %v outage: the commit path waits on etcd", gap, outage)
	}

	// etcd back: each safekeeper live again under a new lease, by itself.
	harness.WaitFor(t, 30*time.Second, "every safekeeper registered again under a new lease", func() bool {
		now := aliveLeases(t, ec.Etcd())
		if len(now) != 3 {
			return false
		}
		for k, l := range now {
			if l == before[k] {
				return false
			}
		}
		return true
	})
	waitLive(t, ec, 3)
	for _, sk := range sks {
		if !strings.Contains(sk.Log(), "registering again") || !strings.Contains(sk.Log(), "registered in etcd again") {
			t.Errorf("safekeeper %d's log does not say it lost its lease and registered again", sk.ID)
		}
	}
	harness.WaitFor(t, 30*time.Second, "the waiting proposer to read its members from etcd", func() bool {
		wprop.CheckRunning()
		return strings.Contains(wprop.Log(), "configuration read from etcd")
	})
	if err := wprop.Stop(30 * time.Second); err != nil {
		t.Errorf("the proposer started during the outage: %v", err)
	}
	code, out, errOut = harness.Run(t, append([]string{"timeline", "create", "--tenant-id", tenant, "--timeline-id", late,
		"--system-id", "7312345678901234567"}, etcdArgs(etcd)...)...)
	if code != 0 || !strings.Contains(out, "placed on") {
		t.Errorf("timeline create once etcd is back: exit %d\n%s%s", code, out, errOut)
	}

	// Every acknowledged row is there, on the primary and on every member.
	led.halt()
	select { // pgbench ends by itself (-T) about now
	case <-pgbDone:
	case <-time.After(60 * time.Second):
		pgbCancel()
		<-pgbDone
	}
	if led.err != nil {
		t.Errorf("the ledger stopped: %v", led.err)
	}
	acked := led.count()
	if got := pg.Exec(t, fmt.Sprintf("SELECT count(*) FROM ledger WHERE id BETWEEN 1 AND %d", acked)); got != strconv.Itoa(acked) {
		t.Errorf("the primary holds %s of the %d acknowledged ledger rows", got, acked)
	}
	if exited, code := prop.Exited(); exited {
		t.Fatalf("the proposer exited (%d) during or after the outage", code)
	}
	if strings.Contains(prop.Log(), "configuration changed in etcd") {
		t.Errorf("the proposer changed its configuration, though none changed in etcd")
	}
	flush := flushLSN(t, pg)
	for _, sk := range sks {
		harness.WaitFor(t, 30*time.Second, fmt.Sprintf("safekeeper %d's flush_lsn to reach the primary's %s", sk.ID, flush), func() bool {
			l, err := proto.ParseLSN(sk.TimelineStatus(t, tenant, timeline)["flush_lsn"])
			return err == nil && l >= flush
		})
	}
	tps := "?"
	if m := pgbenchTPS.FindStringSubmatch(pgbOut.String()); m != nil {
		tps = m[1]
	}
	t.Logf("%d ledger rows acknowledged in all, on the primary and on safekeepers 1-3 (flush_lsn %s); pgbench -c 2 alongside: %s tps",
		acked, flush, tps)
}
