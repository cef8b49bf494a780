package storage

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

// benchSegSize is the segment size of the benchmark timelines; a segment is
// removed by retention once the next one is full, to keep the file small.
const benchSegSize = 16 << 20

// benchCommits runs Commits of size bytes of WAL on tl until next returns
// false.
func benchCommits(b *testing.B, tl *Timeline, n, size int, next func() bool) {
	st := testState(n)
	st.WalSegSize = benchSegSize
	data := walData(0, size, 1)
	lsn := proto.LSN(benchSegSize)
	for next() {
		if err := tl.WriteWAL(lsn, data); err != nil {
			b.Error(err)
			return
		}
		lsn += proto.LSN(size)
		st.FlushLSN = lsn
		st.CommitLSN = lsn - proto.LSN(size)
		if err := tl.Commit(st); err != nil {
			b.Error(err)
			return
		}
		if lsn.SegmentOffset(benchSegSize) < uint64(size) && lsn > 2*benchSegSize {
			if err := tl.RemoveWAL(lsn.SegmentStart(benchSegSize) - benchSegSize); err != nil {
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

// reportWrites reports what bbolt wrote per commit since before: the bytes
// of dirty pages (plus the 4 KiB meta page of each transaction) per WAL
// byte, and the pwrite calls per transaction. These are the figures the WAL
// layout is designed to keep small; unlike MB/s they do not depend on how
// busy the machine is.
func reportWrites(b *testing.B, db *DB, before dbCounters) {
	now := db.counters()
	txs := float64(now.writeTxs - before.writeTxs)
	if txs == 0 || now.walBytes == before.walBytes {
		return
	}
	pageBytes := float64(now.pageAlloc-before.pageAlloc) + txs*float64(db.bolt.Info().PageSize)
	b.ReportMetric(pageBytes/float64(now.walBytes-before.walBytes), "written/WAL-byte")
	b.ReportMetric(pageBytes/txs/float64(db.bolt.Info().PageSize), "pages/tx")
	b.ReportMetric(float64(now.writes-before.writes)/txs, "pwrites/tx")
	b.ReportMetric(float64(now.commits-before.commits)/txs, "commits/tx")
}

// BenchmarkCommit: one timeline, one Commit after another, fsync on, for
// WAL of 8 KiB (a quiet primary), 16 KiB (pgbench's typical group commit)
// and 128 KiB (a busy one) per Commit.
func BenchmarkCommit(b *testing.B) {
	for _, size := range []int{8 << 10, 16 << 10, proto.MaxWALPerRequest} {
		b.Run(fmt.Sprintf("wal=%dKiB", size>>10), func(b *testing.B) {
			db := openTest(b, testPath(b), Options{})
			tl := benchTimeline(b, db, 0)
			b.SetBytes(int64(size))
			before := db.counters()
			benchCommits(b, tl, 0, size, b.Loop)
			reportWrites(b, db, before)
		})
	}
}

// BenchmarkCommitParallel: one timeline per goroutine (GOMAXPROCS ×
// -cpu, raised with SetParallelism), each committing 128 KiB per Commit;
// the group committer shares fsyncs among them.
func BenchmarkCommitParallel(b *testing.B) {
	db := openTest(b, testPath(b), Options{})
	b.SetParallelism(8)
	var n atomic.Int32
	b.SetBytes(proto.MaxWALPerRequest)
	before := db.counters()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(n.Add(1))
		tl := benchTimeline(b, db, i)
		if tl == nil {
			return
		}
		benchCommits(b, tl, i, proto.MaxWALPerRequest, pb.Next)
	})
	reportWrites(b, db, before)
}

// dbCounters are the DB's and bbolt's write counters at one moment.
type dbCounters struct {
	commits, writeTxs, walBytes uint64
	pageAlloc, writes           int64
}

func (db *DB) counters() dbCounters {
	s := db.Stats()
	tx := db.bolt.Stats().TxStats
	return dbCounters{
		commits: s.Commits, writeTxs: s.WriteTxs, walBytes: s.WALBytes,
		pageAlloc: tx.GetPageAlloc(), writes: tx.GetWrite(),
	}
}
