package sim

import (
	"errors"
	"fmt"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
)

// server is one simulated safekeeper process with one timeline: the real
// acceptor on its disk, driven like the server's timeline owner
// (cmd/safekeeper/server/timeline.go): messages of all connections are
// handled one at a time; a SafeKeeperRequest is only staged, and its
// SafeKeeperResponse goes out at the next group flush; every other message
// first flushes and answers what is staged, so replies stay in order; an
// error answers with ErrorResponse and closes the connection; a connection
// that ends (EOF) flushes what it sent.
type server struct {
	w    *World
	idx  int
	cfg  acceptor.Config
	disk *disk
	acc  *acceptor.Acceptor // nil while down
	// waiting lists, in order, the connection of every staged request.
	waiting []*conn
}

func (s *server) up() bool { return s.acc != nil }

// send queues m to the proposer of c, unless the proposer closed c.
func (s *server) send(c *conn, m proto.Message) {
	if !c.pOpen || !c.sOpen {
		return
	}
	c.toP = append(c.toP, frame{payload: m.Encode(nil)})
}

// fail answers err and closes c: nothing more it sent is read.
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
	c.sOpen = false
	c.toSK = nil
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

// flush is the owner's group commit: commit everything staged and answer
// every waiting request, in order.
func (s *server) flush() {
	resp, n, err := s.acc.Flush()
	if err != nil {
		s.w.failf("sk%d: Flush: %v", s.idx, err)
		return
	}
	if n != len(s.waiting) {
		s.w.failf("sk%d: acceptor answered %d staged requests, %d are waiting", s.idx, n, len(s.waiting))
		return
	}
	if n > 0 {
		s.w.chk.reply(s, resp)
		s.w.tracef("sk%d: flush, %d responses: term %d flush %s commit %s", s.idx, n, resp.Term, resp.FlushLSN, resp.CommitLSN)
	}
	for _, c := range s.waiting {
		s.send(c, resp)
	}
	s.waiting = s.waiting[:0]
}

// receive handles the next frame of c (the head of c.toSK).
func (s *server) receive(c *conn, f frame) {
	if f.eof {
		// A dropped connection also flushes what was received (rule 7).
		s.flush()
		c.sOpen = false
		return
	}
	if c.dead {
		return
	}
	m, err := proto.DecodeProposerMessage(f.payload)
	if err != nil {
		s.fail(c, fmt.Errorf("%w: %v", acceptor.ErrProtocol, err))
		return
	}
	// The reader checks the per-connection order before the owner sees
	// the message.
	if err := checkOrder(c, m); err != nil {
		s.fail(c, err)
		return
	}
	if _, isAppend := m.(*proto.SafeKeeperRequest); !isAppend {
		s.flush()
	}
	switch m := m.(type) {
	case *proto.ServerInfo:
		info, err := s.acc.ServerInfo(m)
		if err != nil {
			s.fail(c, err)
			return
		}
		s.w.chk.reply(s, info)
		s.send(c, info)
	case *proto.RequestVote:
		verdict, info, err := s.acc.RequestVote(m)
		if verdict != nil {
			if err == nil {
				s.w.chk.granted(s, m.Candidate)
			}
			s.send(c, verdict)
		}
		if err != nil {
			s.fail(c, err)
			return
		}
		c.ballot = m.Candidate
		s.w.chk.reply(s, info)
		s.send(c, info)
		s.w.tracef("sk%d conn%d: granted %s (flush %s, last_log_term %d)", s.idx, c.id, m.Candidate, info.FlushLSN, info.LastLogTerm)
	case *proto.ProposerElected:
		if err := s.acc.ProposerElected(c.ballot, m); err != nil {
			s.fail(c, err)
			return
		}
		s.w.count("sk: ProposerElected accepted")
		s.w.tracef("sk%d conn%d: ProposerElected term %d start_streaming_at %s accepted", s.idx, c.id, m.Term, m.StartStreamingAt)
	case *proto.SafeKeeperRequest:
		if err := s.acc.Append(m); err != nil {
			if errors.Is(err, acceptor.ErrStorage) {
				s.w.failf("sk%d: storage failed: %v", s.idx, err)
			}
			s.fail(c, err)
			return
		}
		s.waiting = append(s.waiting, c)
	}
}

func checkOrder(c *conn, m proto.Message) error {
	want := [...]string{"ServerInfo", "RequestVote", "ProposerElected", "SafeKeeperRequest"}[c.order]
	bad := func(what string) error {
		return fmt.Errorf("%w: %s out of order: expected %s", acceptor.ErrProtocol, what, want)
	}
	switch m.(type) {
	case *proto.ServerInfo:
		if c.order != pushWantServerInfo {
			return bad("ServerInfo")
		}
		c.order = pushWantVote
	case *proto.RequestVote:
		if c.order != pushWantVote {
			return bad("RequestVote")
		}
		c.order = pushWantElected
	case *proto.ProposerElected:
		if c.order != pushWantElected {
			return bad("ProposerElected")
		}
		c.order = pushStreaming
	case *proto.SafeKeeperRequest:
		if c.order != pushStreaming {
			return bad("SafeKeeperRequest")
		}
	default:
		return bad("message")
	}
	return nil
}

// crash is kill -9: staged writes are lost and every connection ends. What
// the process had already sent may still reach the proposer (the kernel
// sends the socket buffer, then FIN) or not (RST): the seed decides, per
// connection.
func (s *server) crash() {
	s.disk.crash()
	s.acc = nil
	s.waiting = nil
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

// restart rebuilds the acceptor from what is durable on the same disk.
func (s *server) restart() {
	st, err := s.disk.verify()
	if err != nil {
		s.w.failf("sk%d: %v", s.idx, err)
		return
	}
	a, err := acceptor.New(s.cfg, st, s.disk)
	if err != nil {
		s.w.failf("sk%d: restart: %v", s.idx, err)
		return
	}
	s.acc = a
}
