package storage

import (
	"errors"
	"fmt"
	"sync"

	bolt "go.etcd.io/bbolt"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
)

var _ acceptor.Storage = (*Timeline)(nil)

// Timeline is the storage of one timeline: its control state and WAL. It
// implements acceptor.Storage.
//
// WriteWAL, TruncateWAL and Commit mutate the timeline and belong to its one
// owner (the acceptor's, one call at a time). ReadWAL, EndLSN, RemovedUpTo and
// RemoveWAL may be called from any goroutine: readers see committed WAL only.
type Timeline struct {
	db      *DB
	key     tlKey
	segSize uint64

	// commitMu serialises Commit calls, so staged changes reach the disk in
	// the order they were made even if a caller breaks the one-owner rule.
	commitMu sync.Mutex

	mu sync.Mutex
	// staged are the writes and truncations since the last Commit, in
	// order; the written bytes are in buf.
	staged []walOp
	// buf holds the bytes of the staged writes, back to back; it comes from
	// walBufs and goes back there once its Commit is done.
	buf *[]byte
	// writePos is the WAL including staged changes; the next WriteWAL
	// starts at its end.
	writePos walRange
	// end is the committed WAL.
	end walRange
	// removedUpTo is the retention horizon as last committed by RemoveWAL
	// (or read at open).
	removedUpTo proto.LSN
}

// walOp is one staged change: a write of data at lsn, or a truncation of all
// WAL at and above lsn.
type walOp struct {
	truncate bool
	lsn      proto.LSN
	// data is a copy of the caller's bytes, (*Timeline.buf)[off:], or, when
	// kept, the caller's own.
	data []byte
	off  int
	kept bool
}

// keepWALWrite is the smallest write WriteWAL keeps by reference instead of
// copying (a request's WAL is up to 128 KiB): copying it cost a pass over
// every byte and, with many timelines writing at once, a staging buffer per
// timeline in fresh memory.
const keepWALWrite = 32 << 10

// walBufs recycles the staging buffers of all timelines: the append path
// copies each request's WAL once, into memory that is already mapped, rather
// than growing a fresh buffer per Commit (growth and page faults were most
// of the CPU of ingest). It is a bounded free list, not a sync.Pool: a
// burst over many timelines leaves at most maxFreeWALBufs buffers behind,
// and the rest is garbage at once (a sync.Pool keeps everything through one
// more collection).
var walBufs = make(chan *[]byte, maxFreeWALBufs)

const (
	minWALBuf      = 32 << 10
	maxFreeWALBufs = 16
	// maxPooledWALBuf: a buffer grown beyond this by a huge Commit is left
	// to the garbage collector rather than kept.
	maxPooledWALBuf = 16 << 20
)

// getWALBuf returns a recycled staging buffer, or a new one with room for
// need bytes (at least minWALBuf): with many timelines committing at once
// each holds one, so a new one is not bigger than its first write needs.
func getWALBuf(need int) *[]byte {
	select {
	case b := <-walBufs:
		return b
	default:
		b := make([]byte, 0, max(need, minWALBuf))
		return &b
	}
}

func putWALBuf(b *[]byte) {
	if b == nil || cap(*b) > maxPooledWALBuf {
		return
	}
	*b = (*b)[:0]
	select {
	case walBufs <- b:
	default:
	}
}

func (op walOp) end() proto.LSN { return op.lsn + proto.LSN(len(op.data)) }

func (op walOp) kind() string {
	if op.truncate {
		return "truncation"
	}
	return "write"
}

// Key returns the timeline's tenant and timeline ids.
func (t *Timeline) Key() proto.TimelineKey { return t.key.timelineKey() }

// WriteWAL stages data at lsn. A write of at least keepWALWrite bytes is
// kept by reference, not copied: the caller must leave data unchanged until
// the next Commit returns. Smaller writes are copied (and packed together),
// so data may be reused at once. lsn must be the end of the WAL including staged changes: the end of the
// previous write or of a truncation inside the WAL. If the WAL holds no bytes
// (never written, or emptied by a truncation or by retention) the write may
// start anywhere at or above the retention horizon. Anything else fails with
// ErrBadLSN. Staged bytes are invisible to ReadWAL and lost on a crash until
// Commit returns.
func (t *Timeline) WriteWAL(lsn proto.LSN, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	op := walOp{lsn: lsn, data: data}
	pos, err := t.writePos.step(op, t.removedUpTo)
	if err != nil {
		return fmt.Errorf("storage: timeline %s: %w", t.Key(), err)
	}
	if len(data) >= keepWALWrite {
		op.kept = true
		t.staged = append(t.staged, op)
		t.writePos = pos
		return nil
	}
	if t.buf == nil {
		t.buf = getWALBuf(len(data))
	}
	buf := *t.buf
	off, grown := len(buf), cap(buf)-len(buf) < len(data)
	if grown {
		// Double (append grows large slices by a quarter: many copies
		// for a batch of many requests).
		nb := make([]byte, len(buf), max(2*cap(buf), len(buf)+len(data)))
		copy(nb, buf)
		buf = nb
	}
	buf = append(buf, data...)
	*t.buf = buf
	if grown {
		for i := range t.staged {
			if op := &t.staged[i]; !op.truncate && !op.kept {
				op.data = buf[op.off : op.off+len(op.data)]
			}
		}
	}
	// Contiguous copied writes are packed into one op; Commit cuts it into
	// chunks.
	if n := len(t.staged); n > 0 && !t.staged[n-1].truncate && !t.staged[n-1].kept {
		last := &t.staged[n-1]
		last.data = buf[last.off:]
	} else {
		op.data, op.off = buf[off:], off
		t.staged = append(t.staged, op)
	}
	t.writePos = pos
	return nil
}

// TruncateWAL stages the removal of all WAL at and above lsn (a no-op if lsn
// is at or above the end of WAL). It takes effect in the transaction of the
// next Commit, in order with the writes staged before and after it: a crash
// either keeps the WAL as it was before, or applies the truncation together
// with those writes and the state given to Commit. Bytes above lsn are never
// readable again once that Commit has returned.
func (t *Timeline) TruncateWAL(lsn proto.LSN) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	op := walOp{truncate: true, lsn: lsn}
	t.writePos, _ = t.writePos.step(op, t.removedUpTo) // truncations are always allowed
	t.staged = append(t.staged, op)
	return nil
}

// Commit makes the staged truncations and writes, in the order they were
// staged, and the control state s durable in one transaction, through the
// DB's group commit: it returns after the fsync that covers them.
//
// s.TenantID, s.TimelineID and s.WalSegSize must be the timeline's.
// s.RemovedUpTo is ignored — the stored value is the one RemoveWAL set —
// unless the timeline holds no WAL and it is higher: then it becomes the
// horizon, rounded down to a segment boundary (a safekeeper that joins a
// timeline late holds it from there; reads below fail with ErrWALRemoved).
//
// On error nothing of this commit is durable and the staged changes are
// dropped: the timeline is back at its last committed state, which the
// caller should reload (OpenTimeline) before going on.
func (t *Timeline) Commit(s acceptor.State) error {
	t.commitMu.Lock()
	defer t.commitMu.Unlock()

	t.mu.Lock()
	ops, buf := t.staged, t.buf
	t.staged, t.buf = nil, nil
	t.mu.Unlock()
	defer putWALBuf(buf) // the group commit is done with it when Commit returns

	err := t.checkState(&s)
	if err == nil {
		r := &commitReq{t: t, ops: ops, state: s.Clone()}
		if err = t.db.commit(r); err == nil {
			err = r.err
			if err == nil {
				t.mu.Lock()
				t.end = r.end
				t.removedUpTo = max(t.removedUpTo, r.state.RemovedUpTo)
				t.mu.Unlock()
				return nil
			}
		}
	}
	t.mu.Lock()
	t.staged = nil
	t.writePos = t.end
	t.mu.Unlock()
	if errors.Is(err, ErrClosed) || errors.Is(err, ErrReadOnly) || errors.Is(err, ErrBadState) {
		err = fmt.Errorf("storage: commit timeline %s: %w", t.Key(), err)
	}
	return err
}

// Load reads the control state of the last successful Commit (with the
// retention horizon RemoveWAL stored) from disk.
func (t *Timeline) Load() (acceptor.State, error) {
	var st acceptor.State
	err := t.db.bolt.View(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTimelines).Bucket(t.key[:])
		if tb == nil {
			return fmt.Errorf("%w: %s", ErrNoTimeline, t.Key())
		}
		var err error
		st, err = readControl(tb) // copies out of the transaction
		return err
	})
	if err != nil {
		return acceptor.State{}, fmt.Errorf("storage: load timeline %s: %w", t.Key(), err)
	}
	return st, nil
}

func (t *Timeline) checkState(s *acceptor.State) error {
	if makeKey(s.TenantID, s.TimelineID) != t.key {
		return fmt.Errorf("%w: state of timeline %s/%s", ErrBadState, s.TenantID, s.TimelineID)
	}
	if uint64(s.WalSegSize) != t.segSize {
		return fmt.Errorf("%w: wal_seg_size %d, the timeline's is %d", ErrBadState, s.WalSegSize, t.segSize)
	}
	return nil
}

// EndLSN returns the end of the committed WAL. If the timeline holds no WAL
// bytes it is where they were last removed (by retention or truncation), or
// 0 for a timeline never written.
func (t *Timeline) EndLSN() proto.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.end.end
}

// RemovedUpTo returns the retention horizon: WAL below it was removed.
func (t *Timeline) RemovedUpTo() proto.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.removedUpTo
}

// ReadWAL copies committed WAL starting exactly at from into buf and returns
// the number of bytes copied: up to len(buf), less at the end of the WAL, 0 at
// or beyond it. Staged (uncommitted) bytes are never returned. It fails with
// an error wrapping ErrWALRemoved, naming from, if from is below the oldest
// WAL retained.
//
// The read transaction lasts for this call only and the bytes are copied out
// of it, so callers may send them over the network without blocking writers.
// Callers limit what they serve (to commit_lsn or flush_lsn) themselves.
func (t *Timeline) ReadWAL(from proto.LSN, buf []byte) (int, error) {
	if len(buf) == 0 {
		return 0, nil
	}
	n := 0
	err := t.db.bolt.View(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTimelines).Bucket(t.key[:])
		if tb == nil {
			return fmt.Errorf("%w: %s", ErrNoTimeline, t.Key())
		}
		wal := tb.Bucket(bucketWAL)
		if wal == nil {
			return fmt.Errorf("%w: timeline %s has no %q bucket", ErrCorrupt, t.Key(), bucketWAL)
		}
		c := newWALCursor(wal)
		start, v, ok := c.seek(from)
		if !ok {
			return t.notRetained(tb, wal, from)
		}
		if start+proto.LSN(len(v)) <= from {
			return nil // at or past the end of WAL
		}
		off := from - start
		for {
			n += copy(buf[n:], v[off:])
			if n == len(buf) {
				return nil
			}
			next := start + proto.LSN(len(v))
			if start, v, ok = c.next(); !ok || start != next {
				return nil
			}
			off = 0
		}
	})
	if err != nil {
		if errors.Is(err, ErrWALRemoved) || errors.Is(err, ErrNoTimeline) {
			return 0, err
		}
		return 0, fmt.Errorf("storage: read WAL of timeline %s at %s: %w", t.Key(), from, err)
	}
	return n, nil
}

// notRetained returns the error for a read at from that lies before every
// chunk: ErrWALRemoved if some WAL is retained or was removed above from,
// nil (nothing to read) for a timeline without WAL.
func (t *Timeline) notRetained(tb, wal *bolt.Bucket, from proto.LSN) error {
	if first, ok := firstLSN(wal); ok {
		return fmt.Errorf("%w: timeline %s: WAL at %s, oldest retained is %s", ErrWALRemoved, t.Key(), from, first)
	}
	st, err := readControl(tb)
	if err != nil {
		return err
	}
	if from < st.RemovedUpTo {
		return fmt.Errorf("%w: timeline %s: WAL at %s, removed up to %s", ErrWALRemoved, t.Key(), from, st.RemovedUpTo)
	}
	return nil
}

// RemoveWAL removes, in one transaction, every WAL segment that lies wholly
// below upTo, and records the new retention horizon (upTo rounded down to a
// segment boundary) as RemovedUpTo in the stored control state. Storage owns
// that field: later Commits keep it whatever their State says, and
// OpenTimeline returns it. upTo must not be above the end of committed WAL;
// the caller chooses it (at most the lowest position still needed by
// replicas, the proposer's truncate_lsn and commit_lsn). Removing below the
// current horizon is a no-op.
func (t *Timeline) RemoveWAL(upTo proto.LSN) error {
	cut := upTo.SegmentStart(t.segSize)
	if err := t.db.checkOpen(); err != nil {
		return fmt.Errorf("storage: remove WAL of timeline %s: %w", t.Key(), err)
	}
	err := t.db.bolt.Update(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTimelines).Bucket(t.key[:])
		if tb == nil {
			return fmt.Errorf("%w: %s", ErrNoTimeline, t.Key())
		}
		st, err := readControl(tb)
		if err != nil {
			return err
		}
		wal := tb.Bucket(bucketWAL)
		if wal == nil {
			return fmt.Errorf("%w: timeline %s has no %q bucket", ErrCorrupt, t.Key(), bucketWAL)
		}
		if r := walRangeOf(wal, st.RemovedUpTo); upTo > r.end {
			return fmt.Errorf("%w: removal up to %s is above the end of WAL %s", ErrBadLSN, upTo, r.end)
		}
		if cut <= st.RemovedUpTo {
			return nil
		}
		if err := removeBelow(wal, cut); err != nil {
			return err
		}
		st.RemovedUpTo = cut
		return tb.Put(keyControl, encodeState(nil, &st))
	})
	if err != nil {
		return fmt.Errorf("storage: remove WAL of timeline %s up to %s: %w", t.Key(), upTo, err)
	}
	t.mu.Lock()
	t.removedUpTo = max(t.removedUpTo, cut)
	t.end = t.end.removed(cut)
	t.writePos = t.writePos.removed(cut)
	t.mu.Unlock()
	return nil
}
