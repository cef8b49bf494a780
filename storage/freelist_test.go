package storage

import (
	"encoding/binary"
	"os"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/safekeeper/safekeeper/proto"
)

// savedFreelist reads the file's current meta page (the valid one with the
// higher transaction id) and reports whether it points at a stored list of
// free pages (bbolt's freelist field is all ones when none was written).
func savedFreelist(t *testing.T, path string, pageSize int) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A meta page: the 16-byte page header, then magic, version, page
	// size, flags (4 bytes each), the root bucket (16), freelist, pgid,
	// txid (8 each).
	var freelist, txid uint64
	for i := range 2 {
		m := b[i*pageSize+16:]
		if binary.LittleEndian.Uint32(m) != 0xED0CDAED {
			t.Fatalf("meta page %d: bad magic", i)
		}
		if id := binary.LittleEndian.Uint64(m[48:]); id >= txid {
			txid, freelist = id, binary.LittleEndian.Uint64(m[32:])
		}
	}
	return freelist != ^uint64(0)
}

// TestCleanCloseSavesTheFreelist: a clean Close writes the list of free
// pages, so the next Open reads it instead of walking every page of the
// file; that list is right (bbolt's own check passes, and WAL written after
// the reopen reuses the freed pages instead of growing the file); the first
// commit after the Open drops it again, as every commit does.
func TestCleanCloseSavesTheFreelist(t *testing.T) {
	path := testPath(t)
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	pageSize := db.bolt.Info().PageSize
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	const chunk = 64 << 10
	lsn := proto.LSN(testSegSize)
	write := func(tl *Timeline, n int) {
		for range n {
			if err := tl.WriteWAL(lsn, walData(lsn, chunk, 1)); err != nil {
				t.Fatal(err)
			}
			lsn += chunk
			st.FlushLSN = lsn
			if err := tl.Commit(st); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(tl, 8*testSegSize/chunk) // 8 segments
	if err := tl.RemoveWAL(lsn.SegmentStart(testSegSize)); err != nil {
		t.Fatal(err)
	}
	if savedFreelist(t, path, pageSize) {
		t.Fatal("a commit left a stored freelist: NoFreelistSync is off")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if !savedFreelist(t, path, pageSize) {
		t.Fatal("Close stored no freelist: the next Open walks every page")
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	size := fi.Size()

	db = openTest(t, path, Options{})
	if free := db.bolt.Stats().FreePageN; free < 7*testSegSize/pageSize {
		t.Fatalf("%d free pages after the reopen, want the %d or more that RemoveWAL freed", free, 7*testSegSize/pageSize)
	}
	if err := db.bolt.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	}); err != nil {
		t.Fatalf("bbolt's check after the reopen: %v", err)
	}
	tl, _, err = db.OpenTimeline(st.TenantID, st.TimelineID)
	if err != nil {
		t.Fatal(err)
	}
	write(tl, 6*testSegSize/chunk) // fits in the freed pages
	if savedFreelist(t, path, pageSize) {
		t.Fatal("the stored freelist outlived the first commit after the reopen")
	}
	fi, err = os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Fatalf("the file grew from %d to %d bytes: the freed pages were not reused", size, fi.Size())
	}
}
