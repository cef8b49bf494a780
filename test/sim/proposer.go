package sim

import (
	"errors"
	"fmt"

	"github.com/safekeeper/safekeeper/proposer/session"
	"github.com/safekeeper/safekeeper/proto"
)

// simProposer is a walproposer whose every decision is the real
// proposer/session.Session's (and so its Core's): campaigning once a quorum
// greeted, asking each greeted safekeeper for its vote, electing on a
// quorum of grants, ProposerElected, streaming WAL with a bounded number of
// requests in flight, heartbeats carrying commit_lsn, dropping a connection
// that breaks the protocol. What is left here is the driver's IO, in
// simulation: connecting and greeting (proposer/safekeepers.go), the WAL
// source (its own term's WAL, in requests of random size), the election
// timeout, and — where the real driver stops when deposed — being
// "restarted by its operator" a while later, which is how competing
// proposers keep rising terms.
//
// Membership (README_PROTO.md, "Membership and generations"): a proposer
// greets in the configuration it knows and connects to its members and new
// members. A greeting answered with a newer configuration, or an SK001 or
// SK002 refusal carrying one, ends its session (*session.ConfigurationError)
// and the next one starts at once in that configuration, as proposer.Run
// does. A proposer that follows the store (`propose --etcd-endpoints`)
// reads it when a session starts — most of the time: a watch may lag. A
// static one (`propose --safekeepers`, every safekeeper listed) starts in
// generation 0, keeps what it adopted until its process restarts, and
// connects to every safekeeper, members or not.
type simProposer struct {
	w    *World
	idx  int
	uuid proto.ID
	// conf is the configuration it proposes in; static: it lists every
	// safekeeper and does not read the store.
	conf   proto.Configuration
	static bool

	lastTerm  uint64 // highest term any earlier session saw
	sess      *session.Session
	links     []*link
	log       *termLog // own term's WAL, after the election
	deadline  int      // step by which the session must be elected
	idleUntil int      // no session: step at which the next one starts
	stopped   bool     // liveness phase: this proposer no longer runs
}

// link is the connection to one safekeeper.
type link struct {
	c        *conn // nil while down
	greeting bool  // ServerInfo sent, its SafeKeeperInfo not yet received
}

const maxInFlight = 4

func (p *simProposer) active() bool { return p.sess != nil }

func (p *simProposer) elected() bool { return p.sess != nil && p.sess.Core().Election() != nil }

// startSession begins a new term: connect to every safekeeper of the
// configuration (of the list, for a static proposer).
func (p *simProposer) startSession() {
	w := p.w
	if w.store != nil && !p.static && (w.rng.IntN(4) != 0 || !w.faultsOn) {
		p.adopt(w.store.current())
	}
	ids := make([]uint64, len(w.sks))
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	p.sess = session.New(session.Config{
		N: len(w.sks), UUID: p.uuid, LastTerm: p.lastTerm, MaxInFlight: maxInFlight,
		HeartbeatInterval: 50 * stepTime, Configuration: p.conf.Clone(), IDs: ids, Hooks: w.cfg.ProposerHooks,
	}, p)
	p.log = nil
	p.links = make([]*link, len(w.sks))
	for i := range p.links {
		p.links[i] = &link{}
	}
	p.deadline = w.step + 200 + w.rng.IntN(200)
	w.tracef("p%d: new session (terms seen up to %d) in %s", p.idx, p.lastTerm, p.conf)
	for _, i := range p.targets() {
		p.connect(i)
	}
}

// targets are the safekeepers the proposer connects to: its
// configuration's, or every one (static, or generation 0).
func (p *simProposer) targets() []int {
	var out []int
	for i := range p.w.sks {
		if p.static || p.conf.Generation == 0 || p.conf.IsMember(uint64(i+1)) {
			out = append(out, i)
		}
	}
	return out
}

// adopt takes c if it is newer than the proposer's configuration (never
// an older one).
func (p *simProposer) adopt(c proto.Configuration) {
	if c.Generation > p.conf.Generation {
		p.w.tracef("p%d: adopts %s", p.idx, c)
		p.conf = c.Clone()
	}
}

// endSession closes every connection; the next session starts after idle
// steps.
func (p *simProposer) endSession(why error, idle int) {
	if p.sess == nil {
		return
	}
	p.w.tracef("p%d: session of term %d ends: %v", p.idx, p.sess.Core().Ballot().Term, why)
	p.lastTerm = max(p.lastTerm, p.sess.Core().MaxTermSeen())
	for i, l := range p.links {
		if l.c != nil {
			p.w.closeByProposer(l.c)
		}
		p.links[i] = &link{}
	}
	p.w.chk.proposerCommit(p) // last look at what it committed
	p.sess, p.links, p.log = nil, nil, nil
	p.idleUntil = p.w.step + idle
}

// connect opens a connection to safekeeper i and greets it.
func (p *simProposer) connect(i int) {
	l := p.links[i]
	if l.c != nil || !p.w.sks[i].up() {
		return // a connection to a down host fails at once
	}
	l.c = p.w.dial(p.idx, i)
	l.greeting = true
	// START_WAL_PUSH (allow_timeline_creation): only while another
	// safekeeper it is connected to holds the timeline (a new member, or a
	// replaced disk, joins), as proposer/safekeepers.go decides.
	for j, o := range p.links {
		if j != i && o.c != nil && !o.greeting {
			l.c.create = true
		}
	}
	l.c.gen = p.conf.Generation
	si := p.w.serverInfo
	si.Configuration = p.conf.Clone()
	p.send(i, &si)
}

// close closes the proposer's end of link i's connection (what it sent is
// still delivered, then the safekeeper sees EOF) and tells the session.
func (p *simProposer) close(i int) {
	p.closeConn(i)
	p.sess.Disconnected(i)
}

// closeConn closes link i's connection without telling the session (it
// asked for it, and already forgot the connection).
func (p *simProposer) closeConn(i int) {
	l := p.links[i]
	if l.c != nil {
		p.w.closeByProposer(l.c)
	}
	l.c, l.greeting = nil, false
}

// disconnected is the connection of link i breaking under the proposer.
func (p *simProposer) disconnected(i int) {
	l := p.links[i]
	l.c, l.greeting = nil, false
	p.sess.Disconnected(i)
}

func (p *simProposer) send(i int, m proto.Message) {
	if c := p.links[i].c; c != nil {
		c.toSK = append(c.toSK, frame{payload: m.Encode(nil)})
	}
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
		if ce := p.newerConfiguration(i, f); ce != nil {
			// The safekeeper switched to it under a running connection
			// (proposer/driver.go: newerConfiguration).
			p.sessionError(ce)
			return
		}
		p.disconnected(i)
		return
	}
	m, err := proto.DecodeSafeKeeperMessage(f.payload)
	if err != nil {
		p.w.violate(Harness, "p%d: undecodable message from sk%d: %v", p.idx, i, err)
		return
	}
	if l.greeting {
		// The connection layer's greeting, as proposer/safekeepers.go.
		info, ok := m.(*proto.SafeKeeperInfo)
		if !ok {
			p.w.tracef("p%d: sk%d answered the greeting with %T; dropping the connection", p.idx, i, m)
			p.closeConn(i)
			return
		}
		l.greeting = false
		p.act(p.sess.Greeted(i, info))
		return
	}
	p.act(p.sess.Receive(i, m))
}

// act carries out what the session decided.
func (p *simProposer) act(r session.Ready, err error) {
	p.note(r.Events)
	if err != nil {
		p.sessionError(err)
		return
	}
	for _, m := range r.Sends {
		p.send(m.To, m.Msg)
	}
	for _, i := range r.Drop {
		p.closeConn(i)
	}
	if r.Advanced {
		p.w.chk.proposerCommit(p)
	}
	if r.Elect {
		p.elect()
	}
}

// note turns the session's events, what the real driver logs, into the
// run's counts and trace: each counts as "p: <kind>".
func (p *simProposer) note(events []session.Event) {
	for _, ev := range events {
		p.w.count("p: " + ev.Kind.String())
		p.w.tracef("p%d: %s", p.idx, ev.Kind)
	}
}

// newerConfiguration is the configuration an SK001 or SK002 refusal
// carries in its Detail, as a *session.ConfigurationError if it is newer
// than the proposer's; nil otherwise (as proposer/driver.go's).
func (p *simProposer) newerConfiguration(i int, f frame) *session.ConfigurationError {
	if f.code != "SK001" && f.code != "SK002" {
		return nil
	}
	c, err := proto.ParseConfigurationDetail(f.detail)
	if err != nil {
		p.w.violate(Harness, "p%d: the Detail of sk%d's %s: %v", p.idx, i, f.code, err)
		return nil
	}
	if c.Generation <= p.conf.Generation {
		return nil
	}
	return &session.ConfigurationError{Safekeeper: i, Configuration: c, Ours: p.conf.Generation}
}

func (p *simProposer) sessionError(err error) {
	idle := 5 + p.w.rng.IntN(40)
	var ce *session.ConfigurationError
	switch {
	case errors.As(err, &ce):
		// proposer.Run: a new session at once, in that configuration.
		p.w.count("p: newer configuration")
		p.adopt(ce.Configuration)
		idle = 0
	case errors.Is(err, session.ErrDeposed):
		// Run exits (3); its operator restarts it a while later: a
		// static proposer's process starts in generation 0 again.
		p.w.count("p: deposed")
		idle = 50 + p.w.rng.IntN(300)
		if p.static {
			p.conf = proto.Configuration{}
		}
	case errors.Is(err, session.ErrVoteRefused):
		p.w.count("p: vote refused")
	}
	p.endSession(err, idle)
}

// elect decides the election and opens this term's WAL at term_start_lsn.
func (p *simProposer) elect() {
	e, r, err := p.sess.Elect(^proto.LSN(0), p.w.tlStart)
	p.note(r.Events) // counted here, as they were decided, whatever follows
	r.Events = nil
	if err != nil {
		p.sessionError(err)
		return
	}
	p.w.tracef("p%d: elected %s donor sk%d term_start %s history %v", p.idx, p.sess.Core().Ballot(), e.Donor, e.TermStartLSN, e.History)
	if !p.w.chk.elected(p, e) {
		return
	}
	prev, err := p.w.wal.prevRecord(e.History, e.TermStartLSN)
	if err != nil {
		p.w.violate(InvLogMatching, "p%d elected with term_start_lsn %s: %v", p.idx, e.TermStartLSN, err)
		return
	}
	p.log = p.w.wal.startTerm(e.Term, e.TermStartLSN, prev)
	p.act(r, nil)
	p.act(p.sess.PumpAll(), nil)
}

// WAL is the session's WAL source: this term's WAL in requests of random
// size (1 byte .. max), so requests end inside records and page headers.
func (p *simProposer) WAL(_ int, lsn proto.LSN, limit int) []byte {
	end := p.walEnd()
	if lsn >= end {
		return nil
	}
	n := min(end-lsn, proto.LSN(1+p.w.rng.IntN(limit)))
	if p.w.rng.IntN(4) == 0 {
		n = min(end-lsn, proto.LSN(limit))
	}
	wal, err := p.w.wal.read(p.sess.Core().Election().History, lsn, lsn+n)
	if err != nil {
		p.w.violate(Harness, "p%d: its own history cannot be read: %v", p.idx, err)
		return nil
	}
	return wal
}

// End is the end of the WAL this proposer can stream (WAL source).
func (p *simProposer) End() proto.LSN { return p.walEnd() }

func (p *simProposer) walEnd() proto.LSN {
	if p.log == nil {
		return 0
	}
	return p.log.end()
}

// tick is the driver's timer: the session's heartbeats, and the election
// timeout.
func (p *simProposer) tick() {
	if !p.elected() && p.w.step > p.deadline {
		p.w.count("p: election timeout")
		p.endSession(fmt.Errorf("%w: not elected in time", session.ErrNoQuorum), 1+p.w.rng.IntN(20))
		return
	}
	p.act(p.sess.Tick(p.w.now()), nil)
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
	p.act(p.sess.PumpAll(), nil)
}

// stepTime is the simulated time a step takes (for the session's clock).
const stepTime = session.Millisecond
