package proposer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proto"
)

// catchup is a second replication connection to the primary that feeds one
// safekeeper whose start point lies below the in-memory buffer. It has no
// slot of its own and never reports a flush position (so it is never a
// synchronous standby candidate). The owner takes its chunks one at a time
// (pending) and acknowledges each, which paces the stream to the
// safekeeper's pipeline; it is dropped once the safekeeper reaches the
// buffer.
type catchup struct {
	cancel  context.CancelFunc
	id      int
	peer    int // the safekeeper it copies from (a term reader); -1: the primary
	pending *streamChunk
}

// streamChunk is one chunk of a second replication stream (a catch-up
// stream from the primary, or sync's copy from the donor), or the stream's
// failure, for the owner of the safekeeper it feeds.
type streamChunk struct {
	sk, id int // the safekeeper it feeds, and the stream's id
	start  proto.LSN
	wal    []byte
	err    error
	ack    chan struct{} // closed by the owner when it has taken the chunk
}

// piece is the part of c from lsn on, at most max bytes. skipped: c starts
// above lsn (the stream lost WAL). consumed: the piece reaches c's end, so
// the owner acknowledges c once it sent the piece.
func (c *streamChunk) piece(lsn proto.LSN, max int) (d []byte, skipped, consumed bool) {
	if c.start > lsn {
		return nil, true, false
	}
	end := c.start + proto.LSN(len(c.wal))
	if end > lsn {
		d = c.wal[lsn-c.start:]
		d = d[:min(len(d), max)]
	}
	return d, false, lsn+proto.LSN(len(d)) >= end
}

// streamChunks reads a second replication stream of PostgreSQL timeline
// tli from `from` (up to `to`; 0: without end) of the server at connStr —
// as a term reader of term when term > 0 — and posts it chunk by chunk,
// each acknowledged before the next (which paces the stream to its
// safekeeper), and its failure. It reports whether it reached `to`.
func streamChunks(ctx context.Context, peer, connStr, appName string, timeout time.Duration, from, to proto.LSN, tli uint32, term uint64,
	post func(streamChunk) bool) (reached bool) {
	up, err := client.DialReplication(ctx, peer, connStr, appName, timeout)
	if err != nil {
		post(streamChunk{err: err})
		return false
	}
	defer up.Close()
	if err := up.StartReplicationTerm(ctx, "", from, tli, term); err != nil {
		post(streamChunk{err: err})
		return false
	}
	received := from
	err = up.Forward(ctx, from, to, client.HandOff(ctx, func(start proto.LSN, wal []byte, ack chan struct{}) bool {
		if !post(streamChunk{start: start, wal: wal, ack: ack}) {
			return false
		}
		received = start + proto.LSN(len(wal))
		return true
	}))
	if err != nil {
		post(streamChunk{err: err})
		return false
	}
	return to != 0 && received >= to
}

func (s *driver) startCatchup(ctx context.Context, sk *skState) {
	if sk.cu != nil || time.Now().Before(sk.cuRetryAt) {
		return
	}
	from := sk.cuFrom
	peer := -1
	if sk.cuFromPeer {
		if peer = s.catchupPeer(sk.i, from); peer < 0 {
			sk.cuFromPeer = false // no peer has more: the primary again, after the backoff
			sk.cuRetryAt = time.Now().Add(sk.cuBackoff.next())
			s.log.Error("no source holds the WAL a safekeeper needs: the primary removed it and no other safekeeper in this term has WAL past it",
				"safekeeper", s.cfg.Safekeepers[sk.i], "from", from)
			s.findJoinPoint(ctx, sk.i)
			return
		}
	}
	s.catchups++
	cctx, cancel := context.WithCancel(ctx)
	sk.cu = &catchup{cancel: cancel, id: s.catchups, peer: peer}
	if peer >= 0 {
		s.log.Log(ctx, linkLevel(sk.quiet), "safekeeper needs WAL the primary no longer has; catching up from a peer safekeeper (term reader)",
			"safekeeper", s.cfg.Safekeepers[sk.i], "from", from, "peer", s.cfg.Safekeepers[peer], "term", s.sess.Core().Ballot().Term)
	} else {
		s.log.Log(ctx, linkLevel(sk.quiet), "safekeeper behind the buffer; catching up from a second replication stream",
			"safekeeper", s.cfg.Safekeepers[sk.i], "from", from, "buffer_start", s.buf.start)
	}
	go s.runCatchup(cctx, sk.i, sk.cu.id, from, peer)
}

// findJoinPoint asks the other safekeepers (TIMELINE_STATUS) where the
// oldest whole segment they still hold starts, and posts it for safekeeper
// i: if i holds no WAL, it rejoins there (Core.SetJoinPoint) instead of at
// the timeline start, whose WAL neither the primary nor any peer has.
func (s *driver) findJoinPoint(ctx context.Context, i int) {
	if s.joinProbe {
		return
	}
	s.joinProbe = true
	sc := SyncConfig{Safekeepers: s.cfg.Safekeepers, TenantID: s.cfg.TenantID, TimelineID: s.cfg.TimelineID, ConnectTimeout: s.cfg.ConnectTimeout,
		Security: s.cfg.Security}
	seg := uint64(s.ui.SegSize)
	go func() {
		var best proto.LSN
		for j, addr := range s.cfg.Safekeepers {
			if j == i {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			p := probeTimeline(pctx, &sc, addr)
			cancel()
			if !p.Holds || p.TimelineStart == 0 {
				continue
			}
			held := max(p.TimelineStart, p.RemovedTo)
			if off := held.SegmentOffset(seg); off != 0 {
				held += proto.LSN(seg - off) // whole segments only
			}
			if held <= p.Flush && (best == 0 || held < best) {
				best = held
			}
		}
		select {
		case s.joinEvents <- joinEvent{sk: i, at: best}:
		case <-ctx.Done():
		}
	}()
}

// joinEvent is findJoinPoint's answer: where safekeeper sk may rejoin (0:
// no peer holds a whole segment).
type joinEvent struct {
	sk int
	at proto.LSN
}

// onJoinPoint sets safekeeper ev.sk's join point and reconnects it, so its
// next ProposerElected starts there if it still holds no WAL.
func (s *driver) onJoinPoint(ev joinEvent) {
	s.joinProbe = false
	core := s.sess.Core()
	if ev.at == 0 || ev.at > core.CommitLSN() {
		s.log.Error("no peer holds a whole committed segment to join from; the safekeeper needs `safekeeper timeline pull` or a peer that has the WAL",
			"safekeeper", s.cfg.Safekeepers[ev.sk], "oldest_held", ev.at, "commit_lsn", core.CommitLSN())
		return
	}
	s.log.Warn("safekeeper holds no WAL and no source has the timeline's start any more; it joins at the oldest whole segment its peers hold",
		"safekeeper", s.cfg.Safekeepers[ev.sk], "join_at", ev.at, "commit_lsn", core.CommitLSN())
	core.SetJoinPoint(ev.sk, ev.at)
	s.disconnect(s.sks[ev.sk]) // it reconnects, is greeted and elected again
}

// catchupPeer picks the safekeeper to copy WAL from for safekeeper i, which
// needs it from `from` on: the one streaming in this term with the highest
// flush_lsn above from (its term reader serves up to its flush_lsn while
// it votes in our term). -1 if none has WAL past from.
func (s *driver) catchupPeer(i int, from proto.LSN) int {
	best, bestFlush := -1, from
	core := s.sess.Core()
	for j := range s.sks {
		if j == i || !s.sess.Streaming(j) || s.sks[j].cuBad {
			continue
		}
		if f, ok := core.FlushLSN(j); ok && f > bestFlush {
			best, bestFlush = j, f
		}
	}
	if best < 0 {
		for j := range s.sks { // every peer failed once: try them again
			s.sks[j].cuBad = false
		}
	}
	return best
}

func (s *driver) dropCatchup(sk *skState) {
	if sk.cu == nil {
		return
	}
	sk.cu.cancel()
	if sk.cu.pending != nil {
		close(sk.cu.pending.ack)
	}
	sk.cu = nil
}

// runCatchup streams WAL from `from` for safekeeper i: from the primary, or
// (peer ≥ 0) from safekeeper peer as a term reader of our term.
func (s *driver) runCatchup(ctx context.Context, i, id int, from proto.LSN, peer int) {
	post := func(ev streamChunk) bool {
		ev.sk, ev.id = i, id
		select {
		case s.cuEvents <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	if peer < 0 {
		// From the primary, on the PostgreSQL timeline the WAL at `from`
		// belongs to, as a standby asks: a promoted primary has its
		// ancestors' WAL in their timelines' segments, and asked for its own
		// timeline below the switch point it looks in a segment of its
		// timeline that does not exist ("requested WAL segment 00000002...
		// has already been removed" for timeline 1's WAL it holds). An
		// ancestor's stream ends at its switch point; the next timeline's
		// follows from there.
		var ends []proto.PgTimelineEnd
		if s.ui.Timeline > 1 {
			ends, _ = proto.ParsePgHistory(s.ui.Timeline, s.ui.History) // one that does not parse: the primary's own timeline throughout
		}
		for {
			tli, end := proto.PgTimelineAt(ends, s.ui.Timeline, from)
			if !streamChunks(ctx, "primary", s.cfg.Upstream, s.cfg.ApplicationName+"_catchup", s.cfg.ConnectTimeout, from, end, tli, 0, post) {
				return
			}
			from = end
		}
	}
	addr := s.cfg.Safekeepers[peer]
	// addr is host:port: the peer streams in this term.
	connStr, err := client.TimelineConnString(addr, "proposer", s.cfg.Security, s.cfg.TenantID, s.cfg.TimelineID)
	if err != nil {
		post(streamChunk{err: fmt.Errorf("peer safekeeper %s: %w", addr, err)})
		return
	}
	streamChunks(ctx, "peer safekeeper "+addr, connStr, s.cfg.ApplicationName+"_peer_catchup", s.cfg.ConnectTimeout,
		from, 0, s.ui.Timeline, s.sess.Core().Ballot().Term, post)
}

// segmentRemoved reports whether err is a server's "requested WAL segment
// ... has already been removed" (58P01).
func segmentRemoved(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "58P01"
}

func (s *driver) onCatchup(ctx context.Context, ev streamChunk) {
	sk := s.sks[ev.sk]
	if sk.cu == nil || sk.cu.id != ev.id {
		if ev.ack != nil {
			close(ev.ack)
		}
		return
	}
	if ev.err != nil {
		peer := sk.cu.peer
		s.dropCatchup(sk)
		switch {
		case peer < 0 && segmentRemoved(ev.err):
			// The primary no longer has it: copy it from a peer at once.
			s.log.Warn("the primary no longer has the WAL a safekeeper needs; trying a peer safekeeper",
				"safekeeper", s.cfg.Safekeepers[ev.sk], "from", sk.cuFrom, "err", ev.err)
			sk.cuFromPeer = true
			sk.cuWant = true
			return
		case peer >= 0:
			s.sks[peer].cuBad = segmentRemoved(ev.err) // it lacks it: try another peer first
		}
		d := sk.cuBackoff.next()
		s.log.Error("catch-up stream failed", "safekeeper", s.cfg.Safekeepers[ev.sk], "err", ev.err, "retry_in", d)
		sk.cuRetryAt = time.Now().Add(d)
		return
	}
	sk.cu.pending = &ev
	s.act(ctx, s.sess.Pump(ev.sk))
}

// catchupWAL is the WAL the session gets for a safekeeper behind the
// buffer: the next piece of the pending catch-up chunk, nil if there is
// none yet. A chunk wholly handed out is acknowledged to its stream, which
// then reads the next.
func (s *driver) catchupWAL(sk *skState, lsn proto.LSN, max int) []byte {
	p := sk.cu.pending
	if p == nil {
		return nil
	}
	d, skipped, consumed := p.piece(lsn, max)
	if skipped {
		s.log.Error("catch-up stream skipped WAL", "safekeeper", s.cfg.Safekeepers[sk.i], "err", fmt.Sprintf("chunk at %s, safekeeper at %s", p.start, lsn))
		s.dropCatchup(sk)
		sk.cuRetryAt = time.Now().Add(sk.cuBackoff.next())
		return nil
	}
	if consumed {
		sk.cu.pending = nil
		sk.cuBackoff.reset()
		close(p.ack)
	}
	return d
}
