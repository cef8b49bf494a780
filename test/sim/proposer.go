package sim

import (
	"errors"
	"fmt"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
)

// simProposer is a walproposer reduced to its decisions: proposer.Core makes
// them, and this driver does what proposer/driver.go does around it, step
// for step — greet every safekeeper, campaign once a quorum greeted, ask each
// greeted one for its vote, elect on a quorum of grants, send each voter its
// ProposerElected, stream WAL in requests of at most 128 KiB with a bounded
// number in flight, send heartbeats carrying commit_lsn, forget a
// connection's state when it breaks and redo greeting, vote and
// ProposerElected on the next one. A refused vote or no election in time ends
// the session; the next session campaigns above every term it saw. Deposed,
// the real driver stops; here the proposer is "restarted by its operator"
// a while later, which is how competing proposers keep rising terms.
type simProposer struct {
	w    *World
	idx  int
	uuid proto.ID

	lastTerm  uint64 // highest term any earlier session saw
	core      *proposer.Core
	links     []*link
	log       *termLog // own term's WAL, after the election
	deadline  int      // step by which the session must be elected
	idleUntil int      // no session: step at which the next one starts
	stopped   bool     // liveness phase: this proposer no longer runs
}

type linkPhase int

const (
	linkDown linkPhase = iota
	linkGreeting
	linkGreeted
	linkVoting
	linkStreaming
	linkParked // cannot join this term (ErrCannotJoin)
)

type link struct {
	c           *conn
	phase       linkPhase
	pendingVote *proto.VoteResponse
	sent        proto.LSN // end of WAL sent in this term
	inflight    int
	lastSend    int // step
	sentCommit  proto.LSN
	sentTrunc   proto.LSN
}

const maxInFlight = 4

func (p *simProposer) active() bool { return p.core != nil }

func (p *simProposer) elected() bool { return p.core != nil && p.core.Election() != nil }

// startSession begins a new term: connect to every safekeeper.
func (p *simProposer) startSession() {
	p.core = proposer.NewCore(len(p.w.sks), p.uuid)
	p.core.ObserveTerm(p.lastTerm)
	p.log = nil
	p.links = make([]*link, len(p.w.sks))
	for i := range p.links {
		p.links[i] = &link{}
	}
	p.deadline = p.w.step + 200 + p.w.rng.IntN(200)
	p.w.tracef("p%d: new session (terms seen up to %d)", p.idx, p.lastTerm)
	for i := range p.links {
		p.connect(i)
	}
}

// endSession closes every connection; the next session starts after idle
// steps.
func (p *simProposer) endSession(why error, idle int) {
	if p.core == nil {
		return
	}
	p.w.tracef("p%d: session of term %d ends: %v", p.idx, p.core.Ballot().Term, why)
	p.lastTerm = max(p.lastTerm, p.core.MaxTermSeen())
	for i := range p.links {
		p.close(i)
	}
	p.w.chk.proposerCommit(p) // last look at what it committed
	p.core, p.links, p.log = nil, nil, nil
	p.idleUntil = p.w.step + idle
}

// connect opens a connection to safekeeper i and greets it.
func (p *simProposer) connect(i int) {
	l := p.links[i]
	if l.c != nil || !p.w.sks[i].up() {
		return // a connection to a down host fails at once
	}
	l.c = p.w.dial(p.idx, i)
	l.phase = linkGreeting
	p.send(l, &p.w.serverInfo)
}

// close closes the proposer's end of link i's connection: what it sent is
// still delivered, then the safekeeper sees EOF.
func (p *simProposer) close(i int) {
	l := p.links[i]
	if l.c != nil {
		p.w.closeByProposer(l.c)
	}
	p.disconnected(i)
}

// disconnected is driver.disconnect: forget the connection's state.
func (p *simProposer) disconnected(i int) {
	l := p.links[i]
	l.c, l.phase, l.pendingVote, l.inflight = nil, linkDown, nil, 0
	p.core.Disconnected(i)
}

func (p *simProposer) send(l *link, m proto.Message) {
	if l.c == nil {
		return
	}
	l.c.toSK = append(l.c.toSK, frame{payload: m.Encode(nil)})
}

// receive handles the next frame from safekeeper i on connection c.
func (p *simProposer) receive(c *conn, f frame) {
	if !p.active() {
		return
	}
	i := c.s
	l := p.links[i]
	if l.c != c {
		return // a dropped connection's leftovers
	}
	if f.err != "" || f.eof {
		p.w.tracef("p%d: sk%d closed conn%d: %q", p.idx, i, c.id, f.err)
		c.pOpen = false
		p.disconnected(i)
		return
	}
	m, err := proto.DecodeSafeKeeperMessage(f.payload)
	if err != nil {
		p.w.failf("p%d: undecodable message from sk%d: %v", p.idx, i, err)
		return
	}
	if err := p.handle(i, l, m); err != nil {
		p.sessionError(err)
	}
}

func (p *simProposer) sessionError(err error) {
	idle := 5 + p.w.rng.IntN(40)
	if errors.Is(err, proposer.ErrDeposed) {
		p.w.count("p: deposed")
		idle = 50 + p.w.rng.IntN(300)
	} else if errors.Is(err, proposer.ErrVoteRefused) {
		p.w.count("p: vote refused")
	}
	p.endSession(err, idle)
}

func (p *simProposer) handle(i int, l *link, m proto.Message) error {
	switch m := m.(type) {
	case *proto.SafeKeeperInfo:
		switch {
		case l.phase == linkGreeting:
			l.phase = linkGreeted
			if err := p.core.Greeted(i, m); err != nil {
				return err
			}
			if p.core.Ballot().Term != 0 {
				p.requestVote(l)
				return nil
			}
			if p.core.Greetings() >= p.core.Quorum() {
				b, err := p.core.Campaign()
				if err != nil {
					return err
				}
				p.w.tracef("p%d: campaigning with %s", p.idx, b)
				for _, o := range p.links {
					if o.phase == linkGreeted {
						p.requestVote(o)
					}
				}
			}
			return nil
		case l.pendingVote != nil:
			v := l.pendingVote
			l.pendingVote = nil
			quorum, err := p.core.Voted(i, v, m)
			if err != nil {
				return err
			}
			if p.core.Election() != nil {
				p.startSafekeeper(i)
				return nil
			}
			if quorum {
				return p.elect()
			}
			return nil
		}
	case *proto.VoteResponse:
		if l.phase != linkVoting || l.pendingVote != nil {
			break
		}
		if m.VotedFor != p.core.Ballot() {
			_, err := p.core.Voted(i, m, nil)
			return err
		}
		l.pendingVote = m
		return nil
	case *proto.SafeKeeperResponse:
		if l.phase != linkStreaming || l.inflight == 0 {
			break
		}
		l.inflight--
		advanced, err := p.core.Response(i, m)
		if err != nil {
			return err
		}
		if advanced {
			p.w.chk.proposerCommit(p)
		}
		p.pump(i)
		return nil
	}
	p.w.tracef("p%d: unexpected %T from sk%d; dropping the connection", p.idx, m, i)
	p.close(i)
	return nil
}

func (p *simProposer) requestVote(l *link) {
	l.phase = linkVoting
	p.send(l, &proto.RequestVote{Candidate: p.core.Ballot()})
}

// elect decides the election and opens this term's WAL at term_start_lsn.
func (p *simProposer) elect() error {
	e, err := p.core.Elect(^proto.LSN(0), p.w.tlStart)
	if err != nil {
		return err
	}
	p.w.count("p: elected")
	p.w.tracef("p%d: elected %s donor sk%d term_start %s history %v", p.idx, p.core.Ballot(), e.Donor, e.TermStartLSN, e.History)
	if err := p.w.chk.elected(p, e); err != nil {
		p.w.failf("%v", err)
		return nil
	}
	prev, err := p.w.wal.prevRecord(e.History, e.TermStartLSN)
	if err != nil {
		p.w.failf("p%d elected with term_start_lsn %s: %v", p.idx, e.TermStartLSN, err)
		return nil
	}
	p.log = p.w.wal.startTerm(e.Term, e.TermStartLSN, prev)
	for i, l := range p.links {
		if l.phase == linkVoting && p.core.Granted(i) {
			p.startSafekeeper(i)
		}
	}
	return nil
}

// startSafekeeper sends ProposerElected to a safekeeper that granted the
// elected ballot on its current connection.
func (p *simProposer) startSafekeeper(i int) {
	l := p.links[i]
	pe, err := p.core.ProposerElected(i)
	if err != nil {
		p.w.count("p: safekeeper cannot join")
		p.w.tracef("p%d: sk%d cannot join: %v", p.idx, i, err)
		l.phase = linkParked
		return
	}
	p.send(l, pe)
	l.phase, l.sent = linkStreaming, pe.StartStreamingAt
	l.sentCommit, l.sentTrunc = 0, 0
	p.pump(i)
}

// walEnd is the end of the WAL this proposer can stream.
func (p *simProposer) walEnd() proto.LSN {
	if p.log == nil {
		return 0
	}
	return p.log.end()
}

// pump sends WAL to a streaming safekeeper while its pipeline has room. The
// request size is random (1 byte .. 128 KiB), so requests end inside
// records and inside page headers.
func (p *simProposer) pump(i int) {
	l := p.links[i]
	if l.phase != linkStreaming {
		return
	}
	for l.inflight < maxInFlight && l.sent < p.walEnd() {
		n := min(p.walEnd()-l.sent, proto.LSN(1+p.w.rng.IntN(proto.MaxWALPerRequest)))
		if p.w.rng.IntN(4) == 0 {
			n = min(p.walEnd()-l.sent, proto.MaxWALPerRequest)
		}
		wal, err := p.w.wal.read(p.core.Election().History, l.sent, l.sent+n)
		if err != nil {
			p.w.failf("p%d: its own history cannot be read: %v", p.idx, err)
			return
		}
		p.sendRequest(l, wal)
	}
}

func (p *simProposer) sendRequest(l *link, wal []byte) {
	req := p.core.Request(l.sent, wal)
	p.send(l, req)
	l.sent = req.EndLSN
	l.inflight++
	l.lastSend = p.w.step
	l.sentCommit, l.sentTrunc = req.CommitLSN, req.TruncateLSN
}

// tick is driver.onTick: heartbeats to idle safekeepers when commit_lsn or
// truncate_lsn moved or nothing was sent for a while; the election timeout.
func (p *simProposer) tick() {
	if !p.elected() {
		if p.w.step > p.deadline {
			p.w.count("p: election timeout")
			p.endSession(fmt.Errorf("%w: not elected in time", proposer.ErrNoQuorum), 1+p.w.rng.IntN(20))
		}
		return
	}
	commit, trunc := p.core.CommitLSN(), p.core.TruncateLSN()
	for i, l := range p.links {
		if l.phase != linkStreaming {
			continue
		}
		p.pump(i)
		if l.sent >= p.walEnd() && l.inflight < maxInFlight &&
			(p.w.step-l.lastSend >= 50 || l.sentCommit != commit || l.sentTrunc != trunc) {
			p.sendRequest(l, nil)
		}
	}
}

// generate appends a few records of new WAL (the primary writing) and
// streams them.
func (p *simProposer) generate() {
	for range 1 + p.w.rng.IntN(3) {
		n := p.w.rng.IntN(300)
		switch p.w.rng.IntN(50) {
		case 0:
			n = 8000 + p.w.rng.IntN(40000) // spans pages, often requests
		case 1, 2, 3, 4, 5:
			n = 300 + p.w.rng.IntN(3000)
		}
		p.log.record(n)
	}
	for i := range p.links {
		p.pump(i)
	}
}
