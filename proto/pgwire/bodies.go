package pgwire

import "sync"

// Buffers of large message bodies are recycled. Each CopyData of WAL (up to
// 128 KiB and more) used to be read into memory allocated for it alone; with
// a thousand connections streaming at once that is a heap that keeps growing
// into fresh pages, and fresh pages are what ingest of many timelines spent
// most of its CPU on (the kernel zeroing them). A body larger than the
// read-ahead buffer is read into a buffer of its size class (multiples of
// 16 KiB, so that a request of 128 KiB of WAL and its header takes 144 KiB,
// not twice its size) from a free list, and a caller done with a payload
// ReadCopy returned hands it back with Recycle. The free list is bounded
// (maxFreeBodyBytes) and not a sync.Pool: a pool is emptied by every
// collection, and during ingest that is several times a second, so its
// buffers were garbage before they could be used again. DropRecycled empties
// it (a quiet server gives the memory back).
const (
	bodyClassSize    = 16 << 10
	maxPooledBody    = 2 << 20 // above the default MaxMessageSize
	maxFreeBodyBytes = 64 << 20
)

var freeBodies struct {
	sync.Mutex
	lists [maxPooledBody / bodyClassSize][][]byte
	bytes int
}

// bodyClass returns the size class of an n-byte body, or -1 when none fits.
func bodyClass(n int) int {
	if n <= 0 || n > maxPooledBody {
		return -1
	}
	return (n - 1) / bodyClassSize
}

func classSize(c int) int { return (c + 1) * bodyClassSize }

// newBody returns a buffer of length n, recycled when one of its class is
// free.
func newBody(n int) []byte {
	c := bodyClass(n)
	if c < 0 {
		return make([]byte, n)
	}
	f := &freeBodies
	f.Lock()
	if l := f.lists[c]; len(l) > 0 {
		b := l[len(l)-1]
		l[len(l)-1] = nil
		f.lists[c] = l[:len(l)-1]
		f.bytes -= cap(b)
		f.Unlock()
		return b[:n]
	}
	f.Unlock()
	return make([]byte, n, classSize(c))
}

// Recycle gives back a payload returned by ReadCopy once nothing refers to
// it any more (nor to any slice of it). Payloads of other origins, and any
// beyond the free list's bound, are left to the garbage collector.
func Recycle(b []byte) {
	c := bodyClass(cap(b))
	if c < 0 || cap(b) != classSize(c) {
		return
	}
	b = b[:cap(b)]
	if scribbleRecycled {
		for i := range b {
			b[i] = 0xa5
		}
	}
	f := &freeBodies
	f.Lock()
	defer f.Unlock()
	if f.bytes+cap(b) > maxFreeBodyBytes {
		return
	}
	f.lists[c] = append(f.lists[c], b)
	f.bytes += cap(b)
}

// DropRecycled empties the free list of body buffers and returns how many
// bytes it held.
func DropRecycled() int {
	f := &freeBodies
	f.Lock()
	defer f.Unlock()
	n := f.bytes
	for c := range f.lists {
		clear(f.lists[c])
		f.lists[c] = nil
	}
	f.bytes = 0
	return n
}
