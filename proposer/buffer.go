package proposer

import (
	"fmt"
	"sort"

	"github.com/safekeeper/safekeeper/proto"
)

// walBuffer holds a contiguous range [start, end) of the primary's WAL in
// memory, as the chunks the primary sent (XLogData payloads, ≤ 128 KiB each
// from a PostgreSQL walsender). It is trimmed from the front.
type walBuffer struct {
	start, end proto.LSN
	chunks     []walChunk
	size       int
}

type walChunk struct {
	lsn  proto.LSN
	data []byte
}

func newWALBuffer(at proto.LSN) *walBuffer { return &walBuffer{start: at, end: at} }

// add appends data at lsn, which must be the buffer's end.
func (b *walBuffer) add(lsn proto.LSN, data []byte) error {
	if lsn != b.end {
		return fmt.Errorf("proposer: primary sent WAL at %s, expected %s", lsn, b.end)
	}
	if len(data) == 0 {
		return nil
	}
	b.chunks = append(b.chunks, walChunk{lsn: lsn, data: data})
	b.end += proto.LSN(len(data))
	b.size += len(data)
	return nil
}

// read returns up to max bytes at lsn (start ≤ lsn ≤ end) from one chunk. The
// slice aliases the buffer; it stays valid after trimming (chunks are never
// overwritten), so it may be handed to another goroutine.
func (b *walBuffer) read(lsn proto.LSN, max int) []byte {
	if lsn < b.start || lsn >= b.end {
		return nil
	}
	i := sort.Search(len(b.chunks), func(i int) bool { return b.chunks[i].lsn > lsn }) - 1
	c := b.chunks[i]
	d := c.data[lsn-c.lsn:]
	if len(d) > max {
		d = d[:max]
	}
	return d
}

// trim drops whole chunks that end at or below lsn.
func (b *walBuffer) trim(lsn proto.LSN) {
	n := 0
	for n < len(b.chunks) && b.chunks[n].lsn+proto.LSN(len(b.chunks[n].data)) <= lsn {
		b.size -= len(b.chunks[n].data)
		n++
	}
	if n == 0 {
		return
	}
	b.chunks = append(b.chunks[:0:0], b.chunks[n:]...)
	if len(b.chunks) > 0 {
		b.start = b.chunks[0].lsn
	} else {
		b.start = b.end
	}
}
