package sim

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proposer/session"
	"github.com/safekeeper/safekeeper/proto"
)

// Config is one simulation run. Everything that happens in it follows from
// Seed: the same Config always produces the same run, step for step.
type Config struct {
	// Seed seeds the one PRNG (PCG) that chooses every event.
	Seed uint64
	// Steps is the number of steps with faults on.
	Steps int
	// LivenessSteps bounds the final phase: faults off, downed safekeepers
	// restarted, one proposer left; it must commit new WAL within this many
	// steps. 0 skips the phase.
	LivenessSteps int
	// Safekeepers is the number of acceptors (0: chosen by the seed: 3 or 5
	// in generation 0, 5 or 6 with membership changes).
	Safekeepers int
	// Proposers is the number of competing proposers (0: 2..3 by the seed).
	Proposers int
	// NewSession starts each safekeeper's session (acceptor.NewSession when
	// nil). The planted-bug test passes one that plants a bug in the
	// acceptor or the session.
	NewSession func(acceptor.Config, acceptor.State, acceptor.Storage) (*acceptor.Session, error)
	// WrapStorage, when set, wraps each safekeeper's disk as its session
	// sees it: the planted-bug test plants storage bugs with it.
	WrapStorage func(acceptor.Storage) acceptor.Storage
	// NoReplyDurabilityCheck turns off invariant 7 (every reply reflects
	// durable state), so that the planted-bug test can show a durability bug
	// is also caught by its consequence.
	NoReplyDurabilityCheck bool
	// Membership: 0 lets the seed choose (one seed in eight runs in
	// generation 0); MembershipOff runs in generation 0 (a fixed list of
	// safekeepers, every one holding the timeline, no store, no changes);
	// MembershipOn in configurations from generation 1, with 3 members
	// and changes of them (README_PROTO.md, "Membership and generations").
	Membership Membership
	// ProposerHooks are planted in every proposer's session (the
	// planted-bug test: session.Hooks{NewMembersOnly: true}).
	ProposerHooks session.Hooks
	// ControllerSkipsCatchUp plants a bug in the simulation's controller:
	// it writes the final configuration right after the joint one, without
	// waiting for a majority of the new members to reach the sync position.
	ControllerSkipsCatchUp bool
	// ControllerSkipsTermBump plants another: the change without its
	// term bump (README_PROTO.md, "Membership and generations"): the new
	// members are not raised to the sync term, and a new member counts as
	// caught up whatever its term.
	ControllerSkipsTermBump bool
	// NoGenerationCheck turns off invariant 10 (a safekeeper never moves to
	// a lower generation), so that the planted-bug test can show the bug
	// is also caught by its consequence.
	NoGenerationCheck bool
}

// Membership says whether a run has configurations (Config.Membership).
type Membership int

const (
	// MembershipBySeed: seven seeds in eight run with membership changes.
	MembershipBySeed Membership = iota
	// MembershipOff: generation 0, every safekeeper holding the timeline.
	MembershipOff
	// MembershipOn: configurations from generation 1, and changes.
	MembershipOn
)

// initialMembers is the size of the first configuration.
const initialMembers = 3

// faults are the per-step probabilities of each fault, in 1/10000 (at most
// 1000 for a kind, so all together stay well below 1). Each seed
// draws its own, so runs range from calm to very hostile (FoundationDB's
// "buggify" idea: a fault mix per seed rather than one mix for all).
type faults struct {
	crash, restart, cut, closeConn, dup, newCampaign int
	// diskFull fills a safekeeper's disk (every commit fails until
	// diskFreed frees it): the session's storage-failure path.
	diskFull, diskFreed int
	// crashAfter: a safekeeper crashes right after it handled a message
	// (its reply is in flight): the worst moment for a durability bug.
	crashAfter int
	// slowConn: percentage of new connections that are slow.
	slowConn int
	// Membership: a change starts (migrate) or is abandoned mid-way
	// (ctlAbort: rolled back), the controller crashes and another takes
	// over (ctlCrash, ctlRestart), a membership call or its answer is
	// lost (ctlLoss).
	migrate, ctlAbort, ctlCrash, ctlRestart, ctlLoss int
}

// Result is the outcome of a run.
type Result struct {
	Seed    uint64
	Steps   int      // steps run
	Err     error    // the first broken invariant, nil if none
	Trace   []string // the last events before Err
	Counts  []Count  // how often each interesting event happened
	Commit  proto.LSN
	Elected int
	// Digest hashes every safekeeper's durable state and WAL at the end:
	// two runs of one seed must have the same.
	Digest uint64
}

// Count is how often a named event happened in a run.
type Count struct {
	Name string
	N    int
}

// World is one simulated cluster.
type World struct {
	cfg      Config
	rng      *rand.Rand
	step     int
	faults   faults
	faultsOn bool
	maxWAL   proto.LSN

	tlStart    proto.LSN
	serverInfo proto.ServerInfo
	sks        []*server
	props      []*simProposer
	conns      []*conn // open connections, in creation order
	nextConn   int
	wal        *walStore
	chk        *checker

	// Membership (nil store, ctl in generation 0): the configuration
	// store, the controller, and the membership calls in flight.
	store  *confStore
	ctl    *controller
	ctlNet []*ctlMsg

	trace  []traceEntry // ring of recent events, formatted only on failure
	traceN int
	counts []Count
	err    error
}

const (
	segSize  = 1 << 20
	traceLen = 40
	// WAL generated per 3000 steps, at most (a memory and time bound): one
	// seed in eight writes past the first 1 MiB segment.
	maxWAL     = 256 << 10
	maxWALLong = 1100 << 10
)

// NewWorld builds the cluster of cfg: every safekeeper with the timeline
// created (rule 1) and no WAL, no proposer session yet.
func NewWorld(cfg Config) *World {
	w := &World{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5afe_4ee9e7)), faultsOn: true}
	if w.cfg.Membership == MembershipBySeed {
		w.cfg.Membership = MembershipOn
		if w.rng.IntN(8) == 0 {
			w.cfg.Membership = MembershipOff
		}
	}
	membership := w.cfg.Membership == MembershipOn
	if w.cfg.Safekeepers == 0 {
		switch {
		case membership:
			w.cfg.Safekeepers = 5 + w.rng.IntN(2) // 3 members, 2 or 3 outside
		case w.rng.IntN(4) == 0:
			w.cfg.Safekeepers = 5
		default:
			w.cfg.Safekeepers = 3
		}
	}
	if w.cfg.Proposers == 0 {
		w.cfg.Proposers = 2 + w.rng.IntN(2)
	}
	w.faults = faults{
		crash:       w.rng.IntN(150),
		restart:     200 + w.rng.IntN(800),
		cut:         w.rng.IntN(300),
		closeConn:   w.rng.IntN(300),
		dup:         w.rng.IntN(30),
		newCampaign: w.rng.IntN(60),
		crashAfter:  w.rng.IntN(300),
		slowConn:    w.rng.IntN(40),
		diskFull:    w.rng.IntN(40),
		diskFreed:   100 + w.rng.IntN(900),
	}
	if membership {
		w.faults.migrate = 5 + w.rng.IntN(25)
		w.faults.ctlAbort = w.rng.IntN(20)
		w.faults.ctlCrash = w.rng.IntN(15)
		w.faults.ctlRestart = 30 + w.rng.IntN(300)
		w.faults.ctlLoss = w.rng.IntN(100)
	}
	w.maxWAL = maxWAL
	if w.rng.IntN(8) == 0 {
		w.maxWAL = maxWALLong
	}
	w.maxWAL *= proto.LSN(max(1, cfg.Steps/3000)) // long runs keep writing

	w.tlStart = proto.LSN(0x2000000) // a segment boundary
	w.serverInfo = proto.ServerInfo{
		ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: 0x5afe, TenantID: proto.ID{1},
		TimelineID: proto.ID{2}, PgTimeline: 1, WalSegSize: segSize,
	}
	w.wal = newWALStore(segSize, w.serverInfo.SystemID)
	w.chk = newChecker(w)
	// The timeline is created on its first members (generation 1), or on
	// every safekeeper in generation 0; the others hold none yet.
	var first proto.Configuration
	if membership {
		first.Generation = 1
		for i := range min(initialMembers, w.cfg.Safekeepers) {
			first.Members = append(first.Members, uint64(i+1))
		}
		w.store = &confStore{w: w}
		w.store.cas(0, first)
	}
	si := w.serverInfo
	si.Configuration = first
	st := acceptor.NewState(&si)
	for i := range w.cfg.Safekeepers {
		s := &server{w: w, idx: i, cfg: acceptor.Config{NodeID: uint64(i + 1)}}
		if !membership || first.IsMember(uint64(i+1)) {
			s.disk = newDisk(st)
		}
		w.sks = append(w.sks, s)
		s.restart()
	}
	if membership {
		w.ctl = newController(w)
	}
	for i := range w.cfg.Proposers {
		p := &simProposer{w: w, idx: i, uuid: proto.ID{0xa0 + byte(i), 0x55}, idleUntil: w.rng.IntN(30)}
		if membership {
			// p0 follows the store (it must commit in the liveness
			// phase); the others are static one time in three.
			p.static = i > 0 && w.rng.IntN(3) == 0
			if !p.static {
				p.conf = first.Clone()
			}
		}
		w.props = append(w.props, p)
	}
	return w
}

// Standard is the configuration make test runs for seed: 3000 steps with
// faults, then the liveness phase.
func Standard(seed uint64) Config {
	return Config{Seed: seed, Steps: 3000, LivenessSteps: 3000}
}

// RunSeeds runs one simulation per seed, GOMAXPROCS at a time (each run is
// single-threaded and independent, so this changes nothing in any run), and
// returns the results in seed order.
func RunSeeds(seeds []uint64, cfg func(uint64) Config) []Result {
	results := make([]Result, len(seeds))
	next := make(chan int)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				results[k] = Run(cfg(seeds[k]))
			}
		}()
	}
	for k := range seeds {
		next <- k
	}
	close(next)
	wg.Wait()
	return results
}

// Run runs cfg and returns its result.
func Run(cfg Config) Result {
	w := NewWorld(cfg)
	for w.step = 1; w.step <= cfg.Steps && w.err == nil; w.step++ {
		w.doStep()
		w.chk.check()
	}
	if w.err == nil && cfg.LivenessSteps > 0 {
		w.liveness()
	}
	if w.err == nil {
		for _, s := range w.sks {
			if s.disk == nil {
				continue
			}
			if _, err := s.disk.verify(); err != nil {
				w.violate(Harness, "sk%d at the end: %v", s.idx, err)
			}
		}
	}
	return w.result()
}

func (w *World) result() Result {
	r := Result{Seed: w.cfg.Seed, Steps: w.step, Err: w.err, Counts: w.counts, Commit: w.chk.commit, Elected: w.chk.elections}
	h := fnv.New64a()
	for _, s := range w.sks {
		if s.disk == nil {
			fmt.Fprintf(h, "none|")
			continue
		}
		fmt.Fprintf(h, "%+v %d %d|", s.disk.state, s.disk.start, len(s.disk.wal))
		h.Write(s.disk.wal)
	}
	if w.store != nil {
		fmt.Fprintf(h, "%v", w.store.confs)
	}
	r.Digest = h.Sum64()
	if w.err != nil {
		n := min(w.traceN, traceLen)
		for k := w.traceN - n; k < w.traceN; k++ {
			r.Trace = append(r.Trace, w.trace[k%traceLen].String())
		}
	}
	return r
}

// liveness turns faults off, restarts every safekeeper, keeps one proposer
// and requires it to commit new WAL within LivenessSteps steps.
func (w *World) liveness() {
	w.faultsOn = false
	w.tracef("liveness phase: faults off")
	for _, s := range w.sks {
		s.setFull(false)
		if !s.up() {
			s.restart()
		}
	}
	if w.ctl != nil && !w.ctl.alive {
		w.ctl.restart() // it finishes or rolls back a change under way
	}
	for _, p := range w.props[1:] {
		p.endSession(fmt.Errorf("stopped for the liveness phase"), 0)
		p.stopped = true
	}
	p := w.props[0]
	target := w.chk.commit
	end := w.step + w.cfg.LivenessSteps
	for ; w.step < end && w.err == nil; w.step++ {
		w.doStep()
		w.chk.check()
		if p.elected() && p.sess.Core().CommitLSN() > target && p.sess.Core().CommitLSN() > p.sess.Core().Election().TermStartLSN {
			w.count("liveness: committed new WAL")
			return
		}
	}
	if w.err == nil {
		term := uint64(0)
		if p.sess != nil {
			term = p.sess.Core().Ballot().Term
		}
		w.violate(InvLiveness, "liveness: with faults off, p0 (term %d, elected %v) committed no new WAL above %s in %d steps",
			term, p.elected(), target, w.cfg.LivenessSteps)
	}
}

// action is one thing that may happen in a step.
type action struct {
	weight int
	do     func()
}

// doStep picks one enabled action, weighted, and does it.
func (w *World) doStep() {
	var acts []action
	add := func(weight int, do func()) {
		if weight > 0 {
			acts = append(acts, action{weight, do})
		}
	}
	// Deliveries: the head of any connection direction.
	for _, c := range w.conns {
		if c.sOpen && len(c.toSK) > 0 {
			add(c.speed, func() { w.deliverToSK(c) })
		}
		if c.pOpen && len(c.toP) > 0 {
			add(c.speed, func() { w.deliverToP(c) })
		}
	}
	for _, s := range w.sks {
		if s.sess != nil && s.sess.Pending() > 0 {
			add(60, func() { w.tracef("sk%d: group flush", s.idx); s.flush() })
		}
		if s.sess != nil && s.sess.Unpersisted() {
			// The owner's 100 ms timer: rarer than a flush, so that
			// crashes find commit_lsn held in memory only.
			add(10, func() { w.tracef("sk%d: persist commit_lsn", s.idx); s.persist() })
		}
	}
	for _, p := range w.props {
		switch {
		case p.stopped:
		case !p.active():
			if w.step >= p.idleUntil {
				add(20, p.startSession)
			}
		default:
			add(15, p.tick)
			if p.elected() && (p.walEnd()-w.tlStart < w.maxWAL || !w.faultsOn) {
				add(25, func() { p.generate() })
			}
			for _, i := range p.targets() {
				if p.links[i].c == nil && w.sks[i].up() {
					add(10, func() { w.tracef("p%d: reconnect sk%d", p.idx, i); p.connect(i) })
				}
			}
		}
	}
	// Membership calls in flight, and the controller's timer.
	for k := range w.ctlNet {
		add(30, func() { w.deliverCtl(k) })
	}
	if w.ctl != nil && w.ctl.busy() {
		add(5, w.ctl.tick)
	}
	if w.faultsOn {
		// A fault takes the step with its own probability, independent of
		// how many ordinary actions are enabled.
		var faults []action
		w.addFaults(func(weight int, do func()) {
			if weight > 0 {
				faults = append(faults, action{weight, do})
			}
		})
		r := w.rng.IntN(10000)
		for _, a := range faults {
			if r < a.weight {
				a.do()
				w.reap()
				return
			}
			r -= a.weight
		}
	}
	total := 0
	for _, a := range acts {
		total += a.weight
	}
	if total == 0 {
		return
	}
	r := w.rng.IntN(total)
	for _, a := range acts {
		if r < a.weight {
			a.do()
			break
		}
		r -= a.weight
	}
	w.reap()
}

// addFaults offers the faults of this seed's mix, each with its probability
// per step in 1/10000.
func (w *World) addFaults(add func(int, func())) {
	f := w.faults
	down := 0
	for _, s := range w.sks {
		if !s.up() {
			down++
		}
	}
	for _, s := range w.sks {
		if s.up() {
			add(f.crash/len(w.sks), func() { w.count("fault: crash"); w.tracef("FAULT sk%d crashes", s.idx); s.crash() })
		} else {
			add(f.restart/max(down, 1), func() { w.count("fault: restart"); w.tracef("sk%d restarts", s.idx); s.restart() })
		}
		if !s.full {
			add(f.diskFull/len(w.sks), func() { w.count("fault: disk full"); w.tracef("FAULT sk%d: disk full", s.idx); s.setFull(true) })
		} else {
			add(f.diskFreed/len(w.sks), func() { w.tracef("sk%d: disk space freed", s.idx); s.setFull(false) })
		}
	}
	if c := w.ctl; c != nil {
		if c.alive && c.phase == ctlIdle {
			add(f.migrate, c.start)
		}
		if c.alive && (c.phase == ctlSwitch || c.phase == ctlCatchUp) {
			add(f.ctlAbort, func() { w.count("controller abandons a change"); c.rollBack(c.joint) })
		}
		if c.alive {
			add(f.ctlCrash, func() { w.count("fault: controller crash"); c.crash() })
		} else {
			add(f.ctlRestart, c.restart)
		}
		if len(w.ctlNet) > 0 {
			add(f.ctlLoss, func() {
				k := w.rng.IntN(len(w.ctlNet))
				w.count("fault: membership call lost")
				w.tracef("FAULT membership call to/from sk%d lost", w.ctlNet[k].sk)
				w.ctlNet = slices.Delete(w.ctlNet, k, k+1)
			})
		}
	}
	if len(w.conns) > 0 {
		add(f.cut, func() {
			c := w.conns[w.rng.IntN(len(w.conns))]
			w.count("fault: cut")
			w.tracef("FAULT conn%d (p%d-sk%d) cut, %d+%d frames lost", c.id, c.p, c.s, len(c.toSK), len(c.toP))
			w.cut(c, true)
		})
		add(f.closeConn, func() {
			// Half the time the proposer gives up on a slow connection
			// (as a timeout would), leaving its frames in flight.
			c := w.conns[w.rng.IntN(len(w.conns))]
			if w.rng.IntN(2) == 0 {
				var slow []*conn
				for _, o := range w.conns {
					if o.speed < 100 && o.pOpen && len(o.toSK) > 0 {
						slow = append(slow, o)
					}
				}
				if len(slow) > 0 {
					c = slow[w.rng.IntN(len(slow))]
				}
			}
			if !c.pOpen {
				return
			}
			p := w.props[c.p]
			w.count("fault: proposer closes connection")
			w.tracef("FAULT p%d gives up conn%d to sk%d (%d frames still in flight to it)", c.p, c.id, c.s, len(c.toSK))
			p.close(c.s)
		})
		add(f.dup, func() {
			c := w.conns[w.rng.IntN(len(w.conns))]
			q := &c.toSK
			if w.rng.IntN(2) == 0 {
				q = &c.toP
			}
			if len(*q) == 0 {
				return
			}
			k := w.rng.IntN(len(*q))
			if (*q)[k].eof || (*q)[k].err != "" {
				return
			}
			w.count("fault: duplicate frame")
			w.tracef("FAULT conn%d: frame %d duplicated", c.id, k)
			*q = append((*q)[:k+1], (*q)[k:]...)
		})
	}
	for _, p := range w.props {
		if p.active() {
			add(f.newCampaign/len(w.props), func() {
				w.count("fault: proposer restarts its campaign")
				p.endSession(fmt.Errorf("restarted to campaign again"), 0)
				p.startSession()
			})
		}
	}
}

// dial opens a connection from proposer p to safekeeper s.
func (w *World) dial(p, s int) *conn {
	w.nextConn++
	c := &conn{id: w.nextConn, p: p, s: s, pOpen: true, sOpen: true, speed: 100}
	if w.rng.IntN(100) < w.faults.slowConn {
		c.speed = 1 + w.rng.IntN(10)
	}
	w.conns = append(w.conns, c)
	w.tracef("p%d: conn%d to sk%d", p, c.id, s)
	return c
}

func (w *World) deliverToSK(c *conn) {
	f := c.toSK[0]
	c.toSK = c.toSK[1:]
	w.traceFrame(c, f, true)
	s := w.sks[c.s]
	s.receive(c, f)
	if w.faultsOn && s.up() && w.rng.IntN(10000) < w.faults.crashAfter {
		w.count("fault: crash right after a message")
		w.tracef("FAULT sk%d crashes right after that", s.idx)
		s.crash()
	}
}

func (w *World) deliverToP(c *conn) {
	f := c.toP[0]
	c.toP = c.toP[1:]
	w.traceFrame(c, f, false)
	w.props[c.p].receive(c, f)
}

// closeByProposer is the proposer closing its end: what it sent is still
// delivered, then EOF.
func (w *World) closeByProposer(c *conn) {
	if !c.pOpen {
		return
	}
	c.pOpen = false
	c.toP = nil
	if c.sOpen && !c.eofQueued {
		c.toSK = append(c.toSK, frame{eof: true})
		c.eofQueued = true
	}
}

// cut breaks c: everything in flight is lost, both ends see it at once.
// serverAlive: the safekeeper process survives (a network cut, not a
// crash) and flushes what the connection sent, as on any EOF.
func (w *World) cut(c *conn, serverAlive bool) {
	c.toSK, c.toP = nil, nil
	if c.sOpen {
		c.sOpen = false
		if s := w.sks[c.s]; serverAlive && s.sess != nil {
			// The end of the stream reaches the session at once.
			id := acceptor.ConnID(c.id)
			s.act(s.sess.End(id))
			delete(s.conns, id)
		}
	}
	if c.pOpen {
		c.pOpen = false
		if p := w.props[c.p]; p.active() && p.links[c.s].c == c {
			p.disconnected(c.s)
		}
	}
}

// reap forgets connections closed at both ends.
func (w *World) reap() {
	k := 0
	for _, c := range w.conns {
		if !c.closed() {
			w.conns[k] = c
			k++
		}
	}
	clear(w.conns[k:])
	w.conns = w.conns[:k]
}

func (w *World) traceFrame(c *conn, f frame, toSK bool) {
	dir := direction{c.p, c.s, toSK}
	switch {
	case f.eof:
		w.tracef("deliver conn%d %s: EOF", c.id, dir)
	case f.err != "":
		w.tracef("deliver conn%d %s: ErrorResponse", c.id, dir)
	default:
		w.traceAdd(traceEntry{step: w.step, format: "deliver conn%d %s: ", args: []any{c.id, dir}, frame: f.payload})
	}
}

type direction struct {
	p, s int
	toSK bool
}

func (d direction) String() string {
	if d.toSK {
		return fmt.Sprintf("p%d→sk%d", d.p, d.s)
	}
	return fmt.Sprintf("sk%d→p%d", d.s, d.p)
}

// describe summarizes an encoded message for the trace.
func describe(b []byte) string {
	var m proto.Message
	var err error
	switch b[0] {
	case proto.TagServerInfo, proto.TagRequestVote, proto.TagProposerElected, proto.TagSafeKeeperRequest:
		m, err = proto.DecodeProposerMessage(b)
	default:
		m, err = proto.DecodeSafeKeeperMessage(b)
	}
	if err != nil {
		return fmt.Sprintf("undecodable (%v)", err)
	}
	switch m := m.(type) {
	case *proto.ServerInfo:
		return fmt.Sprintf("ServerInfo generation %d", m.Configuration.Generation)
	case *proto.SafeKeeperInfo:
		return fmt.Sprintf("SafeKeeperInfo voted_for %s last_log_term %d flush %s commit %s generation %d",
			m.VotedFor, m.LastLogTerm, m.FlushLSN, m.CommitLSN, m.Configuration.Generation)
	case *proto.RequestVote:
		return fmt.Sprintf("RequestVote %s", m.Candidate)
	case *proto.VoteResponse:
		return fmt.Sprintf("VoteResponse %s", m.VotedFor)
	case *proto.ProposerElected:
		return fmt.Sprintf("ProposerElected term %d start_streaming_at %s history %v", m.Term, m.StartStreamingAt, m.History)
	case *proto.SafeKeeperRequest:
		return fmt.Sprintf("SafeKeeperRequest %s %s..%s commit %s", m.Sender, m.BeginLSN, m.EndLSN, m.CommitLSN)
	case *proto.SafeKeeperResponse:
		return fmt.Sprintf("SafeKeeperResponse term %d flush %s commit %s", m.Term, m.FlushLSN, m.CommitLSN)
	}
	return fmt.Sprintf("%T", m)
}

type traceEntry struct {
	step   int
	format string
	args   []any // values only: formatted later
	frame  []byte
}

func (e traceEntry) String() string {
	s := fmt.Sprintf("%6d  ", e.step) + fmt.Sprintf(e.format, e.args...)
	if e.frame != nil {
		s += describe(e.frame)
	}
	return s
}

func (w *World) tracef(format string, args ...any) {
	w.traceAdd(traceEntry{step: w.step, format: format, args: args})
}

func (w *World) traceAdd(e traceEntry) {
	if len(w.trace) < traceLen {
		w.trace = append(w.trace, traceEntry{})
	}
	w.trace[w.traceN%traceLen] = e
	w.traceN++
}

// now is the simulated time of the current step.
func (w *World) now() session.Instant {
	return session.Instant(0).Add(session.Duration(w.step) * stepTime)
}

func (w *World) count(name string) {
	for i := range w.counts {
		if w.counts[i].Name == name {
			w.counts[i].N++
			return
		}
	}
	w.counts = append(w.counts, Count{name, 1})
}

// FormatTrace renders a trace for a failure message.
func FormatTrace(t []string) string { return "    " + strings.Join(t, "\n    ") }
