package ingest

import (
	"math/rand/v2"
	"slices"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
)

// The timeline every benchmark stream belongs to: PostgreSQL's default
// segment size, and a start at the second segment, as a fresh cluster's
// WAL begins.
const (
	SegSize  = 16 << 20
	TLStart  = proto.LSN(SegSize)
	SystemID = 7400000000000000001
)

// WAL is a stream of valid PostgreSQL 15 WAL from Start: the safekeeper
// decodes page and record headers (and checks xl_crc) on ingest, so the
// bytes must be real WAL, not zeros. Records are XLOG_NOOP records of a
// fixed, seeded mix (RecordMix).
type WAL struct {
	Start proto.LSN
	Data  []byte
	ends  []int // offsets in Data of every record end, ascending
}

// RecordMix says what the generated WAL looks like, for the report.
const RecordMix = "XLOG_NOOP records, seeded: 3 in 4 with 50–300 bytes of data (row-sized), 1 in 4 with 8150–8250 (full-page-image-sized); about 2.2 KB per record on average"

// GenerateWAL returns at least size bytes of WAL from TLStart (it stops at
// the first record end at or after size).
func GenerateWAL(size int64) *WAL {
	g := xlogtest.NewGenerator(TLStart, SegSize, 1, SystemID)
	rng := rand.New(rand.NewPCG(9, 9)) // a fixed seed: the same WAL every run
	w := &WAL{Start: TLStart, Data: make([]byte, 0, size+64<<10)}
	for int64(len(w.Data)) < size {
		n := 50 + rng.IntN(251)
		if rng.IntN(4) == 0 {
			n = 8150 + rng.IntN(101)
		}
		g.Record(n)
		w.Data = append(w.Data, g.Bytes()...)
		g.Take()
		w.ends = append(w.ends, len(w.Data))
	}
	return w
}

// Cut returns the offset of the last record end at or before off (at least
// the first record's end): where a piece of the stream may end so that the
// safekeeper's flush_lsn can reach it.
func (w *WAL) Cut(off int64) int64 {
	i, found := slices.BinarySearch(w.ends, int(off))
	if found {
		return off
	}
	if i == 0 {
		return int64(w.ends[0])
	}
	return int64(w.ends[i-1])
}

// LSN returns the LSN of offset off.
func (w *WAL) LSN(off int64) proto.LSN { return w.Start + proto.LSN(off) }
