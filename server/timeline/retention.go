package timeline

import (
	"context"
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
//   - the position of every active reader: never the segment it reads.
//
// The horizon is then rounded down to a segment start. Each timeline has one
// retention goroutine, woken (never blocking the waker) when its owner
// commits, a consumer reports, a reader leaves or a slot changes, and
// running at most once per Config.RetentionInterval. It works off the owner's
// hot path: the owner only signals it. TIMELINE_STATUS reports the last
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
	r.Horizon = r.Horizon.SegmentStart(in.SegSize)
	return r
}

// runRetention is a timeline's retention goroutine; it returns when ctx is
// done.
func (r *Registry) runRetention(ctx context.Context, t *Timeline) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.repl.kick:
		}
		r.retainOnce(t)
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.RetentionInterval):
		}
	}
}

// retainOnce computes the horizon and removes WAL below it.
func (r *Registry) retainOnce(t *Timeline) {
	st, _ := t.Status()
	in := retentionInputs{
		SegSize: uint64(st.WalSegSize), CommitLSN: st.CommitLSN, TruncateLSN: st.TruncateLSN,
		RemovedUpTo: max(st.RemovedUpTo, t.store.RemovedUpTo()),
		WalKeep:     uint64(r.cfg.WalKeepSize), MaxPeerKeep: uint64(r.cfg.MaxPeerWALKeepSize),
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
		"remote_consistent_lsn", in.RemoteConsistent)
}

// Retain runs one retention pass of t now, besides those its retention
// goroutine runs (tests that need every input settled use it).
func (r *Registry) Retain(t *Timeline) { r.retainOnce(t) }
