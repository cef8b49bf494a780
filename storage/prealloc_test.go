package storage

import (
	"os"
	"testing"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/safekeeper/safekeeper/proto"
)

// lastPageEnd is the end of bbolt's last page in use.
func lastPageEnd(t *testing.T, db *DB) int64 {
	t.Helper()
	var hwm int64
	if err := db.bolt.View(func(tx *bolt.Tx) error { hwm = tx.Size(); return nil }); err != nil {
		t.Fatal(err)
	}
	return hwm
}

// writtenTail is how many bytes past off the file system backs before the
// first hole, and whether they are all zeros.
func writtenTail(t *testing.T, path string, off int64) (n int64, allZero bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hole, err := unix.Seek(int(f.Fd()), off, unix.SEEK_HOLE)
	if err != nil {
		t.Skipf("SEEK_HOLE: %v", err)
	}
	buf := make([]byte, hole-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	for _, b := range buf {
		if b != 0 {
			return hole - off, false
		}
	}
	return hole - off, true
}

// After commits at the end of the file, the file system backs a tail of
// zeros past bbolt's last page in use, so the next commits overwrite
// written blocks (prealloc.go); the database reads back intact across a
// reopen, which does not fill the tail again.
func TestZeroFilledTailAheadOfLastPage(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	const step = 64 << 10
	start := proto.LSN(0x1000000)
	for lsn := start; lsn < start+2<<20; lsn += step {
		if err := tl.WriteWAL(lsn, walData(lsn, step, 1)); err != nil {
			t.Fatal(err)
		}
		st.TimelineStartLSN, st.FlushLSN = start, lsn+step
		if err := tl.Commit(st); err != nil {
			t.Fatal(err)
		}
	}
	hwm := lastPageEnd(t, db)
	n, zero := writtenTail(t, path, hwm)
	if n < zeroAheadMin/2 {
		t.Fatalf("%d bytes written past the last page in use (at %d), want at least %d", n, hwm, zeroAheadMin/2)
	}
	if !zero {
		t.Fatal("the tail past the last page in use is not all zeros")
	}
	size := db.FileSize()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTest(t, path, Options{})
	tl, _, err = db.OpenTimeline(st.TenantID, st.TimelineID)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, step)
	if _, err := tl.ReadWAL(start+step, got); err != nil {
		t.Fatal(err)
	}
	if want := walData(start+step, step, 1); string(got) != string(want) {
		t.Fatal("WAL read back after reopen differs")
	}
	// One more small commit: the tail is long enough, nothing is filled.
	lsn := st.FlushLSN
	if err := tl.WriteWAL(lsn, walData(lsn, 8192, 1)); err != nil {
		t.Fatal(err)
	}
	st.FlushLSN = lsn + 8192
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	if db.FileSize() != size {
		t.Fatalf("file grew from %d to %d bytes on a small commit after reopen", size, db.FileSize())
	}
}
