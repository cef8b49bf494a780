package xlog_test

import (
	"encoding/binary"
	"errors"
	"math/rand"
	"reflect"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
)

// fuzzSeg is small so that fuzzed inputs reach segment boundaries.
const fuzzSeg = 2 * xlog.PageSize

// FuzzDecoder feeds arbitrary bytes, split at an arbitrary point, and checks
// that the decoder never panics, that RecordEnd stays a MAXALIGNed position
// in [start, Pos], that errors wrap ErrInvalidWAL, and that the split does
// not change the outcome.
func FuzzDecoder(f *testing.F) {
	start := proto.LSN(fuzzSeg)
	for seed := int64(0); seed < 6; seed++ {
		rng := rand.New(rand.NewSource(seed))
		g := xlogtest.NewGenerator(start, fuzzSeg, 1, sysid)
		// Small inputs (the fuzzer minimizes in quadratic time): about
		// three pages, so that page and segment boundaries are reached.
		for g.Pos() < start+2*xlog.PageSize {
			switch rng.Intn(6) {
			case 0:
				g.Switch()
			case 1:
				g.AbortedRecord(xlog.PageSize)
			default:
				g.Record(rng.Intn(3000))
			}
		}
		f.Add(g.Take(), uint16(rng.Intn(1<<16)))
	}
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		whole := xlog.NewDecoder(start, fuzzSeg)
		errWhole := whole.Feed(data)

		parts := xlog.NewDecoder(start, fuzzSeg)
		cut := 0
		if len(data) > 0 {
			cut = int(split) % len(data)
		}
		errParts := parts.Feed(data[:cut])
		if errParts == nil {
			errParts = parts.Feed(data[cut:])
		}

		for _, d := range []*xlog.Decoder{whole, parts} {
			if e := d.RecordEnd(); e < start || e > d.Pos() || e%xlog.MaxAlign != 0 {
				t.Fatalf("RecordEnd %s outside [%s, Pos %s] or not MAXALIGNed", e, start, d.Pos())
			}
		}
		if (errWhole == nil) != (errParts == nil) {
			t.Fatalf("split at %d changed the outcome: %v vs %v", cut, errWhole, errParts)
		}
		if errWhole != nil {
			var a, b *xlog.Error
			if !errors.As(errWhole, &a) || !errors.As(errParts, &b) || !errors.Is(errWhole, xlog.ErrInvalidWAL) {
				t.Fatalf("errors are not *xlog.Error: %v, %v", errWhole, errParts)
			}
			if a.LSN != b.LSN {
				t.Fatalf("split at %d moved the error: %v vs %v", cut, errWhole, errParts)
			}
		} else if whole.Pos() != parts.Pos() {
			t.Fatalf("Pos %s vs %s", whole.Pos(), parts.Pos())
		}
		if whole.RecordEnd() != parts.RecordEnd() {
			t.Fatalf("split at %d: RecordEnd %s vs %s", cut, whole.RecordEnd(), parts.RecordEnd())
		}
	})
}

// FuzzReader feeds arbitrary bytes, split at an arbitrary point, to a
// Reader and checks that it never panics, that records come out in LSN
// order each ending after it starts and chained by xl_prev, that errors are
// *xlog.Error, and that the split changes neither the records nor the
// error's LSN.
func FuzzReader(f *testing.F) {
	start := proto.LSN(fuzzSeg)
	rel := xlog.RelFileNode{Spc: 1663, DB: 5, Rel: 16384}
	for seed := int64(0); seed < 6; seed++ {
		rng := rand.New(rand.NewSource(seed))
		g := xlogtest.NewGenerator(start, fuzzSeg, 1, sysid)
		for g.Pos() < start+2*xlog.PageSize {
			switch rng.Intn(7) {
			case 0:
				g.Switch()
			case 1:
				g.AbortedRecord(xlog.PageSize)
			case 2:
				g.Raw(10, 0, 9, xlogtest.EncodeBody(xlogtest.Body{Blocks: []xlogtest.Block{
					{ID: 0, Rel: rel, Block: 1, Data: []byte("abc")},
					{ID: 1, SameRel: true, Image: make([]byte, 100), ImageInfo: xlog.BkpImageHasHole | xlog.BkpImageApply, HoleOffset: 50},
				}, Main: []byte("main")}))
			default:
				g.Record(rng.Intn(3000))
			}
		}
		f.Add(g.Take(), uint16(rng.Intn(1<<16)))
	}
	read := func(parts ...[]byte) ([]xlog.Record, error) {
		r := xlog.NewReader(start, fuzzSeg)
		var out []xlog.Record
		for _, p := range parts {
			r.Feed(p)
			for {
				rec, ok, err := r.Next()
				if err != nil {
					return out, err
				}
				if !ok {
					break
				}
				c := *rec
				c.MainData, c.Blocks = nil, nil // not valid after Next
				out = append(out, c)
			}
		}
		return out, nil
	}
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		cut := 0
		if len(data) > 0 {
			cut = int(split) % len(data)
		}
		a, errA := read(data)
		b, errB := read(data[:cut], data[cut:])
		if len(a) != len(b) || (errA == nil) != (errB == nil) {
			t.Fatalf("split at %d: %d records, %v vs %d records, %v", cut, len(a), errA, len(b), errB)
		}
		for i := range a {
			if !reflect.DeepEqual(a[i], b[i]) {
				t.Fatalf("split at %d: record %d differs: %+v vs %+v", cut, i, a[i], b[i])
			}
			if a[i].End <= a[i].LSN || a[i].End%xlog.MaxAlign != 0 || (i > 0 && a[i].LSN < a[i-1].End) {
				t.Fatalf("record %d at %s..%s after %s", i, a[i].LSN, a[i].End, a[max(i-1, 0)].End)
			}
		}
		if errA != nil {
			var x, y *xlog.Error
			if !errors.As(errA, &x) || !errors.As(errB, &y) || !errors.Is(errA, xlog.ErrInvalidWAL) || x.LSN != y.LSN {
				t.Fatalf("errors %v, %v", errA, errB)
			}
		}
	})
}

// FuzzDecodeRecord decodes arbitrary record bodies (with a correct header
// and CRC) and checks that it never panics, that every slice it returns
// lies inside the record and that errors are *xlog.Error at the record.
func FuzzDecodeRecord(f *testing.F) {
	rel := xlog.RelFileNode{Spc: 1663, DB: 5, Rel: 16384}
	f.Add(xlogtest.EncodeBody(xlogtest.Body{Main: []byte("x")}))
	f.Add(xlogtest.EncodeBody(xlogtest.Body{Blocks: []xlogtest.Block{
		{ID: 0, Rel: rel, Block: 1, Data: []byte("abc")},
		{ID: 2, Fork: 1, SameRel: true, Image: make([]byte, 20), ImageInfo: xlog.BkpImageCompressPGLZ | xlog.BkpImageHasHole, HoleOffset: 8, HoleLength: 100},
	}, Origin: new(uint16), TopLevelXID: new(uint32), Main: make([]byte, 300)}))
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) > 1<<20 {
			return
		}
		rec := make([]byte, xlog.SizeOfXLogRecord+len(body))
		binary.LittleEndian.PutUint32(rec[0:], uint32(len(rec)))
		rec[17] = 10
		copy(rec[xlog.SizeOfXLogRecord:], body)
		binary.LittleEndian.PutUint32(rec[20:], xlog.RecordCRC(rec, body))
		r, err := xlog.DecodeRecord(0x1000028, rec)
		if err != nil {
			var xe *xlog.Error
			if !errors.As(err, &xe) || xe.LSN != 0x1000028 || errors.Is(err, xlog.ErrRecordCRC) {
				t.Fatalf("error %v", err)
			}
			return
		}
		total := len(r.MainData)
		for _, b := range r.Blocks {
			total += len(b.Data) + len(b.ImageData)
			if b.ID > xlog.XLRMaxBlockID {
				t.Fatalf("block id %d", b.ID)
			}
		}
		if total > len(body) {
			t.Fatalf("%d bytes of data and images in a body of %d", total, len(body))
		}
	})
}
