package proposer

import (
	"context"
	"fmt"
	"time"

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
	pending *catchupEvent
}

// catchupEvent is one chunk (or the stream's failure) for the owner.
type catchupEvent struct {
	sk, id int
	start  proto.LSN
	wal    []byte
	err    error
	ack    chan struct{} // closed by the owner when it has taken the chunk
}

func (s *driver) startCatchup(ctx context.Context, sk *skState) {
	if sk.cu != nil || time.Now().Before(sk.cuRetryAt) {
		return
	}
	s.catchups++
	cctx, cancel := context.WithCancel(ctx)
	sk.cu = &catchup{cancel: cancel, id: s.catchups}
	from := sk.cuFrom
	s.log.Info("safekeeper behind the buffer; catching up from a second replication stream",
		"safekeeper", s.cfg.Safekeepers[sk.i], "from", from, "buffer_start", s.buf.start)
	go s.runCatchup(cctx, sk.i, sk.cu.id, from)
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

func (s *driver) runCatchup(ctx context.Context, i, id int, from proto.LSN) {
	post := func(ev catchupEvent) bool {
		ev.sk, ev.id = i, id
		select {
		case s.cuEvents <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	up, err := dialUpstream(ctx, "primary", s.cfg.Upstream, s.cfg.ApplicationName+"_catchup", s.cfg.ConnectTimeout)
	if err != nil {
		post(catchupEvent{err: err})
		return
	}
	defer up.close()
	if err := up.startReplication(ctx, "", from, s.ui.Timeline); err != nil {
		post(catchupEvent{err: err})
		return
	}
	err = up.forward(ctx, from, 0, handOff(ctx, func(start proto.LSN, wal []byte, ack chan struct{}) bool {
		return post(catchupEvent{start: start, wal: wal, ack: ack})
	}))
	if err != nil {
		post(catchupEvent{err: err})
	}
}

func (s *driver) onCatchup(ctx context.Context, ev catchupEvent) {
	sk := s.sks[ev.sk]
	if sk.cu == nil || sk.cu.id != ev.id {
		if ev.ack != nil {
			close(ev.ack)
		}
		return
	}
	if ev.err != nil {
		d := sk.cuBackoff.next()
		s.log.Error("catch-up stream failed", "safekeeper", s.cfg.Safekeepers[ev.sk], "err", ev.err, "retry_in", d)
		s.dropCatchup(sk)
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
	end := p.start + proto.LSN(len(p.wal))
	if p.start > lsn {
		s.log.Error("catch-up stream skipped WAL", "safekeeper", s.cfg.Safekeepers[sk.i], "err", fmt.Sprintf("chunk at %s, safekeeper at %s", p.start, lsn))
		s.dropCatchup(sk)
		sk.cuRetryAt = time.Now().Add(sk.cuBackoff.next())
		return nil
	}
	var d []byte
	if end > lsn {
		d = p.wal[lsn-p.start:]
		d = d[:min(len(d), max)]
	}
	if lsn+proto.LSN(len(d)) >= end {
		sk.cu.pending = nil
		sk.cuBackoff.reset()
		close(p.ack)
	}
	return d
}
