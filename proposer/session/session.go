package session

import (
	"errors"
	"fmt"

	"github.com/safekeeper/safekeeper/proto"
)

// Session is the decision code of one proposer term around Core: for every
// safekeeper, where its connection is in the protocol (greeted, voting,
// streaming, sitting out the term), what was sent to it and what it still
// owes; when to campaign, when the election can be decided, what to send
// after it (ProposerElected, WAL in requests of at most MaxWALPerRequest
// with at most MaxInFlight unanswered and MaxInFlightBytes beyond the end
// of the last one answered, heartbeats carrying commit_lsn and
// truncate_lsn), and when a connection must be dropped.
//
// It does no IO, reads no clock (time comes in through Tick) and logs
// nothing, like Core: Run and Sync drive it with real connections, the
// deterministic simulation drives it with simulated ones. Each call
// returns a Ready that the caller carries out in order; what an operator
// should hear of comes back in Ready.Events, for the caller to log.
// Safekeepers are named by their index in the configured list. Not safe
// for concurrent use.
type Session struct {
	core  *Core
	cfg   Config
	src   WALSource
	links []link
	now   Instant // as of the last Tick
	// ticked: Tick was called; before, now means nothing.
	ticked bool

	// baseCommit is the highest commit_lsn a safekeeper reported: durable
	// on a quorum in an earlier term.
	baseCommit proto.LSN
}

// Config configures a Session.
type Config struct {
	// N is the number of safekeepers; they are named by their index
	// 0..N-1 (in Run, in the configured list).
	N int
	// UUID owns the session's term.
	UUID proto.ID
	// LastTerm is the highest term an earlier session saw: the campaign
	// goes above it.
	LastTerm uint64
	// MaxInFlight bounds the SafeKeeperRequests awaiting a response per
	// safekeeper. Default (below 1) 256, as proposer.Config.MaxInFlight.
	MaxInFlight int
	// MaxInFlightBytes bounds the WAL sent to a safekeeper beyond the end
	// of its last answered request (a SafeKeeperResponse answers one
	// request, in order, once that request's WAL is durable there): the
	// requests not yet answered queue in its socket and its disk's write
	// queue, and a response can come no sooner than that queue drains.
	// One request may always go while none is unanswered. Default (below
	// 1) 4 MiB, as proposer.Config.MaxInFlightBytes.
	MaxInFlightBytes int
	// HeartbeatInterval is how long an idle safekeeper waits for a
	// heartbeat when neither commit_lsn nor truncate_lsn changed. Default
	// (zero or less) 200 ms.
	HeartbeatInterval Duration
	// Configuration is the timeline's configuration the session proposes
	// in (generation 0: none; a quorum is a majority of the N), and IDs
	// the safekeeper_id expected at each index (nil, or 0 at an index:
	// learned from the greeting). See Core.Configure.
	Configuration proto.Configuration
	IDs           []uint64
	// Hooks plant bugs in the core (the simulation's planted-bug tests).
	Hooks Hooks
}

// WALSource is where a Session takes the WAL it streams. Its methods are
// called from inside Session calls, on the caller's goroutine; they may
// change the caller's own state (the driver notes there that a catch-up
// stream is needed, and starts it when it carries out the Ready).
type WALSource interface {
	// WAL returns WAL for safekeeper i from lsn on, at most max bytes, or
	// nil when none is available now (the caller calls Pump when more is).
	// The Session sends all of it, in one SafeKeeperRequest, before it
	// calls WAL again.
	WAL(i int, lsn proto.LSN, max int) []byte
	// End is the end of the WAL available: a safekeeper sent up to it is
	// idle, and gets heartbeats instead.
	End() proto.LSN
}

// Send is one message for safekeeper To.
type Send struct {
	To  int
	Msg proto.Message
}

// Ready is what one Session call decided, for the caller to carry out.
type Ready struct {
	// Sends are the messages to send, in order.
	Sends []Send
	// Drop lists safekeepers whose connection must be closed: it broke the
	// protocol, and the session has already forgotten it (as Disconnected).
	Drop []int
	// Advanced is set when commit_lsn advanced (tell the primary).
	Advanced bool
	// Elect is set when a quorum has granted the ballot: the caller calls
	// Elect, once it knows the end of WAL it can stream.
	Elect bool
	// Events are what the call decided that an operator should hear of, in
	// the order decided, for the caller to log. They are set even when the
	// call also returns an error (a greeting recorded, then found deposing).
	Events []Event
}

// Phase is where a safekeeper's current connection is in the session's
// term.
type Phase int

const (
	// PhaseDown: not connected (or dropped).
	PhaseDown Phase = iota
	// PhaseGreeted: greeted; no vote asked yet (no campaign).
	PhaseGreeted
	// PhaseVoting: asked for its vote.
	PhaseVoting
	// PhaseStreaming: sent ProposerElected; streamed to.
	PhaseStreaming
	// PhaseParked: cannot join this term (ErrCannotJoin).
	PhaseParked
)

// link is what the session knows of one safekeeper's current connection.
type link struct {
	phase       Phase
	pendingVote *proto.VoteResponse // a grant whose fresh SafeKeeperInfo is due
	sent        proto.LSN           // end of WAL sent in this term
	inflight    int                 // requests without a response yet
	// lastSend is when the last request went out, by the session's
	// clock; lastSendSet is false before the first request of the
	// connection, or if it went out before the first Tick: a heartbeat is
	// due at once.
	lastSend    Instant
	lastSendSet bool
	sentCommit  proto.LSN
	sentTrunc   proto.LSN
	acked       proto.LSN // commit_lsn of its last SafeKeeperResponse
	// ends[head:] are the EndLSNs of the requests awaiting a response,
	// oldest first; durable is the end of the last one answered, or where
	// streaming started: sent - durable is what MaxInFlightBytes bounds.
	// (Not flush_lsn, which stops at the last complete record: an
	// XLOG_SWITCH's record ends only with its 16 MiB segment's padding.)
	ends    []proto.LSN
	head    int
	durable proto.LSN
}

// DefaultMaxInFlightBytes is Config.MaxInFlightBytes's default.
const DefaultMaxInFlightBytes = 4 << 20

// New starts a term's session; src is where it takes WAL after the
// election.
func New(cfg Config, src WALSource) *Session {
	if cfg.MaxInFlight < 1 {
		cfg.MaxInFlight = 256
	}
	if cfg.MaxInFlightBytes < 1 {
		cfg.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 200 * Millisecond
	}
	s := &Session{core: NewCore(cfg.N, cfg.UUID), cfg: cfg, src: src, links: make([]link, cfg.N)}
	s.core.Configure(cfg.Configuration, cfg.IDs)
	s.core.SetHooks(cfg.Hooks)
	s.core.ObserveTerm(cfg.LastTerm)
	return s
}

// Core is the session's decision core (CommitLSN, Election, Ballot, ...).
func (s *Session) Core() *Core { return s.core }

// BaseCommit is the highest commit_lsn any safekeeper reported (greeting or
// vote): WAL below it is durable on a quorum from an earlier term.
func (s *Session) BaseCommit() proto.LSN { return s.baseCommit }

// Streaming reports whether safekeeper i accepted this term's
// ProposerElected on its current connection and is being streamed to.
func (s *Session) Streaming(i int) bool { return s.links[i].phase == PhaseStreaming }

// Sent is the end of the WAL sent to safekeeper i in this term.
func (s *Session) Sent(i int) proto.LSN { return s.links[i].sent }

// InFlight is the number of SafeKeeperRequests sent to safekeeper i on its
// current connection that it has not answered yet.
func (s *Session) InFlight(i int) int { return s.links[i].inflight }

// Acked is the commit_lsn of safekeeper i's last SafeKeeperResponse.
func (s *Session) Acked(i int) proto.LSN { return s.links[i].acked }

// Phase is where safekeeper i's current connection is in this term.
func (s *Session) Phase(i int) Phase { return s.links[i].phase }

// Greeted records a new connection to safekeeper i, which answered the
// greeting with info; a connection it had is forgotten. Once a quorum
// greeted, the session campaigns; after that every greeted safekeeper is
// asked for its vote.
func (s *Session) Greeted(i int, info *proto.SafeKeeperInfo) (Ready, error) {
	var r Ready
	if s.links[i].phase != PhaseDown {
		s.Disconnected(i)
	}
	s.links[i] = link{phase: PhaseGreeted}
	s.baseCommit = max(s.baseCommit, info.CommitLSN)
	r.Events = append(r.Events, Event{Kind: EventGreeted, Safekeeper: i, Info: info})
	if err := s.core.Greeted(i, info); err != nil {
		if errors.Is(err, ErrWrongSafekeeper) {
			r.Events = append(r.Events, Event{Kind: EventWrongSafekeeper, Safekeeper: i, Err: err})
			s.links[i] = link{}
			s.core.Disconnected(i)
			r.Drop = append(r.Drop, i)
			return r, nil
		}
		return r, err
	}
	if !s.core.Member(i) {
		r.Events = append(r.Events, Event{Kind: EventNotMember, Safekeeper: i,
			Err: fmt.Errorf("safekeeper_id %d is not a member of %s", info.SafekeeperID, s.core.Configuration())})
		s.links[i].phase = PhaseParked
		return r, nil
	}
	if s.core.Ballot().Term != 0 {
		s.requestVote(&r, i)
		return r, nil
	}
	if s.core.GreetedQuorum() {
		b, err := s.core.Campaign()
		if err != nil {
			return r, err
		}
		r.Events = append(r.Events, Event{Kind: EventCampaigning, Safekeeper: -1, Ballot: b})
		for j := range s.links {
			if s.links[j].phase == PhaseGreeted {
				s.requestVote(&r, j)
			}
		}
	}
	return r, nil
}

// Disconnected forgets safekeeper i's connection.
func (s *Session) Disconnected(i int) {
	s.links[i] = link{}
	s.core.Disconnected(i)
}

// Receive handles message m from safekeeper i's current connection. An
// error ends the session: a refused vote during the campaign
// (ErrVoteRefused), a higher term (a *DeposedError), a duplicate
// safekeeper; a message out of place only drops the connection (Ready.Drop).
func (s *Session) Receive(i int, m proto.Message) (Ready, error) {
	var r Ready
	l := &s.links[i]
	switch m := m.(type) {
	case *proto.VoteResponse:
		if l.phase != PhaseVoting || l.pendingVote != nil {
			s.drop(&r, i, m)
			return r, nil
		}
		if m.VotedFor != s.core.Ballot() {
			_, err := s.core.Voted(i, m, nil)
			if errors.Is(err, ErrCannotJoin) {
				r.Events = append(r.Events, Event{Kind: EventVotedForOther, Safekeeper: i, Err: err})
				l.phase = PhaseParked
				return r, nil
			}
			return r, err
		}
		l.pendingVote = m
	case *proto.SafeKeeperInfo:
		if l.pendingVote == nil {
			s.drop(&r, i, m)
			return r, nil
		}
		v := l.pendingVote
		l.pendingVote = nil
		s.baseCommit = max(s.baseCommit, m.CommitLSN)
		quorum, err := s.core.Voted(i, v, m)
		if err != nil {
			return r, err
		}
		r.Events = append(r.Events, Event{Kind: EventVoteGranted, Safekeeper: i, Info: m, Ballot: v.VotedFor})
		switch {
		case s.core.Election() != nil:
			s.startSafekeeper(&r, i)
			s.pump(&r, i)
		case quorum:
			r.Elect = true
		}
	case *proto.SafeKeeperResponse:
		if l.phase != PhaseStreaming || l.inflight == 0 {
			s.drop(&r, i, m)
			return r, nil
		}
		l.inflight--
		l.acked = m.CommitLSN
		l.answered()
		advanced, err := s.core.Response(i, m)
		if err != nil {
			return r, err
		}
		r.Advanced = advanced
		s.pump(&r, i)
		// A new commit_lsn reaches the safekeepers with the next
		// AppendRequest, or with a heartbeat from the next Tick (readers
		// of a safekeeper get WAL only up to its commit_lsn). It is not
		// broadcast at once, as Neon's walproposer does: under load the
		// primary's next WAL follows within a millisecond and carries it,
		// and the broadcast doubled the messages (and the safekeepers'
		// wake-ups) per commit. The driver ticks commitHeartbeatDelay
		// after an advance, so an idle safekeeper learns it that soon.
	default:
		s.drop(&r, i, m)
	}
	return r, nil
}

// Elect decides the election once Ready.Elect was set (Core.Elect says what
// upstreamEnd and newTimelineStart mean) and sends ProposerElected to every
// voter. It streams nothing yet: the caller sets up its WALSource, then
// calls PumpAll.
func (s *Session) Elect(upstreamEnd, newTimelineStart proto.LSN) (*Election, Ready, error) {
	var r Ready
	e, err := s.core.Elect(upstreamEnd, newTimelineStart)
	if err != nil {
		return nil, r, err
	}
	r.Events = append(r.Events, Event{Kind: EventElected, Safekeeper: -1, Election: e})
	for i := range s.links {
		if s.links[i].phase == PhaseVoting && s.core.Granted(i) {
			s.startSafekeeper(&r, i)
		}
	}
	return e, r, nil
}

// Pump sends safekeeper i what its pipeline has room for.
func (s *Session) Pump(i int) Ready {
	var r Ready
	s.pump(&r, i)
	return r
}

// PumpAll pumps every safekeeper.
func (s *Session) PumpAll() Ready {
	var r Ready
	for i := range s.links {
		s.pump(&r, i)
	}
	return r
}

// Tick advances the session's clock to now: it pumps every streaming
// safekeeper and sends a heartbeat to each idle one whose commit_lsn or
// truncate_lsn is stale or that heard nothing for HeartbeatInterval.
func (s *Session) Tick(now Instant) Ready {
	var r Ready
	s.now, s.ticked = now, true
	if s.core.Election() == nil {
		return r
	}
	commit, trunc := s.core.CommitLSN(), s.core.TruncateLSN()
	for i := range s.links {
		l := &s.links[i]
		if l.phase != PhaseStreaming {
			continue
		}
		s.pump(&r, i)
		if l.sent >= s.src.End() && l.inflight < s.cfg.MaxInFlight &&
			(!l.lastSendSet || now.Sub(l.lastSend) >= s.cfg.HeartbeatInterval || l.sentCommit != commit || l.sentTrunc != trunc) {
			s.sendRequest(&r, i, nil) // heartbeat: begin = end
		}
	}
	return r
}

func (s *Session) requestVote(r *Ready, i int) {
	s.links[i].phase = PhaseVoting
	r.Sends = append(r.Sends, Send{To: i, Msg: &proto.RequestVote{Candidate: s.core.Ballot()}})
}

// startSafekeeper sends ProposerElected to a safekeeper that granted the
// elected ballot on its current connection.
func (s *Session) startSafekeeper(r *Ready, i int) {
	l := &s.links[i]
	pe, err := s.core.ProposerElected(i)
	if err != nil {
		r.Events = append(r.Events, Event{Kind: EventCannotJoin, Safekeeper: i, Err: err})
		l.phase = PhaseParked
		return
	}
	r.Sends = append(r.Sends, Send{To: i, Msg: pe})
	l.phase, l.sent, l.durable = PhaseStreaming, pe.StartStreamingAt, pe.StartStreamingAt
	l.ends, l.head = l.ends[:0], 0
	l.sentCommit, l.sentTrunc = 0, 0
	r.Events = append(r.Events, Event{Kind: EventStreaming, Safekeeper: i, StartStreamingAt: pe.StartStreamingAt})
}

// pump queues WAL to a streaming safekeeper while its pipeline has room.
func (s *Session) pump(r *Ready, i int) {
	l := &s.links[i]
	if l.phase != PhaseStreaming {
		return
	}
	for l.inflight == 0 || (l.inflight < s.cfg.MaxInFlight && int(l.sent-l.durable) < s.cfg.MaxInFlightBytes) {
		wal := s.src.WAL(i, l.sent, proto.MaxWALPerRequest)
		if wal == nil {
			return
		}
		s.sendRequest(r, i, wal)
	}
}

func (s *Session) sendRequest(r *Ready, i int, wal []byte) {
	l := &s.links[i]
	req := s.core.Request(l.sent, wal)
	r.Sends = append(r.Sends, Send{To: i, Msg: req})
	l.sent = req.EndLSN
	l.inflight++
	l.ends = append(l.ends, req.EndLSN)
	l.lastSend, l.lastSendSet = s.now, s.ticked
	l.sentCommit, l.sentTrunc = req.CommitLSN, req.TruncateLSN
}

// answered takes the oldest unanswered request off ends: its WAL is
// durable on the safekeeper.
func (l *link) answered() {
	if l.head < len(l.ends) {
		l.durable = l.ends[l.head]
		l.head++
	}
	if l.head == len(l.ends) {
		l.ends, l.head = l.ends[:0], 0
	} else if l.head >= 64 && l.head*2 >= len(l.ends) {
		n := copy(l.ends, l.ends[l.head:])
		l.ends, l.head = l.ends[:n], 0
	}
}

// drop forgets safekeeper i's connection, which sent m where the protocol
// has no place for it, and asks the caller to close it.
func (s *Session) drop(r *Ready, i int, m proto.Message) {
	r.Events = append(r.Events, Event{Kind: EventDropped, Safekeeper: i, Msg: m})
	s.Disconnected(i)
	r.Drop = append(r.Drop, i)
}
