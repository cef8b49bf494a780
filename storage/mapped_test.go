package storage

import (
	"bytes"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
)

func mappedRSS(t *testing.T, path string) int {
	t.Helper()
	kb, err := harness.MappedRSS(0, path)
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	return kb
}

// ReleaseMapped drops the pages reads mapped in, and the WAL reads back the
// same afterwards.
func TestReleaseMappedKeepsData(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	st := testState(1)
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	start := proto.LSN(testSegSize)
	want := walData(start, 8<<20, 1)
	for off := 0; off < len(want); off += 1 << 20 {
		if err := tl.WriteWAL(start+proto.LSN(off), want[off:off+1<<20]); err != nil {
			t.Fatal(err)
		}
		st.FlushLSN = start + proto.LSN(off+1<<20)
		if err := tl.Commit(st); err != nil {
			t.Fatal(err)
		}
	}
	end := start + proto.LSN(len(want))
	if got := readAll(t, tl, start, end, 64<<10); !bytes.Equal(got, want) {
		t.Fatal("WAL read back differs")
	}
	before := mappedRSS(t, path)
	if before < 4<<10 {
		t.Fatalf("reading 8 MiB of WAL mapped only %d KiB of %s", before, path)
	}
	if err := db.ReleaseMapped(); err != nil {
		t.Fatal(err)
	}
	after := mappedRSS(t, path)
	if after > before/4 {
		t.Fatalf("resident pages of the mapping: %d KiB before ReleaseMapped, %d KiB after", before, after)
	}
	if got := readAll(t, tl, start, end, 64<<10); !bytes.Equal(got, want) {
		t.Fatal("WAL read back after ReleaseMapped differs")
	}
	t.Logf("mapped and resident: %d KiB, after ReleaseMapped %d KiB", before, after)
}
