package timeline

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

// maxBatch bounds how many messages one group commit takes, so that a
// steady stream still gets a SafeKeeperResponse well within 100 ms.
const maxBatch = 64

// Event is one thing for the timeline owner to do: a message a push
// connection sent, or the end of its stream (End: the stream is over after
// CopyDone or an error, whose final item the connection holds). At the end
// the owner first makes durable and answers everything staged (rule 7: a
// dropped connection flushes too).
type Event struct {
	Conn *Conn
	Msg  proto.Message // decoded from Payload (a SafeKeeperRequest's WAL is a slice of it)
	// Payload is the buffer Msg came in; the owner hands it to
	// Config.Recycle after the group commit that takes Msg (storage may
	// keep a request's WAL, a slice of it, until then).
	Payload []byte
	// Cost is the WAL bytes the reader took from the Budget for Msg; the
	// owner gives them back after the group commit that takes Msg.
	Cost int64
	End  bool
}

// Conn is a push connection as its timeline's owner knows it: who it is
// and where its replies go. The push stream makes one when its greeting
// names the timeline and hands it in every Event.
type Conn struct {
	ID     acceptor.ConnID // the connection's name in the timeline's session
	Remote string          // the proposer's address (logs, the HTTP API)
	Since  time.Time       // when the stream started
	// SyncSlots: the stream carries slot tables (START_WAL_PUSH's
	// sync_replication_slots; slotsync.go).
	SyncSlots bool
	Out       Replies
	// dead: the connection takes no more replies (its queue overflowed or
	// its error is queued). Guarded by the timeline's ownMu.
	dead bool
}

// Replies is where the owner puts a push connection's replies, in order;
// the server's push stream implements it with a queue its writer
// goroutine drains. None of its methods may block: the owner's lock is
// held while they run.
type Replies interface {
	// Reply queues m. It returns false when the connection takes nothing
	// more (a proposer that stopped reading overflowed its queue and is
	// being disconnected): the owner then drops what it sends.
	Reply(m proto.Message) bool
	// Fail queues err, which ends the stream (an ErrorResponse, then the
	// connection closes).
	Fail(err error)
	// End queues the stream's final item (CopyDone or the error it ended
	// with): the owner has made durable and answered everything it sent.
	End()
}

func (c *Conn) reply(m proto.Message) {
	if !c.dead && !c.Out.Reply(m) {
		c.dead = true
	}
}

func (c *Conn) fail(err error) {
	if !c.dead {
		c.Out.Fail(err)
		c.dead = true
	}
}

// Timeline is one running timeline: its owner, the state that drives the
// timeline's acceptor.Session, entered under ownMu by the reader
// goroutine of the push connection whose message it is (Handle: run to
// completion, no hand-off per message) and by the timeline's background
// goroutine (run: timers, slot reports, the stop); the durable state the
// owner last published, for readers (Status); and the replication side
// (readers, slots).
type Timeline struct {
	key proto.TimelineKey
	log *slog.Logger

	// ownMu guards own: one message, commit or timer at a time.
	ownMu sync.Mutex
	own   *owner
	// qmu guards queued: events whose reader found the owner busy, for the
	// holder to step before it lets go (Handle). spareQueue is the
	// emptied slice to reuse (ownMu).
	qmu        sync.Mutex
	queued     []queuedEvent
	spareQueue []queuedEvent
	// kick wakes run to look at own again (capacity 1): a commit_lsn
	// waits in memory only, or the connections that sync slots changed.
	kick chan struct{}

	mu      sync.Mutex
	state   acceptor.State // the session's InMem state after the owner's last step
	changed chan struct{}  // closed at the next change of state; made by Status, nil when none waits
	store   *storage.Timeline

	// repl holds the timeline's readers, slots and their feedback.
	repl *replState

	// refusalWarned is when WAL for it was last refused with a warning
	// (unix nanoseconds): the refusals of a proposer that retries every
	// second are warned about once a minute (RefusalWarningDue).
	refusalWarned atomic.Int64

	stopped  chan struct{} // closed when stop is done
	stopOnce sync.Once
	// retain is the timeline's place with the registry's retainer.
	retain retainSlot

	// usersMu guards users, deleted and usersGone (delete.go).
	usersMu   sync.Mutex
	users     map[User]int // bound connections
	deleted   bool
	usersGone chan struct{} // closed when the last user of a deleted timeline unbinds

	// onPublish is a test hook (Hooks.OnPublish), nil in production.
	onPublish func()
	// persistEvery is persistInterval (tests may change it).
	persistEvery time.Duration
	// budget is the registry's.
	budget *Budget
	// metrics is the registry's (nil: none).
	metrics *Metrics
	// recycle is Config.Recycle.
	recycle func([][]byte)

	// backup is the archive's state (backup.go); notify is
	// Config.Backup (nil: no archive).
	backup backupState
	notify BackupNotifier

	// pushMu guards push and retained.
	pushMu   sync.Mutex
	push     PushInfo
	retained retention // the last horizon retention computed
}

// Done is closed when the timeline has stopped (after a delete, or once
// the registry's Close stopped it): it persisted what it held.
func (t *Timeline) Done() <-chan struct{} { return t.stopped }

// Key is the timeline's tenant and timeline id.
func (t *Timeline) Key() proto.TimelineKey { return t.key }

// Log is the timeline's logger: its lines carry tenant_id and timeline_id.
func (t *Timeline) Log() *slog.Logger { return t.log }

// Handle hands ev to the owner, on the caller's goroutine (the push
// connection's reader): run to completion. The session steps the message;
// unless more is true (another message of the connection is already here,
// so the group commit can take it too), everything staged is committed
// (Flush) and answered before Handle returns. An End always commits.
//
// When the owner is busy — committing a batch for this stream on the
// background goroutine, or another connection's message — the event is
// queued for it and Handle returns at once, so the reader goes on reading
// while the fsync runs; whoever holds the owner steps the queued events,
// in order, before it lets go. A stream that keeps more than maxBatch
// messages coming hands each full batch's commit to the background
// goroutine for the same reason: reading and fsync overlap under load,
// and an idle-to-busy stream pays no hand-off. A full queue makes Handle
// wait: the backpressure that reaches the proposer through TCP.
func (t *Timeline) Handle(ev Event, more bool) {
	if !t.ownMu.TryLock() {
		t.qmu.Lock()
		if len(t.queued) < maxQueued {
			t.queued = append(t.queued, queuedEvent{ev: ev, more: more})
			t.qmu.Unlock()
			if t.ownMu.TryLock() { // the holder may have left before we queued
				t.runQueued()
				t.unlockOwner()
			}
			return
		}
		t.qmu.Unlock()
		t.ownMu.Lock()
	}
	t.runQueued() // what was queued before ev comes first
	t.step(ev, more)
	t.unlockOwner()
}

// maxQueued bounds the events queued for a busy owner (each holds its
// WAL's budget until it is committed).
const maxQueued = 2 * maxBatch

type queuedEvent struct {
	ev   Event
	more bool
}

// step hands one event to the owner. ownMu held.
func (t *Timeline) step(ev Event, more bool) {
	o := t.own
	if o.stopped {
		// The registry stopped the timeline (it does so only once its
		// connections have ended): nothing is stepped any more.
		if ev.Cost > 0 {
			t.budget.Release(t.key.TenantID, ev.Cost)
		}
		if ev.Payload != nil && t.recycle != nil {
			t.recycle([][]byte{ev.Payload})
		}
		if ev.End {
			ev.Conn.Out.End()
		} else {
			ev.Conn.fail(ErrStopped)
		}
		return
	}
	o.handle(ev)
	o.batch++
	switch {
	case ev.End || !more || o.batch >= 2*maxBatch:
		o.commit()
	case o.batch >= maxBatch && !o.commitAsked:
		// The stream goes on: the background goroutine commits this
		// batch while the reader reads the next one.
		o.commitAsked = true
		o.kickRun()
	}
}

// runQueued steps the events queued while the owner was busy. ownMu held.
func (t *Timeline) runQueued() {
	for {
		t.qmu.Lock()
		q := t.queued
		if len(q) == 0 {
			t.qmu.Unlock()
			return
		}
		t.queued, t.spareQueue = t.spareQueue[:0], nil
		t.qmu.Unlock()
		for i, e := range q {
			t.step(e.ev, e.more)
			q[i] = queuedEvent{}
		}
		t.spareQueue = q
	}
}

// unlockOwner lets go of the owner, then takes it again for events queued
// meanwhile by a reader that found it busy (and, having failed to take it
// after queueing, left them to the holder).
func (t *Timeline) unlockOwner() {
	for {
		t.ownMu.Unlock()
		t.qmu.Lock()
		n := len(t.queued)
		t.qmu.Unlock()
		if n == 0 || !t.ownMu.TryLock() {
			return
		}
		t.runQueued()
	}
}

// Commit makes durable and answers what the connections staged and left
// for a later message to commit with (and what waits in the queue).
func (t *Timeline) Commit() {
	t.ownMu.Lock()
	t.runQueued()
	if !t.own.stopped && t.own.batch > 0 {
		t.own.commit()
	}
	t.unlockOwner()
}

// SetConfiguration switches the timeline to configuration c if its
// generation is above the stored one (README_PROTO.md, rule 9: what a
// membership change pushes, PUT .../membership) and returns the
// configuration held afterwards and the state. What the connections staged
// is committed first; connections greeted in an older generation are
// refused from their next message on. The same generation with other
// members is an *acceptor.ConfigurationError (ErrConfigurationConflict).
func (t *Timeline) SetConfiguration(c proto.Configuration) (proto.Configuration, acceptor.State, error) {
	t.ownMu.Lock()
	defer t.unlockOwner()
	t.runQueued()
	o := t.own
	if o.stopped {
		return proto.Configuration{}, acceptor.State{}, ErrStopped
	}
	if o.batch > 0 {
		o.commit()
	}
	before := o.sess.State()
	r, cur, err := o.sess.SetConfiguration(c)
	o.logConfiguration(before, "membership call")
	o.act(r)
	return cur, o.sess.State(), err
}

// TermBump raises the timeline's voted_for to term if it is below
// (acceptor.Session.TermBump; POST .../term_bump) and returns the term
// before and after.
func (t *Timeline) TermBump(term uint64) (previous, current uint64, err error) {
	t.ownMu.Lock()
	defer t.unlockOwner()
	t.runQueued()
	o := t.own
	if o.stopped {
		return 0, 0, ErrStopped
	}
	if o.batch > 0 {
		o.commit()
	}
	r, previous, current, err := o.sess.TermBump(term)
	if current != previous {
		o.t.log.Info("term bumped", "term", current, "previous_term", previous)
	}
	o.act(r)
	return previous, current, err
}

// logConfiguration logs a change of the stored configuration since before.
func (o *owner) logConfiguration(before acceptor.State, by string) {
	after := o.sess.State()
	if after.Configuration.Generation != before.Configuration.Generation {
		o.t.log.Info("configuration changed", "generation", after.Configuration.Generation, "members", after.Configuration.Members,
			"new_members", after.Configuration.NewMembers, "previous_generation", before.Configuration.Generation, "by", by)
	}
}

// RemovedUpTo is the retention horizon as stored: no WAL below it.
func (t *Timeline) RemovedUpTo() proto.LSN { return t.store.RemovedUpTo() }

// EndLSN is the end of the WAL stored.
func (t *Timeline) EndLSN() proto.LSN { return t.store.EndLSN() }

// ReadWAL reads stored WAL from pos into buf (storage.Timeline.ReadWAL: a
// short read transaction, copied out).
func (t *Timeline) ReadWAL(pos proto.LSN, buf []byte) (int, error) { return t.store.ReadWAL(pos, buf) }

// Stored is the durable state on disk, which may lag what Status serves
// (commit_lsn and truncate_lsn by up to persistInterval).
func (t *Timeline) Stored() (acceptor.State, error) { return t.store.Load() }

// RefusalWarningDue reports whether a refusal of WAL for the timeline is
// to be warned about now (once a minute; the others are logged at debug),
// and if so records that it was.
func (t *Timeline) RefusalWarningDue() bool {
	now, last := time.Now().UnixNano(), t.refusalWarned.Load()
	return now-last >= int64(refusalWarning) && t.refusalWarned.CompareAndSwap(last, now)
}

// refusalWarning: a timeline's WAL refusals are warned about at most this
// often.
const refusalWarning = time.Minute

func (t *Timeline) setRetention(r retention) {
	t.pushMu.Lock()
	t.retained = retention{Horizon: r.Horizon, Reason: r.Reason}
	t.pushMu.Unlock()
}

// Retention is the horizon retention last computed and what bounds it
// (reason "" before the first pass).
func (t *Timeline) Retention() (horizon proto.LSN, reason string) {
	t.pushMu.Lock()
	defer t.pushMu.Unlock()
	return t.retained.Horizon, t.retained.Reason
}

// PushInfo is the proposer that last streamed to the timeline (sent a
// SafeKeeperRequest, WAL or heartbeat, that the session did not refuse), as
// TIMELINE_STATUS reports it: sync and wal fetch ask it whether a proposer
// is live before they act on their own.
type PushInfo struct {
	Conn      acceptor.ConnID
	Addr      string
	Term      uint64
	At        time.Time // zero: none since the server started
	Connected bool      // Conn is still open
	Since     time.Time // the connection's start
	End       proto.LSN // EndLSN of its last request
	Commit    proto.LSN // CommitLSN of its last request
}

// Proposer returns the proposer that last streamed to the timeline.
func (t *Timeline) Proposer() PushInfo {
	t.pushMu.Lock()
	defer t.pushMu.Unlock()
	return t.push
}

// Status returns the state readers are served from (durable, but for a
// commit_lsn and truncate_lsn that may be ahead of the disk by at most
// persistInterval: WAL below that commit_lsn is durable here and committed
// on a quorum) and a channel closed at its next change.
func (t *Timeline) Status() (acceptor.State, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.changed == nil {
		t.changed = make(chan struct{})
	}
	return t.state.Clone(), t.changed
}

// State is Status without the channel, for a caller that does not wait
// for the next change (the channel is made only for one that does).
func (t *Timeline) State() acceptor.State {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state.Clone()
}

// StartLSN is the timeline's timeline_start_lsn (0 before the first
// election).
func (t *Timeline) StartLSN() proto.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state.TimelineStartLSN
}

func (t *Timeline) publish(st acceptor.State) {
	if st.PgTimeline != t.state.PgTimeline && t.repl != nil {
		t.repl.setTLI(st.PgTimeline) // a PostgreSQL timeline switch: slots restart on the new one
	}
	t.mu.Lock()
	t.state = st
	if t.changed != nil { // made when someone waits (Status): none per commit otherwise
		close(t.changed)
		t.changed = nil
	}
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

// run is the timeline's background goroutine, running only while the
// timeline has something to wait for: a push connection (a full batch to
// commit while its reader reads on: commitAsked), a commit_lsn held in
// memory only (persisted within persistInterval), slot tables to report to
// the connections that sync slots. kickRun starts it (under ownMu) when it
// is not running; it returns, under ownMu, once none of these is left, or
// when the timeline stops. An idle timeline has no goroutine: ten thousand
// of them cost their memory only.
func (t *Timeline) run(done chan struct{}) {
	defer close(done)
	o := t.own
	var timer *time.Timer
	var persist <-chan time.Time // the timer's channel while it is armed
	var slotChange <-chan struct{}
	var slotTick <-chan time.Time
	persistDue := false
	for first := true; ; first = false {
		if !first {
			select {
			case <-persist:
				persist, persistDue = nil, true
			case <-slotChange:
			case <-slotTick:
			case <-t.kick:
			}
		}
		t.ownMu.Lock()
		t.runQueued()
		if o.stopped {
			if timer != nil {
				timer.Stop()
			}
			if o.slotTimer != nil {
				o.slotTimer.Stop()
			}
			t.unlockOwner()
			return
		}
		if persistDue {
			persistDue = false
			o.persistArmed = false
			o.act(o.sess.Persist())
			o.release()
			o.batch = 0
		}
		if o.commitAsked && o.batch > 0 {
			o.commit()
		}
		o.commitAsked = false
		if persist == nil && o.sess.Unpersisted() {
			if timer == nil {
				timer = time.NewTimer(t.persistEvery)
			} else {
				timer.Reset(t.persistEvery)
			}
			persist = timer.C
			o.persistArmed = true
		}
		slotChange, slotTick = o.slotWait()
		o.slotsWatched = len(o.slotConns)
		if persist == nil && slotChange == nil && slotTick == nil && len(o.conns) == 0 {
			o.bgRunning = false
			t.unlockOwner()
			return
		}
		t.unlockOwner()
	}
}

// stop persists what the owner holds in memory for the last time and waits
// for its background goroutine to return; nothing is stepped after (a
// delete, or the registry's Close, once the connections ended). Then the
// slots whose restart_lsn moved are saved. Only the first call acts; every
// call returns once it is done.
func (t *Timeline) stop() {
	t.stopOnce.Do(func() {
		t.ownMu.Lock()
		t.runQueued()
		o := t.own
		o.act(o.sess.Persist())
		o.release()
		o.stopped = true
		bg, running := o.bgDone, o.bgRunning
		if running {
			select {
			case t.kick <- struct{}{}:
			default:
			}
		}
		t.unlockOwner()
		if running {
			<-bg
		}
		t.repl.saveAll()
		close(t.stopped)
	})
}

// owner is the state behind a timeline's session, guarded by ownMu.
type owner struct {
	t     *Timeline
	sess  *acceptor.Session
	conns map[acceptor.ConnID]*Conn // connections the session knows
	// batch is how many events were handled since the last commit; cost
	// is their budget bytes and payloads their messages' buffers, given
	// back once they are committed (release).
	batch    int
	cost     int64
	payloads [][]byte
	// persistArmed: run's persist timer is armed; slotsWatched is how
	// many connections run watches the slot table for. Handle kicks run
	// when what it did changes either. commitAsked: a stream that keeps
	// coming asked run to commit the batch (Handle).
	persistArmed bool
	slotsWatched int
	commitAsked  bool
	// stopped: stop has persisted the session for the last time.
	stopped bool
	// bgRunning: the background goroutine (run) runs; bgDone is closed
	// when it returns.
	bgRunning bool
	bgDone    chan struct{}

	// slotConns are the connections that sync slots (slotsync.go), with
	// the slot table generation each was sent last; slotNext is when the
	// next report may go, slotTimer waits for it.
	slotConns map[acceptor.ConnID]*Conn
	slotSent  map[acceptor.ConnID]uint64
	slotNext  time.Time
	slotTimer *time.Timer
}

// commit is the group commit of the events handled since the last one:
// Flush, then act on what it says, then give their memory back; then
// wake run if it has something new to watch.
func (o *owner) commit() {
	o.act(o.sess.Flush())
	o.release() // the batch is committed (or failed): its WAL left memory
	o.batch = 0
	if (!o.persistArmed && o.sess.Unpersisted()) || o.slotsWatched != len(o.slotConns) {
		o.kickRun()
	}
}

// kickRun wakes the background goroutine to look at the owner again,
// starting it if it is not running. ownMu held.
func (o *owner) kickRun() {
	if o.stopped {
		return
	}
	if !o.bgRunning {
		o.bgRunning = true
		o.bgDone = make(chan struct{})
		go o.t.run(o.bgDone)
		return
	}
	select {
	case o.t.kick <- struct{}{}:
	default:
	}
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
			c.reply(&proto.SafeKeeperSlots{SlotTable: tbl})
			o.slotSent[id] = gen
		}
	}
	o.slotNext = time.Now().Add(slotReportInterval)
	// changed is the channel of the generation read before the table: a
	// change between the two has closed it already, so run looks again at
	// once. (Taking the channel after the table lost such a change until
	// the next one: a stream ending a millisecond after the report was due
	// left its slot's tombstone unreported.)
	return changed, nil
}

// syncSlotsWith starts reporting slot tables to c, whose greeting was just
// answered: its first table goes now, right after the answer.
func (o *owner) syncSlotsWith(c *Conn) {
	if o.slotConns == nil {
		o.slotConns, o.slotSent = map[acceptor.ConnID]*Conn{}, map[acceptor.ConnID]uint64{}
	}
	tbl, gen := o.t.repl.slotTable()
	c.reply(&proto.SafeKeeperSlots{SlotTable: tbl})
	o.slotConns[c.ID], o.slotSent[c.ID] = c, gen
}

// applySlots folds in a merged slot table a proposer sent on c.
func (o *owner) applySlots(c *Conn, m *proto.Slots) {
	if !c.SyncSlots {
		c.fail(fmt.Errorf("%w: Slots on a WAL push stream that did not ask for sync_replication_slots", acceptor.ErrProtocol))
		return
	}
	if err := o.t.repl.applySlots(m.SlotTable, o.t.store.RemovedUpTo()); err != nil {
		o.t.log.Warn("could not store the replication slots copied from the other safekeepers; the proposer sends them again", "err", err)
		delete(o.slotSent, c.ID) // our table goes again, so the proposer sees what we hold
	}
}

// release gives the WAL bytes of the events handled so far back to the
// budget, and their buffers to Config.Recycle. Call it only when what they
// staged is committed or dropped (after Flush, End or Persist): storage may
// hold slices of them until then.
func (o *owner) release() {
	if o.cost > 0 {
		o.t.budget.Release(o.t.key.TenantID, o.cost)
		o.cost = 0
	}
	if len(o.payloads) == 0 {
		return
	}
	if o.t.recycle != nil {
		o.t.recycle(o.payloads)
	}
	clear(o.payloads)
	o.payloads = o.payloads[:0]
}

// addConn and dropConn keep conns, made at the first connection and
// dropped with the last: Go maps do not shrink, and an idle timeline
// keeps none.
func (o *owner) addConn(c *Conn) {
	if o.conns == nil {
		o.conns = map[acceptor.ConnID]*Conn{}
	}
	o.conns[c.ID] = c
}

func (o *owner) dropConn(id acceptor.ConnID) {
	delete(o.conns, id)
	delete(o.slotConns, id)
	delete(o.slotSent, id)
	if len(o.conns) == 0 {
		o.conns = nil
	}
	if len(o.slotConns) == 0 {
		o.slotConns, o.slotSent = nil, nil
	}
}

func (o *owner) handle(ev Event) {
	o.cost += ev.Cost
	if ev.Payload != nil {
		o.payloads = append(o.payloads, ev.Payload)
	}
	c := ev.Conn
	if ev.End {
		// The stream ended: what it sent is made durable and answered
		// first, then its final item goes out.
		o.addConn(c)
		o.act(o.sess.End(c.ID))
		o.dropConn(c.ID)
		c.Out.End()
		o.kickRun() // its last connection gone, run may end
		o.t.pushMu.Lock()
		if o.t.push.Conn == c.ID {
			o.t.push.Connected = false
		}
		o.t.pushMu.Unlock()
		return
	}
	if c.dead {
		return // it takes no more replies (an error, or a proposer that stopped reading)
	}
	o.addConn(c)
	if m, ok := ev.Msg.(*proto.Slots); ok {
		o.applySlots(c, m) // not the session's: slots are no part of the consensus
		return
	}
	wasBroken := o.sess.Broken()
	// Appends change no term, vote or timeline and never truncate: only
	// the other messages pay for a copy of the state to compare with.
	_, isAppend := ev.Msg.(*proto.SafeKeeperRequest)
	var before acceptor.State
	if !isAppend {
		before = o.sess.State()
	}
	r := o.sess.Step(c.ID, ev.Msg)
	if !isAppend {
		o.logChanges(c, ev.Msg, before, r)
	}
	if _, greeting := ev.Msg.(*proto.ServerInfo); greeting && wasBroken != nil && o.sess.Broken() != nil {
		o.t.log.Warn("timeline still cannot write", "err", o.sess.Broken())
	}
	if m, ok := ev.Msg.(*proto.SafeKeeperRequest); ok && len(m.WAL) > 0 && o.t.metrics != nil {
		o.t.metrics.WriteBytes.Observe(float64(len(m.WAL)))
		o.t.metrics.Appends.Inc()
		o.t.metrics.Received.Add(float64(len(m.WAL)))
	}
	if m, ok := ev.Msg.(*proto.SafeKeeperRequest); ok && !r.Ends(c.ID) {
		o.t.pushMu.Lock()
		o.t.push = PushInfo{Conn: c.ID, Addr: c.Remote, Term: m.Sender.Term, At: time.Now(), Connected: true, Since: c.Since,
			End: m.EndLSN, Commit: m.CommitLSN}
		o.t.pushMu.Unlock()
	}
	o.act(r)
	if _, greeting := ev.Msg.(*proto.ServerInfo); greeting && c.SyncSlots && !r.Ends(c.ID) {
		o.syncSlotsWith(c)
	}
}

// logChanges logs, once each, the state changes a message made that an
// operator wants to see (nothing per append): a vote granted or refused, a
// term change, an election, a truncation of WAL.
func (o *owner) logChanges(c *Conn, msg proto.Message, before acceptor.State, r acceptor.Ready) {
	log := o.t.log
	after := o.sess.State()
	if m, ok := msg.(*proto.RequestVote); ok {
		for _, out := range r.Out {
			v, ok := out.Msg.(*proto.VoteResponse)
			if !ok || out.Conn != c.ID {
				continue
			}
			if v.VotedFor == m.Candidate {
				log.Info("vote granted", "term", m.Candidate.Term, "candidate", m.Candidate.String(), "peer", c.Remote,
					"flush_lsn", after.FlushLSN, "last_log_term", after.LastLogTerm())
			} else {
				log.Info("vote refused", "term", m.Candidate.Term, "candidate", m.Candidate.String(), "peer", c.Remote,
					"voted_for", v.VotedFor.String())
			}
		}
	}
	if after.VotedFor.Term != before.VotedFor.Term {
		log.Info("term changed", "term", after.VotedFor.Term, "previous_term", before.VotedFor.Term, "peer", c.Remote)
	}
	if m, ok := msg.(*proto.ProposerElected); ok && !r.Ends(c.ID) {
		log.Info("proposer elected", "term", m.Term, "start_streaming_at", m.StartStreamingAt, "peer", c.Remote)
	}
	if after.FlushLSN < before.FlushLSN {
		log.Info("truncated WAL", "lsn", after.FlushLSN, "previous_flush_lsn", before.FlushLSN, "term", after.VotedFor.Term, "peer", c.Remote)
	}
	if _, greeting := msg.(*proto.ServerInfo); greeting {
		o.logConfiguration(before, "greeting of "+c.Remote)
	}
	if after.PgTimeline != before.PgTimeline {
		log.Info("PostgreSQL timeline switched", "pg_timeline", after.PgTimeline, "previous_pg_timeline", before.PgTimeline,
			"lsn", after.TimelineStartLSN, "peer", c.Remote)
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
		o.t.notifyBackup(r.State.CommitLSN)
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
		c.reply(out.Msg)
	}
}
