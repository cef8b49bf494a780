package xlogtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

const segSize = 1 << 20

// TestWaldumpAcceptsGeneratedWAL checks the generator against PostgreSQL's
// own reader: pg_waldump must see exactly the generated records, in order,
// with our xl_prev and xl_tot_len, and find the end of WAL exactly at
// Pos().
func TestWaldumpAcceptsGeneratedWAL(t *testing.T) {
	bin := pgtest.MustBinDir(t)
	start := proto.LSN(segSize) // segment 1: LSN 0 is never used
	g := NewGenerator(start, segSize, 1, 7000000000000000001)
	type rec struct {
		start proto.LSN
		tot   int
	}
	var want []rec
	add := func(s proto.LSN, tot int) { want = append(want, rec{s, tot}) }
	for _, n := range []int{0, 1, 100, 255, 256, 1000, 8000, 8192, 20000} {
		s, _ := g.Record(n)
		add(s, int(tot(n)))
	}
	// End a record exactly at a page end.
	room := int(xlog.PageSize - uint64(g.Pos())%xlog.PageSize)
	s, e := g.RecordTotal(room)
	add(s, room)
	if uint64(e)%xlog.PageSize != 0 {
		t.Fatalf("RecordTotal(%d) ended at %s, not a page end", room, e)
	}
	s, _ = g.Record(10)
	add(s, int(tot(10)))
	lost, s, _ := g.AbortedRecord(3 * xlog.PageSize)
	add(s, xlog.SizeOfXLogRecord+18)
	overwriteIdx := len(want) - 1
	s, _ = g.Record(segSize + 5000) // spans a segment boundary
	add(s, int(tot(segSize+5000)))
	s, e = g.Switch()
	add(s, xlog.SizeOfXLogRecord)
	if e.SegmentOffset(segSize) != 0 {
		t.Fatalf("Switch ended at %s", e)
	}
	for _, n := range []int{50, 3000} {
		s, _ = g.Record(n)
		add(s, int(tot(n)))
	}

	dir := t.TempDir()
	if err := WriteSegments(dir, 1, segSize, start, g.Take()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, stderr, err := RunWaldump(ctx, bin+"/pg_waldump", dir, start, proto.InvalidLSN)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(want) {
		t.Fatalf("pg_waldump saw %d records, generated %d; stderr: %s", len(recs), len(want), stderr)
	}
	prev := proto.InvalidLSN
	for i, r := range recs {
		if r.Start != want[i].start || r.TotLen != want[i].tot || r.Prev != prev {
			t.Errorf("record %d: pg_waldump %+v, generated start %s tot %d prev %s", i, r, want[i].start, want[i].tot, prev)
		}
		prev = r.Start
	}
	if !strings.Contains(recs[overwriteIdx].Desc, "OVERWRITE_CONTRECORD lsn "+lost.String()+";") {
		t.Errorf("overwrite record desc %q does not name the lost record %s", recs[overwriteIdx].Desc, lost)
	}
	wantErr := fmt.Sprintf("invalid record length at %s: wanted 24, got 0", g.Pos())
	wantErr2 := fmt.Sprintf("invalid record length at %s: expected at least 24, got 0", g.Pos())
	if !strings.Contains(stderr, wantErr) && !strings.Contains(stderr, wantErr2) {
		t.Errorf("pg_waldump did not find the end of WAL at %s: %s", g.Pos(), stderr)
	}
}

// tot is xl_tot_len of Record(n).
func tot(n int) uint32 {
	switch {
	case n == 0:
		return xlog.SizeOfXLogRecord
	case n <= 255:
		return uint32(xlog.SizeOfXLogRecord + 2 + n)
	}
	return uint32(xlog.SizeOfXLogRecord + 5 + n)
}

// TestFirstDiff: equal dumps give "", others the first differing line
// with its number and the two lines before it.
func TestFirstDiff(t *testing.T) {
	if d := FirstDiff("a", "x\ny\n", "b", "x\ny\n"); d != "" {
		t.Fatalf("equal: %q", d)
	}
	got := FirstDiff("wal dump", "l1\nl2\nl3\nl4\n", "pg_waldump", "l1\nl2\nl3\nL4\n")
	want := "first difference at line 4 (wal dump: 5 lines, pg_waldump: 5 lines):\n" +
		"        2  l2\n        3  l3\n" +
		"        4  wal dump:   l4\n        4  pg_waldump: L4"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if got := FirstDiff("a", "x", "b", "x\ny"); !strings.Contains(got, "line 2") || !strings.Contains(got, "a: (end of output)") {
		t.Fatalf("shorter: %s", got)
	}
}
