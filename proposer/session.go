package proposer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/safekeeper/safekeeper/proto"
)

// Session is the decision code of one proposer term around Core: for every
// safekeeper, where its connection is in the protocol (greeted, voting,
// streaming, sitting out the term), what was sent to it and what it still
// owes; when to campaign, when the election can be decided, what to send
// after it (ProposerElected, WAL in requests of at most MaxWALPerRequest
// with at most MaxInFlight unanswered, heartbeats carrying commit_lsn and
// truncate_lsn), and when a connection must be dropped.
//
// It does no IO and reads no clock (time comes in through Tick), like Core:
// Run and Sync drive it with real connections, the deterministic
// simulation drives it with simulated ones. Each call returns a Ready that
// the caller carries out in order. Safekeepers are named by their index in
// the configured list. Not safe for concurrent use.
type Session struct {
	core  *Core
	cfg   SessionConfig
	log   *slog.Logger
	src   WALSource
	links []link
	// quiet[i]: log safekeeper i's connection progress at debug (SetQuiet).
	quiet []bool
	now   time.Time // as of the last Tick

	// baseCommit is the highest commit_lsn a safekeeper reported: durable
	// on a quorum in an earlier term.
	baseCommit proto.LSN
}

// SessionConfig configures a Session.
type SessionConfig struct {
	// Names are the safekeepers' addresses, for the log; their number is the
	// number of safekeepers.
	Names []string
	// UUID owns the session's term.
	UUID proto.ID
	// LastTerm is the highest term an earlier session saw: the campaign
	// goes above it.
	LastTerm uint64
	// MaxInFlight bounds the SafeKeeperRequests awaiting a response per
	// safekeeper. Default (below 1) 256, as Config.MaxInFlight.
	MaxInFlight int
	// HeartbeatInterval is how long an idle safekeeper waits for a
	// heartbeat when neither commit_lsn nor truncate_lsn changed. Default
	// (zero or less) 200 ms.
	HeartbeatInterval time.Duration
	// Logger receives the session's decisions; nil discards them.
	Logger *slog.Logger
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
}

type linkPhase int

const (
	linkDown linkPhase = iota
	linkGreeted
	linkVoting
	linkStreaming
	linkParked // cannot join this term (ErrCannotJoin)
)

// link is what the session knows of one safekeeper's current connection.
type link struct {
	phase       linkPhase
	pendingVote *proto.VoteResponse // a grant whose fresh SafeKeeperInfo is due
	sent        proto.LSN           // end of WAL sent in this term
	inflight    int                 // requests without a response yet
	lastSend    time.Time
	sentCommit  proto.LSN
	sentTrunc   proto.LSN
	acked       proto.LSN // commit_lsn of its last SafeKeeperResponse
}

// NewSession starts a term's session; src is where it takes WAL after the
// election.
func NewSession(cfg SessionConfig, src WALSource) *Session {
	if cfg.MaxInFlight < 1 {
		cfg.MaxInFlight = 256
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 200 * time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Session{core: NewCore(len(cfg.Names), cfg.UUID), cfg: cfg, log: log, src: src, links: make([]link, len(cfg.Names)),
		quiet: make([]bool, len(cfg.Names))}
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
func (s *Session) Streaming(i int) bool { return s.links[i].phase == linkStreaming }

// Sent is the end of the WAL sent to safekeeper i in this term.
func (s *Session) Sent(i int) proto.LSN { return s.links[i].sent }

// InFlight is the number of SafeKeeperRequests sent to safekeeper i on its
// current connection that it has not answered yet.
func (s *Session) InFlight(i int) int { return s.links[i].inflight }

// Acked is the commit_lsn of safekeeper i's last SafeKeeperResponse.
func (s *Session) Acked(i int) proto.LSN { return s.links[i].acked }

// SetQuiet sets the level of the lines that follow safekeeper i's
// connection (greeted, vote granted, streaming): debug when quiet, info
// otherwise. The driver sets it for a reconnect after the same failure
// as the one before (skEvent.quiet): the link's held-back warning says
// the safekeeper keeps failing, and its reconnects say nothing new.
func (s *Session) SetQuiet(i int, quiet bool) { s.quiet[i] = quiet }

// linkLevel is the level of safekeeper i's connection lines.
func (s *Session) linkLevel(i int) slog.Level {
	if s.quiet[i] {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

// Greeted records a new connection to safekeeper i, which answered the
// greeting with info; a connection it had is forgotten. Once a quorum
// greeted, the session campaigns; after that every greeted safekeeper is
// asked for its vote.
func (s *Session) Greeted(i int, info *proto.SafeKeeperInfo) (Ready, error) {
	var r Ready
	if s.links[i].phase != linkDown {
		s.Disconnected(i)
	}
	s.links[i] = link{phase: linkGreeted}
	s.baseCommit = max(s.baseCommit, info.CommitLSN)
	s.log.Log(context.Background(), s.linkLevel(i), "safekeeper greeted", "safekeeper", s.cfg.Names[i], "id", info.SafekeeperID, "voted_for", info.VotedFor.String(),
		"last_log_term", info.LastLogTerm, "flush_lsn", info.FlushLSN, "commit_lsn", info.CommitLSN)
	if err := s.core.Greeted(i, info); err != nil {
		return r, err
	}
	if s.core.Ballot().Term != 0 {
		s.requestVote(&r, i)
		return r, nil
	}
	if s.core.Greetings() >= s.core.Quorum() {
		b, err := s.core.Campaign()
		if err != nil {
			return r, err
		}
		s.log.Info("campaigning", "term", b.Term, "uuid", b.UUID.String())
		for j := range s.links {
			if s.links[j].phase == linkGreeted {
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
	name := s.cfg.Names[i]
	switch m := m.(type) {
	case *proto.VoteResponse:
		if l.phase != linkVoting || l.pendingVote != nil {
			s.drop(&r, i, m)
			return r, nil
		}
		if m.VotedFor != s.core.Ballot() {
			_, err := s.core.Voted(i, m, nil)
			if errors.Is(err, ErrCannotJoin) {
				s.log.Warn("safekeeper voted for another candidate of our term; it sits out this term", "safekeeper", name, "err", err)
				l.phase = linkParked
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
		s.log.Log(context.Background(), s.linkLevel(i), "vote granted", "safekeeper", name, "term", v.VotedFor.Term, "last_log_term", m.LastLogTerm, "flush_lsn", m.FlushLSN)
		switch {
		case s.core.Election() != nil:
			s.startSafekeeper(&r, i)
			s.pump(&r, i)
		case quorum:
			r.Elect = true
		}
	case *proto.SafeKeeperResponse:
		if l.phase != linkStreaming || l.inflight == 0 {
			s.drop(&r, i, m)
			return r, nil
		}
		l.inflight--
		l.acked = m.CommitLSN
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
	s.log.Info("elected", "term", e.Term, "donor", s.cfg.Names[e.Donor], "term_start_lsn", e.TermStartLSN,
		"timeline_start_lsn", e.TimelineStartLSN, "new_timeline", e.NewTimeline, "history", fmt.Sprint(e.History))
	for i := range s.links {
		if s.links[i].phase == linkVoting && s.core.Granted(i) {
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
func (s *Session) Tick(now time.Time) Ready {
	var r Ready
	s.now = now
	if s.core.Election() == nil {
		return r
	}
	commit, trunc := s.core.CommitLSN(), s.core.TruncateLSN()
	for i := range s.links {
		l := &s.links[i]
		if l.phase != linkStreaming {
			continue
		}
		s.pump(&r, i)
		if l.sent >= s.src.End() && l.inflight < s.cfg.MaxInFlight &&
			(now.Sub(l.lastSend) >= s.cfg.HeartbeatInterval || l.sentCommit != commit || l.sentTrunc != trunc) {
			s.sendRequest(&r, i, nil) // heartbeat: begin = end
		}
	}
	return r
}

func (s *Session) requestVote(r *Ready, i int) {
	s.links[i].phase = linkVoting
	r.Sends = append(r.Sends, Send{To: i, Msg: &proto.RequestVote{Candidate: s.core.Ballot()}})
}

// startSafekeeper sends ProposerElected to a safekeeper that granted the
// elected ballot on its current connection.
func (s *Session) startSafekeeper(r *Ready, i int) {
	l := &s.links[i]
	pe, err := s.core.ProposerElected(i)
	if err != nil {
		s.log.Error("safekeeper cannot join this term", "safekeeper", s.cfg.Names[i], "err", err)
		l.phase = linkParked
		return
	}
	r.Sends = append(r.Sends, Send{To: i, Msg: pe})
	l.phase, l.sent = linkStreaming, pe.StartStreamingAt
	l.sentCommit, l.sentTrunc = 0, 0
	s.log.Log(context.Background(), s.linkLevel(i), "safekeeper streaming", "safekeeper", s.cfg.Names[i], "start_streaming_at", pe.StartStreamingAt)
}

// pump queues WAL to a streaming safekeeper while its pipeline has room.
func (s *Session) pump(r *Ready, i int) {
	l := &s.links[i]
	if l.phase != linkStreaming {
		return
	}
	for l.inflight < s.cfg.MaxInFlight {
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
	l.lastSend = s.now
	l.sentCommit, l.sentTrunc = req.CommitLSN, req.TruncateLSN
}

// drop forgets safekeeper i's connection, which sent m where the protocol
// has no place for it, and asks the caller to close it.
func (s *Session) drop(r *Ready, i int, m proto.Message) {
	s.log.Error("unexpected message from safekeeper; dropping the connection", "safekeeper", s.cfg.Names[i], "message", fmt.Sprintf("%T", m))
	s.Disconnected(i)
	r.Drop = append(r.Drop, i)
}
