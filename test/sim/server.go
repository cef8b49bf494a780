package sim

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
)

// server is one simulated safekeeper process with one timeline: the real
// acceptor.Session on its disk. The process around it is only transport,
// as in the server: decoding a frame (an undecodable one ends the stream,
// after the session made durable and answered what came before it), the
// group flush when the world schedules it, and carrying out each Ready
// (the session's replies and errors, in order). Every decision — message
// order, flush before reply, the storage-failure path — is the session's.
type server struct {
	w   *World
	idx int
	cfg acceptor.Config
	// disk is the timeline's storage; nil while this safekeeper does not
	// hold the timeline (a safekeeper outside its configuration, until a
	// greeting or the controller creates it there).
	disk  *disk
	full  bool              // the disk is full (a fault): every commit fails
	alive bool              // the process runs
	sess  *acceptor.Session // nil while down or without the timeline
	// conns are the connections the session knows, by id.
	conns map[acceptor.ConnID]*conn
}

func (s *server) up() bool { return s.alive }

// setFull fills or frees the disk.
func (s *server) setFull(full bool) {
	s.full = full
	if s.disk != nil {
		s.disk.full = full
	}
}

// errNoTimeline is the refusal of a greeting for a timeline this
// safekeeper does not hold when START_WAL_PUSH did not allow creating it
// (SQLSTATE 42704, README_PROTO.md rule 1).
var errNoTimeline = errors.New("sim: the timeline does not exist on this safekeeper (42704)")

// create creates the timeline here in configuration conf, as a greeting
// does (rule 1: atomically, with the greeting's configuration) and as the
// controller's pull does for a new member: empty, in the configuration it
// pushes. On a full disk nothing is created.
func (s *server) create(conf proto.Configuration, by string) error {
	if s.full {
		return fmt.Errorf("%w: creating the timeline: %w", acceptor.ErrStorage, errDiskFull)
	}
	si := s.w.serverInfo
	si.Configuration = conf
	s.disk = newDisk(acceptor.NewState(&si))
	s.disk.full = s.full
	s.w.count("sk: timeline created by " + by)
	s.w.tracef("sk%d: timeline created by %s in %s", s.idx, by, conf)
	s.start()
	return nil
}

// receive handles the next frame of c (the head of c.toSK).
func (s *server) receive(c *conn, f frame) {
	id := acceptor.ConnID(c.id)
	if f.eof {
		// A dropped connection also flushes what was received (rule 7).
		if s.sess != nil {
			s.act(s.sess.End(id))
		}
		delete(s.conns, id)
		c.sOpen = false
		return
	}
	if c.dead {
		return
	}
	s.conns[id] = c
	m, err := proto.DecodeProposerMessage(f.payload)
	if err != nil {
		if s.sess != nil {
			s.act(s.sess.End(id))
		}
		s.fail(c, fmt.Errorf("%w: %w", acceptor.ErrProtocol, err))
		return
	}
	if s.sess == nil {
		// The server routes a stream to its timeline by the greeting
		// (acceptor.Greeting); a timeline it does not hold is created
		// only when the stream allows it.
		si, err := acceptor.Greeting(m)
		switch {
		case err != nil:
			s.fail(c, err)
			return
		case !c.create:
			s.fail(c, errNoTimeline)
			return
		}
		if err := s.create(si.Configuration, "a greeting"); err != nil {
			s.fail(c, err)
			return
		}
	}
	r := s.sess.Step(id, m)
	switch m := m.(type) {
	case *proto.RequestVote:
		for _, out := range r.Out {
			if v, ok := out.Msg.(*proto.VoteResponse); ok && out.Conn == id && v.VotedFor == m.Candidate {
				s.w.chk.granted(s, c, m.Candidate)
				s.w.tracef("sk%d conn%d: granted %s", s.idx, c.id, m.Candidate)
			}
		}
	case *proto.ProposerElected:
		if !r.Ends(id) {
			s.w.count("sk: ProposerElected accepted")
			s.w.tracef("sk%d conn%d: ProposerElected term %d start_streaming_at %s accepted", s.idx, c.id, m.Term, m.StartStreamingAt)
		}
	}
	s.act(r)
}

// flush is the owner's group commit.
func (s *server) flush() {
	s.act(s.sess.Flush())
}

// persist is the owner's timer making the commit_lsn and truncate_lsn held
// in memory durable.
func (s *server) persist() {
	s.w.count("sk: commit_lsn persisted lazily")
	s.act(s.sess.Persist())
}

// act carries out a Ready: every reply is checked against the disk at the
// moment it is sent (invariant 7), then queued to the proposer.
func (s *server) act(r acceptor.Ready) {
	if r.Failed != nil {
		s.w.count("sk: storage failed")
		s.w.tracef("sk%d: storage failed: %v", s.idx, r.Failed)
	}
	if r.Recovered {
		s.w.count("sk: rebuilt after a storage failure")
		s.w.tracef("sk%d: rebuilt from its disk after a storage failure", s.idx)
	}
	responses := 0
	for _, out := range r.Out {
		c := s.conns[out.Conn]
		if c == nil {
			continue
		}
		if out.Err != nil {
			s.fail(c, out.Err)
			continue
		}
		switch m := out.Msg.(type) {
		case *proto.SafeKeeperInfo, *proto.SafeKeeperResponse:
			s.w.chk.reply(s, c, m)
		}
		if resp, ok := out.Msg.(*proto.SafeKeeperResponse); ok {
			if responses == 0 {
				s.w.tracef("sk%d: responses: term %d flush %s commit %s", s.idx, resp.Term, resp.FlushLSN, resp.CommitLSN)
			}
			responses++
		}
		s.send(c, out.Msg)
	}
	s.disk.settle()
}

// send queues m to the proposer of c, unless either end closed c.
func (s *server) send(c *conn, m proto.Message) {
	if !c.pOpen || !c.sOpen || c.dead {
		return
	}
	c.toP = append(c.toP, frame{payload: m.Encode(nil)})
}

// fail answers err and closes c: nothing more it sent is read, and the end
// of its stream reaches the session next (as the server's reader ends once
// the writer closed the socket), with what was in flight to it lost.
func (s *server) fail(c *conn, err error) {
	if c.dead {
		return
	}
	c.dead = true
	s.w.count(errorClass(err))
	s.w.tracef("sk%d conn%d: ErrorResponse %v", s.idx, c.id, err)
	if c.pOpen && c.sOpen {
		f := frame{err: err.Error()}
		// As server/errors.go: a refusal for the configuration carries
		// the one held, as JSON in Detail, with SK001 or SK002.
		var ce *acceptor.ConfigurationError
		if errors.As(err, &ce) {
			switch {
			case errors.Is(err, acceptor.ErrStaleGeneration):
				f.code = "SK001"
			case errors.Is(err, acceptor.ErrNotMember):
				f.code = "SK002"
			default:
				f.code = "22023"
			}
			b, jerr := json.Marshal(ce.Configuration)
			if jerr != nil {
				s.w.violate(Harness, "sk%d: configuration %s as JSON: %v", s.idx, ce.Configuration, jerr)
			}
			f.detail = proto.ConfigurationDetail + string(b)
		}
		c.toP = append(c.toP, f)
	}
	if c.sOpen {
		c.toSK = []frame{{eof: true}}
		c.eofQueued = true
	}
}

func errorClass(err error) string {
	for _, e := range []error{acceptor.ErrVoteRefused, acceptor.ErrStaleTerm, acceptor.ErrCommonPointMismatch,
		acceptor.ErrTruncateCommitted, acceptor.ErrStaleGeneration, acceptor.ErrNotMember, acceptor.ErrIncompatible,
		acceptor.ErrStorage, acceptor.ErrProtocol, errNoTimeline} {
		if errors.Is(err, e) {
			return "sk error: " + e.Error()
		}
	}
	return "sk error: other"
}

// crash is kill -9: staged writes are lost and every connection ends. What
// the process had already sent may still reach the proposer (the kernel
// sends the socket buffer, then FIN) or not (RST): the seed decides, per
// connection.
func (s *server) crash() {
	if s.sess != nil && s.sess.Unpersisted() {
		s.w.count("sk: crash lost a commit_lsn held in memory")
	}
	if s.disk != nil {
		s.disk.crash()
	}
	s.alive = false
	s.sess = nil
	s.conns = nil
	for _, c := range s.w.conns {
		if c.s != s.idx || c.closed() {
			continue
		}
		if c.pOpen && c.sOpen && len(c.toP) > 0 && s.w.rng.IntN(2) == 0 {
			c.toSK = nil
			c.sOpen = false
			c.toP = append(c.toP, frame{eof: true})
			continue
		}
		s.w.cut(c, false)
	}
}

// restart starts the session again from what is durable on the same disk.
// On a full disk it starts broken (the session's first write, the cut above
// flush_lsn, fails) and recovers at a greeting once the disk has room.
func (s *server) restart() {
	s.alive = true
	s.conns = map[acceptor.ConnID]*conn{}
	if s.disk != nil {
		s.start()
	}
}

// start starts the timeline's session from what is durable.
func (s *server) start() {
	st, err := s.disk.verify()
	if err != nil {
		s.w.violate(Harness, "sk%d: %v", s.idx, err)
		return
	}
	var store acceptor.Storage = s.disk
	if s.w.cfg.WrapStorage != nil {
		store = s.w.cfg.WrapStorage(store)
	}
	newSession := acceptor.NewSession
	if s.w.cfg.NewSession != nil {
		newSession = s.w.cfg.NewSession
	}
	sess, err := newSession(s.cfg, st, store)
	if err != nil {
		s.w.violate(Harness, "sk%d: restart: %v", s.idx, err)
		return
	}
	if sess.Broken() != nil {
		s.w.count("sk: restarted on a full disk")
	}
	s.sess = sess
	s.disk.settle()
}

// membership is the membership call (PUT .../membership) of request m:
// Session.SetConfiguration, on a timeline created first if this safekeeper
// does not hold it (as the controller's pull would). The answer is the
// configuration held afterwards, the term and the position.
func (s *server) membership(m *ctlMsg) *ctlMsg {
	a := &ctlMsg{ctl: m.ctl, sk: s.idx, answer: true}
	if s.sess == nil {
		if s.disk != nil { // cannot be: a held timeline runs while the process does
			s.w.violate(Harness, "sk%d: up with a timeline but no session", s.idx)
			return a
		}
		if err := s.create(m.conf, "the controller"); err != nil {
			a.err = err.Error()
			return a
		}
	}
	r, held, err := s.sess.SetConfiguration(m.conf)
	s.act(r)
	if err != nil {
		a.err = err.Error()
		return a
	}
	st := s.sess.State()
	a.conf, a.term, a.pos = held, st.VotedFor.Term, position{st.LastLogTerm(), st.FlushLSN}
	if !held.Equal(st.Configuration) {
		s.w.violate(Harness, "sk%d: the membership call answers %s, the state holds %s", s.idx, held, st.Configuration)
	}
	return a
}

// termBump is the term bump (POST .../term_bump) of request m:
// Session.TermBump. A safekeeper that does not hold the timeline refuses
// (404); the answer is as the membership call's.
func (s *server) termBump(m *ctlMsg) *ctlMsg {
	a := &ctlMsg{ctl: m.ctl, sk: s.idx, answer: true}
	if s.sess == nil {
		a.err = errNoTimeline.Error()
		return a
	}
	r, _, current, err := s.sess.TermBump(m.term)
	s.act(r)
	if err != nil {
		a.err = err.Error()
		return a
	}
	s.w.count("sk: term bumped")
	st := s.sess.State()
	a.conf, a.term, a.pos = st.Configuration, current, position{st.LastLogTerm(), st.FlushLSN}
	return a
}
