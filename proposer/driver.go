package proposer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proposer/session"
	"github.com/safekeeper/safekeeper/proto"
)

// tick is the owner's timer resolution for heartbeats, status updates and
// buffer trimming.
const tick = 50 * time.Millisecond

// commitHeartbeatDelay is how soon after commit_lsn advanced the driver
// ticks the session, so that a safekeeper with no WAL to send gets the new
// commit_lsn in a heartbeat (its readers are served up to it). Under load
// the primary's next WAL comes sooner and carries it in its AppendRequest,
// so the heartbeat is rarely needed.
const commitHeartbeatDelay = 2 * time.Millisecond

// sessionEpoch is the origin of the sessions' clock: Run and Sync tick a
// session with the monotonic time since the process took it.
var sessionEpoch = time.Now()

// sessionTime is t on the sessions' clock (session.Instant).
func sessionTime(t time.Time) session.Instant { return session.Instant(t.Sub(sessionEpoch)) }

// Run is the walproposer: it streams the primary's WAL to the safekeepers
// until ctx is done (then it returns nil) or it is deposed (a *DeposedError,
// errors.Is ErrDeposed). An error from the primary that retrying cannot fix
// (permanentUpstreamError: a role or password it refuses, a bad slot name, a
// database that does not exist) also ends Run, as a *RejectedError. Every
// other failure — the primary or a quorum of safekeepers unreachable, the
// primary starting up, shutting down or out of connections, a refused vote —
// ends the current session; Run then reconnects with backoff and runs a new
// election with a higher term (see docs/proposer.md).
func Run(ctx context.Context, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if err := CheckConnString(cfg.Upstream); err != nil {
		return err
	}
	log := cfg.Logger
	cfg.Stats.configuration(cfg.Configuration)
	bo := backoff{min: cfg.ReconnectMin, max: cfg.ReconnectMax}
	lastTerm, ownTerm := cfg.OwnTerm, cfg.OwnTerm
	createWarned := new(atomic.Bool)
	gaps := make([]responseGap, len(cfg.Safekeepers))
	defer func() { logLinkStats(log, cfg.Safekeepers, gaps) }()
	outage := primaryOutage{log: log}
	for {
		s := newDriver(cfg, lastTerm)
		s.leaseAbove = ownTerm
		s.outage = &outage
		s.createWarned = createWarned
		err := s.run(ctx)
		cfg.Stats.sessionEnded(err)
		lastTerm = max(lastTerm, s.sess.Core().MaxTermSeen())
		ownTerm = max(ownTerm, s.sess.Core().Ballot().Term)
		for i, sk := range s.sks {
			gaps[i].add(sk.gap)
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrDeposed) || errors.Is(err, ErrDuplicateSafekeeper) {
			return deposedBy(ctx, nameDeposed(err, cfg.Safekeepers),
				SyncConfig{Safekeepers: cfg.Safekeepers, TenantID: cfg.TenantID, TimelineID: cfg.TimelineID, ConnectTimeout: cfg.ConnectTimeout,
					Security: cfg.Security})
		}
		if errors.Is(err, ErrIncompatible) || errors.Is(err, ErrNoTimeline) {
			return err
		}
		var ce *session.ConfigurationError
		if errors.As(err, &ce) {
			// A membership change (README_PROTO.md, rule 9): the next
			// session proposes in the newer configuration at once, to the
			// same addresses (a member whose address is not among them
			// does not count; the caller that knows addresses, as propose
			// --etcd-endpoints does, restarts Run with them).
			ce.Addr = cfg.Safekeepers[ce.Safekeeper]
			log.Info("a safekeeper holds a newer configuration; proposing in it", "safekeeper", ce.Addr,
				"generation", ce.Configuration.Generation, "members", ce.Configuration.Members, "new_members", ce.Configuration.NewMembers,
				"was", cfg.Configuration.Generation)
			cfg.Configuration, cfg.SafekeeperIDs = ce.Configuration.Clone(), nil
			cfg.Stats.configuration(cfg.Configuration)
			continue
		}
		if permanentUpstreamError(err) {
			return &RejectedError{Err: err}
		}
		if s.streamed {
			bo.reset()
		}
		d := bo.next()
		if s.primaryDown {
			outage.failed(time.Now(), err, s.sess.Core().Ballot().Term, d)
		} else {
			log.Warn(sessionEndedMsg, "err", err, "term", s.sess.Core().Ballot().Term, "retry_in", d)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
	}
}

// RejectedError is the primary's refusal (a *pgconn.PgError inside Err)
// that reconnecting cannot heal; Run stops with it. errors.Is
// ErrUpstreamRejected.
type RejectedError struct{ Err error }

func (e *RejectedError) Error() string {
	return e.Err.Error() + " (not retried: reconnecting cannot fix this)"
}

// Unwrap returns the primary's error and ErrUpstreamRejected.
func (e *RejectedError) Unwrap() []error { return []error{e.Err, ErrUpstreamRejected} }

// permanentUpstreamError reports whether err carries a SQLSTATE from the
// primary that no retry can heal: class 28 (invalid authorization: unknown
// role, wrong password, no pg_hba.conf entry), 42602 (invalid name, e.g. the
// slot's) or 3D000 (database does not exist). Network errors and the
// states a server leaves by itself — 57P01/57P03 (shutting down, starting
// up), 53300 (too many connections) — are retried.
func permanentUpstreamError(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return strings.HasPrefix(pe.Code, "28") || pe.Code == "42602" || pe.Code == "3D000"
}

// driver is one session's IO: one connection to the primary and one term.
// It greets, elects and streams through a Session, which makes every
// decision; the driver owns the sockets, the WAL buffer, the catch-up
// streams and the clock. It ends with the first primary failure, refused
// vote or deposal.
type driver struct {
	cfg  Config
	log  *slog.Logger
	sess *session.Session
	// stats is cfg.Stats: what the session shows an operator (stats.go).
	stats *Stats
	// outage is Run's: the driver ends it when it reaches the primary.
	outage *primaryOutage
	// primaryDown: the session ended because the primary failed
	// (connecting to it, or its stream): Run logs it through outage.
	primaryDown bool

	up       *client.Replication
	slot     *slotKeeper
	ui       client.SystemInfo
	si       proto.ServerInfo
	links    *skLinks
	sks      []*skState
	buf      *walBuffer
	upEvents chan upstreamEvent
	// commitTimer fires commitHeartbeatDelay after commit_lsn advanced;
	// commitTick is its channel while armed, nil otherwise.
	commitTimer *time.Timer
	commitTick  <-chan time.Time
	cuEvents    chan streamChunk
	joinEvents  chan joinEvent
	joinProbe   bool // a findJoinPoint is running

	// refusals: the safekeepers that refused our ServerInfo for good
	// (their links stopped); Run ends once no quorum is left.
	refusals map[int]error
	// leaseAbove: before the campaign, wait while a proposer of a term
	// above it streams to the timeline (waitLease; ProposerLease).
	leaseAbove uint64
	// missing: the safekeepers whose last answer was that they do not hold
	// the timeline; Run ends once no quorum is left while none holds it.
	missing map[int]error
	// holding counts the safekeepers connected now whose greeting was
	// answered: while one is, the timeline exists and the links' greetings
	// may create it on the others (a replaced disk). A timeline deleted on
	// every safekeeper is not created again: their connections end first.
	holding *atomic.Int32
	// createWarned: the warning that --create found the timeline existing
	// was logged (once per Run).
	createWarned *atomic.Bool
	// slots merges the safekeepers' slot tables (slotsync.go).
	slots *session.SlotMerge

	lastStatus time.Time
	lastCommit proto.LSN // commit reported in the last status update
	streamed   bool      // WAL reached a quorum in this session
	catchups   int       // catch-up streams started (their ids)
	started    time.Time
	now        func() time.Time // the clock of the link stats (responseGap); time.Now
}

// skState is the IO side of one safekeeper: its connection's writer queue
// and its catch-up stream from the primary.
type skState struct {
	i, gen    int
	out       chan []byte // nil while disconnected
	cu        *catchup
	cuWant    bool      // the session needs WAL below the buffer: start a catch-up
	cuFrom    proto.LSN // where
	cuRetryAt time.Time
	cuBackoff backoff
	// cuFromPeer: the primary answered 58P01 (it removed the WAL this
	// safekeeper needs); the next catch-up copies from a peer safekeeper.
	cuFromPeer bool
	// cuBad: a catch-up from this safekeeper as the peer found the WAL
	// removed there too; others are tried first.
	cuBad bool
	gap   responseGap // waits for a SafeKeeperResponse (Run logs them at exit)
	// quiet: this connection is a reconnect after the same failure as the
	// one before (skEvent.quiet); its lines go at debug (logEvents).
	quiet bool
}

type upstreamEvent struct {
	m   client.StreamMsg
	err error
}

func newDriver(cfg Config, lastTerm uint64) *driver {
	s := &driver{cfg: cfg, log: cfg.Logger, stats: cfg.Stats, now: time.Now, holding: new(atomic.Int32), createWarned: new(atomic.Bool),
		slots: session.NewSlotMerge(len(cfg.Safekeepers))}
	s.sess = session.New(session.Config{
		N: len(cfg.Safekeepers), UUID: cfg.ProposerUUID, LastTerm: lastTerm,
		MaxInFlight: cfg.MaxInFlight, MaxInFlightBytes: cfg.MaxInFlightBytes, HeartbeatInterval: session.Duration(cfg.HeartbeatInterval),
		Configuration: cfg.Configuration, IDs: cfg.SafekeeperIDs,
	}, s)
	for i := range cfg.Safekeepers {
		s.sks = append(s.sks, &skState{i: i, cuBackoff: backoff{min: cfg.ReconnectMin, max: cfg.ReconnectMax}})
	}
	return s
}

func (s *driver) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.started = time.Now()
	if err := s.connectPrimary(ctx); err != nil {
		return s.primaryFailed(ctx, err)
	}
	defer func() { s.up.Close() }()
	if !s.cfg.Create {
		// Before anything is created anywhere (the slot on the primary, a
		// timeline on a safekeeper): a mistyped id ends Run here, with
		// ErrNoTimeline naming the safekeepers that do not hold it.
		if err := checkTimeline(ctx, s.cfg); err != nil {
			return err
		}
	}
	// Before the campaign, and before the slot: what the primary is
	// decides whether the safekeepers can take it at all (an old primary
	// after a failover is refused at once, not after a wait). While it
	// waits for another proposer, the primary's connection is closed (no
	// walsender held, no second row in pg_stat_replication); afterwards it
	// connects again.
	if s.cfg.ProposerLease > 0 {
		waited, err := waitLease(ctx, s.cfg, s.leaseAbove, &s.si, func() { s.up.Close() })
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if waited {
			if err := s.connectPrimary(ctx); err != nil {
				return s.primaryFailed(ctx, err)
			}
		}
	}
	up := s.up
	var err error
	if s.ui.RestartLSN, err = up.EnsureSlot(ctx, s.cfg.SlotName); err != nil {
		return s.primaryFailed(ctx, err)
	}
	slot := newSlotKeeper(s.cfg.Upstream, s.cfg.SlotName, s.ui.RestartLSN, s.log)
	s.slot = slot
	slotDone := make(chan struct{})
	go func() { defer close(slotDone); slot.run(ctx) }()
	defer func() { cancel(); <-slotDone }()
	s.log.Info("connected to primary", "system_id", s.ui.SystemID, "pg_timeline", s.ui.Timeline, "flush", s.ui.XLogPos,
		"wal_segment_size", s.ui.SegSize, "server_version_num", s.ui.PgVersion, "slot", s.cfg.SlotName, "slot_restart_lsn", s.ui.RestartLSN)
	s.outage.back(time.Now())
	var hist *proto.TimelineHistory
	if s.ui.Timeline > 1 {
		hist = &proto.TimelineHistory{PgTimeline: s.ui.Timeline, Content: s.ui.History}
	}
	s.links = &skLinks{
		addrs: s.cfg.Safekeepers, si: &s.si, hist: hist, queueCap: s.cfg.MaxInFlight + 16, log: s.log, stats: s.stats,
		create: s.cfg.Create, holding: s.holding,
		bo:     backoff{min: s.cfg.ReconnectMin, max: s.cfg.ReconnectMax},
		events: make(chan skEvent, 256),
		dial: client.DialConfig{TenantID: s.cfg.TenantID, TimelineID: s.cfg.TimelineID, SyncSlots: true,
			ApplicationName: s.cfg.ApplicationName, ConnectTimeout: s.cfg.ConnectTimeout, Security: s.cfg.Security},
	}
	s.upEvents = make(chan upstreamEvent, 64)
	s.cuEvents = make(chan streamChunk, 16)
	s.joinEvents = make(chan joinEvent, 1)
	s.links.start(ctx)
	defer func() {
		cancel()
		for _, sk := range s.sks {
			s.dropCatchup(sk)
			if sk.out != nil {
				close(sk.out)
				sk.out = nil
			}
		}
		s.links.wg.Wait()
	}()
	return s.loop(ctx)
}

// connectPrimary opens the replication connection to the primary
// (s.up), asks it what it is (s.ui) and describes it to the safekeepers
// (s.si).
func (s *driver) connectPrimary(ctx context.Context) error {
	up, err := client.DialReplication(ctx, "primary", s.cfg.Upstream, s.cfg.ApplicationName, s.cfg.ConnectTimeout)
	if err != nil {
		return err
	}
	if s.ui, err = up.Identify(ctx); err != nil {
		up.Close()
		return err
	}
	s.up = up
	// The primary answers (Stats; the log says it is back once the session
	// holds its slot: a primary that answers and then fails at the slot
	// every time is one outage, not one per attempt).
	s.stats.primaryConnected(s.ui.XLogPos)
	s.stats.publishWait(s.stats.waits.truncate(s.ui.XLogPos))
	s.si = proto.ServerInfo{
		ProtocolVersion: proto.ProtocolVersion, PgVersion: s.ui.PgVersion, SystemID: s.ui.SystemID,
		TenantID: s.cfg.TenantID, TimelineID: s.cfg.TimelineID, PgTimeline: s.ui.Timeline,
		WalSegSize: s.ui.SegSize, ProposerUUID: s.cfg.ProposerUUID, WalEnd: s.ui.XLogPos,
		Configuration: s.cfg.Configuration.Clone(),
	}
	return nil
}

// loop is the owner: the only goroutine that touches the session, the
// buffer and the safekeeper states.
func (s *driver) loop(ctx context.Context) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	defer func() {
		if s.commitTimer != nil {
			s.commitTimer.Stop()
		}
	}()
	electionDeadline := time.Now().Add(s.cfg.ElectionTimeout)
	for {
		upEvents := s.upEvents
		if s.buf != nil && s.buf.size > 2*s.cfg.BufferSize {
			upEvents = nil // the quorum lags a whole buffer behind: stop reading the primary
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-s.links.events:
			if err := s.onSafekeeper(ctx, ev); err != nil {
				return err
			}
		case ev := <-upEvents:
			if ev.err != nil {
				return s.primaryFailed(ctx, ev.err)
			}
			if err := s.onUpstream(ctx, ev.m); err != nil {
				return err
			}
		case ev := <-s.cuEvents:
			s.onCatchup(ctx, ev)
		case ev := <-s.joinEvents:
			s.onJoinPoint(ev)
		case now := <-s.commitTick:
			s.commitTick = nil
			s.act(ctx, s.sess.Tick(sessionTime(now)))
		case now := <-t.C:
			core := s.sess.Core()
			if core.Election() == nil && now.After(electionDeadline) {
				err := fmt.Errorf("%w: no quorum of votes within %v (%d greeted, %d granted of %d)",
					ErrNoQuorum, s.cfg.ElectionTimeout, core.Greetings(), core.Grants(), core.N())
				if ends := s.links.lastErrors(func(i int) bool { return s.sks[i].out == nil }); ends != "" {
					err = fmt.Errorf("%w; not connected: %s", err, ends)
				}
				return err
			}
			s.act(ctx, s.sess.Tick(sessionTime(now)))
			if now.Sub(s.lastStatus) >= s.cfg.StatusInterval {
				s.sendStatus(true)
			}
			if s.buf != nil {
				s.trim()
			}
		}
	}
}

// act carries out what the session decided: log its events, send, drop
// connections, tell the primary a new commit_lsn, start the catch-up
// streams it needs.
func (s *driver) act(ctx context.Context, r session.Ready) {
	s.logEvents(r)
	for _, m := range r.Sends {
		s.send(s.sks[m.To], m.Msg)
	}
	for _, i := range r.Drop {
		s.closeLink(s.sks[i])
	}
	if r.Advanced {
		if !s.streamed {
			s.streamed = true
			s.log.Info("quorum reached the term start; streaming", "commit_lsn", s.sess.Core().CommitLSN(), "since_connect", time.Since(s.started).Round(time.Millisecond))
		}
		s.sendStatus(false)
		if s.commitTick == nil {
			if s.commitTimer == nil {
				s.commitTimer = time.NewTimer(commitHeartbeatDelay)
			} else {
				s.commitTimer.Reset(commitHeartbeatDelay)
			}
			s.commitTick = s.commitTimer.C
		}
	}
	for _, sk := range s.sks {
		if sk.cuWant {
			sk.cuWant = false
			s.startCatchup(ctx, sk)
		}
	}
}

// logEvents logs the session's events in r (act does, and so does a
// caller that does not act on r because the call also failed).
func (s *driver) logEvents(r session.Ready) {
	logEvents(s.log, s.cfg.Safekeepers, func(i int) bool { return s.sks[i].quiet }, r.Events)
}

func (s *driver) send(sk *skState, m proto.Message) {
	if sk.out == nil {
		return
	}
	select {
	case sk.out <- m.Encode(nil):
		if _, ok := m.(*proto.SafeKeeperRequest); ok {
			sk.gap.sent(s.now())
		}
	default:
		// Cannot happen: MaxInFlight bounds the queue. Treat as a broken link.
		s.log.Error("safekeeper send queue full; dropping the connection", "safekeeper", s.cfg.Safekeepers[sk.i])
		s.disconnect(sk)
	}
}

// closeLink closes safekeeper sk's connection (its writer sends what is
// queued, then closes the socket, and the link reconnects) and its
// catch-up stream, and ignores the rest of that connection's events.
func (s *driver) closeLink(sk *skState) {
	if sk.out != nil {
		close(sk.out)
		sk.out = nil
	}
	s.dropCatchup(sk)
	sk.cuWant = false
	sk.gen = 0 // connections count from 1: no event matches
	sk.gap.disconnected()
	s.stats.links[sk.i].phase.Store(int32(session.PhaseDown))
}

func (s *driver) disconnect(sk *skState) {
	s.closeLink(sk)
	s.sess.Disconnected(sk.i)
}

func (s *driver) onSafekeeper(ctx context.Context, ev skEvent) error {
	sk := s.sks[ev.sk]
	if ev.refused {
		if ev.gen == sk.gen && sk.out != nil { // refused after its greeting (TimelineHistory)
			s.disconnect(sk)
		}
		return s.refused(ev)
	}
	if ev.missing {
		return s.missingAt(ev)
	}
	if ev.out != nil { // a new, greeted connection
		delete(s.missing, ev.sk)
		if s.cfg.Create && ev.info.VotedFor.Term > 0 && s.createWarned.CompareAndSwap(false, true) {
			s.log.Warn("--create: the timeline exists already (it has a term); nothing was created: start without --create from now on, "+
				"so a mistyped id is refused rather than created", "safekeeper", s.cfg.Safekeepers[ev.sk], "term", ev.info.VotedFor.Term)
		}
		if sk.out != nil {
			s.disconnect(sk)
		}
		sk.gen, sk.out = ev.gen, ev.out
		s.slots.Connected(ev.sk)
		sk.quiet = ev.quiet
		r, err := s.sess.Greeted(ev.sk, ev.info)
		if err != nil {
			s.logEvents(r)
			return err
		}
		s.publishLinks() // a campaign asks every greeted safekeeper
		s.act(ctx, r)
		return nil
	}
	if ev.gen != sk.gen {
		return nil // a dropped connection's leftovers
	}
	if ev.err != nil {
		if ce := newerConfiguration(ev.err, ev.sk, s.cfg.Configuration.Generation); ce != nil {
			return ce // the safekeeper switched to it under a running connection
		}
		// The link warns about it (skLinks.loop, rate-limited per reason).
		s.log.Debug("safekeeper disconnected", "safekeeper", s.cfg.Safekeepers[ev.sk], "err", ev.err)
		s.disconnect(sk)
		return nil
	}
	if m, ok := ev.msg.(*proto.SafeKeeperSlots); ok {
		// Not the session's: slots are no part of the consensus.
		for i, t := range s.slots.Report(ev.sk, m.SlotTable, func(i int) bool { return s.sks[i].out != nil }) {
			s.send(s.sks[i], &proto.Slots{SlotTable: t})
		}
		return nil
	}
	r, err := s.sess.Receive(ev.sk, ev.msg)
	if err != nil {
		s.logEvents(r)
		if errors.Is(err, ErrVoteRefused) {
			s.stats.refusedVote(ev.sk)
		}
		return err
	}
	if _, ok := ev.msg.(*proto.SafeKeeperResponse); ok {
		// The hot path: a response changes no phase (a drop is closeLink's).
		l := &s.stats.links[ev.sk]
		l.responses.Add(1)
		if f, ok := s.sess.Core().FlushLSN(ev.sk); ok {
			l.flush.Store(uint64(f))
		}
		if s.sess.Streaming(ev.sk) {
			sk.gap.answered(s.now(), s.sess.InFlight(ev.sk) > 0)
		}
	} else {
		s.publishLink(ev.sk)
	}
	s.act(ctx, r)
	if r.Elect {
		return s.elect(ctx)
	}
	return nil
}

// refused records a safekeeper's refusal of our ServerInfo for good; once
// no quorum is left, the session (and Run) ends with ErrIncompatible.
func (s *driver) refused(ev skEvent) error {
	if s.refusals == nil {
		s.refusals = map[int]error{}
	}
	s.refusals[ev.sk] = ev.err
	if refusalBlocksQuorum(len(s.refusals), len(s.cfg.Safekeepers)) {
		return incompatibleError(s.refusals, s.cfg.Safekeepers, &s.si)
	}
	s.log.Error("safekeeper refuses this primary for good; not retried, the others go on", "safekeeper", s.cfg.Safekeepers[ev.sk], "err", ev.err)
	return nil
}

// missingAt records a safekeeper's answer that it does not hold the
// timeline. While no safekeeper has greeted, a quorum of such answers ends
// the session (and Run) with ErrNoTimeline: the ids name a timeline that
// was never created, and without Config.Create nothing creates it. Once one
// has greeted, the others create it at their next greeting.
func (s *driver) missingAt(ev skEvent) error {
	if s.missing == nil {
		s.missing = map[int]error{}
	}
	s.missing[ev.sk] = ev.err
	if s.holding.Load() > 0 || !refusalBlocksQuorum(len(s.missing), len(s.cfg.Safekeepers)) {
		return nil
	}
	var on []string
	for i, addr := range s.cfg.Safekeepers {
		if _, ok := s.missing[i]; ok {
			on = append(on, addr)
		}
	}
	err := fmt.Errorf("%w: timeline %s/%s is not on %s", ErrNoTimeline, s.cfg.TenantID, s.cfg.TimelineID, strings.Join(on, ", "))
	if others := s.links.lastErrors(func(i int) bool { _, ok := s.missing[i]; return !ok }); others != "" {
		err = fmt.Errorf("%w; no answer from %s", err, others)
	}
	return err
}

// elect decides the election, sends ProposerElected to every voter and
// starts the primary's stream.
func (s *driver) elect(ctx context.Context) error {
	// The primary's flush position read at connect time is stale by now if
	// another proposer kept streaming meanwhile: read it again, or the
	// donor's WAL would look like WAL the primary lost.
	if pos, err := s.up.FlushPos(ctx); err != nil {
		return s.primaryFailed(ctx, err)
	} else if pos > s.ui.XLogPos {
		s.ui.XLogPos = pos
	}
	newStart := s.ui.RestartLSN
	if newStart == 0 || newStart > s.ui.XLogPos {
		newStart = s.ui.XLogPos
	}
	newStart = newStart.SegmentStart(uint64(s.ui.SegSize))
	e, r, err := s.sess.Elect(s.ui.XLogPos, newStart)
	if err != nil {
		s.logEvents(r)
		return err
	}
	s.publishLinks()
	s.act(ctx, r)
	from := e.TermStartLSN
	for i := range s.sks {
		if s.sess.Streaming(i) {
			from = min(from, s.sess.Sent(i))
		}
	}
	// Do not ask the primary for WAL its slot no longer guarantees; a
	// safekeeper that needs older WAL gets it from a catch-up stream.
	if keep := s.ui.RestartLSN.SegmentStart(uint64(s.ui.SegSize)); s.ui.RestartLSN != 0 && from < keep {
		from = min(keep, e.TermStartLSN)
	}
	// The stream runs without the slot: the slot is held at truncate_lsn by
	// the slot keeper, while this stream reports commit_lsn as flushed.
	if err := s.up.StartReplication(ctx, "", from, s.ui.Timeline); err != nil {
		return s.primaryFailed(ctx, err)
	}
	s.log.Info("streaming from primary", "start", from)
	s.stats.elected.Store(true)
	s.buf = newWALBuffer(from)
	s.sendStatus(true)
	go func() {
		for {
			m, err := s.up.Recv(ctx)
			select {
			case s.upEvents <- upstreamEvent{m: m, err: err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	s.act(ctx, s.sess.PumpAll())
	return nil
}

func (s *driver) onUpstream(ctx context.Context, m client.StreamMsg) error {
	s.notePrimary(m)
	if m.WAL != nil {
		if err := s.buf.add(m.Start, m.WAL); err != nil {
			return err
		}
		s.act(ctx, s.sess.PumpAll())
		if s.buf.size > s.cfg.BufferSize {
			s.trim()
		}
		return nil
	}
	if m.ReplyRequested {
		s.sendStatus(true)
	}
	return nil
}

// WAL is the session's WALSource: for a safekeeper behind the buffer, the
// pending chunk of its catch-up stream (asking act to start one if it has
// none); else the buffer.
func (s *driver) WAL(i int, lsn proto.LSN, max int) []byte {
	sk := s.sks[i]
	if s.buf == nil {
		return nil
	}
	if sk.cu != nil {
		if lsn < s.buf.start {
			return s.catchupWAL(sk, lsn, max)
		}
		s.log.Log(context.Background(), linkLevel(sk.quiet), "safekeeper caught up with the buffer", "safekeeper", s.cfg.Safekeepers[i], "at", lsn)
		s.dropCatchup(sk)
	}
	if lsn < s.buf.start {
		sk.cuWant, sk.cuFrom = true, lsn
		return nil
	}
	return s.buf.read(lsn, max)
}

// End is the end of the buffered WAL (WALSource).
func (s *driver) End() proto.LSN {
	if s.buf == nil {
		return 0
	}
	return s.buf.end
}

// trim drops buffered WAL no safekeeper needs: below every known flush_lsn,
// or, when the buffer is over BufferSize, up to what a quorum was sent (the
// ones behind then catch up from a separate stream).
func (s *driver) trim() {
	core := s.sess.Core()
	need := s.buf.end
	for i := range s.sks {
		if f, ok := core.FlushLSN(i); ok {
			need = min(need, f)
		}
	}
	if s.buf.end-need > proto.LSN(s.cfg.BufferSize) {
		q := s.buf.start
		if l, ok := core.QuorumLSN(func(i int) (proto.LSN, bool) {
			return s.sess.Sent(i), s.sess.Streaming(i) && s.sks[i].cu == nil
		}); ok {
			q = l
		}
		need = max(need, min(s.buf.end-proto.LSN(s.cfg.BufferSize), q))
	}
	s.buf.trim(need)
}

// sendStatus sends a standby status update: write = WAL received from the
// primary, flush = quorum commit_lsn (what the primary's synchronous commits
// wait for), apply = 0 (the proposer applies nothing; remote_apply commits
// would wait forever, which is the honest answer). force sends it even if
// commit_lsn did not move.
func (s *driver) sendStatus(force bool) {
	if s.buf == nil {
		return
	}
	core := s.sess.Core()
	s.stats.commit.Store(uint64(core.CommitLSN()))
	s.stats.truncate.Store(uint64(core.TruncateLSN()))
	flush := max(core.CommitLSN(), s.sess.BaseCommit())
	flush = min(flush, s.buf.end)
	if !force && flush == s.lastCommit {
		return
	}
	if err := s.up.SendStatus(s.buf.end, flush, 0, time.Now()); err != nil {
		s.log.Debug("standby status update failed", "err", err) // the reader reports the broken connection
	}
	s.lastStatus, s.lastCommit = time.Now(), flush
	s.stats.write.Store(uint64(s.buf.end))
	s.stats.flush.Store(uint64(flush))
	s.stats.publishWait(s.stats.waits.flushed(flush))
	s.slot.offer(min(core.TruncateLSN(), flush))
}

// primaryFailed records that the session ends because the primary failed
// with err (connecting to it, or its stream), and returns err. A failure
// caused by ctx ending (the proposer stops) is not the primary's.
func (s *driver) primaryFailed(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		s.primaryDown = true
		s.stats.primaryFailed(err)
	}
	return err
}

// notePrimary records what an XLogData or keepalive m says of the
// primary: its end of WAL, and when the WAL in it arrived (Stats.Lag).
func (s *driver) notePrimary(m client.StreamMsg) {
	end := m.ServerEnd
	if m.WAL != nil {
		end = max(end, m.Start+proto.LSN(len(m.WAL)))
	}
	if uint64(end) > s.stats.primaryEnd.Load() {
		s.stats.primaryEnd.Store(uint64(end))
	}
	if m.WAL != nil {
		if at := s.now(); s.stats.waits.arrived(m.Start+proto.LSN(len(m.WAL)), at) {
			s.stats.publishWait(at)
		}
	}
}

// publishLink shows safekeeper i's session phase and flush_lsn in Stats.
func (s *driver) publishLink(i int) {
	l := &s.stats.links[i]
	l.phase.Store(int32(s.sess.Phase(i)))
	if f, ok := s.sess.Core().FlushLSN(i); ok {
		l.flush.Store(uint64(f))
	}
}

// publishLinks is publishLink for every safekeeper, and the term: a
// greeting (which may start the campaign) and the election change the
// others' phases too.
func (s *driver) publishLinks() {
	for i := range s.sks {
		s.publishLink(i)
	}
	s.stats.term.Store(s.sess.Core().Ballot().Term)
}

// newerConfiguration is the configuration a safekeeper's refusal for the
// timeline's configuration carries (SQLSTATE SK001 or SK002, with it as
// JSON in Detail; README_PROTO.md, rule 9), as a *session.ConfigurationError
// if it is newer than generation ours; nil otherwise.
func newerConfiguration(err error, i int, ours uint64) *session.ConfigurationError {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || (pe.Code != sqlstateStaleGeneration && pe.Code != sqlstateNotMember) {
		return nil
	}
	c, perr := proto.ParseConfigurationDetail(pe.Detail)
	if perr != nil || c.Generation <= ours {
		return nil
	}
	return &session.ConfigurationError{Safekeeper: i, Configuration: c, Ours: ours}
}
