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

// A recycled body is handed out again for its class, the free list is
// bounded, and DropRecycled empties it.
func TestRecycledBodiesAreReused(t *testing.T) {
	DropRecycled()
	b := newBody(128<<10 + 40)
	Recycle(b)
	if got := newBody(130 << 10); &got[:1][0] != &b[:1][0] {
		t.Fatal("a body of the same class was not reused")
	}
	for range maxFreeBodyBytes/(144<<10) + 10 {
		Recycle(make([]byte, 1, 144<<10))
	}
	if n := DropRecycled(); n > maxFreeBodyBytes || n < maxFreeBodyBytes-144<<10 {
		t.Fatalf("the free list held %d bytes, bound %d", n, maxFreeBodyBytes)
	}
	if n := DropRecycled(); n != 0 {
		t.Fatalf("DropRecycled left %d bytes", n)
	}
}
