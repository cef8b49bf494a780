package xlog_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
)

// readAll feeds data (starting at r.Fed()) in random pieces of at most
// maxChunk bytes and returns every record, or the first error.
func readAll(t *testing.T, rng *rand.Rand, r *xlog.Reader, data []byte, maxChunk int) ([]xlog.Record, error) {
	t.Helper()
	var out []xlog.Record
	for len(data) > 0 {
		n := min(len(data), 1+rng.Intn(maxChunk))
		r.Feed(data[:n])
		data = data[n:]
		for {
			rec, ok, err := r.Next()
			if err != nil {
				return out, err
			}
			if !ok {
				break
			}
			out = append(out, *rec)
		}
	}
	return out, nil
}

// TestReaderAssemblesAcrossPages: records of every size (over pages and
// segments, ending at page ends, switches, a record lost and overwritten
// after a crash), fed in random splits, come out with the starts, ends and
// lengths they were written with and their prev links.
func TestReaderAssemblesAcrossPages(t *testing.T) {
	for _, seed := range seeds() {
		rng := rand.New(rand.NewSource(seed))
		s := randomStream(rng, segLSN, 300)
		for _, maxChunk := range []int{4 << 10, 1 << 20} {
			recs, err := readAll(t, rng, xlog.NewReader(s.start, segSize), s.data, maxChunk)
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			if len(recs) != len(s.starts) {
				t.Fatalf("seed %d: %d records, want %d", seed, len(recs), len(s.starts))
			}
			for i, r := range recs {
				if r.LSN != s.starts[i] || r.End != s.ends[i] {
					t.Fatalf("seed %d: record %d at %s..%s, want %s..%s", seed, i, r.LSN, r.End, s.starts[i], s.ends[i])
				}
				if i > 0 && r.Prev != s.starts[i-1] && !(r.RmID == xlog.RMXLogID && r.Info == xlog.XLogOverwriteContrecord) {
					t.Fatalf("seed %d: record %d at %s: prev %s, want %s", seed, i, r.LSN, r.Prev, s.starts[i-1])
				}
			}
		}
	}
}

// TestReaderStopsAtEndOfFedBytes: a record is returned once its last byte
// is fed, not before; the reader then waits for more.
func TestReaderStopsAtEndOfFedBytes(t *testing.T) {
	g := xlogtest.NewGenerator(segLSN, segSize, 1, sysid)
	g.Record(100)
	st, end := g.Record(3 * xlog.PageSize)
	data := g.Take()
	last := int(end - segLSN)
	for last > 0 && data[last-1] == 0 { // the record's unpadded end
		last--
	}
	r := xlog.NewReader(segLSN, segSize)
	r.Feed(data[:last-1])
	var got []proto.LSN
	for {
		rec, ok, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got = append(got, rec.LSN)
	}
	if len(got) != 1 {
		t.Fatalf("records %v from bytes ending one short of the second's end; want only the first", got)
	}
	r.Feed(data[last-1 : last])
	rec, ok, err := r.Next()
	if err != nil || !ok || rec.LSN != st || rec.End != end {
		t.Fatalf("after its last byte: %v %v %v; want the record at %s", rec, ok, err, st)
	}
}

// TestReaderSkipsContinuationAtStart: started at any page inside a long
// record (one crossing a segment boundary too), the reader skips its tail
// and returns the next record first.
func TestReaderSkipsContinuationAtStart(t *testing.T) {
	start := segLSN + segSize - 5*xlog.PageSize
	g := xlogtest.NewGenerator(start, segSize, 1, sysid)
	g.Record(100)
	bigStart, bigEnd := g.Record(9 * xlog.PageSize)
	next, _ := g.Record(10)
	g.Record(5000)
	data := g.Take()
	rng := rand.New(rand.NewSource(1))
	for p := (bigStart/xlog.PageSize + 1) * xlog.PageSize; p < bigEnd; p += xlog.PageSize {
		recs, err := readAll(t, rng, xlog.NewReader(p, segSize), data[p-start:], 3000)
		if err != nil {
			t.Fatalf("start %s: %v", p, err)
		}
		if len(recs) != 2 || recs[0].LSN != next {
			t.Fatalf("start %s: %d records, first %v; want 2 from %s", p, len(recs), recs, next)
		}
	}
}

// TestReaderFindsNextRecord: SkipBefore(x) with the reader started at x's
// page returns the first record starting at or after x, as pg_waldump -s x
// does (XLogFindNextRecord), for every x in a stream.
func TestReaderFindsNextRecord(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	s := randomStream(rng, segLSN, 80)
	for i := 0; i < 200; i++ {
		x := s.start + proto.LSN(rng.Intn(len(s.data)))
		page := x &^ (xlog.PageSize - 1)
		want := proto.InvalidLSN
		for _, st := range s.starts {
			if st >= x {
				want = st
				break
			}
		}
		r := xlog.NewReader(page, segSize)
		r.SkipBefore(x)
		recs, err := readAll(t, rng, r, s.data[page-s.start:], 1<<20)
		if binary.LittleEndian.Uint16(s.data[page-s.start:]) == 0 {
			// A zeroed page after a switch: no record can be found from
			// there (pg_waldump: "could not find a valid record").
			if !errors.Is(err, xlog.ErrInvalidWAL) {
				t.Fatalf("from %s in a switch's zeroed pages: %v, want an error", x, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("from %s: %v", x, err)
		}
		switch {
		case want == proto.InvalidLSN && len(recs) != 0:
			t.Fatalf("from %s (after the last record): got %s", x, recs[0].LSN)
		case want != proto.InvalidLSN && (len(recs) == 0 || recs[0].LSN != want):
			t.Fatalf("from %s: first record %v, want %s", x, recs, want)
		}
	}
}

// TestReaderSwitchEndsSegment: after XLOG_SWITCH the rest of the segment
// (zeros, no page headers) is skipped and reading goes on at the next
// segment's first record.
func TestReaderSwitchEndsSegment(t *testing.T) {
	g := xlogtest.NewGenerator(segLSN, segSize, 1, sysid)
	g.Record(10)
	sw, swEnd := g.Switch()
	after, _ := g.Record(10)
	data := g.Take()
	recs, err := readAll(t, rand.New(rand.NewSource(1)), xlog.NewReader(segLSN, segSize), data, 100000)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || recs[1].LSN != sw || !recs[1].IsSwitch() || recs[1].End != swEnd || recs[2].LSN != after || recs[2].Prev != sw {
		t.Fatalf("records %+v; want the switch at %s ending at %s, then %s", recs, sw, swEnd, after)
	}
	if after != segLSN+segSize+xlog.SizeOfXLogLongPHD {
		t.Fatalf("the record after the switch is at %s", after)
	}
}

// TestReaderCRCFailureNamesRecord: a flipped byte anywhere in a record (its
// first page, a continuation page, its header) fails it with ErrRecordCRC
// at its start; the records before it are returned.
func TestReaderCRCFailureNamesRecord(t *testing.T) {
	g := xlogtest.NewGenerator(segLSN, segSize, 1, sysid)
	g.Record(50)
	victim, vEnd := g.Record(2 * xlog.PageSize) // spans pages
	g.Record(50)
	data := g.Take()
	for _, at := range []proto.LSN{victim + 4, victim + 30, victim + xlog.PageSize, vEnd - 8} {
		off := int(at - segLSN)
		if uint64(at)%xlog.PageSize < xlog.SizeOfXLogShortPHD { // not a page header byte
			at += xlog.SizeOfXLogShortPHD
			off += xlog.SizeOfXLogShortPHD
		}
		bad := bytes.Clone(data)
		bad[off] ^= 0x01
		recs, err := readAll(t, rand.New(rand.NewSource(1)), xlog.NewReader(segLSN, segSize), bad, 5000)
		var xe *xlog.Error
		if !errors.Is(err, xlog.ErrRecordCRC) || !errors.As(err, &xe) || xe.LSN != victim || len(recs) != 1 {
			t.Fatalf("byte at %s flipped: %d records, %v; want 1 record and a CRC failure at %s", at, len(recs), err, victim)
		}
		if !errors.Is(err, xlog.ErrInvalidWAL) {
			t.Fatalf("a CRC error does not wrap ErrInvalidWAL: %v", err)
		}
	}
}

// TestReaderPrevLinkMismatch: a record whose xl_prev is not the previous
// record's start is refused at its LSN.
func TestReaderPrevLinkMismatch(t *testing.T) {
	g := xlogtest.NewGenerator(segLSN, segSize, 1, sysid)
	first, _ := g.Record(50)
	g.Record(50)
	g.SetPrev(first) // should be the second
	bad, _ := g.Record(50)
	recs, err := readAll(t, rand.New(rand.NewSource(1)), xlog.NewReader(segLSN, segSize), g.Take(), 100)
	var xe *xlog.Error
	if !errors.As(err, &xe) || xe.LSN != bad || errors.Is(err, xlog.ErrRecordCRC) || len(recs) != 2 {
		t.Fatalf("%d records, %v; want 2 and a prev-link error at %s", len(recs), err, bad)
	}
}

// TestReaderPageHeaderChecks: a bad magic, pageaddr or missing contrecord
// flag on a continuation page is refused at that page.
func TestReaderPageHeaderChecks(t *testing.T) {
	g := xlogtest.NewGenerator(segLSN, segSize, 1, sysid)
	g.Record(3 * xlog.PageSize)
	data := g.Take()
	page2 := segLSN + xlog.PageSize
	for name, damage := range map[string]func(b []byte){
		"magic":      func(b []byte) { b[xlog.PageSize] ^= 0xff },
		"pageaddr":   func(b []byte) { b[xlog.PageSize+9] ^= 0x01 },
		"contrecord": func(b []byte) { b[xlog.PageSize+2] &^= xlog.XLPFirstIsContRecord },
		"rem_len":    func(b []byte) { binary.LittleEndian.PutUint32(b[xlog.PageSize+16:], 7) },
	} {
		bad := bytes.Clone(data)
		damage(bad)
		_, err := readAll(t, rand.New(rand.NewSource(1)), xlog.NewReader(segLSN, segSize), bad, 1<<20)
		var xe *xlog.Error
		if !errors.As(err, &xe) || xe.LSN != page2 {
			t.Errorf("%s damaged: %v; want an error at page %s", name, err, page2)
		}
	}
}

func u16(v uint16) *uint16 { return &v }
func u32(v uint32) *uint32 { return &v }

// TestDecodeBlockReferences: block headers as DecodeXLogRecord reads them:
// relation, fork, block number, data, images with and without a hole,
// compressed with a hole length, SAME_REL, gaps in block ids, origin,
// top-level xid, short and long main data; FPILen counts image bytes.
func TestDecodeBlockReferences(t *testing.T) {
	rel := xlog.RelFileNode{Spc: 1663, DB: 5, Rel: 16384}
	full := bytes.Repeat([]byte{0xAB}, xlog.BlockSize)
	holed := bytes.Repeat([]byte{0xCD}, xlog.BlockSize-1000)
	body := xlogtest.Body{
		Blocks: []xlogtest.Block{
			{ID: 0, Rel: rel, Block: 7, Data: []byte("tuple data")},
			{ID: 1, SameRel: true, Block: 8, Image: full, ImageInfo: xlog.BkpImageApply},
			{ID: 3, Fork: 1, Rel: xlog.RelFileNode{Spc: 1663, DB: 5, Rel: 16390}, Block: 2, Image: holed,
				ImageInfo: xlog.BkpImageApply | xlog.BkpImageHasHole, HoleOffset: 200},
			{ID: 4, Fork: 2, SameRel: true, Block: 0, Image: []byte("compressed"), ImageInfo: xlog.BkpImageCompressLZ4 | xlog.BkpImageHasHole,
				HoleOffset: 64, HoleLength: 4000, Data: []byte{1, 2, 3}},
		},
		Origin:      u16(3),
		TopLevelXID: u32(1234),
		Main:        bytes.Repeat([]byte("m"), 300),
	}
	g := xlogtest.NewGenerator(segLSN, segSize, 1, sysid)
	st, end := g.Raw(10, 0x00, 777, xlogtest.EncodeBody(body))
	recs, err := readAll(t, rand.New(rand.NewSource(1)), xlog.NewReader(segLSN, segSize), g.Take(), 3000)
	if err != nil || len(recs) != 1 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	r := recs[0]
	if r.LSN != st || r.End != end || r.XID != 777 || r.RmID != 10 || !r.HasOrigin || r.Origin != 3 || !r.HasTopLevelXID || r.TopLevelXID != 1234 ||
		!bytes.Equal(r.MainData, body.Main) || len(r.Blocks) != 4 {
		t.Fatalf("record %+v", r)
	}
	want := []struct {
		id, fork uint8
		rel      xlog.RelFileNode
		blk      uint32
		data     string
		imgLen   int
		hole     [2]uint16
		apply    bool
	}{
		{0, 0, rel, 7, "tuple data", -1, [2]uint16{}, false},
		{1, 0, rel, 8, "", xlog.BlockSize, [2]uint16{0, 0}, true},
		{3, 1, xlog.RelFileNode{Spc: 1663, DB: 5, Rel: 16390}, 2, "", xlog.BlockSize - 1000, [2]uint16{200, 1000}, true},
		{4, 2, xlog.RelFileNode{Spc: 1663, DB: 5, Rel: 16390}, 0, "\x01\x02\x03", len("compressed"), [2]uint16{64, 4000}, false},
	}
	for i, w := range want {
		b := r.Blocks[i]
		if b.ID != w.id || b.Fork != w.fork || b.Rel != w.rel || b.Block != w.blk || string(b.Data) != w.data {
			t.Errorf("block %d: %+v, want %+v", i, b, w)
		}
		if (b.Image != nil) != (w.imgLen >= 0) {
			t.Errorf("block %d: image %v, want length %d", i, b.Image, w.imgLen)
			continue
		}
		if b.Image != nil && (int(b.Image.Len) != w.imgLen || len(b.ImageData) != w.imgLen || b.Image.HoleOffset != w.hole[0] ||
			b.Image.HoleLength != w.hole[1] || b.Image.Apply() != w.apply) {
			t.Errorf("block %d: image %+v, want len %d hole %v apply %v", i, *b.Image, w.imgLen, w.hole, w.apply)
		}
	}
	if got, want := r.FPILen(), xlog.BlockSize+xlog.BlockSize-1000+len("compressed"); got != want {
		t.Errorf("FPILen %d, want %d", got, want)
	}
	if r.Blocks[3].ForkName() != "vm" || r.Blocks[2].ForkName() != "fsm" {
		t.Errorf("fork names %s, %s", r.Blocks[2].ForkName(), r.Blocks[3].ForkName())
	}
}

// TestDecodeRejectsBadBodies: the checks of DecodeXLogRecord, each at the
// record's LSN and none a CRC error (the CRC is right).
func TestDecodeRejectsBadBodies(t *testing.T) {
	rel := xlog.RelFileNode{Spc: 1, DB: 2, Rel: 3}
	for name, body := range map[string][]byte{
		"out-of-order block ids": xlogtest.EncodeBody(xlogtest.Body{Blocks: []xlogtest.Block{{ID: 2, Rel: rel}, {ID: 1, Rel: rel}}}),
		"SAME_REL first":         xlogtest.EncodeBody(xlogtest.Body{Blocks: []xlogtest.Block{{ID: 0, SameRel: true}}}),
		"invalid block id":       {40, 0, 0, 0},
		"HAS_DATA, no data":      {0, xlog.BkpBlockHasData, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0},
		"data, no HAS_DATA":      {0, 0, 5, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5},
		"short header":           {0, 0},
		"main data too long":     {xlog.XLRBlockIDDataShort, 10, 1, 2, 3},
		"trailing bytes":         {xlog.XLRBlockIDDataShort, 1, 1, 2},
		"image without hole, short": xlogtest.EncodeBody(xlogtest.Body{Blocks: []xlogtest.Block{{ID: 0, Rel: rel, Image: make([]byte, 100),
			ImageInfo: xlog.BkpImageApply}}}),
		"hole at offset 0": xlogtest.EncodeBody(xlogtest.Body{Blocks: []xlogtest.Block{{ID: 0, Rel: rel, Image: make([]byte, 100),
			ImageInfo: xlog.BkpImageApply | xlog.BkpImageHasHole}}}),
		"rmgr id 50": nil,
	} {
		g := xlogtest.NewGenerator(segLSN, segSize, 1, sysid)
		rmid := byte(10)
		if name == "rmgr id 50" {
			rmid = 50
		}
		st, _ := g.Raw(rmid, 0, 0, body)
		_, err := readAll(t, rand.New(rand.NewSource(1)), xlog.NewReader(segLSN, segSize), g.Take(), 1<<20)
		var xe *xlog.Error
		if !errors.As(err, &xe) || xe.LSN != st || errors.Is(err, xlog.ErrRecordCRC) {
			t.Errorf("%s: %v; want a decoding error at %s", name, err, st)
		}
	}
}

// TestIdentify: names of the common record types, UNKNOWN otherwise.
func TestIdentify(t *testing.T) {
	for _, c := range []struct {
		rmid, info uint8
		want       string
	}{
		{0, 0x10, "CHECKPOINT_ONLINE"}, {0, 0xB0, "FPI"}, {0, 0xA0, "FPI_FOR_HINT"}, {0, 0x40, "SWITCH"},
		{1, 0x00, "COMMIT"}, {1, 0x80, "COMMIT"}, {1, 0x20, "ABORT"},
		{10, 0x00, "INSERT"}, {10, 0x80, "INSERT+INIT"}, {10, 0x40, "HOT_UPDATE"}, {10, 0x60, "LOCK"},
		{9, 0x10, "PRUNE"}, {9, 0xD0, "MULTI_INSERT+INIT"}, {11, 0x00, "INSERT_LEAF"},
		{8, 0x10, "RUNNING_XACTS"}, {2, 0x10, "CREATE"}, {20, 0x00, "Generic"},
		{0, 0xC0, "UNKNOWN (c0)"}, {13, 0x00, "UNKNOWN (0)"}, {12, 0x20, "INSERT"}, {200, 0x10, "UNKNOWN (10)"},
	} {
		if got := xlog.RecordType(&xlog.Record{RmID: c.rmid, Info: c.info}); got != c.want {
			t.Errorf("rmgr %d info %#x: %q, want %q", c.rmid, c.info, got, c.want)
		}
	}
	if xlog.RmgrName(10) != "Heap" || xlog.RmgrName(21) != "LogicalMessage" || xlog.RmgrName(130) != "custom130" {
		t.Errorf("rmgr names: %s %s %s", xlog.RmgrName(10), xlog.RmgrName(21), xlog.RmgrName(130))
	}
}
