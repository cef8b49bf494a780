package storage

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// The database file keeps a tail of written blocks (zeros) ahead of
// bbolt's last page in use, so that a commit at the end of the file
// overwrites blocks the file system has already allocated and written:
// its fdatasync then flushes data only, with no journal commit for new
// blocks and their extent. PostgreSQL zero-fills each WAL segment before
// use for the same reason. bbolt grows its file with ftruncate, a hole,
// and every commit into the hole allocated blocks: measured on this
// project's test machine (ext4 on a virtio disk), a commit of 6 page
// writes and bbolt's two fdatasyncs cost about 320 µs of CPU and 670 µs
// of wall time into a hole, 210 µs and 390 µs into written blocks.
//
// The tail is filled by the leader of a group commit after it has woken
// its committers, inside a write transaction of its own (which holds
// bbolt's writer lock, so no page past the last one in use is taken
// meanwhile), at most zeroChunk per commit, so a fill delays the next
// batch by a few milliseconds at most. Zeros past the last page in use are
// no part of the database: a crash in the middle of a fill leaves a
// longer file, nothing else. A file whose interior has free pages (after
// retention or a delete) reuses those first, and the tail is not filled
// while they last. ReusableBytes counts the tail as room in the file.
const (
	zeroChunk    = 1 << 20  // at most this much is zero-filled per commit
	zeroAheadMin = 1 << 20  // the tail kept ahead of the last page in use: hwm/16 within these bounds
	zeroAheadMax = 16 << 20 //
	zeroRetry    = time.Minute
	// zeroBatchMax: after a commit of more WAL than this the tail is not
	// filled (the journal cost is spread, and filling would double the
	// bytes written by a large ingest).
	zeroBatchMax = 256 << 10
)

// zeroAhead fills the next part of the tail, if it is short. The caller
// leads the group commit (db.leading).
func (db *DB) zeroAhead() {
	if db.opts.ReadOnly || db.opts.UnsafeNoFsync {
		return
	}
	if !db.zeroFailed.IsZero() && time.Since(db.zeroFailed) < zeroRetry {
		return
	}
	if db.lastBatchBytes > zeroBatchMax {
		// A large commit: its journal commit is spread over much data, and
		// zeros written ahead of a stream of such commits would double the
		// bytes written. Small commits are the ones that gain.
		return
	}
	if db.zeroInit && db.zeroedTo-db.hwm >= min(max(db.hwm/16, zeroAheadMin), zeroAheadMax)/2 {
		return // the tail is long enough (db.hwm lags by at most a batch)
	}
	tx, err := db.bolt.Begin(true)
	if err != nil {
		return
	}
	defer tx.Rollback() // nothing is written through bbolt
	hwm := tx.Size()    // the end of the last page in use
	ahead := min(max(hwm/16, zeroAheadMin), zeroAheadMax)
	if db.zeroFile == nil {
		return // it could not be opened (openZeroFile warned)
	}
	if !db.zeroInit {
		db.zeroInit = true
		// What the file system already backs past the last page in use
		// (an earlier run's tail) is not written again.
		if off, err := unix.Seek(int(db.zeroFile.Fd()), hwm, unix.SEEK_HOLE); err == nil {
			db.zeroedTo = off
		}
	}
	if db.zeroedTo-hwm >= ahead/2 {
		return
	}
	// Free pages inside the file are taken before the end: while they
	// last, the tail is not needed.
	if st := db.bolt.Stats(); int64(st.FreePageN+st.PendingPageN)*int64(db.bolt.Info().PageSize) >= ahead/2 {
		return
	}
	start := max(hwm, db.zeroedTo)
	end := min(start+zeroChunk, hwm+ahead)
	fi, err := db.zeroFile.Stat()
	if err != nil {
		db.zeroFailure(err)
		return
	}
	if err := writeZeros(db.zeroFile, start, end); err != nil {
		// Most likely a full disk: give back what the fill added; bbolt
		// grows the file by itself as before.
		if end > fi.Size() {
			_ = db.zeroFile.Truncate(fi.Size())
		}
		db.zeroFailure(err)
		return
	}
	db.zeroedTo = end
}

func (db *DB) zeroFailure(err error) {
	db.zeroFailed = time.Now()
	db.log.Warn("could not zero-fill the database file ahead of its last page; commits at its end cost more until it works", "err", err, "retry_in", zeroRetry)
}

var zeros [64 << 10]byte

// writeZeros writes zeros over [start, end) of f and makes them durable.
func writeZeros(f *os.File, start, end int64) error {
	for off := start; off < end; {
		n := min(int64(len(zeros)), end-off)
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			return fmt.Errorf("storage: zero-fill %s: %w", f.Name(), err)
		}
		off += n
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("storage: zero-fill %s: fdatasync: %w", f.Name(), err)
	}
	return nil
}

// openZeroFile opens the descriptor the tail is written through, with the
// database, so that a server's open descriptors do not change with its
// first commit.
func (db *DB) openZeroFile() {
	if db.opts.ReadOnly || db.opts.UnsafeNoFsync {
		return
	}
	f, err := os.OpenFile(db.path, os.O_WRONLY, 0)
	if err != nil {
		db.zeroFailure(err)
		return
	}
	db.zeroFile = f
}
