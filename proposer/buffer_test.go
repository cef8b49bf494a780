package proposer

import (
	"bytes"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

func TestWALBufferReadsAcrossChunksAndTrimsWholeChunks(t *testing.T) {
	b := newWALBuffer(100)
	if err := b.add(101, []byte{1}); err == nil {
		t.Fatal("a gap must be refused")
	}
	b.add(100, []byte{1, 2, 3})
	b.add(103, []byte{4, 5})
	b.add(105, []byte{6, 7, 8, 9})
	if got := b.read(102, 10); !bytes.Equal(got, []byte{3}) {
		t.Fatalf("read at 102: %v (one chunk at a time)", got)
	}
	if got := b.read(105, 2); !bytes.Equal(got, []byte{6, 7}) {
		t.Fatalf("read at 105 max 2: %v", got)
	}
	if b.read(109, 5) != nil || b.read(99, 5) != nil {
		t.Fatal("reads outside [start, end) return nothing")
	}
	b.trim(104) // inside the second chunk: only the first goes
	if b.start != 103 || b.size != 6 || b.end != 109 {
		t.Fatalf("after trim(104): start %s size %d end %s", b.start, b.size, b.end)
	}
	b.trim(proto.LSN(200))
	if b.start != 109 || b.size != 0 {
		t.Fatalf("after trimming all: start %s size %d", b.start, b.size)
	}
	b.add(109, []byte{10})
	if got := b.read(109, 1); !bytes.Equal(got, []byte{10}) {
		t.Fatalf("read after refill: %v", got)
	}
}
