package pgwire

import "sync"

// Buffers of large message bodies are recycled. Each CopyData of WAL (up to
// 128 KiB and more) used to be read into memory allocated for it alone; with
// a thousand connections streaming at once that is a heap that keeps growing
// into fresh pages. A body larger than the read-ahead buffer is read into a
// buffer from a pool of its size class (multiples of 16 KiB, so that a
// request of 128 KiB of WAL and its header takes 144 KiB, not twice its
// size), and a caller done with a payload ReadCopy returned may hand it back
// with Recycle.
const (
	bodyClassSize = 16 << 10
	maxPooledBody = 2 << 20 // above the default MaxMessageSize
)

var bodyPools [maxPooledBody / bodyClassSize]sync.Pool

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
	if b, ok := bodyPools[c].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, classSize(c))
}

// Recycle gives back a payload returned by ReadCopy once nothing refers to
// it any more (nor to any slice of it). Payloads of other origins are
// ignored.
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
	bodyPools[c].Put(&b)
}
