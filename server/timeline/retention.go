package timeline

import (
	"container/heap"
	"sync"
	"sync/atomic"
	"time"

	"github.com/safekeeper/safekeeper/proto"
)

// Retention: removing WAL nobody can need any more.
//
// WAL below the horizon is removed, by whole segments (storage.RemoveWAL,
// one transaction that also records removed_up_to, so a crash leaves the
// removal done or not done). The horizon is the lowest of:
//
//   - commit_lsn minus Config.WalKeepSize (default 1 GB, as PostgreSQL's
//     wal_keep_size): WAL kept below commit_lsn whatever else says, for
//     readers that come back (uncommitted WAL is never removed);
//   - truncate_lsn from the proposer, the peer horizon: the lowest
//     flush_lsn of all safekeepers, so a lagging peer can still copy what
//     it lacks from us. A peer more than Config.MaxPeerWALKeepSize behind
//     commit_lsn (one that never comes back: the proposer never heard from
//     it, so truncate_lsn stays 0) no longer holds WAL here; it recovers by
//     `safekeeper timeline pull`;
//   - the restart_lsn of every replication slot that has one (persistent or
//     temporary). A slot more than Config.MaxSlotWALKeepSize behind
//     commit_lsn (default: never) is invalidated, as PostgreSQL's
//     max_slot_wal_keep_size does: it no longer reserves WAL, and a reader
//     asking for removed WAL gets 58P01;
//   - the highest remote_consistent_lsn (ps_applylsn) that pageserver-style
//     consumers reported since this server started, once one has: what is
//     durable in the consumer's own storage;
//   - the position of every active reader: never the segment it reads;
//   - with an archive (Config.Backup), backup_lsn: WAL not yet in the
//     archive is never removed. While the store is unreachable the
//     disk limits protect the disk.
//
// The horizon is then rounded down to a segment start. A timeline asks
// the registry's retainer for a pass (never blocking) when its owner
// commits, a consumer reports, a reader leaves or a slot changes; the
// retainer's few workers run the passes of all timelines, each at most
// once per Config.RetentionInterval, off the owner's hot path. TIMELINE_STATUS reports the last
// horizon and what set it.

// retentionInputs is everything the horizon depends on.
type retentionInputs struct {
	SegSize          uint64
	CommitLSN        proto.LSN
	TruncateLSN      proto.LSN
	RemovedUpTo      proto.LSN
	Slots            []slotPos // every slot with a restart_lsn
	ConsumerSeen     bool
	RemoteConsistent proto.LSN
	ReaderPos        []proto.LSN // next LSN of every active reader
	Archiving        bool        // an archive is configured: BackupLSN bounds
	BackupLSN        proto.LSN

	WalKeep, MaxPeerKeep, MaxSlotKeep uint64 // bytes; MaxSlotKeep 0: no limit
}

type slotPos struct {
	Name       string
	RestartLSN proto.LSN
}

// retention is a horizon and why it is there.
type retention struct {
	Horizon proto.LSN // segment boundary below which WAL may go; 0: none
	Reason  string    // what bounds it
	// Invalidate are the slots too far behind (MaxSlotKeep).
	Invalidate []slotPos
}

// below is commit_lsn minus n bytes, 0 if that is below the start.
func below(commit proto.LSN, n uint64) proto.LSN {
	if uint64(commit) <= n {
		return 0
	}
	return commit - proto.LSN(n)
}

// retentionHorizon returns the segment boundary below which WAL may be
// removed (0 when nothing may be) and what bounds it. A horizon at or below
// RemovedUpTo means there is nothing new to remove.
func retentionHorizon(in retentionInputs) retention {
	if in.SegSize == 0 {
		return retention{Reason: "no WAL"}
	}
	r := retention{Horizon: below(in.CommitLSN, in.WalKeep), Reason: "wal_keep_size"}
	lower := func(l proto.LSN, why string) {
		if l < r.Horizon {
			r.Horizon, r.Reason = l, why
		}
	}
	if peerFloor := below(in.CommitLSN, in.MaxPeerKeep); in.TruncateLSN >= peerFloor {
		lower(in.TruncateLSN, "peer safekeepers' flush_lsn (truncate_lsn)")
	} else {
		lower(peerFloor, "max_peer_wal_keep_size (a peer safekeeper is further behind)")
	}
	slotFloor := proto.LSN(0)
	if in.MaxSlotKeep > 0 {
		slotFloor = below(in.CommitLSN, in.MaxSlotKeep)
	}
	for _, s := range in.Slots {
		if s.RestartLSN < slotFloor {
			r.Invalidate = append(r.Invalidate, s)
			continue
		}
		lower(s.RestartLSN, "replication slot \""+s.Name+"\"")
	}
	if in.ConsumerSeen {
		lower(in.RemoteConsistent, "remote_consistent_lsn")
	}
	for _, l := range in.ReaderPos {
		lower(l, "an active reader")
	}
	if in.Archiving {
		lower(in.BackupLSN, "the archive (backup_lsn)")
	}
	r.Horizon = r.Horizon.SegmentStart(in.SegSize)
	return r
}

// retentionWorkers bounds the retention passes that run at once, over all
// timelines: a pass is a read of the timeline's state and, when the
// horizon moved past a segment, one removal transaction (an fsync). Four
// keep one slow removal from holding up the others without taking the
// cores the push streams need.
const retentionWorkers = 4

// retainer runs the retention passes of every timeline of a registry: a
// timeline asks for a pass (kick, never blocking) and gets one as soon as a
// worker is free and Config.RetentionInterval has passed since its last
// one. An idle timeline costs nothing here: no goroutine waits for it.
type retainer struct {
	r    *Registry
	mu   sync.Mutex
	due  retainQueue   // timelines asked for, earliest first
	wake chan struct{} // the dispatcher looks at due again; capacity 1
	// passDone is broadcast when a pass ends (forget waits on it).
	passDone *sync.Cond
	work     chan *Timeline
	stop     chan struct{}
	stopped  bool
	wg       sync.WaitGroup
}

// retainSlot is a timeline's place with the retainer, guarded by its mu.
type retainSlot struct {
	// waiting mirrors asked for kick's fast path, without mu: a pass is
	// asked for and has not started, so it will see what changed before
	// this kick (it reads the timeline's state when it runs).
	waiting atomic.Bool
	asked   bool      // a pass was asked for and has not started
	queued  bool      // it is in due (asked, or a pass that ran asked again)
	running bool      // a worker runs its pass now
	gone    bool      // forgotten: no pass any more
	last    time.Time // when its last pass started
	at      time.Time // when its next pass may start (queued)
	index   int       // in due
}

func newRetainer(r *Registry) *retainer {
	rt := &retainer{r: r, wake: make(chan struct{}, 1), work: make(chan *Timeline), stop: make(chan struct{})}
	rt.passDone = sync.NewCond(&rt.mu)
	rt.wg.Add(1 + retentionWorkers)
	go rt.dispatch()
	for range retentionWorkers {
		go rt.worker()
	}
	return rt
}

// kick asks for a retention pass of t. Every commit of every timeline
// kicks: one already waiting for its pass takes no lock.
func (rt *retainer) kick(t *Timeline) {
	s := &t.retain
	if s.waiting.Load() {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if s.gone || s.asked {
		return
	}
	s.asked = true
	s.waiting.Store(true)
	if s.running {
		return // the worker queues it when the pass ends
	}
	rt.queue(t)
}

// queue puts t, asked for, in due at the earliest time its next pass may
// start. mu held.
func (rt *retainer) queue(t *Timeline) {
	s := &t.retain
	s.at = time.Now()
	if !s.last.IsZero() {
		s.at = later(s.at, s.last.Add(rt.r.cfg.RetentionInterval))
	}
	s.queued = true
	heap.Push(&rt.due, t)
	select {
	case rt.wake <- struct{}{}:
	default:
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// dispatch hands each timeline in due to a free worker once its time has
// come.
func (rt *retainer) dispatch() {
	defer rt.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		rt.mu.Lock()
		var next *Timeline
		var wait time.Duration = -1
		if len(rt.due) > 0 {
			if w := time.Until(rt.due[0].retain.at); w > 0 {
				wait = w
			} else {
				next = heap.Pop(&rt.due).(*Timeline)
				next.retain.queued = false
				next.retain.asked = false
				next.retain.waiting.Store(false)
				next.retain.running = true
				next.retain.last = time.Now()
			}
		}
		rt.mu.Unlock()
		if next != nil {
			select {
			case rt.work <- next:
			case <-rt.stop:
				rt.finish(next)
				return
			}
			continue
		}
		var tick <-chan time.Time
		if wait >= 0 {
			timer.Reset(wait)
			tick = timer.C
		}
		select {
		case <-rt.wake:
		case <-tick:
		case <-rt.stop:
			return
		}
		if tick != nil && !timer.Stop() {
			select { // drained, for the next Reset
			case <-timer.C:
			default:
			}
		}
	}
}

func (rt *retainer) worker() {
	defer rt.wg.Done()
	for {
		select {
		case t := <-rt.work:
			rt.r.retainOnce(t)
			rt.finish(t)
		case <-rt.stop:
			return
		}
	}
}

// finish ends t's pass: asked for again meanwhile, it goes back in due.
func (rt *retainer) finish(t *Timeline) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s := &t.retain
	s.running = false
	if s.asked && !s.gone && !rt.stopped {
		rt.queue(t)
	}
	rt.passDone.Broadcast()
}

// forget ends t's passes: none starts from now on, and forget returns once
// the one running (if any) has ended.
func (rt *retainer) forget(t *Timeline) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s := &t.retain
	s.gone = true
	if s.queued {
		heap.Remove(&rt.due, s.index)
		s.queued = false
	}
	for s.running {
		rt.passDone.Wait()
	}
}

// close stops the dispatcher and the workers once the passes running have
// ended; no pass starts after.
func (rt *retainer) close() {
	rt.mu.Lock()
	if rt.stopped {
		rt.mu.Unlock()
		return
	}
	rt.stopped = true
	rt.mu.Unlock()
	close(rt.stop)
	rt.wg.Wait()
}

// retainQueue is a heap of timelines by the time their next pass may start.
type retainQueue []*Timeline

func (q retainQueue) Len() int           { return len(q) }
func (q retainQueue) Less(i, j int) bool { return q[i].retain.at.Before(q[j].retain.at) }
func (q retainQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].retain.index, q[j].retain.index = i, j
}
func (q *retainQueue) Push(x any) {
	t := x.(*Timeline)
	t.retain.index = len(*q)
	*q = append(*q, t)
}
func (q *retainQueue) Pop() any {
	old := *q
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return t
}

// retainOnce computes the horizon and removes WAL below it.
func (r *Registry) retainOnce(t *Timeline) {
	st := t.State()
	in := retentionInputs{
		SegSize: uint64(st.WalSegSize), CommitLSN: st.CommitLSN, TruncateLSN: st.TruncateLSN,
		RemovedUpTo: max(st.RemovedUpTo, t.store.RemovedUpTo()),
		WalKeep:     uint64(r.cfg.WalKeepSize), MaxPeerKeep: uint64(r.cfg.MaxPeerWALKeepSize),
		Archiving: r.cfg.Backup != nil, BackupLSN: t.BackupLSN(),
	}
	if r.cfg.MaxSlotWALKeepSize > 0 {
		in.MaxSlotKeep = uint64(r.cfg.MaxSlotWALKeepSize)
	}
	t.repl.retentionInputs(&in)
	h := retentionHorizon(in)
	for _, sl := range h.Invalidate {
		if t.repl.invalidateSlot(sl.Name, sl.RestartLSN) {
			t.log.Warn("invalidating replication slot because its restart_lsn exceeds max_slot_wal_keep_size",
				"slot", sl.Name, "restart_lsn", sl.RestartLSN, "commit_lsn", in.CommitLSN, "max_slot_wal_keep_size", in.MaxSlotKeep)
		}
	}
	t.setRetention(h)
	if h.Horizon <= in.RemovedUpTo {
		return
	}
	if err := t.store.RemoveWAL(h.Horizon); err != nil {
		t.log.Warn("WAL removal failed", "up_to", h.Horizon, "err", err)
		return
	}
	if from := max(in.RemovedUpTo, st.TimelineStartLSN).SegmentStart(in.SegSize); h.Horizon > from {
		r.removedSegments.Add(int64(uint64(h.Horizon-from) / in.SegSize))
	}
	t.log.Info("removed WAL", "up_to", h.Horizon, "bounded_by", h.Reason, "commit_lsn", in.CommitLSN, "truncate_lsn", in.TruncateLSN,
		"remote_consistent_lsn", in.RemoteConsistent, "backup_lsn", in.BackupLSN)
}

// Retain runs one retention pass of t now, besides those the retainer
// runs (tests that need every input settled use it).
func (r *Registry) Retain(t *Timeline) { r.retainOnce(t) }
