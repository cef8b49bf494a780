package xlog_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
)

const (
	segSize = 1 << 20
	segLSN  = proto.LSN(segSize) // start of segment 1
	sysid   = 7000000000000000001
)

// seeds returns fixed seeds plus one from the clock; tests log the seed they
// fail with.
func seeds() []int64 { return []int64{1, 2, 3, time.Now().UnixNano()} }

// expectedEnd is the largest end <= pos, or floor if none.
func expectedEnd(ends []proto.LSN, pos, floor proto.LSN) proto.LSN {
	i := sort.Search(len(ends), func(i int) bool { return ends[i] > pos })
	if i == 0 {
		return floor
	}
	return max(ends[i-1], floor)
}

// feedChecked feeds data to d in random pieces of at most maxChunk bytes,
// always also cutting at every record end and one byte either side, and
// after each Feed checks that RecordEnd is the end of the last record fully
// fed (floor before the first).
func feedChecked(t *testing.T, seed int64, d *xlog.Decoder, data []byte, ends []proto.LSN, floor proto.LSN, maxChunk int) {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	base := d.Pos()
	cuts := map[int]bool{len(data): true}
	for _, e := range ends {
		for _, c := range []int{int(e-base) - 1, int(e - base), int(e-base) + 1} {
			if c > 0 && c < len(data) {
				cuts[c] = true
			}
		}
	}
	for c := 0; c < len(data); {
		c += 1 + rng.Intn(maxChunk)
		cuts[min(c, len(data))] = true
	}
	sorted := make([]int, 0, len(cuts))
	for c := range cuts {
		sorted = append(sorted, c)
	}
	slices.Sort(sorted)
	at := 0
	for _, c := range sorted {
		if err := d.Feed(data[at:c]); err != nil {
			t.Fatalf("seed %d: Feed of [%s, %s): %v", seed, base+proto.LSN(at), base+proto.LSN(c), err)
		}
		at = c
		pos := d.Pos()
		if pos != base+proto.LSN(c) {
			t.Fatalf("seed %d: Pos = %s after feeding to %s", seed, pos, base+proto.LSN(c))
		}
		if got, want := d.RecordEnd(), expectedEnd(ends, pos, floor); got != want {
			t.Fatalf("seed %d: after feeding to %s: RecordEnd = %s, want %s", seed, pos, got, want)
		}
	}
}

// stream is generated WAL with the ends of its records.
type stream struct {
	start  proto.LSN
	data   []byte
	starts []proto.LSN
	ends   []proto.LSN
}

func (s *stream) add(st, e proto.LSN) {
	s.starts = append(s.starts, st)
	s.ends = append(s.ends, e)
}

// randomStream generates n records of sizes from tiny to over a segment,
// records ending exactly at a page end, switches and a lost record
// overwritten after a crash.
func randomStream(rng *rand.Rand, start proto.LSN, n int) *stream {
	g := xlogtest.NewGenerator(start, segSize, 1, sysid)
	s := &stream{start: start}
	bigDone := false
	for i := 0; i < n; i++ {
		switch k := rng.Intn(20); {
		case k < 8:
			s.add(g.Record(rng.Intn(64)))
		case k < 12:
			s.add(g.Record(64 + rng.Intn(4000)))
		case k < 15:
			s.add(g.Record(8000 + rng.Intn(30000))) // spans pages
		case k == 15:
			room := int(xlog.PageSize - uint64(g.Pos())%xlog.PageSize)
			if room >= xlog.SizeOfXLogRecord+2 {
				s.add(g.RecordTotal(room)) // ends exactly at a page end
			} else {
				s.add(g.RecordTotal(room + xlog.PageSize - xlog.SizeOfXLogShortPHD))
			}
		case k == 16:
			s.add(g.Switch())
		case k == 17 && !bigDone:
			bigDone = true
			s.add(g.Record(segSize + rng.Intn(segSize))) // spans segments
		case k == 18:
			_, st, e := g.AbortedRecord(xlog.PageSize + rng.Intn(3*xlog.PageSize))
			s.add(st, e)
		default:
			s.add(g.Record(rng.Intn(300)))
		}
	}
	s.data = g.Take()
	return s
}

func TestRecordEndRandomSplits(t *testing.T) {
	for _, seed := range seeds() {
		rng := rand.New(rand.NewSource(seed))
		s := randomStream(rng, segLSN, 300)
		for _, maxChunk := range []int{61, 4000, 200000} {
			d := xlog.NewDecoder(s.start, segSize)
			feedChecked(t, seed, d, s.data, s.ends, s.start, maxChunk)
			if got, want := d.RecordEnd(), s.ends[len(s.ends)-1]; got != want {
				t.Fatalf("seed %d: final RecordEnd %s, want %s", seed, got, want)
			}
		}
	}
}

func TestRecordEndByteAtATime(t *testing.T) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	s := randomStream(rng, segLSN, 60)
	if len(s.data) > 4<<20 {
		s.data = s.data[:4<<20]
	}
	d := xlog.NewDecoder(s.start, segSize)
	for i := range s.data {
		if err := d.Feed(s.data[i : i+1]); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if got, want := d.RecordEnd(), expectedEnd(s.ends, d.Pos(), s.start); got != want {
			t.Fatalf("seed %d: at %s RecordEnd = %s, want %s", seed, d.Pos(), got, want)
		}
	}
}

// TestStartInsideRecord starts the decoder at every page start inside a
// long record (one crossing a segment boundary too): the record's tail is
// skipped and is not a record; the first end reported is the next record's.
func TestStartInsideRecord(t *testing.T) {
	start := segLSN + segSize - 5*xlog.PageSize
	g := xlogtest.NewGenerator(start, segSize, 1, sysid)
	g.Record(100)
	bigStart, bigEnd := g.Record(9 * xlog.PageSize) // crosses into segment 2
	var ends []proto.LSN
	for _, n := range []int{0, 5000, 17, 20000} {
		_, e := g.Record(n)
		ends = append(ends, e)
	}
	data := g.Take()
	if bigEnd.SegmentStart(segSize) == bigStart.SegmentStart(segSize) {
		t.Fatal("big record does not cross a segment boundary")
	}
	seed := time.Now().UnixNano()
	for p := (bigStart/xlog.PageSize + 1) * xlog.PageSize; p < bigEnd; p += xlog.PageSize {
		d := xlog.NewDecoder(p, segSize)
		feedChecked(t, seed, d, data[p-start:], ends, p, 3000)
		if d.RecordEnd() != ends[len(ends)-1] {
			t.Fatalf("start %s: RecordEnd %s, want %s", p, d.RecordEnd(), ends[len(ends)-1])
		}
	}
}

// TestStartAtRecordEnd starts the decoder at record ends in mid-page, where
// xl_prev of the first record cannot be checked against anything.
func TestStartAtRecordEnd(t *testing.T) {
	for _, seed := range seeds() {
		rng := rand.New(rand.NewSource(seed))
		s := randomStream(rng, segLSN, 120)
		for i := 0; i < 10; i++ {
			k := rng.Intn(len(s.ends) - 1)
			st := s.ends[k]
			d := xlog.NewDecoder(st, segSize)
			feedChecked(t, seed, d, s.data[st-s.start:], s.ends[k+1:], st, 5000)
		}
	}
}

// TestHeaderSplitAcrossPages: a record whose 24-byte header starts 8 or
// 16 bytes before a page end continues its header on the next page.
func TestHeaderSplitAcrossPages(t *testing.T) {
	for _, left := range []int{8, 16} {
		g := xlogtest.NewGenerator(segLSN, segSize, 1, sysid)
		var ends []proto.LSN
		// Fill the first page up to left bytes before its end.
		_, e := g.RecordTotal(xlog.PageSize - xlog.SizeOfXLogLongPHD - left)
		ends = append(ends, e)
		s, e := g.Record(100)
		ends = append(ends, e)
		if uint64(s)%xlog.PageSize != uint64(xlog.PageSize-left) {
			t.Fatalf("record starts at %s, not %d bytes before a page end", s, left)
		}
		_, e = g.Record(0)
		ends = append(ends, e)
		data := g.Take()
		for _, chunk := range []int{1, 3, 1000} {
			feedChecked(t, int64(chunk), xlog.NewDecoder(segLSN, segSize), data, ends, segLSN, chunk)
		}
	}
}

// TestSwitch: a switch record ends at the next segment start, reported only
// once the zero-filled rest of the segment (which has no page headers) is
// fed.
func TestSwitch(t *testing.T) {
	g := xlogtest.NewGenerator(segLSN, segSize, 1, sysid)
	_, e1 := g.Record(1000)
	swStart, swEnd := g.Switch()
	_, e3 := g.Record(10)
	data := g.Take()
	if swEnd != segLSN+segSize {
		t.Fatalf("switch end %s", swEnd)
	}
	d := xlog.NewDecoder(segLSN, segSize)
	if err := d.Feed(data[:swEnd-segLSN-1]); err != nil {
		t.Fatal(err)
	}
	if d.RecordEnd() != e1 {
		t.Fatalf("RecordEnd = %s inside the switched segment, want %s (switch at %s)", d.RecordEnd(), e1, swStart)
	}
	if err := d.Feed(data[swEnd-segLSN-1 : swEnd-segLSN]); err != nil {
		t.Fatal(err)
	}
	if d.RecordEnd() != swEnd {
		t.Fatalf("RecordEnd = %s at the segment end, want %s", d.RecordEnd(), swEnd)
	}
	if err := d.Feed(data[swEnd-segLSN:]); err != nil {
		t.Fatal(err)
	}
	if d.RecordEnd() != e3 {
		t.Fatalf("RecordEnd = %s, want %s", d.RecordEnd(), e3)
	}
}

// TestOverwriteContrecord: a record cut by a crash and overwritten is not a
// record; decoding restarts after the next page's header.
func TestOverwriteContrecord(t *testing.T) {
	g := xlogtest.NewGenerator(segLSN, segSize, 1, sysid)
	_, e1 := g.Record(3000)
	lost, _, e2 := g.AbortedRecord(20000)
	_, e3 := g.Record(50)
	data := g.Take()
	d := xlog.NewDecoder(segLSN, segSize)
	feedChecked(t, 1, d, data, []proto.LSN{e1, e2, e3}, segLSN, 100)
	// Fed only up to the page end, the lost record is still incomplete.
	d = xlog.NewDecoder(segLSN, segSize)
	pageEnd := (lost/xlog.PageSize + 1) * xlog.PageSize
	if err := d.Feed(data[:pageEnd-segLSN]); err != nil || d.RecordEnd() != e1 {
		t.Fatalf("RecordEnd %s (err %v), want %s", d.RecordEnd(), err, e1)
	}
}

// TestErrors damages a valid stream in one place and checks the decoder
// stops there with an *Error wrapping ErrInvalidWAL that names the LSN,
// whether fed at once or byte by byte, and keeps returning it.
func TestErrors(t *testing.T) {
	g := xlogtest.NewGenerator(segLSN, segSize, 1, sysid)
	r1, e1 := g.Record(100)
	r2, e2 := g.Record(xlog.PageSize) // continues onto page 2
	r3, _ := g.Record(50)
	room := int(xlog.PageSize - uint64(g.Pos())%xlog.PageSize)
	_, e4 := g.RecordTotal(room + xlog.PageSize - xlog.SizeOfXLogShortPHD) // ends at page 3's end
	r5, _ := g.Record(10)                                                  // first on page 4
	clean := g.Take()
	page2 := segLSN + xlog.PageSize
	page4 := e4
	if uint64(page4)%xlog.PageSize != 0 || r5 != page4+xlog.SizeOfXLogShortPHD {
		t.Fatalf("layout: e4 %s r5 %s", e4, r5)
	}
	at := func(b []byte, l proto.LSN) []byte { return b[l-segLSN:] }
	u16 := func(l proto.LSN, off int) func([]byte) {
		return func(b []byte) {
			binary.LittleEndian.PutUint16(at(b, l)[off:], binary.LittleEndian.Uint16(at(b, l)[off:])^0x0100)
		}
	}
	tests := []struct {
		name    string
		damage  func([]byte)
		lsn     proto.LSN // Error.LSN
		lastEnd proto.LSN // RecordEnd when it stops
	}{
		{"bad magic", u16(page2, 0), page2, e1},
		{"unknown info bits", func(b []byte) { at(b, page2)[2] |= 0x10 }, page2, e1},
		{"bad pageaddr", func(b []byte) { at(b, page2)[9] ^= 0x01 }, page2, e1},
		{"bad tli order", func(b []byte) { at(b, segLSN)[4] = 2 }, page2, e1},
		{"missing contrecord flag", func(b []byte) { at(b, page2)[2] &^= xlog.XLPFirstIsContRecord }, page2, e1},
		{"wrong xlp_rem_len", func(b []byte) { at(b, page2)[16] += 8 }, page2, e1},
		{"unexpected contrecord", func(b []byte) { at(b, page4)[2] |= xlog.XLPFirstIsContRecord }, page4, e4},
		{"no long header at segment start", func(b []byte) { at(b, segLSN)[2] &^= xlog.XLPLongHeader }, segLSN, segLSN},
		{"wrong xlp_seg_size", func(b []byte) { at(b, segLSN)[34] ^= 1 }, segLSN, segLSN},
		{"wrong xlp_xlog_blcksz", func(b []byte) { at(b, segLSN)[37] ^= 1 }, segLSN, segLSN},
		{"tiny xl_tot_len", func(b []byte) { binary.LittleEndian.PutUint32(at(b, r3), 10) }, r3, e2},
		{"zero xl_tot_len", func(b []byte) { binary.LittleEndian.PutUint32(at(b, r3), 0) }, r3, e2},
		{"huge xl_tot_len", func(b []byte) { binary.LittleEndian.PutUint32(at(b, r3), 0x40000000) }, r3, e2},
		{"bad xl_prev", func(b []byte) { at(b, r3)[8] ^= 0x08 }, r3, e2},
		{"bad CRC in data", func(b []byte) { at(b, page2)[30] ^= 0xFF }, r2, e1},
		{"bad CRC in header", func(b []byte) { at(b, r1)[4] ^= 1 }, r1, segLSN},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := slices.Clone(clean)
			tc.damage(b)
			for _, oneByte := range []bool{false, true} {
				d := xlog.NewDecoder(segLSN, segSize)
				var err error
				if oneByte {
					for i := 0; i < len(b) && err == nil; i++ {
						err = d.Feed(b[i : i+1])
					}
				} else {
					err = d.Feed(b)
				}
				var xe *xlog.Error
				if !errors.Is(err, xlog.ErrInvalidWAL) || !errors.As(err, &xe) {
					t.Fatalf("oneByte=%v: err = %v, want an *xlog.Error wrapping ErrInvalidWAL", oneByte, err)
				}
				if xe.LSN != tc.lsn {
					t.Errorf("oneByte=%v: error at %s, want %s: %v", oneByte, xe.LSN, tc.lsn, err)
				}
				if d.RecordEnd() != tc.lastEnd {
					t.Errorf("oneByte=%v: RecordEnd = %s, want %s", oneByte, d.RecordEnd(), tc.lastEnd)
				}
				if again := d.Feed(b[:1]); again != err {
					t.Errorf("Feed after error = %v, want the same error %v", again, err)
				}
			}
		})
	}
	d := xlog.NewDecoder(segLSN, segSize)
	if err := d.Feed(clean); err != nil || d.RecordEnd() != g.Pos() {
		t.Fatalf("undamaged stream: %v, RecordEnd %s want %s", err, d.RecordEnd(), g.Pos())
	}
}

func TestNewDecoderBadArguments(t *testing.T) {
	for _, tc := range []struct {
		start proto.LSN
		seg   uint64
	}{{segLSN + 4, segSize}, {segLSN, 3 << 20}, {segLSN, 4096}} {
		err := xlog.NewDecoder(tc.start, tc.seg).Feed([]byte{0})
		if !errors.Is(err, xlog.ErrInvalidWAL) {
			t.Errorf("NewDecoder(%s, %d): Feed err = %v", tc.start, tc.seg, err)
		}
	}
}

func TestEmptyPages(t *testing.T) {
	const seg = 1 << 20
	from, to := proto.LSN(5*seg), proto.LSN(5*seg+2*xlog.PageSize+100)
	b := xlog.EmptyPages(from, to, seg, 3, 77)
	if len(b) != int(to-from) {
		t.Fatalf("%d bytes for %d", len(b), to-from)
	}
	for off, long := range map[int]bool{0: true, xlog.PageSize: false, 2 * xlog.PageSize: false} {
		h := b[off:]
		if binary.LittleEndian.Uint16(h) != xlog.PageMagic || binary.LittleEndian.Uint32(h[4:]) != 3 ||
			binary.LittleEndian.Uint64(h[8:]) != uint64(from)+uint64(off) || (binary.LittleEndian.Uint16(h[2:])&xlog.XLPLongHeader != 0) != long {
			t.Fatalf("page header at +%d: %x", off, h[:xlog.SizeOfXLogLongPHD])
		}
	}
	if long := b[:xlog.SizeOfXLogLongPHD]; binary.LittleEndian.Uint64(long[24:]) != 77 || binary.LittleEndian.Uint32(long[32:]) != seg {
		t.Fatalf("long header %x", long)
	}
	if tail := xlog.EmptyPages(from+xlog.PageSize+10, to, seg, 3, 77); !bytes.Equal(tail, b[xlog.PageSize+10:]) {
		t.Fatal("a range starting inside a page is not the same bytes")
	}
}
