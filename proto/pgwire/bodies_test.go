package pgwire

import "testing"

func TestBodyClasses(t *testing.T) {
	for _, tc := range []struct{ n, cap int }{
		{readBufSize + 1, 16 << 10}, {16 << 10, 16 << 10}, {16<<10 + 1, 32 << 10},
		{128<<10 + 40, 144 << 10}, {2 << 20, 2 << 20}, {2<<20 + 1, 2<<20 + 1},
	} {
		b := newBody(tc.n)
		if len(b) != tc.n || cap(b) != tc.cap {
			t.Errorf("newBody(%d): len %d cap %d, want cap %d", tc.n, len(b), cap(b), tc.cap)
		}
		Recycle(b) // never panics, whatever its origin
	}
	Recycle(nil)
	Recycle(make([]byte, 100))
	Recycle(make([]byte, 10, 20<<10)) // not a class size: ignored
}
