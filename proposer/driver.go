package proposer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto"
)

// tick is the owner's timer resolution for heartbeats, status updates and
// buffer trimming.
const tick = 50 * time.Millisecond

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
	log := cfg.Logger
	bo := backoff{min: cfg.ReconnectMin, max: cfg.ReconnectMax}
	var lastTerm uint64
	for {
		s := newSession(cfg, lastTerm)
		err := s.run(ctx)
		lastTerm = max(lastTerm, s.core.MaxTermSeen())
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrDeposed) || errors.Is(err, ErrDuplicateSafekeeper) {
			return nameDeposed(err, cfg.Safekeepers)
		}
		if permanentUpstreamError(err) {
			return &RejectedError{Err: err}
		}
		if s.streamed {
			bo.reset()
		}
		d := bo.next()
		log.Warn("proposer session ended; reconnecting and starting a new term", "err", err, "term", s.core.Ballot().Term, "retry_in", d)
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

// session is one connection to the primary and one term: greet, elect,
// stream. It ends with the first primary failure, refused vote or deposal.
type session struct {
	cfg  Config
	log  *slog.Logger
	core *Core

	up       *upstream
	slot     *slotKeeper
	ui       upstreamInfo
	si       proto.ServerInfo
	links    *skLinks
	sks      []*skState
	buf      *walBuffer
	upEvents chan upstreamEvent
	cuEvents chan catchupEvent

	// baseCommit is the highest commit_lsn a safekeeper reported: durable
	// on a quorum in an earlier term, so it may be reported to the primary
	// as flushed before this term's commit_lsn catches up.
	baseCommit proto.LSN
	lastStatus time.Time
	lastCommit proto.LSN // commit reported in the last status update
	streamed   bool      // WAL reached a quorum in this session
	catchups   int       // catch-up streams started (their ids)
	started    time.Time
}

type skState struct {
	i, gen      int
	out         chan []byte // nil while disconnected
	phase       skPhase
	pendingVote *proto.VoteResponse
	sent        proto.LSN // end of WAL queued to it in this term
	inflight    int       // requests without a response yet
	hbPending   int       // responses due until the last commit heartbeat is answered (0: none unanswered)
	lastSend    time.Time
	sentCommit  proto.LSN
	sentTrunc   proto.LSN
	cu          *catchup
	cuRetryAt   time.Time
	cuBackoff   backoff
}

type skPhase int

const (
	skDown skPhase = iota
	skGreeted
	skVoting
	skStreaming
	skParked // cannot join this term (ErrCannotJoin)
)

type upstreamEvent struct {
	m   upstreamMsg
	err error
}

func newSession(cfg Config, lastTerm uint64) *session {
	s := &session{cfg: cfg, log: cfg.Logger, core: NewCore(len(cfg.Safekeepers), cfg.ProposerUUID)}
	s.core.ObserveTerm(lastTerm)
	for i := range cfg.Safekeepers {
		s.sks = append(s.sks, &skState{i: i, cuBackoff: backoff{min: cfg.ReconnectMin, max: cfg.ReconnectMax}})
	}
	return s
}

func (s *session) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.started = time.Now()
	up, err := dialUpstream(ctx, "primary", s.cfg.Upstream, s.cfg.ApplicationName, s.cfg.ConnectTimeout)
	if err != nil {
		return err
	}
	s.up = up
	defer up.close()
	if s.ui, err = up.identify(ctx); err != nil {
		return err
	}
	if s.ui.RestartLSN, err = up.ensureSlot(ctx, s.cfg.SlotName); err != nil {
		return err
	}
	slot := newSlotKeeper(s.cfg.Upstream, s.cfg.SlotName, s.ui.RestartLSN, s.log)
	s.slot = slot
	slotDone := make(chan struct{})
	go func() { defer close(slotDone); slot.run(ctx) }()
	defer func() { cancel(); <-slotDone }()
	s.log.Info("connected to primary", "system_id", s.ui.SystemID, "timeline", s.ui.Timeline, "flush", s.ui.XLogPos,
		"wal_segment_size", s.ui.SegSize, "server_version_num", s.ui.PgVersion, "slot", s.cfg.SlotName, "slot_restart_lsn", s.ui.RestartLSN)
	s.si = proto.ServerInfo{
		ProtocolVersion: proto.ProtocolVersion, PgVersion: s.ui.PgVersion, SystemID: s.ui.SystemID,
		TenantID: s.cfg.TenantID, TimelineID: s.cfg.TimelineID, PgTimeline: s.ui.Timeline,
		WalSegSize: s.ui.SegSize, ProposerUUID: s.cfg.ProposerUUID, WalEnd: s.ui.XLogPos,
	}
	s.links = &skLinks{
		addrs: s.cfg.Safekeepers, si: &s.si, queueCap: s.cfg.MaxInFlight + 16, log: s.log,
		bo:     backoff{min: s.cfg.ReconnectMin, max: s.cfg.ReconnectMax},
		events: make(chan skEvent, 256),
		dial: DialConfig{TenantID: s.cfg.TenantID, TimelineID: s.cfg.TimelineID,
			ApplicationName: s.cfg.ApplicationName, ConnectTimeout: s.cfg.ConnectTimeout},
	}
	s.upEvents = make(chan upstreamEvent, 64)
	s.cuEvents = make(chan catchupEvent, 16)
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

// loop is the owner: the only goroutine that touches the core, the buffer
// and the safekeeper states.
func (s *session) loop(ctx context.Context) error {
	t := time.NewTicker(tick)
	defer t.Stop()
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
				return ev.err
			}
			if err := s.onUpstream(ctx, ev.m); err != nil {
				return err
			}
		case ev := <-s.cuEvents:
			s.onCatchup(ctx, ev)
		case now := <-t.C:
			if s.core.Election() == nil && now.After(electionDeadline) {
				return fmt.Errorf("%w: no quorum of votes within %v (%d greeted, %d granted of %d)",
					ErrNoQuorum, s.cfg.ElectionTimeout, s.core.Greetings(), s.core.Grants(), s.core.N())
			}
			if err := s.onTick(ctx, now); err != nil {
				return err
			}
		}
	}
}

func (s *session) send(sk *skState, m proto.Message) {
	if sk.out == nil {
		return
	}
	select {
	case sk.out <- m.Encode(nil):
	default:
		// Cannot happen: inflight bounds the queue. Treat as a broken link.
		s.log.Error("safekeeper send queue full; dropping the connection", "safekeeper", s.cfg.Safekeepers[sk.i])
		s.disconnect(sk)
	}
}

func (s *session) disconnect(sk *skState) {
	if sk.out != nil {
		close(sk.out)
		sk.out = nil
	}
	s.dropCatchup(sk)
	sk.phase, sk.pendingVote, sk.inflight, sk.hbPending = skDown, nil, 0, 0
	sk.gen = -sk.gen // ignore the rest of this connection's events
	s.core.Disconnected(sk.i)
}

func (s *session) onSafekeeper(ctx context.Context, ev skEvent) error {
	sk := s.sks[ev.sk]
	addr := s.cfg.Safekeepers[ev.sk]
	if ev.out != nil { // a new, greeted connection
		if sk.out != nil {
			s.disconnect(sk)
		}
		sk.gen, sk.out, sk.phase, sk.inflight, sk.hbPending = ev.gen, ev.out, skGreeted, 0, 0
		s.baseCommit = max(s.baseCommit, ev.info.CommitLSN)
		s.log.Info("safekeeper greeted", "safekeeper", addr, "id", ev.info.SafekeeperID, "voted_for", ev.info.VotedFor.String(),
			"last_log_term", ev.info.LastLogTerm, "flush_lsn", ev.info.FlushLSN, "commit_lsn", ev.info.CommitLSN)
		if err := s.core.Greeted(ev.sk, ev.info); err != nil {
			return err
		}
		if s.core.Ballot().Term != 0 {
			s.requestVote(sk)
			return nil
		}
		if s.core.Greetings() >= s.core.Quorum() {
			b, err := s.core.Campaign()
			if err != nil {
				return err
			}
			s.log.Info("campaigning", "term", b.Term, "uuid", b.UUID.String())
			for _, o := range s.sks {
				if o.phase == skGreeted {
					s.requestVote(o)
				}
			}
		}
		return nil
	}
	if ev.gen != sk.gen {
		return nil // a dropped connection's leftovers
	}
	if ev.err != nil {
		s.log.Warn("safekeeper disconnected", "safekeeper", addr, "err", ev.err)
		s.disconnect(sk)
		return nil
	}
	switch m := ev.msg.(type) {
	case *proto.VoteResponse:
		if sk.phase != skVoting || sk.pendingVote != nil {
			s.log.Error("unexpected vote verdict; dropping the connection", "safekeeper", addr)
			s.disconnect(sk)
			return nil
		}
		if m.VotedFor != s.core.Ballot() {
			_, err := s.core.Voted(ev.sk, m, nil)
			if errors.Is(err, ErrCannotJoin) {
				s.log.Warn("safekeeper voted for another candidate of our term; it sits out this term", "safekeeper", addr, "err", err)
				sk.phase = skParked
				return nil
			}
			return err
		}
		sk.pendingVote = m
	case *proto.SafeKeeperInfo:
		if sk.pendingVote == nil {
			s.log.Error("unexpected SafeKeeperInfo; dropping the connection", "safekeeper", addr)
			s.disconnect(sk)
			return nil
		}
		v := sk.pendingVote
		sk.pendingVote = nil
		s.baseCommit = max(s.baseCommit, m.CommitLSN)
		quorum, err := s.core.Voted(ev.sk, v, m)
		if err != nil {
			return err
		}
		s.log.Info("vote granted", "safekeeper", addr, "term", v.VotedFor.Term, "last_log_term", m.LastLogTerm, "flush_lsn", m.FlushLSN)
		if s.core.Election() != nil {
			s.startSafekeeper(sk)
			return nil
		}
		if quorum {
			return s.elect(ctx)
		}
	case *proto.SafeKeeperResponse:
		if sk.phase != skStreaming || sk.inflight == 0 {
			s.log.Error("unexpected SafeKeeperResponse; dropping the connection", "safekeeper", addr)
			s.disconnect(sk)
			return nil
		}
		sk.inflight--
		if sk.hbPending > 0 {
			sk.hbPending--
		}
		advanced, err := s.core.Response(ev.sk, m)
		if err != nil {
			return err
		}
		if advanced {
			if !s.streamed {
				s.streamed = true
				s.log.Info("quorum reached the term start; streaming", "commit_lsn", s.core.CommitLSN(), "since_connect", time.Since(s.started).Round(time.Millisecond))
			}
			s.sendStatus(false)
		}
		s.pump(ctx, sk)
		// Readers of a safekeeper get WAL only up to its commit_lsn: tell
		// every safekeeper the new one now, not at the next tick (Neon's
		// walproposer broadcasts it the same way).
		if advanced {
			for _, o := range s.sks {
				s.sendCommit(o)
			}
		} else {
			s.sendCommit(sk) // it may have had a heartbeat unanswered when commit_lsn advanced
		}
	default:
		s.log.Error("unexpected message; dropping the connection", "safekeeper", addr, "type", fmt.Sprintf("%T", m))
		s.disconnect(sk)
	}
	return nil
}

func (s *session) requestVote(sk *skState) {
	sk.phase = skVoting
	s.send(sk, &proto.RequestVote{Candidate: s.core.Ballot()})
}

// elect decides the election, sends ProposerElected to every voter and
// starts the primary's stream.
func (s *session) elect(ctx context.Context) error {
	// The primary's flush position read at connect time is stale by now if
	// another proposer kept streaming meanwhile: read it again, or the
	// donor's WAL would look like WAL the primary lost.
	if pos, err := s.up.flushPos(ctx); err != nil {
		return err
	} else if pos > s.ui.XLogPos {
		s.ui.XLogPos = pos
	}
	newStart := s.ui.RestartLSN
	if newStart == 0 || newStart > s.ui.XLogPos {
		newStart = s.ui.XLogPos
	}
	newStart = newStart.SegmentStart(uint64(s.ui.SegSize))
	e, err := s.core.Elect(s.ui.XLogPos, newStart)
	if err != nil {
		return err
	}
	s.log.Info("elected", "term", e.Term, "donor", s.cfg.Safekeepers[e.Donor], "term_start_lsn", e.TermStartLSN,
		"timeline_start_lsn", e.TimelineStartLSN, "new_timeline", e.NewTimeline, "history", fmt.Sprint(e.History))
	from := e.TermStartLSN
	for _, sk := range s.sks {
		if sk.phase == skVoting && s.core.Granted(sk.i) {
			s.startSafekeeper(sk)
			if sk.phase == skStreaming {
				from = min(from, sk.sent)
			}
		}
	}
	// Do not ask the primary for WAL its slot no longer guarantees; a
	// safekeeper that needs older WAL gets it from a catch-up stream.
	if keep := s.ui.RestartLSN.SegmentStart(uint64(s.ui.SegSize)); s.ui.RestartLSN != 0 && from < keep {
		from = min(keep, e.TermStartLSN)
	}
	// The stream runs without the slot: the slot is held at truncate_lsn by
	// the slot keeper, while this stream reports commit_lsn as flushed.
	if err := s.up.startReplication(ctx, "", from, s.ui.Timeline); err != nil {
		return err
	}
	s.log.Info("streaming from primary", "start", from)
	s.buf = newWALBuffer(from)
	s.sendStatus(true)
	go func() {
		for {
			m, err := s.up.recv(ctx)
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
	for _, sk := range s.sks {
		s.pump(ctx, sk)
	}
	return nil
}

// startSafekeeper sends ProposerElected to a safekeeper that granted the
// elected ballot on its current connection.
func (s *session) startSafekeeper(sk *skState) {
	pe, err := s.core.ProposerElected(sk.i)
	if err != nil {
		s.log.Error("safekeeper cannot join this term", "safekeeper", s.cfg.Safekeepers[sk.i], "err", err)
		sk.phase = skParked
		return
	}
	s.send(sk, pe)
	sk.phase, sk.sent = skStreaming, pe.StartStreamingAt
	sk.sentCommit, sk.sentTrunc, sk.hbPending = 0, 0, 0
	s.log.Info("safekeeper streaming", "safekeeper", s.cfg.Safekeepers[sk.i], "start_streaming_at", pe.StartStreamingAt)
}

func (s *session) onUpstream(ctx context.Context, m upstreamMsg) error {
	if m.wal != nil {
		if err := s.buf.add(m.start, m.wal); err != nil {
			return err
		}
		for _, sk := range s.sks {
			s.pump(ctx, sk)
		}
		if s.buf.size > s.cfg.BufferSize {
			s.trim()
		}
		return nil
	}
	if m.replyRequested {
		s.sendStatus(true)
	}
	return nil
}

// pump queues WAL to a streaming safekeeper while its pipeline has room:
// from the catch-up stream while it is behind the buffer, else from the
// buffer.
func (s *session) pump(ctx context.Context, sk *skState) {
	if sk.phase != skStreaming || s.buf == nil {
		return
	}
	for sk.inflight < s.cfg.MaxInFlight {
		if sk.cu != nil {
			if sk.sent >= s.buf.start {
				s.log.Info("safekeeper caught up with the buffer", "safekeeper", s.cfg.Safekeepers[sk.i], "at", sk.sent)
				s.dropCatchup(sk)
				continue
			}
			if !s.feedCatchup(sk) {
				return
			}
			continue
		}
		if sk.sent < s.buf.start {
			s.startCatchup(ctx, sk)
			return
		}
		d := s.buf.read(sk.sent, proto.MaxWALPerRequest)
		if d == nil {
			return
		}
		s.sendRequest(sk, d)
	}
}

func (s *session) sendRequest(sk *skState, wal []byte) {
	req := s.core.Request(sk.sent, wal)
	s.send(sk, req)
	sk.sent = req.EndLSN
	sk.inflight++
	sk.lastSend = time.Now()
	sk.sentCommit, sk.sentTrunc = req.CommitLSN, req.TruncateLSN
}

// sendCommit sends a heartbeat carrying the current commit_lsn to a
// streaming safekeeper that has no WAL left to send (one with WAL gets
// commit_lsn with it) and was not sent this commit_lsn yet. At most one such
// heartbeat is unanswered per safekeeper: a newer commit_lsn waits for its
// response, so a busy quorum cannot flood an idle safekeeper.
func (s *session) sendCommit(sk *skState) {
	if sk.phase != skStreaming || s.buf == nil || sk.cu != nil || sk.sent < s.buf.end ||
		sk.inflight >= s.cfg.MaxInFlight || sk.hbPending > 0 || sk.sentCommit == s.core.CommitLSN() {
		return
	}
	s.sendRequest(sk, nil)
	sk.hbPending = sk.inflight // answered once every request queued so far is
}

func (s *session) onTick(ctx context.Context, now time.Time) error {
	if s.buf == nil {
		return nil
	}
	commit, trunc := s.core.CommitLSN(), s.core.TruncateLSN()
	for _, sk := range s.sks {
		if sk.phase != skStreaming {
			continue
		}
		if sk.cu == nil && sk.sent < s.buf.start || sk.cu != nil && sk.cu.pending != nil {
			s.pump(ctx, sk) // a retry after a failed catch-up, or a stalled pipeline
		}
		idle := sk.cu == nil && sk.sent >= s.buf.end
		if idle && sk.inflight < s.cfg.MaxInFlight &&
			(now.Sub(sk.lastSend) >= s.cfg.HeartbeatInterval || sk.sentCommit != commit || sk.sentTrunc != trunc) {
			s.sendRequest(sk, nil) // heartbeat: begin = end
		}
	}
	if now.Sub(s.lastStatus) >= s.cfg.StatusInterval {
		s.sendStatus(true)
	}
	s.trim()
	return nil
}

// trim drops buffered WAL no safekeeper needs: below every known flush_lsn,
// or, when the buffer is over BufferSize, up to what a quorum was sent (the
// ones behind then catch up from a separate stream).
func (s *session) trim() {
	need := s.buf.end
	for i := range s.sks {
		if f, ok := s.core.FlushLSN(i); ok {
			need = min(need, f)
		}
	}
	if s.buf.end-need > proto.LSN(s.cfg.BufferSize) {
		var sent []proto.LSN
		for _, sk := range s.sks {
			if sk.phase == skStreaming && sk.cu == nil {
				sent = append(sent, sk.sent)
			}
		}
		q := s.buf.start
		if len(sent) >= s.core.Quorum() {
			sortLSNs(sent)
			q = sent[len(sent)-s.core.Quorum()]
		}
		need = max(need, min(s.buf.end-proto.LSN(s.cfg.BufferSize), q))
	}
	s.buf.trim(need)
}

func sortLSNs(l []proto.LSN) {
	for i := 1; i < len(l); i++ {
		for j := i; j > 0 && l[j] < l[j-1]; j-- {
			l[j], l[j-1] = l[j-1], l[j]
		}
	}
}

// sendStatus sends a standby status update: write = WAL received from the
// primary, flush = quorum commit_lsn (what the primary's synchronous commits
// wait for), apply = 0 (the proposer applies nothing; remote_apply commits
// would wait forever, which is the honest answer). force sends it even if
// commit_lsn did not move.
func (s *session) sendStatus(force bool) {
	if s.buf == nil {
		return
	}
	flush := max(s.core.CommitLSN(), s.baseCommit)
	flush = min(flush, s.buf.end)
	if !force && flush == s.lastCommit {
		return
	}
	if err := s.up.sendStatus(s.buf.end, flush, 0, time.Now()); err != nil {
		s.log.Debug("standby status update failed", "err", err) // the reader reports the broken connection
	}
	s.lastStatus, s.lastCommit = time.Now(), flush
	s.slot.offer(min(s.core.TruncateLSN(), flush))
}
