package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
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
	msg  proto.Message // decoded from payload (a SafeKeeperRequest's WAL is a slice of it)
	// payload is the CopyData msg came in; the owner recycles it after the
	// group commit that takes msg (storage may keep a request's WAL, a slice
	// of it, until then).
	payload []byte
	end     *outItem
	// cost is the WAL bytes the reader took from Server.walBudget for msg;
	// the owner gives them back after the group commit that takes msg.
	cost int64
}

// timeline is one running timeline: its owner goroutine (run), which alone
// drives the timeline's acceptor.Session, fed by the push connections'
// reader goroutines through a bounded queue; the durable state the owner
// last published, for readers; and the replication side (readers, slots).
type timeline struct {
	key proto.TimelineKey
	log *slog.Logger
	in  chan event

	mu      sync.Mutex
	state   acceptor.State // the session's InMem state after the owner's last step
	changed chan struct{}  // closed and replaced whenever state changes
	store   *storage.Timeline

	// repl holds the timeline's readers, slots and their feedback.
	repl *replState

	// refusalWarned is when WAL for it was last refused with a warning
	// (unix nanoseconds): the refusals of a proposer that retries every
	// second are warned about once a minute (refusalWarning).
	refusalWarned atomic.Int64

	stopped chan struct{} // closed when the owner returned
	retired chan struct{} // closed when the retention goroutine returned
	// cancel stops the owner and retention goroutines (a delete).
	cancel context.CancelFunc

	// usersMu guards users, deleted and usersGone (delete.go).
	usersMu   sync.Mutex
	users     map[*pgwire.Conn]int // bound connections
	deleted   bool
	usersGone chan struct{} // closed when the last user of a deleted timeline unbinds

	// onPublish is a test hook (hooks.onPublish), nil in production.
	onPublish func()
	// persistEvery is persistInterval (tests may change it).
	persistEvery time.Duration
	// walBudget is the server's (Server.walBudget).
	walBudget *budget
	// metrics is the server's (nil in tests that build a timeline alone).
	metrics *serverMetrics

	// pushMu guards push and retained.
	pushMu   sync.Mutex
	push     pushInfo
	retained retention // the last horizon retention computed
}

func (t *timeline) setRetention(r retention) {
	t.pushMu.Lock()
	t.retained = retention{Horizon: r.Horizon, Reason: r.Reason}
	t.pushMu.Unlock()
}

func (t *timeline) retention() retention {
	t.pushMu.Lock()
	defer t.pushMu.Unlock()
	return t.retained
}

// pushInfo is the proposer that last streamed to the timeline (sent a
// SafeKeeperRequest, WAL or heartbeat, that the session did not refuse), as
// TIMELINE_STATUS reports it: sync and wal fetch ask it whether a proposer
// is live before they act on their own.
type pushInfo struct {
	conn      acceptor.ConnID
	addr      string
	term      uint64
	at        time.Time // zero: none since the server started
	connected bool      // conn is still open
	since     time.Time // the connection's start
	end       proto.LSN // EndLSN of its last request
	commit    proto.LSN // CommitLSN of its last request
}

// pushStatus returns the proposer that last streamed to the timeline.
func (t *timeline) pushStatus() pushInfo {
	t.pushMu.Lock()
	defer t.pushMu.Unlock()
	return t.push
}

// Status returns the state readers are served from (durable, but for a
// commit_lsn and truncate_lsn that may be ahead of the disk by at most
// persistInterval: WAL below that commit_lsn is durable here and committed
// on a quorum) and a channel closed at its next change.
func (t *timeline) Status() (acceptor.State, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state.Clone(), t.changed
}

// startLSN is the timeline's timeline_start_lsn (0 before the first
// election).
func (t *timeline) startLSN() proto.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state.TimelineStartLSN
}

func (t *timeline) publish(st acceptor.State) {
	if st.PgTimeline != t.state.PgTimeline && t.repl != nil {
		t.repl.setTLI(st.PgTimeline) // a PostgreSQL timeline switch: slots restart on the new one
	}
	t.mu.Lock()
	t.state = st
	close(t.changed)
	t.changed = make(chan struct{})
	t.mu.Unlock()
	if t.onPublish != nil {
		t.onPublish()
	}
}

// persistInterval bounds how long a commit_lsn or truncate_lsn that came
// without WAL stays in memory only (acceptor.Session.Unpersisted): the owner
// persists it this long after it arrived, unless a WAL commit, a vote or an
// election stored it first. Most such updates ride along with the next WAL
// commit and cost no fsync of their own.
const persistInterval = 100 * time.Millisecond

// run is the owner loop: it hands every queued event to the session, then
// commits the batch (Flush), and acts on each Ready as it says: publish the
// new state, then send the replies. A commit_lsn held in memory only is
// persisted within persistInterval and at the end. It returns when ctx is
// done and every connection has left (the server closes them first).
func (t *timeline) run(ctx context.Context, sess *acceptor.Session) {
	defer close(t.stopped)
	o := owner{t: t, sess: sess, conns: map[acceptor.ConnID]*pushConn{}}
	timer := time.NewTimer(t.persistEvery)
	timer.Stop()
	defer timer.Stop()
	var persist <-chan time.Time // the timer's channel while it is armed
	var slotChange <-chan struct{}
	var slotTick <-chan time.Time
	defer func() {
		if o.slotTimer != nil {
			o.slotTimer.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			o.act(sess.Persist())
			o.release()
			return
		case <-persist:
			persist = nil
			o.act(sess.Persist())
		case <-slotChange:
		case <-slotTick:
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
			r := sess.Flush()
			o.act(r)
			o.release() // the batch is committed (or failed): its WAL left memory
		}
		if persist == nil && sess.Unpersisted() {
			timer.Reset(t.persistEvery)
			persist = timer.C
		}
		slotChange, slotTick = o.slotWait()
	}
}

// owner is the state of the owner goroutine.
type owner struct {
	t     *timeline
	sess  *acceptor.Session
	conns map[acceptor.ConnID]*pushConn // connections the session knows
	// cost is the walBudget bytes of the events handled since the last
	// release, and payloads their messages' buffers.
	cost     int64
	payloads [][]byte

	// slotConns are the connections that sync slots (slotsync.go), with
	// the slot table generation each was sent last; slotNext is when the
	// next report may go, slotTimer waits for it.
	slotConns map[acceptor.ConnID]*pushConn
	slotSent  map[acceptor.ConnID]uint64
	slotNext  time.Time
	slotTimer *time.Timer
}

// slotWait reports slot tables to the connections that sync slots and did
// not get the current one, at most every slotReportInterval, and returns
// what the owner waits on next: the next change of the table, or the time
// the next report may go (nil, nil when no connection syncs slots).
func (o *owner) slotWait() (<-chan struct{}, <-chan time.Time) {
	if len(o.slotConns) == 0 {
		return nil, nil
	}
	gen, changed := o.t.repl.slotsGen()
	behind := false
	for id := range o.slotConns {
		if o.slotSent[id] != gen {
			behind = true
			break
		}
	}
	if !behind {
		return changed, nil
	}
	if wait := time.Until(o.slotNext); wait > 0 {
		if o.slotTimer == nil {
			o.slotTimer = time.NewTimer(wait)
		} else {
			o.slotTimer.Reset(wait)
		}
		return nil, o.slotTimer.C
	}
	tbl, gen := o.t.repl.slotTable()
	for id, c := range o.slotConns {
		if o.slotSent[id] != gen {
			c.send(&proto.SafeKeeperSlots{SlotTable: tbl})
			o.slotSent[id] = gen
		}
	}
	o.slotNext = time.Now().Add(slotReportInterval)
	_, changed = o.t.repl.slotsGen()
	return changed, nil
}

// syncSlotsWith starts reporting slot tables to c, whose greeting was just
// answered: its first table goes now, right after the answer.
func (o *owner) syncSlotsWith(c *pushConn) {
	if o.slotConns == nil {
		o.slotConns, o.slotSent = map[acceptor.ConnID]*pushConn{}, map[acceptor.ConnID]uint64{}
	}
	tbl, gen := o.t.repl.slotTable()
	c.send(&proto.SafeKeeperSlots{SlotTable: tbl})
	o.slotConns[c.id], o.slotSent[c.id] = c, gen
}

// applySlots folds in a merged slot table a proposer sent on c.
func (o *owner) applySlots(c *pushConn, m *proto.Slots) {
	if !c.syncSlots {
		c.fail(fmt.Errorf("%w: Slots on a WAL push stream that did not ask for sync_replication_slots", acceptor.ErrProtocol))
		return
	}
	if err := o.t.repl.applySlots(m.SlotTable, o.t.store.RemovedUpTo()); err != nil {
		o.t.log.Warn("could not store the replication slots copied from the other safekeepers; the proposer sends them again", "err", err)
		delete(o.slotSent, c.id) // our table goes again, so the proposer sees what we hold
	}
}

// release gives the WAL bytes of the events handled so far back to the
// server's budget, and their buffers to pgwire. Call it only when what they
// staged is committed or dropped (after Flush, End or Persist): storage may
// hold slices of them until then.
func (o *owner) release() {
	if o.cost > 0 {
		o.t.walBudget.release(o.t.key.TenantID, o.cost)
		o.cost = 0
	}
	for i, p := range o.payloads {
		pgwire.Recycle(p)
		o.payloads[i] = nil
	}
	o.payloads = o.payloads[:0]
}

func (o *owner) handle(ev event) {
	o.cost += ev.cost
	if ev.payload != nil {
		o.payloads = append(o.payloads, ev.payload)
	}
	c := ev.conn
	if ev.end != nil {
		// The stream ended: what it sent is made durable and answered
		// first, then its final item goes out.
		o.conns[c.id] = c
		o.act(o.sess.End(c.id))
		delete(o.conns, c.id)
		delete(o.slotConns, c.id)
		delete(o.slotSent, c.id)
		c.enqueue(*ev.end)
		o.t.pushMu.Lock()
		if o.t.push.conn == c.id {
			o.t.push.connected = false
		}
		o.t.pushMu.Unlock()
		return
	}
	if c.dead() {
		return // its writer gave up (an error, or a proposer that stopped reading)
	}
	o.conns[c.id] = c
	if m, ok := ev.msg.(*proto.Slots); ok {
		o.applySlots(c, m) // not the session's: slots are no part of the consensus
		return
	}
	wasBroken := o.sess.Broken()
	// Appends change no term, vote or timeline and never truncate: only
	// the other messages pay for a copy of the state to compare with.
	_, isAppend := ev.msg.(*proto.SafeKeeperRequest)
	var before acceptor.State
	if !isAppend {
		before = o.sess.State()
	}
	r := o.sess.Step(c.id, ev.msg)
	if !isAppend {
		o.logChanges(c, ev.msg, before, r)
	}
	if _, greeting := ev.msg.(*proto.ServerInfo); greeting && wasBroken != nil && o.sess.Broken() != nil {
		o.t.log.Warn("timeline still cannot write", "err", o.sess.Broken())
	}
	if m, ok := ev.msg.(*proto.SafeKeeperRequest); ok && len(m.WAL) > 0 && o.t.metrics != nil {
		o.t.metrics.writeBytes.Observe(float64(len(m.WAL)))
		o.t.metrics.appends.Inc()
		o.t.metrics.received.Add(float64(len(m.WAL)))
	}
	if m, ok := ev.msg.(*proto.SafeKeeperRequest); ok && !r.Ends(c.id) {
		o.t.pushMu.Lock()
		o.t.push = pushInfo{conn: c.id, addr: c.remote, term: m.Sender.Term, at: time.Now(), connected: true, since: c.since,
			end: m.EndLSN, commit: m.CommitLSN}
		o.t.pushMu.Unlock()
	}
	o.act(r)
	if _, greeting := ev.msg.(*proto.ServerInfo); greeting && c.syncSlots && !r.Ends(c.id) {
		o.syncSlotsWith(c)
	}
}

// logChanges logs, once each, the state changes a message made that an
// operator wants to see (nothing per append): a vote granted or refused, a
// term change, an election, a truncation of WAL.
func (o *owner) logChanges(c *pushConn, msg proto.Message, before acceptor.State, r acceptor.Ready) {
	log := o.t.log
	after := o.sess.State()
	if m, ok := msg.(*proto.RequestVote); ok {
		for _, out := range r.Out {
			v, ok := out.Msg.(*proto.VoteResponse)
			if !ok || out.Conn != c.id {
				continue
			}
			if v.VotedFor == m.Candidate {
				log.Info("vote granted", "term", m.Candidate.Term, "candidate", m.Candidate.String(), "peer", c.remote,
					"flush_lsn", after.FlushLSN, "last_log_term", after.LastLogTerm())
			} else {
				log.Info("vote refused", "term", m.Candidate.Term, "candidate", m.Candidate.String(), "peer", c.remote,
					"voted_for", v.VotedFor.String())
			}
		}
	}
	if after.VotedFor.Term != before.VotedFor.Term {
		log.Info("term changed", "term", after.VotedFor.Term, "previous_term", before.VotedFor.Term, "peer", c.remote)
	}
	if m, ok := msg.(*proto.ProposerElected); ok && !r.Ends(c.id) {
		log.Info("proposer elected", "term", m.Term, "start_streaming_at", m.StartStreamingAt, "peer", c.remote)
	}
	if after.FlushLSN < before.FlushLSN {
		log.Info("truncated WAL", "lsn", after.FlushLSN, "previous_flush_lsn", before.FlushLSN, "term", after.VotedFor.Term, "peer", c.remote)
	}
	if after.PgTimeline != before.PgTimeline {
		log.Info("PostgreSQL timeline switched", "pg_timeline", after.PgTimeline, "previous_pg_timeline", before.PgTimeline,
			"lsn", after.TimelineStartLSN, "peer", c.remote)
	}
}

// act carries out a Ready: publish the new state (readers —
// START_REPLICATION, IDENTIFY_SYSTEM, TIMELINE_STATUS — then see at least
// the flush_lsn and commit_lsn any proposer is told), then queue each reply
// on its connection's writer. SafeKeeperResponses carry the readers'
// feedback to the proposer.
func (o *owner) act(r acceptor.Ready) {
	if r.Failed != nil {
		o.t.log.Error("storage failed; timeline refuses WAL until a proposer reconnects and the disk works", "err", r.Failed)
	}
	if r.Recovered {
		o.t.log.Info("timeline recovered from storage failure", "flush_lsn", o.sess.State().FlushLSN)
	}
	if r.State != nil {
		o.t.publish(*r.State)
		o.t.repl.kickRetention()
	}
	var fed *proto.SafeKeeperResponse
	for _, out := range r.Out {
		c := o.conns[out.Conn]
		if c == nil {
			continue
		}
		if out.Err != nil {
			c.fail(out.Err)
			continue
		}
		if resp, ok := out.Msg.(*proto.SafeKeeperResponse); ok && resp != fed {
			// One response value answers every request of a commit.
			resp.HotStandby, resp.Consumer = o.t.repl.feedback()
			fed = resp
		}
		c.send(out.Msg)
	}
}
