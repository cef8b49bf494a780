package server

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
//   - the restart_lsn of every replication slot that has one (persistent or
//     temporary): what slot users still need;
//   - the highest remote_consistent_lsn (ps_applylsn) that consumers
//     reported since this server started: what is durable in the consumer's
//     own storage. If no consumer reported since start, NOTHING is removed:
//     without a consumer we cannot know that WAL is safe elsewhere, so the
//     default is to keep everything (a restart forgets the reports on
//     purpose, for the same reason);
//   - truncate_lsn from the proposer: WAL below it is on every safekeeper;
//   - commit_lsn: uncommitted WAL is never removed;
//   - the position of every active reader: never the segment it reads.
//
// The horizon is then rounded down to a segment start. Each timeline has one
// retention goroutine, woken (never blocking the waker) when its owner
// commits, a consumer reports, a reader leaves or a slot changes, and
// running at most once per Config.RetentionInterval. It works off the owner's
// hot path: the owner only signals it.

// retentionInputs is everything the horizon depends on.
type retentionInputs struct {
	SegSize          uint64
	CommitLSN        proto.LSN
	TruncateLSN      proto.LSN
	RemovedUpTo      proto.LSN
	SlotRestart      []proto.LSN // valid restart_lsn of every slot
	ConsumerSeen     bool
	RemoteConsistent proto.LSN
	ReaderPos        []proto.LSN // next LSN of every active reader
}

// retentionHorizon returns the segment boundary below which WAL may be
// removed, or 0 when nothing may be removed. A result at or below
// RemovedUpTo means there is nothing new to remove.
func retentionHorizon(in retentionInputs) proto.LSN {
	if !in.ConsumerSeen || in.SegSize == 0 {
		return 0
	}
	h := min(in.RemoteConsistent, in.TruncateLSN, in.CommitLSN)
	for _, l := range in.SlotRestart {
		h = min(h, l)
	}
	for _, l := range in.ReaderPos {
		h = min(h, l)
	}
	return h.SegmentStart(in.SegSize)
}

// runRetention is a timeline's retention goroutine; it returns when ctx is
// done.
func (s *Server) runRetention(ctx context.Context, t *timeline) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.repl.kick:
		}
		s.retainOnce(t)
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.cfg.RetentionInterval):
		}
	}
}

// retainOnce computes the horizon and removes WAL below it.
func (s *Server) retainOnce(t *timeline) {
	st, _ := t.Status()
	in := retentionInputs{
		SegSize: uint64(st.WalSegSize), CommitLSN: st.CommitLSN, TruncateLSN: st.TruncateLSN,
		RemovedUpTo: max(st.RemovedUpTo, t.store.RemovedUpTo()),
	}
	t.repl.retentionInputs(&in)
	h := retentionHorizon(in)
	if h <= in.RemovedUpTo {
		return
	}
	if err := t.store.RemoveWAL(h); err != nil {
		t.log.Warn("WAL removal failed", "up_to", h, "err", err)
		return
	}
	t.log.Info("removed WAL", "up_to", h, "commit_lsn", in.CommitLSN, "truncate_lsn", in.TruncateLSN,
		"remote_consistent_lsn", in.RemoteConsistent)
}
