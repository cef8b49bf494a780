package storage

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
)

const testSegSize = 1 << 20 // the smallest wal_seg_size: segment boundaries come quickly

// testState returns the state of a new timeline (n picks the ids).
func testState(n int) acceptor.State {
	var s acceptor.State
	s.TenantID[0], s.TenantID[15] = 0x7e, byte(n>>8)
	s.TimelineID[0], s.TimelineID[15] = byte(n), 0x11
	s.SystemID = 7342
	s.PgVersion = 160004
	s.WalSegSize = testSegSize
	s.PgTimeline = 1
	return s
}

func testPath(t testing.TB) string { return filepath.Join(t.TempDir(), "safekeeper.db") }

func openTest(t testing.TB, path string, opts Options) *DB {
	t.Helper()
	db, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// walData returns n bytes of WAL content for LSNs [lsn, lsn+n) written in
// generation gen: every (LSN, generation) pair gives a different-looking
// byte, so a byte from another write or from before a truncation is caught.
func walData(lsn proto.LSN, n int, gen uint64) []byte {
	b := make([]byte, n)
	for i := range b {
		x := (uint64(lsn)+uint64(i))*0x9E3779B97F4A7C15 + gen*0xBF58476D1CE4E5B9
		b[i] = byte(x>>56) ^ byte(x>>29)
	}
	return b
}

// readAll reads committed WAL [from, to) through ReadWAL in reads of
// bufSize bytes, failing the test on an error or short read.
func readAll(t testing.TB, tl *Timeline, from, to proto.LSN, bufSize int) []byte {
	t.Helper()
	out := make([]byte, 0, to-from)
	buf := make([]byte, bufSize)
	for lsn := from; lsn < to; {
		n, err := tl.ReadWAL(lsn, buf[:min(len(buf), int(to-lsn))])
		if err != nil {
			t.Fatalf("ReadWAL(%s): %v", lsn, err)
		}
		if n == 0 {
			t.Fatalf("ReadWAL(%s) = 0 bytes, want up to %s", lsn, to)
		}
		out = append(out, buf[:n]...)
		lsn += proto.LSN(n)
	}
	return out
}

// assertEnd checks that no byte is readable at or above end.
func assertEnd(t testing.TB, tl *Timeline, end proto.LSN) {
	t.Helper()
	if got := tl.EndLSN(); got != end {
		t.Fatalf("EndLSN = %s, want %s", got, end)
	}
	buf := make([]byte, 64)
	for _, lsn := range []proto.LSN{end, end + 1, end + 1000, end.SegmentStart(testSegSize) + testSegSize} {
		if n, err := tl.ReadWAL(lsn, buf); n != 0 || err != nil {
			t.Fatalf("ReadWAL(%s) above the end %s = %d, %v; want 0, nil", lsn, end, n, err)
		}
	}
}

// chunks returns the start and length of every WAL chunk of tl straight
// from bbolt, in key order, checking the extent layout on the way: each
// extent's key is its first chunk's, and no extent crosses a segment
// boundary.
func chunks(t testing.TB, db *DB, tl *Timeline) (starts []proto.LSN, lens []int) {
	t.Helper()
	err := db.bolt.View(func(tx *bolt.Tx) error {
		wal := tx.Bucket(bucketTimelines).Bucket(tl.key[:]).Bucket(bucketWAL)
		return wal.ForEachBucket(func(ek []byte) error {
			first := true
			return wal.Bucket(ek).ForEach(func(k, v []byte) error {
				if first && !bytes.Equal(k, ek) {
					return fmt.Errorf("extent %s starts with chunk %s", keyLSN(ek), keyLSN(k))
				}
				first = false
				if seg := keyLSN(ek).SegmentStart(tl.segSize); keyLSN(k)+proto.LSN(len(v)) > seg+proto.LSN(tl.segSize) {
					return fmt.Errorf("extent %s: chunk %s..%s crosses the segment end", keyLSN(ek), keyLSN(k), keyLSN(k)+proto.LSN(len(v)))
				}
				starts = append(starts, keyLSN(k))
				lens = append(lens, len(v))
				return nil
			})
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return starts, lens
}

func TestRoundTripReopen(t *testing.T) {
	path := testPath(t)
	opts := Options{MaxChunkSize: 100_000}
	db := openTest(t, path, opts)
	st := testState(1)
	start := proto.LSN(3*testSegSize + 0x28) // a timeline starting mid-segment
	st.TimelineStartLSN = start
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	var want []byte
	lsn := start
	for c := range 12 {
		// Several writes per commit, small and large, crossing segment
		// boundaries; the caller's buffers are scribbled over as soon as the
		// contract allows: a small write's at once, a kept one's after
		// Commit.
		var kept [][]byte
		for range 1 + rng.IntN(4) {
			n := 1 + rng.IntN(250_000)
			data := walData(lsn, n, 1)
			buf := append([]byte(nil), data...)
			if err := tl.WriteWAL(lsn, buf); err != nil {
				t.Fatal(err)
			}
			if n < keepWALWrite {
				clear(buf)
			} else {
				kept = append(kept, buf)
			}
			want = append(want, data...)
			lsn += proto.LSN(n)
		}
		st.FlushLSN = lsn
		st.CommitLSN = lsn - 10
		st.VotedFor.Term = uint64(c)
		if err := tl.Commit(st); err != nil {
			t.Fatal(err)
		}
		for _, b := range kept {
			clear(b)
		}
	}
	end := lsn
	if lsn.SegmentNo(testSegSize) < start.SegmentNo(testSegSize)+2 {
		t.Fatalf("test wrote too little: %s..%s", start, end)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openTest(t, path, opts)
	keys, err := db.Timelines()
	if err != nil {
		t.Fatal(err)
	}
	if want := []proto.TimelineKey{{TenantID: st.TenantID, TimelineID: st.TimelineID}}; !reflect.DeepEqual(keys, want) {
		t.Fatalf("Timelines = %v, want %v", keys, want)
	}
	tl, got, err := db.OpenTimeline(st.TenantID, st.TimelineID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, st) {
		t.Fatalf("state after reopen = %+v, want %+v", got, st)
	}

	// Layout: chunks contiguous, within MaxChunkSize, inside one segment.
	starts, lens := chunks(t, db, tl)
	next := start
	for i, s := range starts {
		if s != next {
			t.Fatalf("chunk %d starts at %s, want %s", i, s, next)
		}
		if lens[i] == 0 || lens[i] > opts.MaxChunkSize {
			t.Fatalf("chunk %d at %s holds %d bytes, want 1..%d", i, s, lens[i], opts.MaxChunkSize)
		}
		last := s + proto.LSN(lens[i]) - 1
		if s.SegmentNo(testSegSize) != last.SegmentNo(testSegSize) {
			t.Fatalf("chunk %d [%s, %s] crosses a segment boundary", i, s, last)
		}
		next = s + proto.LSN(lens[i])
	}
	if next != end {
		t.Fatalf("chunks end at %s, want %s", next, end)
	}

	// Whole WAL, in reads of various sizes.
	for _, bufSize := range []int{1, 4096, 1 << 20, 5 << 20} {
		if bufSize == 1 {
			// byte by byte is slow; do it for the first few KiB only
			if got := readAll(t, tl, start, start+5000, 1); !bytes.Equal(got, want[:5000]) {
				t.Fatal("byte-by-byte read differs")
			}
			continue
		}
		if got := readAll(t, tl, start, end, bufSize); !bytes.Equal(got, want) {
			t.Fatalf("read with %d-byte buffer differs from what was written", bufSize)
		}
	}
	// Arbitrary LSNs: inside chunks, at chunk starts, at segment boundaries.
	froms := []proto.LSN{start, end - 1, (start + testSegSize).SegmentStart(testSegSize), (start + testSegSize).SegmentStart(testSegSize) - 1}
	froms = append(froms, starts...)
	for range 200 {
		froms = append(froms, start+proto.LSN(rng.Int64N(int64(end-start))))
	}
	buf := make([]byte, 150_000)
	for _, from := range froms {
		n, err := tl.ReadWAL(from, buf)
		if err != nil {
			t.Fatalf("ReadWAL(%s): %v", from, err)
		}
		wantN := min(len(buf), int(end-from))
		if n != wantN {
			t.Fatalf("ReadWAL(%s) = %d bytes, want %d", from, n, wantN)
		}
		if off := from - start; !bytes.Equal(buf[:n], want[off:off+proto.LSN(n)]) {
			t.Fatalf("ReadWAL(%s) returned wrong bytes", from)
		}
	}
	assertEnd(t, tl, end)
	if _, err := tl.ReadWAL(start-1, buf); !errors.Is(err, ErrWALRemoved) {
		t.Fatalf("ReadWAL below the timeline start: %v, want ErrWALRemoved", err)
	}
}

func TestStagedInvisibleUntilCommit(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	const start = proto.LSN(0x1000028)
	first := walData(start, 5000, 1)
	if err := tl.WriteWAL(start, first); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10000)
	if n, err := tl.ReadWAL(start, buf); n != 0 || err != nil {
		t.Fatalf("staged WAL readable before Commit: ReadWAL = %d, %v", n, err)
	}
	if got := tl.EndLSN(); got != 0 {
		t.Fatalf("EndLSN before Commit = %s, want 0", got)
	}
	st.FlushLSN = start + 5000
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, tl, start, start+5000, 10000); !bytes.Equal(got, first) {
		t.Fatal("committed WAL differs")
	}

	// Stage more plus a truncation, then "crash" (close without Commit):
	// none of it may be visible, before or after reopen.
	second := walData(start+5000, 3000, 2)
	if err := tl.WriteWAL(start+5000, second); err != nil {
		t.Fatal(err)
	}
	if err := tl.TruncateWAL(start + 100); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, tl, start, start+5000, 10000); !bytes.Equal(got, first) {
		t.Fatal("staged truncation visible before Commit")
	}
	assertEnd(t, tl, start+5000)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTest(t, path, Options{})
	tl, got, err := db.OpenTimeline(st.TenantID, st.TimelineID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, st) {
		t.Fatalf("state = %+v, want %+v", got, st)
	}
	if got := readAll(t, tl, start, start+5000, 10000); !bytes.Equal(got, first) {
		t.Fatal("WAL after reopen differs from the committed WAL")
	}
	assertEnd(t, tl, start+5000)
}

func TestTruncateThenWrite(t *testing.T) {
	const start = proto.LSN(testSegSize + 0x28)
	for _, tc := range []struct {
		name  string
		trunc proto.LSN // relative to start
	}{
		{"inside a chunk", 70_123},
		{"at a chunk start", 100_000},
		{"at a segment boundary", testSegSize - 0x28},
		{"inside the first chunk", 1},
		{"at the timeline start", 0},
		{"at the end", 1_500_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := testPath(t)
			opts := Options{MaxChunkSize: 100_000}
			db := openTest(t, path, opts)
			st := testState(1)
			tl, err := db.CreateTimeline(st)
			if err != nil {
				t.Fatal(err)
			}
			old := walData(start, 1_500_000, 1)
			if err := tl.WriteWAL(start, old); err != nil {
				t.Fatal(err)
			}
			st.FlushLSN = start + proto.LSN(len(old))
			if err := tl.Commit(st); err != nil {
				t.Fatal(err)
			}

			// Truncate, write a new tail in two writes, commit: one transaction.
			trunc := start + tc.trunc
			if err := tl.TruncateWAL(trunc); err != nil {
				t.Fatal(err)
			}
			tail := walData(trunc, 200_000, 2)
			if err := tl.WriteWAL(trunc, tail[:50_000]); err != nil {
				t.Fatal(err)
			}
			if err := tl.WriteWAL(trunc+50_000, tail[50_000:]); err != nil {
				t.Fatal(err)
			}
			st.VotedFor.Term = 2
			st.FlushLSN = trunc + proto.LSN(len(tail))
			if err := tl.Commit(st); err != nil {
				t.Fatal(err)
			}
			want := append(bytes.Clone(old[:tc.trunc]), tail...)
			end := trunc + proto.LSN(len(tail))
			check := func(tl *Timeline) {
				t.Helper()
				if got := readAll(t, tl, start, end, 1<<20); !bytes.Equal(got, want) {
					t.Fatal("WAL after truncate+write differs")
				}
				assertEnd(t, tl, end)
			}
			check(tl)
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			db = openTest(t, path, opts)
			tl, got, err := db.OpenTimeline(st.TenantID, st.TimelineID)
			if err != nil {
				t.Fatal(err)
			}
			if got.VotedFor.Term != 2 {
				t.Fatalf("state after reopen has term %d, want 2", got.VotedFor.Term)
			}
			check(tl)

			// A truncation alone (no write after it) hides everything above it.
			cut := trunc + 10
			if err := tl.TruncateWAL(cut); err != nil {
				t.Fatal(err)
			}
			if err := tl.Commit(got); err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, tl, start, cut, 1<<20); !bytes.Equal(got, want[:cut-start]) {
				t.Fatal("WAL after truncation differs")
			}
			assertEnd(t, tl, cut)
		})
	}
}

// TestTruncateEmptiesWAL: a truncation at or below the first byte leaves no
// WAL, and the next write may then start anywhere (the acceptor truncates at
// flush_lsn = 0 on a new timeline, then writes at the timeline start).
func TestTruncateEmptiesWAL(t *testing.T) {
	db := openTest(t, testPath(t), Options{})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.TruncateWAL(0); err != nil {
		t.Fatal(err)
	}
	const a = proto.LSN(0x2000000)
	if err := tl.WriteWAL(a, walData(a, 1000, 1)); err != nil {
		t.Fatal(err)
	}
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	if err := tl.TruncateWAL(a - 5); err != nil {
		t.Fatal(err)
	}
	const b = proto.LSN(0x1800000)
	data := walData(b, 2000, 2)
	if err := tl.WriteWAL(b, data); err != nil {
		t.Fatal(err)
	}
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, tl, b, b+2000, 4096); !bytes.Equal(got, data) {
		t.Fatal("WAL differs")
	}
	assertEnd(t, tl, b+2000)
	if _, err := tl.ReadWAL(b-1, make([]byte, 10)); !errors.Is(err, ErrWALRemoved) {
		t.Fatalf("ReadWAL below the first byte = %v, want ErrWALRemoved", err)
	}
}

func TestWriteMustBeContiguous(t *testing.T) {
	db := openTest(t, testPath(t), Options{})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	const start = proto.LSN(0x1000000)
	if err := tl.WriteWAL(start, walData(start, 100, 1)); err != nil {
		t.Fatal(err)
	}
	for _, lsn := range []proto.LSN{start + 99, start + 101, start} {
		if err := tl.WriteWAL(lsn, []byte{1}); !errors.Is(err, ErrBadLSN) {
			t.Fatalf("WriteWAL(%s) after WAL ending at %s = %v, want ErrBadLSN", lsn, start+100, err)
		}
	}
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	if err := tl.WriteWAL(start+101, []byte{1}); !errors.Is(err, ErrBadLSN) {
		t.Fatalf("WriteWAL with a gap after commit = %v, want ErrBadLSN", err)
	}
	if err := tl.WriteWAL(start+100, []byte{1}); err != nil {
		t.Fatal(err)
	}
}

func TestCommitChecksState(t *testing.T) {
	db := openTest(t, testPath(t), Options{})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	other := testState(2)
	if err := tl.Commit(other); !errors.Is(err, ErrBadState) {
		t.Fatalf("Commit of another timeline's state = %v, want ErrBadState", err)
	}
	st.WalSegSize *= 2
	if err := tl.Commit(st); !errors.Is(err, ErrBadState) {
		t.Fatalf("Commit with another wal_seg_size = %v, want ErrBadState", err)
	}
}

func TestCreateTimeline(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	st := testState(1)
	st.History = proto.TermHistory{{Term: 1, StartLSN: 0x1000000}}
	if _, _, err := db.OpenTimeline(st.TenantID, st.TimelineID); !errors.Is(err, ErrNoTimeline) {
		t.Fatalf("OpenTimeline before create = %v, want ErrNoTimeline", err)
	}
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	// A duplicate is refused and changes nothing.
	dup := st
	dup.SystemID++
	if _, err := db.CreateTimeline(dup); !errors.Is(err, ErrTimelineExists) {
		t.Fatalf("second CreateTimeline = %v, want ErrTimelineExists", err)
	}
	// Invalid states are refused before anything is written.
	bad := testState(2)
	for _, seg := range []uint32{0, 1 << 19, 3 << 20, 2 << 30} {
		bad.WalSegSize = seg
		if _, err := db.CreateTimeline(bad); !errors.Is(err, ErrBadState) {
			t.Fatalf("CreateTimeline with wal_seg_size %d = %v, want ErrBadState", seg, err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openTest(t, path, Options{})
	keys, err := db.Timelines()
	if err != nil {
		t.Fatal(err)
	}
	if want := []proto.TimelineKey{tl.Key()}; !reflect.DeepEqual(keys, want) {
		t.Fatalf("Timelines = %v, want %v", keys, want)
	}
	tl2, got, err := db.OpenTimeline(st.TenantID, st.TimelineID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, st) {
		t.Fatalf("state = %+v, want %+v", got, st)
	}
	if again, _, _ := db.OpenTimeline(st.TenantID, st.TimelineID); again != tl2 {
		t.Fatal("OpenTimeline returned a second handle for the same timeline")
	}
	// The timeline is usable: the WAL bucket was created with it.
	if err := tl2.WriteWAL(0x1000000, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := tl2.Commit(got); err != nil {
		t.Fatal(err)
	}
}

// TestCreateTimelineAtomic fails CreateTimeline's transaction after its
// buckets were created: nothing of the timeline may remain. (The crash test
// also kills processes in the middle of CreateTimeline.)
func TestCreateTimelineAtomic(t *testing.T) {
	path := testPath(t)
	fault := errors.New("injected fault")
	db, err := open(path, Options{}, testHooks{createFault: func() error { return fault }})
	if err != nil {
		t.Fatal(err)
	}
	st := testState(1)
	if _, err := db.CreateTimeline(st); !errors.Is(err, fault) {
		t.Fatalf("CreateTimeline = %v, want the injected fault", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTest(t, path, Options{})
	keys, err := db.Timelines()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Fatalf("a failed CreateTimeline left timelines %v", keys)
	}
	if _, _, err := db.OpenTimeline(st.TenantID, st.TimelineID); !errors.Is(err, ErrNoTimeline) {
		t.Fatalf("OpenTimeline after a failed create = %v, want ErrNoTimeline", err)
	}
	if _, err := db.CreateTimeline(st); err != nil {
		t.Fatalf("CreateTimeline after the failed one: %v", err)
	}
}

func TestOpenLocked(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	if _, err := db.CreateTimeline(testState(1)); err != nil {
		t.Fatal(err)
	}
	for _, readOnly := range []bool{false, true} {
		startT := time.Now()
		second, err := Open(path, Options{Timeout: 50 * time.Millisecond, ReadOnly: readOnly})
		if err == nil {
			_ = second.Close()
			t.Fatalf("second Open (read-only %v) succeeded while the file is open", readOnly)
		}
		if !errors.Is(err, ErrLocked) {
			t.Fatalf("second Open (read-only %v) = %v, want ErrLocked", readOnly, err)
		}
		if d := time.Since(startT); d > 5*time.Second {
			t.Fatalf("second Open took %v, want about the 50ms timeout", d)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// Once closed, the file opens again, also read-only, and refuses writes.
	ro := openTest(t, path, Options{ReadOnly: true})
	if _, err := ro.CreateTimeline(testState(2)); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("CreateTimeline on a read-only DB = %v, want ErrReadOnly", err)
	}
	tl, st, err := ro.OpenTimeline(testState(1).TenantID, testState(1).TimelineID)
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.Commit(st); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Commit on a read-only DB = %v, want ErrReadOnly", err)
	}
	if err := tl.RemoveWAL(0); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("RemoveWAL on a read-only DB = %v, want ErrReadOnly", err)
	}
	if n, err := tl.ReadWAL(0, make([]byte, 8)); n != 0 || err != nil {
		t.Fatalf("ReadWAL on a read-only DB = %d, %v", n, err)
	}
}

func TestOpenDefaultsAreDurable(t *testing.T) {
	db := openTest(t, testPath(t), Options{})
	if db.bolt.NoSync || db.bolt.NoGrowSync {
		t.Fatalf("default Options: NoSync=%v NoGrowSync=%v, want fsync on", db.bolt.NoSync, db.bolt.NoGrowSync)
	}
	unsafe := openTest(t, testPath(t), Options{UnsafeNoFsync: true})
	if !unsafe.bolt.NoSync {
		t.Fatal("UnsafeNoFsync did not turn off fsync")
	}
}

func TestClosedDB(t *testing.T) {
	db := openTest(t, testPath(t), Options{})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tl.WriteWAL(0x1000000, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := tl.Commit(st); !errors.Is(err, ErrClosed) {
		t.Fatalf("Commit after Close = %v, want ErrClosed", err)
	}
	if _, err := db.CreateTimeline(testState(2)); !errors.Is(err, ErrClosed) {
		t.Fatalf("CreateTimeline after Close = %v, want ErrClosed", err)
	}
}

func TestRemoveWAL(t *testing.T) {
	path := testPath(t)
	opts := Options{MaxChunkSize: 300_000}
	db := openTest(t, path, opts)
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	start := proto.LSN(2*testSegSize + 0x28)
	end := start + 3*testSegSize + 12345
	want := walData(start, int(end-start), 1)
	if err := tl.WriteWAL(start, want); err != nil {
		t.Fatal(err)
	}
	st.FlushLSN = end
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}

	if err := tl.RemoveWAL(end + 1); !errors.Is(err, ErrBadLSN) {
		t.Fatalf("RemoveWAL above the end = %v, want ErrBadLSN", err)
	}
	// Removing up to the middle of segment 4 removes segments 2 and 3.
	upTo := proto.LSN(4*testSegSize + 777)
	horizon := proto.LSN(4 * testSegSize)
	if err := tl.RemoveWAL(upTo); err != nil {
		t.Fatal(err)
	}
	check := func(tl *Timeline) {
		t.Helper()
		starts, _ := chunks(t, db, tl)
		if len(starts) == 0 || starts[0] != horizon {
			t.Fatalf("first chunk after removal at %v, want %s", starts, horizon)
		}
		if got := tl.RemovedUpTo(); got != horizon {
			t.Fatalf("RemovedUpTo = %s, want %s", got, horizon)
		}
		for _, from := range []proto.LSN{start, horizon - 1} {
			_, err := tl.ReadWAL(from, make([]byte, 10))
			if !errors.Is(err, ErrWALRemoved) {
				t.Fatalf("ReadWAL(%s) below the horizon = %v, want ErrWALRemoved", from, err)
			}
		}
		if got := readAll(t, tl, horizon, end, 1<<20); !bytes.Equal(got, want[horizon-start:]) {
			t.Fatal("WAL above the horizon differs")
		}
		assertEnd(t, tl, end)
	}
	check(tl)
	// A Commit with a stale RemovedUpTo keeps the stored horizon.
	st.RemovedUpTo = 0
	st.CommitLSN = end
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	if err := tl.RemoveWAL(start); err != nil { // below the horizon: no-op
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTest(t, path, opts)
	tl, got, err := db.OpenTimeline(st.TenantID, st.TimelineID)
	if err != nil {
		t.Fatal(err)
	}
	if got.RemovedUpTo != horizon || got.CommitLSN != end {
		t.Fatalf("state after reopen: removed_up_to %s commit_lsn %s, want %s and %s", got.RemovedUpTo, got.CommitLSN, horizon, end)
	}
	check(tl)
	// Writing below the horizon is refused.
	if err := tl.TruncateWAL(horizon); err != nil { // empties the WAL
		t.Fatal(err)
	}
	if err := tl.WriteWAL(horizon-8, []byte("x")); !errors.Is(err, ErrBadLSN) {
		t.Fatalf("WriteWAL below the horizon = %v, want ErrBadLSN", err)
	}
}

// TestRemoveAllWAL: retention may remove every byte; the WAL then continues
// at the horizon.
func TestRemoveAllWAL(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	start, end := proto.LSN(testSegSize+8), proto.LSN(3*testSegSize)
	if err := tl.WriteWAL(start, walData(start, int(end-start), 1)); err != nil {
		t.Fatal(err)
	}
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	if err := tl.RemoveWAL(end); err != nil {
		t.Fatal(err)
	}
	if s, _ := chunks(t, db, tl); len(s) != 0 {
		t.Fatalf("chunks left after removing everything: %v", s)
	}
	assertEnd(t, tl, end)
	if _, err := tl.ReadWAL(end-1, make([]byte, 1)); !errors.Is(err, ErrWALRemoved) {
		t.Fatalf("ReadWAL below the horizon = %v, want ErrWALRemoved", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTest(t, path, Options{})
	tl, st, err = db.OpenTimeline(st.TenantID, st.TimelineID)
	if err != nil {
		t.Fatal(err)
	}
	assertEnd(t, tl, end)
	if err := tl.WriteWAL(end, walData(end, 10, 2)); err != nil {
		t.Fatal(err)
	}
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, tl, end, end+10, 10); !bytes.Equal(got, walData(end, 10, 2)) {
		t.Fatal("WAL after the horizon differs")
	}
}

// TestGroupCommitOneTransaction holds the committer while n timelines each
// call Commit, then lets it go: all n commits must land in one write
// transaction, and each caller returns only after it.
func TestGroupCommitOneTransaction(t *testing.T) {
	const n = 8
	gate := make(chan struct{})
	var once sync.Once
	db, err := open(testPath(t), Options{}, testHooks{beforeBatch: func() { once.Do(func() { <-gate }) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	tls := make([]*Timeline, n)
	for i := range tls {
		if tls[i], err = db.CreateTimeline(testState(i)); err != nil {
			t.Fatal(err)
		}
	}
	before := db.Stats()
	errs := make(chan error, n)
	for i, tl := range tls {
		go func() {
			lsn := proto.LSN(0x1000000)
			if err := tl.WriteWAL(lsn, walData(lsn, 1000, uint64(i))); err != nil {
				errs <- err
				return
			}
			errs <- tl.Commit(testState(i))
		}()
	}
	waitFor(t, func() bool { db.mu.Lock(); defer db.mu.Unlock(); return len(db.pending) == n })
	for _, tl := range tls {
		if tl.EndLSN() != 0 {
			t.Fatal("a Commit is visible before its transaction ran")
		}
	}
	close(gate)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	after := db.Stats()
	if got := after.WriteTxs - before.WriteTxs; got != 1 {
		t.Fatalf("%d commits took %d write transactions, want 1", n, got)
	}
	if got := after.Commits - before.Commits; got != n {
		t.Fatalf("Stats.Commits grew by %d, want %d", got, n)
	}
	for i, tl := range tls {
		lsn := proto.LSN(0x1000000)
		if got := readAll(t, tl, lsn, lsn+1000, 1000); !bytes.Equal(got, walData(lsn, 1000, uint64(i))) {
			t.Fatalf("timeline %d: WAL differs", i)
		}
	}
}

// TestGroupCommitConcurrent: goroutines committing on their own timelines
// share fsyncs, and everything they committed is there after reopen.
func TestGroupCommitConcurrent(t *testing.T) {
	const n, m = 16, 25
	path := testPath(t)
	db := openTest(t, path, Options{})
	tls := make([]*Timeline, n)
	for i := range tls {
		var err error
		if tls[i], err = db.CreateTimeline(testState(i)); err != nil {
			t.Fatal(err)
		}
	}
	before := db.Stats()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, tl := range tls {
		wg.Go(func() {
			st := testState(i)
			lsn := proto.LSN(0x1000000)
			for c := range m {
				data := walData(lsn, 4000+i, uint64(i))
				if err := tl.WriteWAL(lsn, data); err != nil {
					errs <- err
					return
				}
				lsn += proto.LSN(len(data))
				st.FlushLSN = lsn
				st.VotedFor.Term = uint64(c)
				if err := tl.Commit(st); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	after := db.Stats()
	commits, txs := after.Commits-before.Commits, after.WriteTxs-before.WriteTxs
	t.Logf("%d commits in %d write transactions (%.1f per fsync)", commits, txs, float64(commits)/float64(txs))
	if commits != n*m {
		t.Fatalf("Stats.Commits = %d, want %d", commits, n*m)
	}
	if txs >= commits {
		t.Fatalf("%d commits took %d write transactions: no group commit", commits, txs)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTest(t, path, Options{})
	for i := range n {
		st := testState(i)
		tl, got, err := db.OpenTimeline(st.TenantID, st.TimelineID)
		if err != nil {
			t.Fatal(err)
		}
		lsn := proto.LSN(0x1000000)
		end := lsn + proto.LSN(m*(4000+i))
		if got.VotedFor.Term != m-1 || got.FlushLSN != end {
			t.Fatalf("timeline %d: state term %d flush %s, want %d and %s", i, got.VotedFor.Term, got.FlushLSN, m-1, end)
		}
		wal := readAll(t, tl, lsn, end, 1<<20)
		for c := range m {
			part := wal[c*(4000+i) : (c+1)*(4000+i)]
			if !bytes.Equal(part, walData(lsn, 4000+i, uint64(i))) {
				t.Fatalf("timeline %d: commit %d's WAL differs", i, c)
			}
			lsn += proto.LSN(4000 + i)
		}
		assertEnd(t, tl, end)
	}
}

// TestGroupCommitRefusesOneRequestAlone: a Commit whose staged writes break
// the LSN rules inside the transaction (here: retention moved the horizon
// after the write was staged) is refused alone; the others in its batch
// commit.
func TestGroupCommitRefusesOneRequestAlone(t *testing.T) {
	gate := make(chan struct{})
	var once sync.Once
	db, err := open(testPath(t), Options{}, testHooks{beforeBatch: func() { once.Do(func() { <-gate }) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	good, err := db.CreateTimeline(testState(1))
	if err != nil {
		t.Fatal(err)
	}
	bad, err := db.CreateTimeline(testState(2))
	if err != nil {
		t.Fatal(err)
	}
	// bad: WAL [1 MiB, 2 MiB) committed through a direct transaction (the
	// committer is held), then truncated away and rewritten at 1 MiB+8 in a
	// staged write, then the horizon moves to 2 MiB underneath it.
	err = db.bolt.Update(func(tx *bolt.Tx) error {
		r := &commitReq{t: bad, ops: []walOp{{lsn: testSegSize, data: walData(testSegSize, testSegSize, 1)}}, state: testState(2)}
		return r.apply(tx.Bucket(bucketTimelines), db.opts.MaxChunkSize)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.TruncateWAL(testSegSize); err != nil {
		t.Fatal(err)
	}
	if err := bad.WriteWAL(testSegSize+8, []byte("late")); err != nil {
		t.Fatal(err)
	}
	if err := good.WriteWAL(testSegSize, []byte("good")); err != nil {
		t.Fatal(err)
	}
	if err := bad.RemoveWAL(2 * testSegSize); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() { errs <- good.Commit(testState(1)) }()
	go func() { errs <- bad.Commit(testState(2)) }()
	waitFor(t, func() bool { db.mu.Lock(); defer db.mu.Unlock(); return len(db.pending) == 2 })
	close(gate)
	var failed []error
	for range 2 {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) != 1 || !errors.Is(failed[0], ErrBadLSN) {
		t.Fatalf("commit errors = %v, want one ErrBadLSN", failed)
	}
	if got := readAll(t, good, testSegSize, testSegSize+4, 4); string(got) != "good" {
		t.Fatalf("good timeline WAL = %q", got)
	}
	if s, _ := chunks(t, db, bad); len(s) != 0 {
		t.Fatalf("refused commit changed the WAL: chunks at %v", s)
	}
}

func TestSlowCommitLogged(t *testing.T) {
	var buf harness.SyncBuffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	db := openTest(t, testPath(t), Options{Logger: logger, SlowCommit: time.Nanosecond})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, line := range bytes.Split(buf.Bytes(), []byte("\n")) {
		if bytes.Contains(line, []byte("slow fsync")) && bytes.Contains(line, []byte("duration=")) {
			found = true
		}
	}
	if !found {
		t.Fatalf("no slow-commit record with a duration in the log:\n%s", buf.Bytes())
	}
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

func ExampleTimeline_ReadWAL() {
	dir, err := os.MkdirTemp("", "storage-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	db, err := Open(filepath.Join(dir, "safekeeper.db"), Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	st := acceptor.State{WalSegSize: 16 << 20}
	tl, _ := db.CreateTimeline(st)
	_ = tl.WriteWAL(0x1000028, []byte("hello, WAL"))
	_ = tl.Commit(st)
	buf := make([]byte, 5)
	n, _ := tl.ReadWAL(0x100002F, buf)
	fmt.Printf("%s %s\n", buf[:n], tl.EndLSN())
	// Output: WAL 0/1000032
}

// TestLateJoinerTakesTheHorizon: a timeline that holds no WAL takes a
// higher removed_up_to from the caller (a safekeeper joining late starts
// holding the timeline there): reads below fail with ErrWALRemoved, a write
// below is refused, it survives a reopen; once WAL is held, a higher value
// from the caller is ignored again.
func TestLateJoinerTakesTheHorizon(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	const join = proto.LSN(5 * testSegSize)
	st.RemovedUpTo = join + 100 // rounded down to its segment
	if err := tl.TruncateWAL(join); err != nil {
		t.Fatal(err)
	}
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	if got := tl.RemovedUpTo(); got != join {
		t.Fatalf("RemovedUpTo %s, want %s", got, join)
	}
	if err := tl.WriteWAL(join-8, walData(join-8, 8, 1)); !errors.Is(err, ErrBadLSN) {
		t.Fatalf("a write below the joiner's horizon: %v, want ErrBadLSN", err)
	}
	data := walData(join, 3000, 1)
	if err := tl.WriteWAL(join, data); err != nil {
		t.Fatal(err)
	}
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, tl, join, join+3000, 4096); !bytes.Equal(got, data) {
		t.Fatal("WAL differs")
	}
	if _, err := tl.ReadWAL(join-1, make([]byte, 10)); !errors.Is(err, ErrWALRemoved) {
		t.Fatalf("ReadWAL below the joiner's horizon = %v, want ErrWALRemoved", err)
	}
	st.RemovedUpTo = join + 2*testSegSize // ignored: WAL is held
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db = openTest(t, path, Options{})
	tl, got, err := db.OpenTimeline(st.TenantID, st.TimelineID)
	if err != nil {
		t.Fatal(err)
	}
	if got.RemovedUpTo != join || tl.RemovedUpTo() != join {
		t.Fatalf("after reopen: removed_up_to %s / %s, want %s", got.RemovedUpTo, tl.RemovedUpTo(), join)
	}
}

// TestPgHistoryStored: a state's PostgreSQL history file is stored with
// the commit that sets it and read back, also after a reopen.
func TestPgHistoryStored(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	st.PgTimeline, st.PgHistory = 2, []byte("1\t0/3000158\tno recovery target specified\n")
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db = openTest(t, path, Options{})
	_, got, err := db.OpenTimeline(st.TenantID, st.TimelineID)
	if err != nil || got.PgTimeline != 2 || !bytes.Equal(got.PgHistory, st.PgHistory) {
		t.Fatalf("after reopen: TLI %d, history %q, %v", got.PgTimeline, got.PgHistory, err)
	}
}

// TestDeleteTimeline deletes a timeline with WAL and a slot next to another
// one: it is gone after a reopen, the other is untouched, a second delete is
// ErrNoTimeline, and the same ids can be created anew, empty.
func TestDeleteTimeline(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	var tls []*Timeline
	for n := 1; n <= 2; n++ {
		st := testState(n)
		tl, err := db.CreateTimeline(st)
		if err != nil {
			t.Fatal(err)
		}
		if err := tl.WriteWAL(0x1000000, walData(0x1000000, 3*testSegSize/2, 1)); err != nil {
			t.Fatal(err)
		}
		st.TimelineStartLSN, st.FlushLSN = 0x1000000, 0x1000000+3*testSegSize/2
		if err := tl.Commit(st); err != nil {
			t.Fatal(err)
		}
		if err := tl.CreateSlot(Slot{Name: "s", RestartLSN: 0x1000000, RestartTLI: 1}); err != nil {
			t.Fatal(err)
		}
		tls = append(tls, tl)
	}
	gone, kept := testState(1), testState(2)
	if err := db.DeleteTimeline(gone.TenantID, gone.TimelineID); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteTimeline(gone.TenantID, gone.TimelineID); !errors.Is(err, ErrNoTimeline) {
		t.Fatalf("second DeleteTimeline = %v, want ErrNoTimeline", err)
	}
	// The old handle's commits fail instead of writing somewhere.
	if err := tls[0].Commit(gone); !errors.Is(err, ErrNoTimeline) {
		t.Fatalf("Commit on a deleted timeline's handle = %v, want ErrNoTimeline", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTest(t, path, Options{})
	keys, err := db.Timelines()
	if err != nil {
		t.Fatal(err)
	}
	if want := []proto.TimelineKey{tls[1].Key()}; !reflect.DeepEqual(keys, want) {
		t.Fatalf("Timelines after delete and reopen = %v, want %v", keys, want)
	}
	if _, _, err := db.OpenTimeline(gone.TenantID, gone.TimelineID); !errors.Is(err, ErrNoTimeline) {
		t.Fatalf("OpenTimeline of the deleted timeline = %v, want ErrNoTimeline", err)
	}
	tl, st, err := db.OpenTimeline(kept.TenantID, kept.TimelineID)
	if err != nil || st.FlushLSN != 0x1000000+3*testSegSize/2 {
		t.Fatalf("the other timeline: %+v, %v", st, err)
	}
	if got := readAll(t, tl, 0x1000000, st.FlushLSN, 8192); !bytes.Equal(got, walData(0x1000000, 3*testSegSize/2, 1)) {
		t.Fatal("the other timeline's WAL changed")
	}
	if slots, err := tl.Slots(); err != nil || len(slots) != 1 {
		t.Fatalf("the other timeline's slots: %v, %v", slots, err)
	}
	again, err := db.CreateTimeline(gone)
	if err != nil {
		t.Fatalf("CreateTimeline after delete: %v", err)
	}
	if again == tls[0] || again.EndLSN() != 0 {
		t.Fatalf("recreated timeline: same handle %v, end %v", again == tls[0], again.EndLSN())
	}
	if slots, err := again.Slots(); err != nil || len(slots) != 0 {
		t.Fatalf("recreated timeline's slots: %v, %v", slots, err)
	}
}

// TestReusableBytesAfterDelete: bbolt's file never shrinks, so the room a
// deleted timeline leaves is inside it. ReusableBytes counts it (free and
// pending pages), also after a reopen (the freelist is rebuilt), and new
// WAL fills that room before the file grows.
func TestReusableBytesAfterDelete(t *testing.T) {
	const walBytes = 8 << 20
	path := testPath(t)
	db := openTest(t, path, Options{UnsafeNoFsync: true})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	for lsn := proto.LSN(0x1000000); lsn < 0x1000000+walBytes; lsn += testSegSize {
		if err := tl.WriteWAL(lsn, walData(lsn, testSegSize, 1)); err != nil {
			t.Fatal(err)
		}
		st.TimelineStartLSN, st.FlushLSN = 0x1000000, lsn+testSegSize
		if err := tl.Commit(st); err != nil {
			t.Fatal(err)
		}
	}
	size, before := db.FileSize(), db.ReusableBytes()
	if size < walBytes {
		t.Fatalf("file of %d bytes after %d bytes of WAL", size, walBytes)
	}
	if err := db.DeleteTimeline(st.TenantID, st.TimelineID); err != nil {
		t.Fatal(err)
	}
	if db.FileSize() != size {
		t.Fatalf("file size %d after the delete, was %d: the test assumes bbolt never shrinks it", db.FileSize(), size)
	}
	after := db.ReusableBytes()
	if after-before < walBytes {
		t.Fatalf("ReusableBytes %d before the delete, %d after: want at least %d more", before, after, walBytes)
	}
	if after > size {
		t.Fatalf("ReusableBytes %d is more than the file's %d bytes", after, size)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTest(t, path, Options{UnsafeNoFsync: true})
	if got := db.ReusableBytes(); got < walBytes {
		t.Fatalf("ReusableBytes after reopen = %d, want at least %d", got, walBytes)
	}
	st2 := testState(2)
	tl, err = db.CreateTimeline(st2)
	if err != nil {
		t.Fatal(err)
	}
	for lsn := proto.LSN(0x1000000); lsn < 0x1000000+walBytes/2; lsn += testSegSize {
		if err := tl.WriteWAL(lsn, walData(lsn, testSegSize, 2)); err != nil {
			t.Fatal(err)
		}
		st2.TimelineStartLSN, st2.FlushLSN = 0x1000000, lsn+testSegSize
		if err := tl.Commit(st2); err != nil {
			t.Fatal(err)
		}
	}
	if db.FileSize() != size {
		t.Fatalf("file grew from %d to %d bytes though %d were free inside", size, db.FileSize(), after)
	}
	if got := db.ReusableBytes(); got > after-walBytes/2+walBytes/8 {
		t.Fatalf("ReusableBytes %d after writing %d bytes into %d free", got, walBytes/2, after)
	}
}

// TestReusableBytesCountsNoHole: bbolt grows the file ahead with ftruncate,
// a hole the file system does not back; writing into it takes free space,
// so it is not counted as room inside the file (a pull onto a small disk
// counted 16 MiB that were not there).
func TestReusableBytesCountsNoHole(t *testing.T) {
	db := openTest(t, testPath(t), Options{})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	// Past bbolt's first sizes, so that it grows the file by a step.
	if err := tl.WriteWAL(0x1000000, walData(0x1000000, 2*testSegSize, 1)); err != nil {
		t.Fatal(err)
	}
	st.TimelineStartLSN, st.FlushLSN = 0x1000000, 0x1000000+2*testSegSize
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	size, allocated, reusable := db.FileSize(), db.AllocatedBytes(), db.ReusableBytes()
	t.Logf("file %d bytes, %d allocated, %d reusable", size, allocated, reusable)
	if allocated >= size {
		t.Skip("this file system backs the whole file: no hole to leave out")
	}
	if reusable > allocated {
		t.Fatalf("ReusableBytes %d counts the hole: only %d of the file's %d bytes are allocated", reusable, allocated, size)
	}
}

// TestMkdirAllDurable: the directories missing on the way are made (and
// their parents fsynced); an existing one is left as it is; a file in the
// way is an error.
func TestMkdirAllDurable(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "a", "b", "c")
	if err := MkdirAllDurable(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("%s: %v, %v", dir, fi, err)
	}
	if err := MkdirAllDurable(dir, 0o700); err != nil {
		t.Fatalf("again: %v", err)
	}
	file := filepath.Join(root, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAllDurable(filepath.Join(file, "x"), 0o700); err == nil {
		t.Fatal("a directory under a file was made")
	}
}

// TestConfigurationStored: a timeline's configuration is stored at
// creation and with the commit that changes it, and read back after a
// reopen; a timeline created without one (as before generations) reads
// back in generation 0.
func TestConfigurationStored(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	st := testState(1)
	st.Configuration = proto.Configuration{Generation: 1, Members: []uint64{1, 2, 3}}
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	legacy := testState(2)
	if _, err := db.CreateTimeline(legacy); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db = openTest(t, path, Options{})
	tl, got, err := db.OpenTimeline(st.TenantID, st.TimelineID)
	if err != nil || !got.Configuration.Equal(st.Configuration) {
		t.Fatalf("after create and reopen: %s, %v", got.Configuration, err)
	}
	if _, got, err := db.OpenTimeline(legacy.TenantID, legacy.TimelineID); err != nil || got.Configuration.Generation != 0 || got.Configuration.Members != nil {
		t.Fatalf("timeline without a configuration: %s, %v", got.Configuration, err)
	}
	st.Configuration = proto.Configuration{Generation: 2, Members: []uint64{1, 2, 3}, NewMembers: []uint64{1, 2, 4}}
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	st.VotedFor.Term++ // a commit that leaves the configuration as it is
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db = openTest(t, path, Options{})
	_, got, err = db.OpenTimeline(st.TenantID, st.TimelineID)
	if err != nil || !got.Configuration.Equal(st.Configuration) || got.VotedFor.Term != st.VotedFor.Term {
		t.Fatalf("after a change and reopen: %s (term %d), %v", got.Configuration, got.VotedFor.Term, err)
	}
}
