package acceptor

import (
	"errors"
	"fmt"

	"github.com/safekeeper/safekeeper/proto"
)

// ConnID names one WAL push connection of a Session. The caller chooses
// them; an id is never reused within a Session's life.
type ConnID uint64

// Out is one thing to send on a connection: a reply (Msg), or the error
// that ends the connection (Err: send it as an ErrorResponse, then close;
// the Session processes nothing more from that connection).
type Out struct {
	Conn ConnID
	Msg  proto.Message
	Err  error
}

// Ready is what one Session call produced, to be acted on in this order:
// first publish State (when set) to whatever reads the timeline, then send
// Out, in order. What it reports is durable already: the Session commits
// before it answers (rules 2 and 6). Publishing first means that a reader
// never sees less than a proposer has been told.
type Ready struct {
	// State is the new state to serve readers from (Acceptor.InMem), set
	// when it changed since the last Ready that carried one: durable, except
	// that its CommitLSN and TruncateLSN may be ahead of the disk until
	// Persist (WAL up to that CommitLSN is durable all the same).
	State *State
	// Out are the replies and errors, in the order they must be sent.
	Out []Out
	// Failed is the storage failure that stopped the session in this call
	// (nil if none did): log it.
	Failed error
	// Recovered is set when this call rebuilt a stopped session from what
	// is durable: log it.
	Recovered bool
}

// Ends reports whether r ends connection c (an Out with an error for it).
func (r Ready) Ends(c ConnID) bool {
	for _, out := range r.Out {
		if out.Conn == c && out.Err != nil {
			return true
		}
	}
	return false
}

// Session is the WAL push protocol of one timeline on one safekeeper, over
// all its connections: the one entry point that the server's timeline owner
// and the deterministic simulation both drive. Around the Acceptor it holds
//
//   - the per-connection message order (ServerInfo, RequestVote,
//     ProposerElected, then SafeKeeperRequests; rule 8: a message out of
//     order ends its connection) and the ballot each connection was granted;
//   - the group commit: Step only stages a SafeKeeperRequest; Flush commits
//     everything staged, of every connection, in one Storage.Commit and
//     answers each request, in order (rule 6). Any other message first
//     commits and answers what is staged, so replies stay in order, and so
//     does the end of a connection (End; rule 7);
//   - the storage-failure path: when a commit fails, every waiting request's
//     connection ends with the error (nothing it sent since the last commit
//     is acknowledged) and the Acceptor is stopped. Greetings are refused
//     with the error until one finds the storage writable: then the Acceptor
//     is rebuilt from what is durable (Storage.Load, New) and serves again.
//
// Like Acceptor it does no IO and keeps no clock. It is not safe for
// concurrent use: one owner drives it.
type Session struct {
	cfg   Config
	store Storage
	hooks hooks

	acc *Acceptor // nil only when the timeline opened broken
	st  State     // the durable state while acc is nil
	// broken is the storage failure that stopped the acceptor; nil while
	// healthy.
	broken error

	conns map[ConnID]*sessionConn
	// waiting lists, in order, the connection of every staged request.
	waiting []ConnID

	// pubAcc and pubVersion identify the last state handed out in a Ready
	// (or by NewSession): a new one is handed out when either changes.
	pubAcc     *Acceptor
	pubVersion uint64
}

// sessionConn is what a Session keeps of one connection.
type sessionConn struct {
	order  order
	ballot proto.Ballot // granted on this connection
	dead   bool         // ended by an error: nothing more from it counts
	// pgTLI is the PostgreSQL timeline its ServerInfo named; history is
	// set once its TimelineHistory came, sw when that asks for a switch.
	pgTLI   uint32
	history bool
	sw      *pgSwitch
	// gen is the generation its ServerInfo named: the connection acts in
	// it, and is refused once the timeline's configuration is newer
	// (rule 9).
	gen uint64
}

// NewSession starts the session of a timeline from its durable state st:
// New builds the Acceptor (durably cutting WAL above flush_lsn). When that
// write fails — storage that cannot write, such as a full disk after a
// restart — the session still starts, broken: State is st, and greetings are
// refused until the storage works again (see Session). Errors other than
// storage failures are returned.
func NewSession(cfg Config, st State, store Storage) (*Session, error) {
	return newSession(cfg, st, store, hooks{})
}

func newSession(cfg Config, st State, store Storage, h hooks) (*Session, error) {
	s := &Session{cfg: cfg, store: store, hooks: h, st: st.Clone()}
	acc, err := newAcceptor(cfg, st, store, h)
	switch {
	case err == nil:
		s.acc = acc
		s.pubAcc, s.pubVersion = acc, acc.version
	case errors.Is(err, ErrStorage):
		s.broken = err
	default:
		return nil, err
	}
	return s, nil
}

// State returns a copy of the durable state.
func (s *Session) State() State {
	if s.acc == nil {
		return s.st.Clone()
	}
	return s.acc.State()
}

// InMem returns the state to serve readers from (Acceptor.InMem).
func (s *Session) InMem() State {
	if s.acc == nil {
		return s.st.Clone()
	}
	return s.acc.InMem()
}

// Unpersisted reports whether a commit_lsn or truncate_lsn is held in
// memory only: the owner calls Persist within 100 ms (Acceptor.Unpersisted).
func (s *Session) Unpersisted() bool { return s.acc != nil && s.broken == nil && s.acc.Unpersisted() }

// Persist makes durable what is staged (answering it, as Flush does) and
// the commit_lsn and truncate_lsn held in memory. The owner calls it at most
// 100 ms after Unpersisted became true, and before it stops.
func (s *Session) Persist() Ready {
	var r Ready
	s.flush(&r)
	if s.broken == nil && s.acc.Unpersisted() {
		if err := s.acc.Persist(); err != nil {
			s.storageFailed(&r, err)
		}
	}
	s.noteState(&r)
	return r
}

// Broken returns the storage failure that stopped the session, nil while it
// is healthy.
func (s *Session) Broken() error { return s.broken }

// Pending is how many staged SafeKeeperRequests wait for Flush.
func (s *Session) Pending() int { return len(s.waiting) }

// Step handles message m from connection c (a new id starts a new
// connection, which must open with ServerInfo). A SafeKeeperRequest's WAL is
// staged in Storage, which may keep it by reference: leave it unchanged
// until the next Flush (or End) returns.
func (s *Session) Step(c ConnID, m proto.Message) Ready {
	var r Ready
	sc := s.conns[c]
	if sc == nil {
		if s.conns == nil {
			s.conns = map[ConnID]*sessionConn{}
		}
		sc = &sessionConn{}
		s.conns[c] = sc
	}
	if sc.dead {
		return r
	}
	s.step(&r, c, sc, m)
	s.noteState(&r)
	return r
}

func (s *Session) step(r *Ready, c ConnID, sc *sessionConn, m proto.Message) {
	next, err := sc.order.next(m)
	if _, isAppend := m.(*proto.SafeKeeperRequest); err != nil || !isAppend {
		// Anything but a request is answered at once: what is staged is
		// made durable and answered first, so replies stay in order.
		s.flush(r)
	}
	if err != nil {
		s.fail(r, c, err)
		return
	}
	sc.order = next
	if s.broken != nil {
		if _, greeting := m.(*proto.ServerInfo); greeting {
			s.rebuild(r)
		}
		if s.broken != nil {
			s.fail(r, c, s.broken)
			return
		}
	}
	switch m := m.(type) {
	case *proto.ServerInfo:
		info, err := s.acc.ServerInfo(m)
		if err != nil {
			s.refuse(r, c, err)
			return
		}
		sc.pgTLI = m.PgTimeline
		sc.gen = m.Configuration.Generation
		s.reply(r, c, info)
	case *proto.TimelineHistory:
		if sc.history {
			s.fail(r, c, fmt.Errorf("%w: a second TimelineHistory", ErrProtocol))
			return
		}
		sw, err := s.acc.TimelineHistory(sc.pgTLI, m)
		if err != nil {
			s.refuse(r, c, err)
			return
		}
		sc.history, sc.sw = true, sw
	case *proto.RequestVote:
		if err := s.acc.CheckGeneration(sc.gen); err != nil {
			s.refuse(r, c, err)
			return
		}
		if stored := s.acc.st.PgTimeline; sc.pgTLI > stored && sc.sw == nil {
			s.refuse(r, c, fmt.Errorf("%w: ServerInfo named PostgreSQL timeline %d, newer than this timeline's %d: its TimelineHistory must come before RequestVote",
				ErrIncompatible, sc.pgTLI, stored))
			return
		}
		verdict, info, err := s.acc.RequestVote(m)
		if verdict != nil {
			s.reply(r, c, verdict)
		}
		if err != nil {
			s.refuse(r, c, err)
			return
		}
		sc.ballot = m.Candidate
		sc.sw.view(info)
		s.reply(r, c, info)
	case *proto.ProposerElected:
		if err := s.acc.CheckGeneration(sc.gen); err != nil {
			s.refuse(r, c, err)
			return
		}
		if err := s.acc.proposerElected(sc.ballot, m, sc.sw); err != nil {
			s.refuse(r, c, err)
		}
	case *proto.SafeKeeperRequest:
		if err := s.acc.CheckGeneration(sc.gen); err != nil {
			s.refuse(r, c, err)
			return
		}
		if err := s.acc.Append(m); err != nil {
			s.refuse(r, c, err)
			return
		}
		if s.hooks.replyBeforeFlush {
			s.reply(r, c, s.acc.stagedResponse()) // PLANTED BUG (hooks.go)
			return
		}
		s.waiting = append(s.waiting, c)
	}
}

// SetConfiguration adopts configuration c if its generation is above the
// stored one (Acceptor.SetConfiguration): what a membership change pushes
// to a safekeeper. What is staged is made durable and answered first.
// Connections greeted in an older generation are refused from their next
// message on. It returns the configuration now stored.
func (s *Session) SetConfiguration(c proto.Configuration) (Ready, proto.Configuration, error) {
	var r Ready
	s.flush(&r)
	if s.broken != nil {
		return r, s.st.Configuration.Clone(), s.broken
	}
	_, err := s.acc.SetConfiguration(c)
	if errors.Is(err, ErrStorage) {
		s.storageFailed(&r, err)
	}
	s.noteState(&r)
	return r, s.acc.Configuration(), err
}

// TermBump raises voted_for to term if it is below (Acceptor.TermBump);
// what is staged is made durable and answered first. It returns the term
// before and the one after.
func (s *Session) TermBump(term uint64) (r Ready, previous, current uint64, err error) {
	s.flush(&r)
	if s.broken != nil {
		return r, s.st.VotedFor.Term, s.st.VotedFor.Term, s.broken
	}
	previous, err = s.acc.TermBump(term)
	if errors.Is(err, ErrStorage) {
		s.storageFailed(&r, err)
	}
	s.noteState(&r)
	return r, previous, s.acc.State().VotedFor.Term, err
}

// Flush is the group commit: it makes every staged request durable in one
// Storage.Commit and answers each, in order. Call it when no message is
// ready (the server: after every batch of queued messages).
func (s *Session) Flush() Ready {
	var r Ready
	s.flush(&r)
	s.noteState(&r)
	return r
}

// End is the end of connection c's stream, by CopyDone, an error or a
// dropped socket: what it (and every other connection) sent is made
// durable and answered first (rule 7). Then c is forgotten.
func (s *Session) End(c ConnID) Ready {
	var r Ready
	s.flush(&r)
	delete(s.conns, c)
	if len(s.conns) == 0 {
		s.conns = nil // Go maps do not shrink: an idle timeline keeps none
	}
	s.noteState(&r)
	return r
}

func (s *Session) flush(r *Ready) {
	if s.broken != nil {
		return // the waiting connections were failed with it
	}
	resp, n, err := s.acc.Flush()
	if err != nil {
		s.storageFailed(r, err)
		return
	}
	if n != len(s.waiting) {
		panic(fmt.Sprintf("acceptor: %d requests staged, %d connections waiting", n, len(s.waiting)))
	}
	for _, c := range s.waiting {
		s.reply(r, c, resp)
	}
	s.waiting = s.waiting[:0]
}

// refuse ends c with err; a storage failure also stops the session.
func (s *Session) refuse(r *Ready, c ConnID, err error) {
	if errors.Is(err, ErrStorage) {
		s.storageFailed(r, err)
	}
	s.fail(r, c, err)
}

// storageFailed stops the session: every waiting connection ends with err,
// since nothing it sent after the last commit is durable.
func (s *Session) storageFailed(r *Ready, err error) {
	if s.broken == nil {
		r.Failed = err
	}
	s.broken = err
	for _, c := range s.waiting {
		s.fail(r, c, err)
	}
	s.waiting = s.waiting[:0]
}

// rebuild replaces a stopped acceptor with one built from the durable state
// (New discards what was staged and never committed).
func (s *Session) rebuild(r *Ready) {
	st, err := s.store.Load()
	if err != nil {
		s.broken = storageError(err)
		return
	}
	acc, err := newAcceptor(s.cfg, st, s.store, s.hooks)
	if err != nil {
		s.broken = storageError(err)
		return
	}
	s.acc, s.broken = acc, nil
	r.Recovered = true
}

func storageError(err error) error {
	if errors.Is(err, ErrStorage) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrStorage, err)
}

func (s *Session) reply(r *Ready, c ConnID, m proto.Message) {
	if sc := s.conns[c]; sc != nil && !sc.dead {
		r.Out = append(r.Out, Out{Conn: c, Msg: m})
	}
}

func (s *Session) fail(r *Ready, c ConnID, err error) {
	if sc := s.conns[c]; sc != nil && !sc.dead {
		sc.dead = true
		r.Out = append(r.Out, Out{Conn: c, Err: err})
	}
}

// noteState hands out the durable state in r if it changed since the last
// one handed out.
func (s *Session) noteState(r *Ready) {
	if s.acc == nil || (s.acc == s.pubAcc && s.acc.version == s.pubVersion) {
		return
	}
	st := s.acc.InMem()
	r.State = &st
	s.pubAcc, s.pubVersion = s.acc, s.acc.version
}

// Greeting returns m as the ServerInfo that must open a WAL push stream, or
// the error a Session gives a connection whose first message is another:
// a server that routes connections to timelines by their greeting checks
// the first message with it.
func Greeting(m proto.Message) (*proto.ServerInfo, error) {
	var o order
	if _, err := o.next(m); err != nil {
		return nil, err
	}
	return m.(*proto.ServerInfo), nil
}

// order is where a connection is in the message order of the WAL push
// protocol.
type order int

const (
	wantServerInfo order = iota
	wantVote
	wantElected
	streaming
)

func (o order) next(m proto.Message) (order, error) {
	bad := func(what string) (order, error) {
		return o, fmt.Errorf("%w: %s out of order: expected %s", ErrProtocol, what, [...]string{
			"ServerInfo", "RequestVote", "ProposerElected", "SafeKeeperRequest"}[o])
	}
	switch m.(type) {
	case *proto.ServerInfo:
		if o != wantServerInfo {
			return bad("ServerInfo")
		}
		return wantVote, nil
	case *proto.TimelineHistory:
		if o != wantVote {
			return bad("TimelineHistory")
		}
		return wantVote, nil
	case *proto.RequestVote:
		if o != wantVote {
			return bad("RequestVote")
		}
		return wantElected, nil
	case *proto.ProposerElected:
		if o != wantElected {
			return bad("ProposerElected")
		}
		return streaming, nil
	case *proto.SafeKeeperRequest:
		if o != streaming {
			return bad("SafeKeeperRequest")
		}
		return streaming, nil
	}
	return bad("message")
}
