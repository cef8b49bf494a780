package chaos

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
)

// TestReplacedSafekeeperRecoversFromPeers: safekeeper 3's disk is replaced
// (an empty data directory, same id and address) after the primary has
// recycled the WAL from the timeline's start. The proposer's catch-up from
// the primary gets 58P01, so it copies from a peer safekeeper instead (a
// term reader of its term), and safekeeper 3 ends up with the whole
// timeline, byte for byte as its peers, while commits go on; the primary's
// slot, which waits for every safekeeper, moves on again once it has.
func TestReplacedSafekeeperRecoversFromPeers(t *testing.T) {
	skipShort(t)
	rng := newRand(t)
	c := startCluster(t, options{conf: []string{
		// Recycle quickly: no WAL kept for anybody but the proposer's slot.
		"wal_keep_size = 0", "max_wal_size = '32MB'", "min_wal_size = '16MB'",
	}})
	b := newBank(t, c.pg)
	b.start(3, rng)
	sts, _ := c.statuses()
	start := sts[0].TimelineStart
	startSeg := proto.SegmentFileName(1, start, c.pg.WALSegSize)

	// WAL well past the timeline start, committed everywhere; then
	// checkpoints until the primary no longer holds the first segment.
	mark := start + 6<<20
	harness.WaitFor(t, 180*time.Second, "6 MiB of WAL", func() bool { c.checkProposerAlive(); return c.flushLSN() >= mark })
	c.waitCommitted(mark, 60*time.Second)
	harness.WaitFor(t, 60*time.Second, "the primary to recycle "+startSeg, func() bool {
		c.pg.Exec(t, "SELECT pg_switch_wal()")
		c.pg.Exec(t, "CHECKPOINT")
		_, err := os.Stat(filepath.Join(c.pg.WALDir(), startSeg))
		return os.IsNotExist(err)
	})

	// Safekeeper 3 gets a new, empty disk.
	sk := c.sks[2]
	sk.Kill()
	sk.DataDir = filepath.Join(t.TempDir(), "replaced")
	sk.Start()
	c.waitAcked(b, 200, "with safekeeper 3 replaced")
	target := c.flushLSN()
	harness.WaitFor(t, 120*time.Second, "safekeeper 3 to hold the WAL up to "+target.String(), func() bool {
		c.checkProposerAlive()
		st, err := timelineStatus(sk.Addr)
		return err == nil && st.FlushLSN >= target
	})
	log := c.prop.Log()
	if !strings.Contains(log, "catching up from a peer safekeeper") {
		t.Fatalf("the proposer did not copy from a peer:\n%s", harness.Tail(log, 30))
	}
	t.Logf("safekeeper 3 recovered from a peer: %s", harness.LastLine(log, "catching up from a peer safekeeper"))
	// The slot waits for every safekeeper: it moves past target once
	// safekeeper 3 has it.
	harness.WaitFor(t, 60*time.Second, "the proposer's slot to pass "+target.String(), func() bool {
		out, err := c.pg.Query(t.Context(), "SELECT restart_lsn >= '"+target.String()+"'::pg_lsn FROM pg_replication_slots WHERE slot_name = 'proposer'")
		return err == nil && out == "t"
	})

	b.stopAndReport()
	acked, _ := b.snapshot()
	final := c.finish()
	b.check(t, "primary", func(sql string) string { return c.pg.Exec(t, sql) }, acked)
	// Every segment from the timeline's start: safekeeper 3's equals
	// safekeeper 1's (the primary recycled the first ones).
	for _, s := range c.sks {
		if err := s.Stop(30 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	one, three := c.export(c.sks[0]), c.export(sk)
	seg := proto.LSN(c.pg.WALSegSize)
	n := 0
	for s := start; s+seg <= final; s += seg {
		name := proto.SegmentFileName(1, s, uint64(seg))
		a, errA := os.ReadFile(filepath.Join(one, name))
		b, errB := os.ReadFile(filepath.Join(three, name))
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Fatalf("segment %s: safekeeper 1 %v, safekeeper 3 %v, equal %v", name, errA, errB, bytes.Equal(a, b))
		}
		n++
	}
	t.Logf("safekeeper 3 holds all %d complete segments from the timeline start %s, equal to safekeeper 1's", n, start)
	if n < 6 {
		t.Fatalf("only %d segments compared", n)
	}
}

// TestReplacedSafekeeperJoinsWherePeersHoldWAL: as above, but the peers
// have kept only --wal-keep-size of WAL, so neither the primary nor any
// peer holds the timeline's start any more. The empty safekeeper joins at
// the oldest whole segment its peers still hold (it then holds the
// timeline from there: a read below is 58P01, never zeros), copies from a
// peer and follows the quorum, byte for byte as its peers: every segment
// from where it joined to the end is compared.
//
// The peers trim with a small --wal-keep-size until the start is gone and
// are then restarted (one at a time, the quorum streaming on) with the
// default, 1 GB, as is safekeeper 3: from then on nobody removes WAL, so
// the segments compared are exactly those from the join point to the end,
// whatever the timing. The WAL comes from the test, not only the workload:
// each step writes a row and switches segments, so every step ends one.
func TestReplacedSafekeeperJoinsWherePeersHoldWAL(t *testing.T) {
	skipShort(t)
	rng := newRand(t)
	trim := []string{"--wal-keep-size", "2MB", "--retention-interval", "100ms"}
	keep := []string{"--retention-interval", "100ms"} // --wal-keep-size 1GB, the default
	c := startCluster(t, options{
		skArgs: trim,
		conf:   []string{"wal_keep_size = 0", "max_wal_size = '32MB'", "min_wal_size = '16MB'"},
	})
	b := newBank(t, c.pg)
	b.start(3, rng)
	sts, _ := c.statuses()
	start := sts[0].TimelineStart
	seg := proto.LSN(c.pg.WALSegSize)
	c.pg.Exec(t, "CREATE TABLE peer_filler(x int)")
	// segments ends n segments from here: a row, then a switch, n times (the
	// row makes each switch end a segment of its own).
	segments := func(n int) {
		t.Helper()
		from := c.flushLSN().SegmentStart(uint64(seg))
		for i := 0; i < n; i++ {
			c.pg.Exec(t, "INSERT INTO peer_filler VALUES (1); SELECT pg_switch_wal()")
		}
		if now := c.flushLSN(); now < from+proto.LSN(n)*seg {
			t.Fatalf("%d segment switches from %s reached only %s", n, from, now)
		}
	}
	segments(12)
	c.waitCommitted(c.flushLSN(), 60*time.Second)
	startSeg := proto.SegmentFileName(1, start, uint64(seg))
	harness.WaitFor(t, 60*time.Second, "the primary to recycle "+startSeg, func() bool {
		c.pg.Exec(t, "SELECT pg_switch_wal()")
		c.pg.Exec(t, "CHECKPOINT")
		_, err := os.Stat(filepath.Join(c.pg.WALDir(), startSeg))
		return os.IsNotExist(err)
	})
	c.waitCommitted(c.flushLSN(), 60*time.Second)
	// Every safekeeper removed the timeline's first segments.
	harness.WaitFor(t, 30*time.Second, "the safekeepers to remove WAL past the timeline start", func() bool {
		for _, sk := range c.sks {
			rm, _ := proto.ParseLSN(statusRow(t, sk.Addr)["removed_up_to"])
			if rm <= start+2*seg {
				return false
			}
		}
		return true
	})
	// The peers keep everything from here on; what they hold after the
	// restart is what they will hold at the end.
	var held []proto.LSN
	for _, sk := range c.sks[:2] {
		if err := sk.Stop(30 * time.Second); err != nil {
			t.Fatalf("stop safekeeper %d: %v", sk.ID, err)
		}
		sk.Args = keep
		sk.Start()
		c.waitCommitted(c.flushLSN(), 60*time.Second)
		rm, _ := proto.ParseLSN(statusRow(t, sk.Addr)["removed_up_to"])
		held = append(held, rm)
	}
	// Segments the peers hold and safekeeper 3 will have to copy.
	const copied = 4
	segments(copied)
	c.waitCommitted(c.flushLSN(), 60*time.Second)
	for i, sk := range c.sks[:2] {
		if rm, _ := proto.ParseLSN(statusRow(t, sk.Addr)["removed_up_to"]); rm != held[i] {
			t.Fatalf("safekeeper %d removed WAL up to %s after its restart with --wal-keep-size 1GB (was %s)", sk.ID, rm, held[i])
		}
	}

	sk := c.sks[2]
	sk.Kill()
	sk.DataDir = filepath.Join(t.TempDir(), "replaced")
	sk.Args = keep
	sk.Start()
	c.waitAcked(b, 200, "with safekeeper 3 replaced")
	target := c.flushLSN()
	harness.WaitFor(t, 120*time.Second, "safekeeper 3 to hold the WAL up to "+target.String(), func() bool {
		c.checkProposerAlive()
		st, err := timelineStatus(sk.Addr)
		return err == nil && st.FlushLSN >= target
	})
	row := statusRow(t, sk.Addr)
	joined, _ := proto.ParseLSN(row["removed_up_to"])
	if tls, _ := proto.ParseLSN(row["timeline_start_lsn"]); tls != start || joined <= start || joined.SegmentOffset(uint64(seg)) != 0 {
		t.Fatalf("safekeeper 3: timeline_start_lsn %s, removed_up_to %s; want the timeline's start %s and a later segment boundary", tls, joined, start)
	}
	if oldest := min(held[0], held[1]); joined != oldest {
		t.Fatalf("safekeeper 3 joined at %s; the oldest whole segment its peers hold is %s (%s, %s)", joined, oldest, held[0], held[1])
	}
	if !strings.Contains(c.prop.Log(), "it joins at the oldest whole segment its peers hold") {
		t.Fatalf("the proposer did not make safekeeper 3 join late:\n%s", harness.Tail(c.prop.Log(), 40))
	}
	t.Logf("safekeeper 3 joined at %s (timeline start %s; the peers hold from %s and %s): %s", joined, start, held[0], held[1],
		harness.LastLine(c.prop.Log(), "joins at the oldest whole segment"))
	want := fmt.Sprintf("58P01 requested WAL segment %s has already been removed", proto.SegmentFileName(1, start, uint64(seg)))
	if got := startAt(t, sk, start); got != want {
		t.Fatalf("a read below safekeeper 3's first byte: %q, want %q", got, want)
	}

	b.stopAndReport()
	acked, _ := b.snapshot()
	final := c.finish()
	b.check(t, "primary", func(sql string) string { return c.pg.Exec(t, sql) }, acked)
	for _, s := range c.sks {
		if err := s.Stop(30 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// Every complete segment from the join point to the end, on both (a
	// missing one fails): at least the ones written before the join, which
	// safekeeper 3 copied from a peer.
	one, three := c.export(c.sks[0]), c.export(sk)
	n := 0
	for s := joined; s+seg <= final; s += seg {
		name := proto.SegmentFileName(1, s, uint64(seg))
		a, errA := os.ReadFile(filepath.Join(one, name))
		b, errB := os.ReadFile(filepath.Join(three, name))
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Fatalf("segment %s: safekeeper 1 %v, safekeeper 3 %v, equal %v", name, errA, errB, bytes.Equal(a, b))
		}
		n++
	}
	if n < copied {
		t.Fatalf("%d segments from %s to %s compared, want at least the %d written before the join", n, joined, final, copied)
	}
	t.Logf("%d segments from %s compared: equal", n, joined)
}
