package sim

import (
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
	w    *World
	idx  int
	cfg  acceptor.Config
	disk *disk
	sess *acceptor.Session // nil while down
	// conns are the connections the session knows, by id.
	conns map[acceptor.ConnID]*conn
}

func (s *server) up() bool { return s.sess != nil }

// receive handles the next frame of c (the head of c.toSK).
func (s *server) receive(c *conn, f frame) {
	id := acceptor.ConnID(c.id)
	if f.eof {
		// A dropped connection also flushes what was received (rule 7).
		s.act(s.sess.End(id))
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
		s.act(s.sess.End(id))
		s.fail(c, fmt.Errorf("%w: %w", acceptor.ErrProtocol, err))
		return
	}
	r := s.sess.Step(id, m)
	switch m := m.(type) {
	case *proto.RequestVote:
		for _, out := range r.Out {
			if v, ok := out.Msg.(*proto.VoteResponse); ok && out.Conn == id && v.VotedFor == m.Candidate {
				s.w.chk.granted(s, m.Candidate)
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
			s.w.chk.reply(s, m)
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
		c.toP = append(c.toP, frame{err: err.Error()})
	}
	if c.sOpen {
		c.toSK = []frame{{eof: true}}
		c.eofQueued = true
	}
}

func errorClass(err error) string {
	for _, e := range []error{acceptor.ErrVoteRefused, acceptor.ErrStaleTerm, acceptor.ErrCommonPointMismatch,
		acceptor.ErrTruncateCommitted, acceptor.ErrIncompatible, acceptor.ErrStorage, acceptor.ErrProtocol} {
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
	if s.up() && s.sess.Unpersisted() {
		s.w.count("sk: crash lost a commit_lsn held in memory")
	}
	s.disk.crash()
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
	s.conns = map[acceptor.ConnID]*conn{}
	s.disk.settle()
}
