package storage

import (
	"sync/atomic"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

// benchWAL is the WAL written per Commit: one full SafeKeeperRequest.
const benchWAL = proto.MaxWALPerRequest

// benchSegSize is the segment size of the benchmark timelines; a segment is
// removed by retention once the next one is full, to keep the file small.
const benchSegSize = 16 << 20

// benchCommits runs Commits of benchWAL bytes on tl until next returns false.
func benchCommits(b *testing.B, tl *Timeline, n int, next func() bool) {
	st := testState(n)
	st.WalSegSize = benchSegSize
	data := walData(0, benchWAL, 1)
	lsn := proto.LSN(benchSegSize)
	for next() {
		if err := tl.WriteWAL(lsn, data); err != nil {
			b.Error(err)
			return
		}
		lsn += benchWAL
		st.FlushLSN = lsn
		if err := tl.Commit(st); err != nil {
			b.Error(err)
			return
		}
		if lsn.SegmentOffset(benchSegSize) == 0 {
			if err := tl.RemoveWAL(lsn - benchSegSize); err != nil {
				b.Error(err)
				return
			}
		}
	}
}

func benchTimeline(b *testing.B, db *DB, n int) *Timeline {
	st := testState(n)
	st.WalSegSize = benchSegSize
	tl, err := db.CreateTimeline(st)
	if err != nil {
		b.Error(err) // may run on a RunParallel goroutine: no Fatal
	}
	return tl
}

// BenchmarkCommit: one timeline, 128 KiB of WAL per Commit, fsync on.
func BenchmarkCommit(b *testing.B) {
	db := openTest(b, testPath(b), Options{})
	tl := benchTimeline(b, db, 0)
	b.SetBytes(benchWAL)
	benchCommits(b, tl, 0, b.Loop)
	b.ReportMetric(float64(db.Stats().Commits)/float64(db.Stats().WriteTxs), "commits/fsync")
}

// BenchmarkCommitParallel: one timeline per goroutine (GOMAXPROCS ×
// -cpu, raised with SetParallelism), each committing 128 KiB per Commit;
// the group committer shares fsyncs among them.
func BenchmarkCommitParallel(b *testing.B) {
	db := openTest(b, testPath(b), Options{})
	b.SetParallelism(8)
	var n atomic.Int32
	b.SetBytes(benchWAL)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(n.Add(1))
		tl := benchTimeline(b, db, i)
		if tl == nil {
			return
		}
		benchCommits(b, tl, i, pb.Next)
	})
	b.ReportMetric(float64(db.Stats().Commits)/float64(db.Stats().WriteTxs), "commits/fsync")
}
