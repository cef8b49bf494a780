package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

// maxBatch bounds how many queued events one group commit takes, so that a
// steady stream still gets a SafeKeeperResponse well within 100 ms.
const maxBatch = 64

// eventQueue is the capacity of a timeline's inbound queue: at most this many
// requests (≤ 128 KiB of WAL each) wait in memory for the owner.
const eventQueue = 64

// event is one thing for the timeline owner to do: a message, or the end of
// a connection's stream (end is then its final item: the end after CopyDone,
// or the error that ended it). Either way the owner first makes durable and
// answers everything staged (rule 7: a dropped connection flushes too).
type event struct {
	conn *pushConn
	msg  proto.Message // decoded from a private copy of the payload
	end  *outItem
}

// timeline is one timeline's owner: a goroutine that alone drives the
// acceptor, fed by the connections' reader goroutines through a bounded
// queue. Readers of state use the snapshot.
type timeline struct {
	key proto.TimelineKey
	log *slog.Logger
	in  chan event

	mu      sync.Mutex
	state   acceptor.State // durable state after the owner's last step
	changed chan struct{}  // closed and replaced whenever state changes
	store   *storage.Timeline

	// repl holds the timeline's readers, slots and their feedback.
	repl *replState

	stopped chan struct{}
}

// Status returns the durable state and a channel closed at its next change.
func (t *timeline) Status() (acceptor.State, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state.Clone(), t.changed
}

func (t *timeline) publish(st acceptor.State) {
	t.mu.Lock()
	t.state = st
	close(t.changed)
	t.changed = make(chan struct{})
	t.mu.Unlock()
}

// run is the owner loop. It returns when ctx is done and every connection
// has left (the server closes them first).
//
// broken, when not nil, is the storage failure that kept acc from being
// built (acc is then nil): the timeline starts read-only, as after a storage
// failure, and the next greeting tries again.
func (t *timeline) run(ctx context.Context, acc *acceptor.Acceptor, broken error, rebuild func() (*acceptor.Acceptor, error)) {
	defer close(t.stopped)
	o := owner{t: t, acc: acc, broken: broken, rebuild: rebuild}
	for {
		select {
		case <-ctx.Done():
			o.flush()
			return
		case ev := <-t.in:
			o.handle(ev)
		drain:
			for i := 1; i < maxBatch; i++ {
				select {
				case ev := <-t.in:
					o.handle(ev)
				default:
					break drain
				}
			}
			o.flush()
		}
	}
}

// owner is the state of the owner goroutine.
type owner struct {
	t   *timeline
	acc *acceptor.Acceptor
	// broken is the storage failure that stopped acc (nil while healthy).
	// The next greeting rebuilds the acceptor from what is durable, so a
	// safekeeper recovers by itself once the disk works again.
	broken  error
	rebuild func() (*acceptor.Acceptor, error)
	// waiting lists, in order, the connection of every staged request.
	waiting []*pushConn
}

// flush commits staged WAL and sends every waiting SafeKeeperResponse.
// refuse ends c's stream with err; a storage failure also stops the
// acceptor until it is rebuilt.
func (o *owner) refuse(c *pushConn, err error) {
	if errors.Is(err, acceptor.ErrStorage) {
		o.storageFailed(err)
	}
	c.fail(err)
}

// tryRebuild replaces a failed acceptor with one rebuilt from the durable
// state (acceptor.New discards whatever was staged and not committed).
func (o *owner) tryRebuild() {
	acc, err := o.rebuild()
	if err != nil {
		o.t.log.Warn("timeline still cannot write", "err", err)
		if !errors.Is(err, acceptor.ErrStorage) {
			err = fmt.Errorf("%w: %w", acceptor.ErrStorage, err)
		}
		o.broken = err
		return
	}
	o.acc, o.broken = acc, nil
	o.t.log.Info("timeline recovered from storage failure", "flush_lsn", acc.State().FlushLSN)
	o.t.publish(acc.State())
}

func (o *owner) flush() {
	if o.broken != nil {
		return // waiting connections were failed with it
	}
	resp, n, err := o.acc.Flush()
	if err != nil {
		o.storageFailed(err)
		return
	}
	if n != len(o.waiting) {
		panic("server: acceptor staged count differs from waiting connections")
	}
	// Publish before answering: once a proposer holds a response, readers
	// (START_REPLICATION, IDENTIFY_SYSTEM, TIMELINE_STATUS) see at least
	// the flush_lsn and commit_lsn it reports.
	o.t.publish(o.acc.State())
	// Relay the readers' feedback to the proposer.
	resp.HotStandby, resp.Consumer = o.t.repl.feedback()
	for _, c := range o.waiting {
		c.send(resp)
	}
	o.waiting = o.waiting[:0]
	o.t.repl.kickRetention()
}

// storageFailed ends every waiting connection: nothing they sent since the
// last commit is acknowledged.
func (o *owner) storageFailed(err error) {
	if o.broken == nil {
		o.t.log.Error("storage failed; timeline refuses WAL until a proposer reconnects and the disk works", "err", err)
	}
	o.broken = err
	for _, c := range o.waiting {
		c.fail(err)
	}
	o.waiting = o.waiting[:0]
}

func (o *owner) handle(ev event) {
	c := ev.conn
	if c.dead() && ev.end == nil {
		return // after an error nothing more from this connection is processed
	}
	if _, isAppend := ev.msg.(*proto.SafeKeeperRequest); !isAppend {
		// Any other step replies at once: everything staged before it is
		// made durable and answered first, so replies stay in order.
		o.flush()
	}
	if ev.end != nil {
		c.enqueue(*ev.end)
		return
	}
	if o.broken != nil {
		if _, greeting := ev.msg.(*proto.ServerInfo); greeting {
			o.tryRebuild()
		}
		if o.broken != nil {
			c.fail(o.broken)
			return
		}
	}
	// Replies go out after the new state is published (see flush).
	var replies []proto.Message
	switch m := ev.msg.(type) {
	case *proto.ServerInfo:
		info, err := o.acc.ServerInfo(m)
		if err != nil {
			o.refuse(c, err)
			return
		}
		replies = append(replies, info)
	case *proto.RequestVote:
		verdict, info, err := o.acc.RequestVote(m)
		if verdict != nil {
			replies = append(replies, verdict)
		}
		if err != nil {
			o.t.publish(o.acc.State())
			for _, r := range replies {
				c.send(r)
			}
			o.refuse(c, err)
			return
		}
		c.ballot = m.Candidate
		replies = append(replies, info)
	case *proto.ProposerElected:
		if err := o.acc.ProposerElected(c.ballot, m); err != nil {
			o.refuse(c, err)
			return
		}
		o.t.log.Info("proposer elected", "term", m.Term, "start_streaming_at", m.StartStreamingAt,
			"conn", c.remote)
	case *proto.SafeKeeperRequest:
		if err := o.acc.Append(m); err != nil {
			o.refuse(c, err)
			return
		}
		o.waiting = append(o.waiting, c)
	}
	o.t.publish(o.acc.State())
	for _, r := range replies {
		c.send(r)
	}
}
