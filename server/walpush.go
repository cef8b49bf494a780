package server

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/netq"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/proto/replcmd"
	"github.com/safekeeper/safekeeper/server/auth"
	"github.com/safekeeper/safekeeper/server/timeline"
)

// maxOutQueue bounds the replies waiting for one proposer connection's
// writer. A proposer that stops reading while it keeps sending overflows it
// and is disconnected rather than stalling its timeline's owner.
const maxOutQueue = 4096

// pushConn is one START_WAL_PUSH stream. Its reader goroutine (the
// connection's own) decodes each CopyData and runs the timeline's owner on
// it (timeline.Handle: step, group commit, replies queued), then writes the
// replies queued meanwhile itself when the socket takes them at once
// (writeOwn); its writer goroutine sends the rest — replies queued from
// other goroutines, and whatever would block — in order.
type pushConn struct {
	srv    *Server
	pc     *pgwire.Conn
	remote string
	log    *slog.Logger
	opts   startupIDs   // tenant/timeline named in the startup options, if any
	claims *auth.Claims // the token's, when auth is on
	// create: the greeting may create the timeline (START_WAL_PUSH's
	// allow_timeline_creation, true when the option is absent).
	create bool
	// syncSlots: the stream carries slot tables (START_WAL_PUSH's
	// sync_replication_slots; server/timeline's slotsync.go).
	syncSlots bool

	id    acceptor.ConnID    // the connection's name in its timeline's session
	since time.Time          // when the stream started
	tl    *timeline.Timeline // set once ServerInfo named the timeline
	tc    *timeline.Conn     // the connection as tl's owner knows it, with tl
	// final is the stream's last item, set by the reader before it hands
	// the end to the owner, which queues it (End) after answering the rest.
	final outItem

	// wmu is held while queued items are taken and written, by the writer
	// or by the reader (writeOwn), so that they go out in queue order.
	wmu      sync.Mutex
	ownSpare []outItem // writeOwn's batch slice (reader only)
	ownEnc   []byte    // writeOwn's encoding buffer (reader only)

	mu     sync.Mutex
	queue  []outItem     // queued for the writer; grows only as far as it is used
	closed bool          // nothing more will be queued
	isDead bool          // nothing more is accepted (the final item is queued, or the queue overflowed)
	wake   chan struct{} // capacity 1: something was queued, or closed set
	// own: the reader is in Handle and writes or hands on what is queued
	// when it returns (writeOwn), so enqueue need not wake the writer.
	own bool

	finished chan struct{} // closed by the writer when the stream has ended
	endedOK  bool          // set by the writer before finished: ended by CopyDone
}

type outItem struct {
	msg  proto.Message
	err  error // send an ErrorResponse, then close the connection
	done bool  // send CopyDone, CommandComplete, ReadyForQuery
}

// enqueue hands an item to the writer without blocking the owner. It
// returns false when the connection takes nothing more.
func (c *pushConn) enqueue(it outItem) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isDead {
		return false
	}
	if len(c.queue) >= maxOutQueue {
		c.isDead, c.closed = true, true
		c.log.Warn("proposer does not read its responses; disconnecting", "queued", len(c.queue))
		// The writer may be blocked on the full socket for good: closing
		// it ends the writer and the reader now.
		c.pc.Close()
	} else {
		c.queue = append(c.queue, it)
		if it.err != nil || it.done {
			c.isDead, c.closed = true, true // nothing after an error or the end
		}
	}
	if !c.own || c.closed {
		c.signal()
	}
	return !c.isDead
}

// signal wakes the writer.
func (c *pushConn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// handle runs the timeline's owner on ev (timeline.Handle), then sends
// the replies queued meanwhile (writeOwn).
func (c *pushConn) handle(ev timeline.Event, more bool) {
	c.mu.Lock()
	c.own = true
	c.mu.Unlock()
	c.tl.Handle(ev, more)
	c.writeOwn()
}

// ownBacklog bounds the bytes the proposer may leave unacknowledged on the
// socket for the reader to write its replies itself: below it a write of
// a few responses cannot block. Past it (a proposer slow to read) the
// writer goroutine takes over and the reader goes on reading.
const ownBacklog = netq.SmallBacklog

// writeOwn ends the reader's Handle: what was queued meanwhile is written
// now, by the reader, when that cannot block it (no error or end queued,
// the writer is not writing, the socket's backlog is small); otherwise the
// writer is woken to write it. This saves the hand-off to the writer on
// every commit of the common case, one proposer streaming.
func (c *pushConn) writeOwn() {
	c.mu.Lock()
	c.own = false
	n, closed := len(c.queue), c.closed
	c.mu.Unlock()
	if n == 0 && !closed {
		return
	}
	if closed || !c.wmu.TryLock() {
		c.signal()
		return
	}
	defer c.wmu.Unlock()
	if backlog, ok := c.pc.SendBacklog(); !ok || backlog > ownBacklog {
		c.signal()
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.signal()
		return
	}
	items := c.queue
	c.queue = c.ownSpare[:0]
	c.mu.Unlock()
	for i, it := range items {
		if err := c.write(it, &c.ownEnc); err != nil {
			break // sticky: the writer's next write ends the stream
		}
		items[i] = outItem{}
	}
	if err := c.pc.Flush(); err != nil {
		c.signal() // the writer finds the error and ends the stream
	}
	if cap(items) > keptOutItems {
		items = nil
	}
	if cap(c.ownEnc) > 64<<10 {
		c.ownEnc = nil
	}
	c.ownSpare = items
}

// Reply, Fail and End are the owner's (timeline.Replies).
func (c *pushConn) Reply(m proto.Message) bool { return c.enqueue(outItem{msg: m}) }

func (c *pushConn) Fail(err error) { c.enqueue(outItem{err: err}) }

func (c *pushConn) End() { c.enqueue(c.final) }

// take waits until something is queued or the queue is closed, takes wmu,
// and returns every queued item, giving the queue spare (emptied) to fill
// next. The caller writes them and unlocks wmu. Items the reader wrote
// itself meanwhile (writeOwn) are not waited for again.
func (c *pushConn) take(spare []outItem) (items []outItem, closed bool) {
	for {
		c.mu.Lock()
		if len(c.queue) > 0 || c.closed {
			c.mu.Unlock()
			c.wmu.Lock()
			c.mu.Lock()
			if len(c.queue) > 0 || c.closed {
				items, closed = c.queue, c.closed
				c.queue = spare[:0]
				c.mu.Unlock()
				return items, closed
			}
			c.mu.Unlock()
			c.wmu.Unlock()
			continue
		}
		c.mu.Unlock()
		<-c.wake
	}
}

// keptOutItems: a batch slice longer than this (a burst) is not kept for
// reuse, so an idle connection holds little memory.
const keptOutItems = 64

// writer sends queued replies, every reply queued so far in one socket
// write. It closes finished when the stream is over, and then keeps wmu:
// nothing more is written.
func (c *pushConn) writer() {
	defer close(c.finished)
	var spare []outItem
	var enc []byte
	for {
		items, closed := c.take(spare)
		for i, it := range items {
			if err := c.write(it, &enc); err != nil {
				c.writeFailed(err)
				return
			}
			if it.err != nil {
				// The ErrorResponse must reach a proposer that is still
				// sending and behind in reading: no reset.
				c.pc.CloseLingering(drainGrace)
				c.drain()
				return
			}
			if it.done {
				c.endedOK = true
				return
			}
			items[i] = outItem{} // let the message go
		}
		if len(items) > 0 {
			if err := c.pc.Flush(); err != nil {
				c.writeFailed(err)
				return
			}
		}
		if closed {
			c.pc.Close() // the queue overflowed
			return
		}
		c.wmu.Unlock()
		if cap(items) > keptOutItems {
			items = nil
		}
		if cap(enc) > 64<<10 {
			enc = nil
		}
		spare = items // the queue now fills the previous spare
	}
}

// drainGrace bounds how long the reader may go on after the response path
// broke: long enough to read what the kernel already holds.
const drainGrace = time.Second

// writeFailed ends the stream after a failed socket write, which means the
// proposer is gone (typically it closed with our responses unread, so its
// kernel reset the connection). WAL it sent before that may still sit in our
// receive buffer; Linux delivers it before reporting the reset. The reader
// goes on until it has read all of it (then EOF or the reset) or drainGrace
// passes, so everything that reached this machine is made durable and every
// report (TIMELINE_STATUS, IDENTIFY_SYSTEM, the next vote) agrees on one
// flush_lsn. Nothing is acknowledged any more: replies are discarded.
func (c *pushConn) writeFailed(err error) {
	c.log.Debug("write to proposer failed; reading what it already sent", "err", err)
	if c.pc.SetReadDeadline(time.Now().Add(drainGrace)) != nil {
		c.pc.Close()
	}
	c.drain()
	c.pc.Close()
}

// drain discards queued items until the queue is closed (it always is once
// the stream's final item, an error or the end, is queued). The writer
// holds wmu meanwhile, so the reader writes nothing itself either.
func (c *pushConn) drain() {
	for {
		c.mu.Lock()
		clear(c.queue)
		c.queue = c.queue[:0]
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return
		}
		<-c.wake
	}
}

func (c *pushConn) write(it outItem, buf *[]byte) error {
	switch {
	case it.err != nil:
		c.log.Info("ending WAL push stream", "err", it.err)
		c.pc.SendError(fatalError(it.err)) // the connection closes
		return c.pc.Flush()
	case it.done:
		c.log.Info("ending WAL push stream: the proposer sent CopyDone")
		c.pc.SendCopyDone()
		c.pc.SendCommandComplete("START_WAL_PUSH")
		c.pc.SendReadyForQuery()
		return c.pc.Flush()
	}
	*buf = it.msg.Encode((*buf)[:0])
	return c.pc.SendCopyData(*buf)
}

// runPush runs a START_WAL_PUSH stream until the proposer ends it (CopyDone:
// the connection returns to query mode and ok is true), an error ends it, or
// the connection drops.
func (s *Server) runPush(pc *pgwire.Conn, cmd replcmd.StartWALPush, ids startupIDs, claims *auth.Claims, log *slog.Logger) (ok bool) {
	id := acceptor.ConnID(s.connSeq.Add(1))
	c := &pushConn{
		srv: s, pc: pc, remote: pc.RemoteAddr().String(), log: log.With("conn", uint64(id)), opts: ids, claims: claims,
		create: cmd.AllowTimelineCreation, syncSlots: cmd.SyncReplicationSlots,
		id: id, wake: make(chan struct{}, 1), finished: make(chan struct{}), since: time.Now(),
	}
	if err := pc.StartCopyBoth(); err != nil {
		return false
	}
	if err := pc.Flush(); err != nil {
		return false
	}
	go c.writer()
	c.final = c.readLoop()
	if c.tl != nil {
		// The owner makes durable and answers what this connection sent,
		// then queues the final item (End), so nothing is cut off.
		c.handle(timeline.Event{Conn: c.tc, End: true}, false)
	} else {
		c.enqueue(c.final)
	}
	<-c.finished
	if c.tl != nil {
		c.tl.Unbind(pc)
	}
	return c.endedOK
}

// readLoop reads the proposer's messages until CopyDone, a read error or an
// undecodable message, and returns the stream's final item: the end, or
// the error to answer with. The first message must be the ServerInfo that
// names the timeline (and agrees with the startup options); every later one
// goes to that timeline's owner, whose session checks the order.
func (c *pushConn) readLoop() outItem {
	for {
		// The WAL budget is taken before the body is read, so that bodies
		// waiting for it (one per connection) are not in memory meanwhile.
		// Only after the greeting, which names (and, with auth, is allowed
		// on) the timeline: the greeting itself is small and takes none.
		// Once the budget is taken the body must arrive within bodyTimeout:
		// a connection that announces a body and stalls must not hold the
		// budget for long (timeline.Budget).
		var cost int64
		if typ, n, err := c.pc.PeekMessage(); err == nil && typ == 'd' && n > 0 {
			switch {
			case c.tl == nil && n > maxGreeting:
				return outItem{err: pgwire.Errorf(pgwire.ProtocolViolation,
					"the first message of a WAL push is %d bytes; a greeting (ServerInfo) is at most %d", n, maxGreeting)}
			case c.tl != nil:
				budget := c.srv.reg.Budget()
				cost = budget.Cost(n)
				if !budget.TryAcquire(c.tl.Key().TenantID, cost) {
					// What this connection staged or queued holds budget
					// until it is committed: commit it before waiting for
					// more.
					c.tl.Commit()
					if err := budget.Acquire(c.srv.stopCtx, c.tl.Key().TenantID, cost); err != nil {
						return outItem{err: errShutdown}
					}
				}
				c.setReadDeadline(time.Now().Add(bodyTimeout))
			}
		}
		item, m, payload := c.readOne()
		if cost > 0 {
			c.setReadDeadline(time.Time{})
		}
		if m == nil {
			if cost > 0 {
				c.srv.reg.Budget().Release(c.tl.Key().TenantID, cost)
			}
			return item
		}
		if r, ok := m.(*proto.SafeKeeperRequest); ok && len(r.WAL) > 0 {
			if err := c.srv.walRefused(c.tl); err != nil {
				if cost > 0 {
					c.srv.reg.Budget().Release(c.tl.Key().TenantID, cost)
				}
				pgwire.Recycle(payload)
				if c.tl.RefusalWarningDue() {
					c.log.Warn("refusing WAL: disk limit", "err", err)
				} else {
					c.log.Debug("refusing WAL: disk limit", "err", err)
				}
				return outItem{err: err}
			}
			c.srv.mem.walIn.Add(int64(len(r.WAL)))
		}
		// Run to completion: this goroutine steps the message and, unless
		// the next one is already here for the same group commit, commits
		// and answers before it reads again.
		c.handle(timeline.Event{Conn: c.tc, Msg: m, Payload: payload, Cost: cost}, c.pc.Pending())
	}
}

// setReadDeadline sets the connection's read deadline to t, unless a
// shutdown or the timeline's delete has cut its reads: then the cut stays.
// Both mark themselves (stopping, deleted) before they cut (a deadline in
// the past), so either the check after the set sees the mark and cuts
// again, or their cut comes after the set and overrides it. Without this
// a cut that landed while the reader was not blocked on the socket (a
// proposer streaming without pause) was undone by the next message's
// deadline, and the connection went on until its socket was closed.
func (c *pushConn) setReadDeadline(t time.Time) {
	c.pc.SetReadDeadline(t)
	if c.srv.isStopping() || (c.tl != nil && c.tl.Deleted()) {
		c.pc.SetReadDeadline(time.Now())
	}
}

// maxGreeting bounds the first message of a push stream, read before the
// stream has a timeline (and so a budget to take from).
const maxGreeting = 64 << 10

// bodyTimeout is how long a push message's body may take to arrive once
// its header is in and its budget taken.
const bodyTimeout = 30 * time.Second

// readOne reads and decodes the next message; the first must be the
// ServerInfo that names the timeline. It returns the message and its
// payload, or (m nil) the stream's final item.
func (c *pushConn) readOne() (outItem, proto.Message, []byte) {
	payload, err := c.pc.ReadCopy()
	if errors.Is(err, pgwire.ErrCopyDone) {
		return outItem{done: true}, nil, nil
	}
	if err != nil {
		if c.srv.isStopping() {
			return outItem{err: errShutdown}, nil, nil
		}
		if c.tl != nil && c.tl.Deleted() {
			return outItem{err: errTimelineDeleted}, nil, nil
		}
		if !errors.Is(err, io.EOF) {
			c.log.Debug("proposer connection read failed", "err", err)
		}
		return outItem{err: err}, nil, nil
	}
	m, err := proto.DecodeProposerMessage(payload)
	if err != nil {
		return outItem{err: fmt.Errorf("%w: %w", acceptor.ErrProtocol, err)}, nil, nil
	}
	if c.tl == nil {
		si, err := acceptor.Greeting(m)
		if err == nil {
			err = c.opts.check(si)
		}
		var tl *timeline.Timeline
		if err == nil {
			// Checked before the greeting may create the timeline.
			if err = allows(c.claims, c.srv.auth != nil, proto.TimelineKey{TenantID: si.TenantID, TimelineID: si.TimelineID}); err != nil {
				c.log.Info("refused WAL push: the token does not cover the timeline", "tenant_id", si.TenantID.String(), "timeline_id", si.TimelineID.String())
			}
		}
		if err == nil {
			tl, err = c.srv.timelineFor(si, c.create)
		}
		if err == nil {
			if err = fromTimeline(tl.Bind(c.pc)); err == nil {
				c.tl = tl
				c.tc = &timeline.Conn{ID: c.id, Remote: c.remote, Since: c.since, SyncSlots: c.syncSlots, Out: c}
				// From here the stream's lines name the timeline. (The
				// writer reads c.log only for items queued after this.)
				c.log = tl.Log().With("peer", c.remote, "conn", uint64(c.id))
				c.log.Info("proposer connected", "wal_end", si.WalEnd, "pg_timeline", si.PgTimeline, "proposer_uuid", si.ProposerUUID.String())
			}
		}
		if err != nil {
			return outItem{err: err}, nil, nil
		}
	}
	return outItem{}, m, payload
}

// check reports whether a greeting agrees with the startup options.
func (ids startupIDs) check(m *proto.ServerInfo) error {
	if ids.hasTenant && ids.tenant != m.TenantID {
		return fmt.Errorf("%w: ServerInfo tenant_id %s differs from startup option tenant_id %s", acceptor.ErrProtocol, m.TenantID, ids.tenant)
	}
	if ids.hasTimeline && ids.timeline != m.TimelineID {
		return fmt.Errorf("%w: ServerInfo timeline_id %s differs from startup option timeline_id %s", acceptor.ErrProtocol, m.TimelineID, ids.timeline)
	}
	return nil
}

// recycle gives the bodies of the messages a group commit took back to
// pgwire (timeline.Config.Recycle).
func recycle(bufs [][]byte) {
	for _, b := range bufs {
		pgwire.Recycle(b)
	}
}
