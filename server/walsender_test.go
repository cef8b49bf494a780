package server

import "testing"

func TestNextChunkCutsOnPages(t *testing.T) {
	cases := []struct{ pos, limit, want uint64 }{
		{0x1000000, 0x1000100, 0x1000100},               // short: up to the limit
		{0x1000000, 0x1000000 + maxSendSize, 0x1020000}, // exactly 128 KiB
		{0x1000000, 0x1000000 + maxSendSize + 1, 0x1020000},
		{0x1000010, 0x2000000, 0x1020000},               // limited and unaligned: cut to a page
		{0x1001ff0, 0x2000000, 0x1020000},               // start near a page end
		{0x1000010, 0x1000010 + maxSendSize, 0x1020010}, // not limited: not cut
		{0xFFFF0000, 0x1_0001_0000, 0x1_0001_0000},      // across the 4 GiB line
	}
	for _, c := range cases {
		got := uint64(nextChunk(lsn(c.pos), lsn(c.limit)))
		if got != c.want {
			t.Errorf("nextChunk(%#x, %#x) = %#x, want %#x", c.pos, c.limit, got, c.want)
		}
		if got-c.pos > maxSendSize || got <= c.pos {
			t.Errorf("nextChunk(%#x, %#x) = %#x: size %d", c.pos, c.limit, got, got-c.pos)
		}
	}
}
