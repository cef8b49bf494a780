package xlog_test

import (
	"errors"
	"math/rand"
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
