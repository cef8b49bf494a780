package chaos

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/etcdtest"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// TestFailoverPromoteAndReprotect is the bad day, whole: a primary with the
// proposer and three safekeepers under load; the primary's host is lost
// (kill -9 of the primary and the proposer); `safekeeper sync` brings the
// quorum to the end of WAL; a hot standby streaming from safekeeper 1
// replays to it and is promoted (PostgreSQL timeline 2); a proposer started
// against the new primary protects it on the same safekeepers, which switch
// to timeline 2 (TIMELINE_HISTORY 2 is the new primary's file); a second
// standby, following the old primary's timeline through safekeeper 2,
// follows the new one there. Every transfer acknowledged by either primary
// is on the new primary and on the second standby.
func TestFailoverPromoteAndReprotect(t *testing.T) {
	skipShort(t)
	rng := newRand(t)
	etcd := etcdtest.Start(t).Endpoints()
	c := startCluster(t, options{skArgs: fleetArgs(etcd)})
	c.adoptInto(etcd) // sync finds the safekeepers through etcd too, below
	b := newBank(t, c.pg)
	next := c.startStandby(c.sks[0])     // to be promoted
	follower := c.startStandby(c.sks[1]) // follows through timeline 2
	b.start(4, rng)
	c.waitAcked(b, 300, "on the first primary")
	// Safekeeper 3 stops and misses the last of timeline 1: it comes back
	// after the promotion and catches up across the switch.
	if err := c.sks[2].Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	c.waitAcked(b, 100, "on the first primary, with safekeeper 3 down")

	// The primary's host is lost.
	c.prop.Kill()
	c.pg.Kill(t)
	b.halt(30 * time.Second)
	acked1, _ := b.snapshot()
	c.prop = nil

	// sync: the quorum's end of WAL, committed.
	var addrs []string
	for _, sk := range c.sks {
		addrs = append(addrs, sk.Addr)
	}
	code, out, stderr := harness.Run(t, "sync", "--safekeepers", strings.Join(addrs, ","),
		"--tenant-id", tenantID.String(), "--timeline-id", timelineID.String(), "--timeout", "60s")
	if code != 0 {
		t.Fatalf("sync: exit %d: %s", code, stderr)
	}
	end, err := proto.ParseLSN(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("sync printed %q", out)
	}
	// The same through etcd: the same end (sync is idempotent).
	code, out, stderr = harness.Run(t, "sync", "--etcd-endpoints", strings.Join(etcd, ","),
		"--tenant-id", tenantID.String(), "--timeline-id", timelineID.String(), "--timeout", "60s")
	if code != 0 || strings.TrimSpace(out) != end.String() {
		t.Fatalf("sync --etcd-endpoints: exit %d, %q (want %s): %s", code, out, end, stderr)
	}

	// The standby replays to it and is promoted.
	next.WaitReplay(t, end.String(), replayTimeout)
	next.Promote(t)
	harness.WaitFor(t, 60*time.Second, "the promoted standby to leave recovery", func() bool {
		return next.Exec(t, "select pg_is_in_recovery()") == "f"
	})
	if tli := next.Exec(t, "select substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"); tli != "00000002" {
		t.Fatalf("promoted server on timeline %s, want 2", tli)
	}
	next.Exec(t, "alter system set synchronous_standby_names = 'proposer'")
	next.Exec(t, "select pg_reload_conf()")

	// A proposer protects the new primary on the same safekeepers.
	prop := harness.StartProposer(t, harness.ProposerOptions{Name: "proposer2", Upstream: next.ConnString(),
		Safekeepers: strings.Split(c.proposerAddrs(), ","), Tenant: tenantID.String(), Timeline: timelineID.String(),
		Slot: "proposer", ApplicationName: "proposer", Debug: true, Args: []string{"--buffer-size", "1MiB"}})
	c.prop = prop
	harness.WaitSyncStandby(t, next, prop, "proposer", 90*time.Second)
	// Safekeeper 3 returns below the switch point: the proposer catches it
	// up from the new primary on timeline 1 up to the switch and on
	// timeline 2 after it, as a standby asks (timeline 1's WAL is in
	// timeline 1's segments there; asked for on timeline 2, the primary
	// would answer that a timeline 2 segment has been removed).
	c.sks[2].Start()

	b2 := &bank{t: t, pg: next, stop: make(chan struct{}), acked: map[int64]proto.LSN{}}
	b2.ctx, b2.hard = context.WithCancel(context.Background())
	t.Cleanup(func() { b2.halt(0) })
	b2.next.Store(b.next.Load() + 1_000_000)
	b2.start(3, rng)
	c.waitAcked(b2, 300, "on the promoted primary")

	// The safekeepers switched to timeline 2, with the new primary's history.
	history := next.Exec(t, "select pg_read_file('pg_wal/00000002.history')")
	for i, sk := range c.sks {
		row := statusRow(t, sk.Addr)
		if row["pg_timeline"] != "2" {
			t.Errorf("safekeeper %d: pg_timeline %s, want 2", i+1, row["pg_timeline"])
		}
	}
	if got := timelineHistoryOf(t, c.sks[2]); strings.TrimSpace(got) != strings.TrimSpace(history) {
		t.Errorf("TIMELINE_HISTORY 2 on safekeeper 3 = %q, the new primary's file %q", got, history)
	}

	// The old primary's host comes back: PostgreSQL starts as the primary of
	// timeline 1 it was. Its proposer is refused at once — an older
	// PostgreSQL timeline, exit 4, which the unit does not restart — and
	// does not wait for the proposer streaming for the promoted primary to
	// stop (it never would) or touch the old primary's slot.
	c.pg.Restart(t)
	if tli := c.pg.Exec(t, "select timeline_id from pg_control_checkpoint()"); tli != "1" {
		t.Fatalf("the old primary restarted on timeline %s, want 1", tli)
	}
	oldStart := time.Now()
	old := exec.CommandContext(harness.Context(t, 60*time.Second), harness.Binary(t), "propose",
		"--upstream", c.pg.ConnString(),
		"--safekeepers", c.proposerAddrs(), "--tenant-id", tenantID.String(), "--timeline-id", timelineID.String(),
		"--slot", "proposer", "--application-name", "proposer")
	var oldLog strings.Builder
	old.Stdout, old.Stderr = &oldLog, &oldLog
	old.Run()
	last := harness.LastLine(oldLog.String(), "safekeeper: ")
	if code := old.ProcessState.ExitCode(); code != 4 ||
		!strings.HasPrefix(last, "safekeeper: refused: older PostgreSQL timeline: the safekeepers' timeline is on PostgreSQL timeline 2, this primary on 1") ||
		!strings.Contains(last, "pg_rewind") || strings.Contains(oldLog.String(), "waiting") {
		t.Fatalf("the old primary's proposer after %v: exit %d; want exit 4 at once with one line saying refused: older PostgreSQL timeline, and no wait\n%s",
			time.Since(oldStart).Round(time.Millisecond), code, oldLog.String())
	}
	t.Logf("the old primary's proposer, refused in %v: %s", time.Since(oldStart).Round(time.Millisecond), last)
	c.pg.Stop(t)

	b2.stopAndReport()
	acked2, _ := b2.snapshot()
	final := lsnOf(t, next.Exec(t, "select pg_current_wal_flush_lsn()"))
	c.waitCommitted(final, 60*time.Second)
	if log := prop.Log(); !strings.Contains(log, "catching up from a second replication stream") ||
		strings.Contains(log, "the primary no longer has the WAL a safekeeper needs") {
		t.Errorf("safekeeper 3 below the switch point: want a catch-up from the new primary, which holds timeline 1's WAL, and no peer catch-up:\n%s",
			harness.LastLine(log, "trying a peer safekeeper")+"\n"+harness.LastLine(log, "catching up"))
	}
	follower.WaitReplay(t, final.String(), replayTimeout)
	if tli := follower.Exec(t, "select received_tli from pg_stat_wal_receiver"); tli != "2" {
		t.Errorf("the second standby receives timeline %s, want 2", tli)
	}
	query := func(s *pgtest.Cluster) func(string) string { return func(sql string) string { return s.Exec(t, sql) } }
	b.check(t, "promoted primary (first primary's transfers)", query(next), acked1)
	b2.check(t, "promoted primary (its own transfers)", query(next), acked2)
	b.check(t, "second standby (first primary's transfers)", query(follower), acked1)
	b2.check(t, "second standby (promoted primary's transfers)", query(follower), acked2)
	t.Logf("failover: %d transfers acknowledged before, %d after; sync at %s; both on the promoted primary and the standby that followed it through a safekeeper",
		len(acked1), len(acked2), end)
	// Stock standbys report their replay position before they are sent
	// anything (reconnecting, switching timelines): not misbehaviour.
	for i, sk := range c.sks {
		if strings.Contains(sk.Log(), "reported a position past") {
			t.Errorf("safekeeper %d warned about a stock standby's report:\n%s", i+1, harness.LastLine(sk.Log(), "reported a position past"))
		}
	}

	// wal export names each segment by its timeline, as PostgreSQL does,
	// and the timeline 2 ones are the promoted primary's byte for byte.
	if err := prop.Stop(30 * time.Second); err != nil {
		t.Errorf("proposer exit: %v", err)
	}
	next.Exec(t, "select pg_switch_wal()")
	sk := c.sks[0]
	if err := sk.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	exported := c.export(sk)
	seg := proto.LSN(c.pg.WALSegSize)
	byTLI := map[uint32]int{}
	for s := end.SegmentStart(uint64(seg)) - 2*seg; s+seg <= final; s += seg {
		tli := uint32(2)
		if s < end.SegmentStart(uint64(seg)) {
			tli = 1
		}
		name := proto.SegmentFileName(tli, s, uint64(seg))
		mine, err := os.ReadFile(filepath.Join(exported, name))
		if err != nil {
			t.Errorf("segment %s not exported under its timeline's name: %v", name, err)
			continue
		}
		if tli == 2 {
			theirs, err := os.ReadFile(filepath.Join(next.WALDir(), name))
			if err != nil || !bytes.Equal(mine, theirs) {
				t.Errorf("segment %s: differs from the promoted primary's (%v)", name, err)
			}
		}
		byTLI[tli]++
	}
	if byTLI[1] == 0 || byTLI[2] == 0 {
		t.Errorf("exported segments by timeline: %v, want both", byTLI)
	}
	t.Logf("wal export across the switch: %d segments named for timeline 1, %d for timeline 2 (equal to the promoted primary's)", byTLI[1], byTLI[2])
}

func lsnOf(t *testing.T, s string) proto.LSN {
	t.Helper()
	l, err := proto.ParseLSN(strings.TrimSpace(s))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// timelineHistoryOf runs TIMELINE_HISTORY 2 on a safekeeper.
func timelineHistoryOf(t *testing.T, sk *harness.Safekeeper) string {
	t.Helper()
	conn := replConn(t, sk.Addr)
	defer conn.Close(context.Background())
	res, err := conn.Exec(harness.Context(t, 10*time.Second), "TIMELINE_HISTORY 2").ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 {
		t.Fatalf("TIMELINE_HISTORY 2: %v", err)
	}
	return string(res[0].Rows[0][1])
}
