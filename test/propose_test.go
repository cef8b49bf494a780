package test

import (
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// TestProposeRefusedForGoodExitsClearly: safekeepers whose timeline belongs
// to another cluster (another system id) refuse the proposer's ServerInfo;
// no retry can fix that, so once no quorum is possible `propose` exits 1
// with one line naming the safekeepers and the mismatch, instead of warning
// and reconnecting forever.
func TestProposeRefusedForGoodExitsClearly(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Options{WALSegSizeMB: 1})
	sks := []*harness.Safekeeper{harness.StartSafekeeper(t, 1), harness.StartSafekeeper(t, 2), harness.StartSafekeeper(t, 3)}
	// The timeline, created by a test proposer of another cluster (sysID,
	// 1 MiB segments) on safekeepers 1 and 2; safekeeper 3 does not hold it.
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	_, end := gen.Record(200)
	wal := gen.Take()
	for _, sk := range sks[:2] {
		p := startTerm(t, sk, 1, 1)
		p.send(p.appendReq(tlStart, wal, end))
		p.resp()
		p.c.Close()
	}
	prop := harness.StartProcess(t, "proposer", "propose",
		"--upstream", pg.ConnString(),
		"--safekeepers", strings.Join([]string{sks[0].Addr, sks[1].Addr, sks[2].Addr}, ","),
		"--tenant-id", tenant(1).String(), "--timeline-id", proto.ID{0xbb, 1}.String())
	harness.WaitFor(t, 60*time.Second, "the proposer to give up", func() bool {
		exited, _ := prop.Exited()
		return exited
	})
	_, code := prop.Exited()
	log := prop.Log()
	last := strings.TrimSpace(log[strings.LastIndex(strings.TrimRight(log, "\n"), "\n")+1:])
	if code != 1 || !strings.Contains(last, "no quorum is possible") || !strings.Contains(last, "system_id") ||
		!strings.Contains(last, sks[0].Addr) || !strings.Contains(last, sks[1].Addr) {
		t.Fatalf("propose against another cluster's timeline: exit %d, last line %q; want exit 1 and one line naming both safekeepers and system_id\n%s", code, last, log)
	}
	if n := strings.Count(log, "system_id"); n > 4 {
		t.Errorf("the refusal was logged %d times: retried instead of given up", n)
	}
}

// TestProposerSlotHoldsWALForALaggingSafekeeper: while the proposer
// streams, its physical slot on the primary exists and holds WAL at
// truncate_lsn — the oldest WAL some safekeeper still needs — not at the
// quorum commit_lsn. The replication stream runs without the slot (a slot
// in use would follow the flush position the stream reports, commit_lsn,
// and leave a lagging safekeeper behind); the slot keeper advances it on
// its own, so pg_replication_slots shows it active=f while
// pg_stat_replication shows the proposer streaming. With one safekeeper
// down, the WAL it lacks stays on the primary across a checkpoint.
func TestProposerSlotHoldsWALForALaggingSafekeeper(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Options{WALSegSizeMB: 1, Conf: []string{"max_wal_size = '32MB'", "min_wal_size = '2MB'"}})
	sks := []*harness.Safekeeper{harness.StartSafekeeper(t, 1), harness.StartSafekeeper(t, 2), harness.StartSafekeeper(t, 3)}
	tl := proto.ID{0xbb, 7}
	prop := harness.StartProcess(t, "proposer", "propose",
		"--upstream", pg.ConnString(),
		"--safekeepers", strings.Join([]string{sks[0].Addr, sks[1].Addr, sks[2].Addr}, ","),
		"--tenant-id", tenant(1).String(), "--timeline-id", tl.String(),
		"--slot", "proposer", "--application-name", "proposer")
	flushOf := func(sk *harness.Safekeeper) (flush, commit proto.LSN) {
		_, flush, commit = skTimelineOf(t, sk, tenant(1), tl)
		return flush, commit
	}
	lsn := func(sql string) proto.LSN {
		l, err := proto.ParseLSN(pg.Exec(t, sql))
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return l
	}
	slot := func() (active string, restart proto.LSN) {
		out := pg.Exec(t, "select active::text || ' ' || coalesce(restart_lsn::text, '0/0') from pg_replication_slots where slot_name = 'proposer'")
		f := strings.Fields(out)
		if len(f) != 2 {
			t.Fatalf("pg_replication_slots for the proposer's slot: %q", out)
		}
		l, err := proto.ParseLSN(f[1])
		if err != nil {
			t.Fatal(err)
		}
		return f[0], l
	}
	harness.WaitFor(t, 60*time.Second, "the proposer to stream", func() bool {
		if exited, code := prop.Exited(); exited {
			t.Fatalf("proposer exited %d:\n%s", code, prop.Log())
		}
		out, err := pg.Query(t.Context(), "select state from pg_stat_replication where application_name = 'proposer'")
		return err == nil && out == "streaming"
	})
	pg.Exec(t, "create table slot_t(x int); insert into slot_t select generate_series(1, 20000)")
	end := lsn("select pg_current_wal_flush_lsn()")
	harness.WaitFor(t, 30*time.Second, "every safekeeper to hold the WAL and the slot to follow", func() bool {
		for _, sk := range sks {
			if f, _ := flushOf(sk); f < end {
				return false
			}
		}
		_, r := slot()
		return r >= end.SegmentStart(pg.WALSegSize)
	})
	active, _ := slot()
	t.Logf("streaming: pg_replication_slots active=%s, pg_stat_replication %q", active, pg.Exec(t, "select state || ' ' || sync_state from pg_stat_replication where application_name = 'proposer'"))

	lagging, _ := flushOf(sks[2])
	sks[2].Kill()
	for i := 0; i < 6; i++ {
		pg.Exec(t, "insert into slot_t select generate_series(1, 50000); select pg_switch_wal()")
	}
	end = lsn("select pg_current_wal_flush_lsn()")
	harness.WaitFor(t, 30*time.Second, "two safekeepers to commit the WAL written while the third is down", func() bool {
		f, c := flushOf(sks[0])
		return f >= end && c >= end
	})
	_, restart := slot()
	pg.Exec(t, "checkpoint")
	if restart > lagging || restart == 0 {
		t.Fatalf("the slot holds WAL from %s; the safekeeper that is down has it only up to %s (committed %s)", restart, lagging, end)
	}
	need := pg.Exec(t, "select pg_walfile_name('"+lagging.String()+"')")
	if n := pg.Exec(t, "select count(*) from pg_ls_waldir() where name = '"+need+"'"); n != "1" {
		t.Fatalf("after a checkpoint the primary removed %s, which the safekeeper that is down still needs (slot restart_lsn %s)", need, restart)
	}
	sks[2].Start()
	harness.WaitFor(t, 60*time.Second, "the safekeeper that was down to catch up", func() bool {
		f, _ := flushOf(sks[2])
		return f >= end
	})
}
