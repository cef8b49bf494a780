package sim

import (
	"fmt"
	"slices"

	"github.com/safekeeper/safekeeper/proto"
)

// Membership changes in simulation (README_PROTO.md, "Membership and
// generations"): the configuration store, and the controller that changes
// a timeline's members through it. Neither is protocol code under test —
// the store is etcd's compare-and-swap, the controller the steps the
// README gives for a change — so both are written here, small, and the
// safekeepers they talk to are the real acceptor.Session.

// confStore is the configuration store (etcd's key of the timeline, in
// simulation): generation k is confs[k-1]. A generation is created only by
// compare-and-swap on the current one (cas), so one generation names one
// configuration and each is created from the one before.
type confStore struct {
	w     *World
	confs []proto.Configuration
}

// current is the newest configuration (generation 0 when there is none).
func (s *confStore) current() proto.Configuration {
	if len(s.confs) == 0 {
		return proto.Configuration{}
	}
	return s.confs[len(s.confs)-1].Clone()
}

// get is generation gen as the store created it.
func (s *confStore) get(gen uint64) (proto.Configuration, bool) {
	if gen == 0 || gen > uint64(len(s.confs)) {
		return proto.Configuration{}, false
	}
	return s.confs[gen-1], true
}

// cas creates next if the current generation is expect (next's generation
// is expect+1), and reports whether it did. Every pair it creates is checked
// for quorum intersection (invariant 9).
func (s *confStore) cas(expect uint64, next proto.Configuration) bool {
	w := s.w
	cur := s.current()
	if cur.Generation != expect {
		return false
	}
	if next.Generation != expect+1 {
		w.violate(Harness, "store: compare-and-swap on generation %d writes generation %d", expect, next.Generation)
		return false
	}
	if err := next.Validate(); err != nil {
		w.violate(Harness, "store: %s: %v", next, err)
		return false
	}
	if cur.Generation > 0 {
		if q1, q2, ok := quorumsIntersect(cur, next); !ok {
			w.violate(InvQuorumIntersection, "invariant 9 (consecutive configurations' quorums intersect): %s has quorum %v, %s has quorum %v, disjoint",
				cur, q1, next, q2)
			return false
		}
	}
	s.confs = append(s.confs, next.Clone())
	w.tracef("store: generation %d created: %s", next.Generation, next)
	return true
}

// isQuorum reports whether the node ids for which in holds make a quorum of
// c: a majority of each of its groups.
func isQuorum(c proto.Configuration, in func(id uint64) bool) bool {
	for _, g := range c.Groups() {
		n := 0
		for _, id := range g {
			if in(id) {
				n++
			}
		}
		if n <= len(g)/2 {
			return false
		}
	}
	return true
}

// quorumsIntersect reports whether every quorum of a intersects every
// quorum of b; if not, it returns two disjoint ones.
func quorumsIntersect(a, b proto.Configuration) (qa, qb []uint64, ok bool) {
	ids := a.All()
	for _, id := range b.All() {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for set := range 1 << len(ids) {
		in := func(id uint64) bool { return set&(1<<slices.Index(ids, id)) != 0 }
		out := func(id uint64) bool { return !in(id) }
		if isQuorum(a, in) && isQuorum(b, out) {
			for _, id := range ids {
				if in(id) {
					qa = append(qa, id)
				} else {
					qb = append(qb, id)
				}
			}
			return qa, qb, false
		}
	}
	return nil, nil, true
}

// position is a safekeeper's (last_log_term, flush_lsn): how far its WAL
// goes, ordered by term first, as an election orders voters (rule 3).
type position struct {
	term uint64
	lsn  proto.LSN
}

func (a position) less(b position) bool {
	if a.term != b.term {
		return a.term < b.term
	}
	return a.lsn < b.lsn
}

func (a position) String() string { return fmt.Sprintf("(%d, %s)", a.term, a.lsn) }

// ctlMsg is a call of the controller in flight: a membership call (PUT
// .../membership) or a term bump (POST .../term_bump) to safekeeper sk, or
// the safekeeper's answer. Like a connection's frames it is delivered when
// the scheduler picks it, and may be lost (a fault, a crashed safekeeper, a
// crashed controller).
type ctlMsg struct {
	ctl    int  // the controller incarnation that sent the request
	sk     int  // safekeeper index
	answer bool // false: a request
	// A request: conf to push, or (bump) the term to raise voted_for to.
	bump bool
	conf proto.Configuration
	term uint64
	// The answer (to either): the configuration held afterwards, the term
	// and the position, or the error.
	pos position
	err string
}

// ctlPhase is where the controller is in a change.
type ctlPhase int

const (
	// ctlIdle: no change under way.
	ctlIdle ctlPhase = iota
	// ctlSwitch: the joint configuration is in the store; it is pushed to
	// the old and the new members until a majority of the old members
	// answered holding it; the highest position among those answers is
	// the sync position.
	ctlSwitch
	// ctlCatchUp: wait until a majority of the new members holds the joint
	// configuration at or past the sync position, then write the final
	// configuration; past the deadline, roll back instead.
	ctlCatchUp
	// ctlFinal: the final configuration (or the rollback) is in the store;
	// it is pushed until a majority of its members answered holding it.
	ctlFinal
)

var ctlPhaseNames = [...]string{"idle", "switch", "catch-up", "final"}

func (p ctlPhase) String() string { return ctlPhaseNames[p] }

// controller is the one process changing the timeline's members, following
// README_PROTO.md's change and fleet/controller's move: write the
// joint configuration by compare-and-swap; push it to the old and the new
// members; once a majority of the old members holds it, take the sync
// position — the highest (last_log_term, flush_lsn) among their answers:
// every WAL committed in the old configuration is at or below it, and from
// then on no commit can do without a majority of the new members — and the
// sync term, the highest term among them: every term a proposer of the old
// configuration was elected in is at or below it; raise the new members
// that are not old ones to the sync term (term bump); wait until a majority
// of the new members is at or past the sync position and the sync term (a
// proposer in the joint configuration streams to them); then write the
// final configuration (generation + 2, the new members) and push it. A
// controller that crashes is replaced by another (a new incarnation) that
// resumes from the store: a joint configuration there is finished or
// rolled back (generation + 2 with the old members), at random.
//
// Without the term bump a majority of the new members may never have seen
// a term that a proposer of the old configuration won with votes given just
// before the switch; a proposer of the final configuration elected by them
// then wins the same term (seed 1671 found it; docs/correctness.md).
type controller struct {
	w     *World
	id    int // incarnation
	alive bool
	phase ctlPhase
	// joint is the change under way (or just ended, in ctlFinal: its
	// members are pushed the final configuration too, so that removed
	// ones learn); final is what ctlFinal pushes.
	joint, final proto.Configuration
	rollback     bool
	// answers[i] is safekeeper i's last answer to this incarnation in this
	// phase (nil: none); pushed[i] the step of the last request to it.
	answers  []*ctlMsg
	pushed   []int
	sync     position
	syncTerm uint64
	deadline int // ctlCatchUp: roll back after this step
	// poll is the number of steps between polls of a new member catching
	// up, patience how long the catch-up may take before the change is
	// rolled back: each seed draws its own.
	poll, patience int
}

// ctlRetry is the number of steps before a request without an answer is
// sent again.
const ctlRetry = 80

func newController(w *World) *controller {
	c := &controller{w: w, id: 1, alive: true, poll: 10 + w.rng.IntN(300), patience: 200 + w.rng.IntN(2500)}
	c.reset()
	return c
}

func (c *controller) reset() {
	c.answers = make([]*ctlMsg, len(c.w.sks))
	c.pushed = make([]int, len(c.w.sks))
	for i := range c.pushed {
		c.pushed[i] = -ctlRetry
	}
}

func (c *controller) busy() bool { return c.alive && c.phase != ctlIdle }

// crash is the controller process dying: its state is gone, answers to it
// are dropped; requests it sent may still arrive.
func (c *controller) crash() {
	c.w.tracef("FAULT controller %d crashes in phase %s", c.id, c.phase)
	c.alive = false
	c.phase = ctlIdle
}

// restart is another controller taking over: it reads the store and
// resumes what it finds.
func (c *controller) restart() {
	c.id++
	c.alive = true
	c.reset()
	cur := c.w.store.current()
	c.w.tracef("controller %d starts; the store holds %s", c.id, cur)
	if !cur.Joint() {
		// Push the current configuration again: the last pushes may have
		// been lost with the previous controller.
		c.toFinal(proto.Configuration{}, cur, false)
		return
	}
	c.w.count("controller resumes a change")
	if c.w.rng.IntN(2) == 0 {
		c.joint, c.phase = cur, ctlSwitch
		c.w.tracef("controller %d finishes the change to %v", c.id, cur.NewMembers)
		return
	}
	c.rollBack(cur)
}

// start begins a change from the store's configuration: replace one
// member, or all of them (as many as there are safekeepers outside).
func (c *controller) start() {
	w := c.w
	cur := w.store.current()
	if cur.Joint() {
		return // a change the store has not seen end: only a restart resumes it
	}
	var out []uint64
	for i := range w.sks {
		if id := uint64(i + 1); !slices.Contains(cur.Members, id) {
			out = append(out, id)
		}
	}
	if len(out) == 0 {
		return
	}
	w.rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	next := slices.Clone(cur.Members)
	kind := "one"
	if w.rng.IntN(3) == 0 {
		kind = "all"
		perm := w.rng.Perm(len(next))
		for k := range min(len(out), len(next)) {
			next[perm[k]] = out[k]
		}
	} else {
		next[w.rng.IntN(len(next))] = out[0]
	}
	slices.Sort(next)
	joint := proto.Configuration{Generation: cur.Generation + 1, Members: cur.Members, NewMembers: next}
	if !w.store.cas(cur.Generation, joint) {
		return
	}
	w.count("migration started (replace " + kind + ")")
	w.tracef("controller %d: change %v → %v (generation %d)", c.id, cur.Members, next, joint.Generation)
	c.reset()
	c.joint, c.phase = joint, ctlSwitch
	if w.cfg.ControllerSkipsCatchUp {
		// PLANTED BUG (Config.ControllerSkipsCatchUp): the final
		// configuration right after the joint one, without waiting for
		// the new members to catch up.
		c.finish()
	}
}

// tick sends what the phase needs: pushes without an answer yet, and polls.
func (c *controller) tick() {
	w := c.w
	switch c.phase {
	case ctlSwitch:
		for _, id := range c.joint.All() {
			c.pushIfDue(int(id-1), c.joint, ctlRetry)
		}
	case ctlCatchUp:
		if w.step > c.deadline {
			w.tracef("controller %d: the new members did not catch up in time", c.id)
			c.rollBack(c.joint)
			return
		}
		for _, id := range c.joint.NewMembers {
			i := int(id - 1)
			a := c.answers[i]
			switch {
			case c.caughtUp(a):
			case !slices.Contains(c.joint.Members, id) && a != nil && a.term < c.syncTerm && !w.cfg.ControllerSkipsTermBump:
				if w.step-c.pushed[i] >= ctlRetry {
					c.pushed[i] = w.step
					w.ctlNet = append(w.ctlNet, &ctlMsg{ctl: c.id, sk: i, bump: true, term: c.syncTerm})
				}
			default:
				c.pushIfDue(i, c.joint, c.poll)
			}
		}
	case ctlFinal:
		for _, id := range c.targets() {
			c.pushIfDue(int(id-1), c.final, ctlRetry)
		}
	}
}

// targets are the safekeepers ctlFinal pushes to: the final members, and
// the joint configuration's others (so that removed members learn).
func (c *controller) targets() []uint64 {
	ids := c.final.All()
	for _, id := range c.joint.All() {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

func (c *controller) pushIfDue(i int, conf proto.Configuration, every int) {
	if a := c.answers[i]; a != nil && a.conf.Generation >= conf.Generation && c.phase != ctlCatchUp {
		return
	}
	if c.w.step-c.pushed[i] < every {
		return
	}
	c.pushed[i] = c.w.step
	c.w.ctlNet = append(c.w.ctlNet, &ctlMsg{ctl: c.id, sk: i, conf: conf.Clone()})
}

// answer takes a safekeeper's answer to a membership call.
func (c *controller) answer(m *ctlMsg) {
	w := c.w
	if !c.alive || m.ctl != c.id || c.phase == ctlIdle {
		return // for a controller that is gone
	}
	if m.err != "" {
		w.count("controller: membership call refused")
		c.pushed[m.sk] = w.step // try again after ctlRetry
		return
	}
	c.answers[m.sk] = m
	switch c.phase {
	case ctlSwitch:
		var got []position
		for _, id := range c.joint.Members {
			if a := c.answers[id-1]; a != nil && a.conf.Generation >= c.joint.Generation {
				got = append(got, a.pos)
			}
		}
		if len(got) <= len(c.joint.Members)/2 {
			return
		}
		c.sync, c.syncTerm = position{}, 0
		for _, id := range c.joint.Members {
			if a := c.answers[id-1]; a != nil && a.conf.Generation >= c.joint.Generation {
				if c.sync.less(a.pos) {
					c.sync = a.pos
				}
				c.syncTerm = max(c.syncTerm, a.term)
			}
		}
		c.phase, c.deadline = ctlCatchUp, w.step+c.patience
		for i := range c.pushed {
			c.pushed[i] = -ctlRetry // bump or poll at once
		}
		w.tracef("controller %d: a majority of %v holds generation %d; sync position %s, sync term %d",
			c.id, c.joint.Members, c.joint.Generation, c.sync, c.syncTerm)
	case ctlCatchUp:
		n := 0
		for _, id := range c.joint.NewMembers {
			if c.caughtUp(c.answers[id-1]) {
				n++
			}
		}
		if n > len(c.joint.NewMembers)/2 {
			w.tracef("controller %d: a majority of %v reached the sync position %s", c.id, c.joint.NewMembers, c.sync)
			c.finish()
		}
	case ctlFinal:
		n := 0
		for _, id := range c.final.Members {
			if a := c.answers[id-1]; a != nil && a.conf.Generation >= c.final.Generation {
				n++
			}
		}
		if n > len(c.final.Members)/2 {
			switch {
			case !c.joint.Joint():
			case c.rollback:
				w.count("migration rolled back")
			default:
				w.count("migration finished")
			}
			w.tracef("controller %d: a majority of %v holds generation %d; done", c.id, c.final.Members, c.final.Generation)
			c.phase = ctlIdle
		}
	}
}

// caughtUp reports whether answer a shows a new member ready to form a
// quorum of the final configuration: in the joint configuration, at or past
// the sync position, and at or above the sync term.
func (c *controller) caughtUp(a *ctlMsg) bool {
	return a != nil && a.conf.Generation >= c.joint.Generation && !a.pos.less(c.sync) &&
		(a.term >= c.syncTerm || c.w.cfg.ControllerSkipsTermBump)
}

// finish writes the final configuration of the joint one: the new members.
func (c *controller) finish() {
	final := proto.Configuration{Generation: c.joint.Generation + 1, Members: slices.Clone(c.joint.NewMembers)}
	if !c.w.store.cas(c.joint.Generation, final) {
		c.phase = ctlIdle
		return
	}
	c.toFinal(c.joint, final, false)
}

// rollBack ends the change joint with its old members (generation + 2).
func (c *controller) rollBack(joint proto.Configuration) {
	back := proto.Configuration{Generation: joint.Generation + 1, Members: slices.Clone(joint.Members)}
	if !c.w.store.cas(joint.Generation, back) {
		c.phase = ctlIdle
		return
	}
	c.w.tracef("controller %d: rolls the change back to %v", c.id, joint.Members)
	c.toFinal(joint, back, true)
}

func (c *controller) toFinal(joint, final proto.Configuration, rollback bool) {
	c.reset()
	c.joint, c.final, c.rollback, c.phase = joint, final, rollback, ctlFinal
}

// deliverCtl delivers membership call k: a request reaches its safekeeper
// (lost if it is down), an answer its controller.
func (w *World) deliverCtl(k int) {
	m := w.ctlNet[k]
	w.ctlNet = slices.Delete(w.ctlNet, k, k+1)
	if m.answer {
		w.tracef("controller %d: sk%d answers: %s term %d position %s %s", m.ctl, m.sk, m.conf, m.term, m.pos, m.err)
		w.ctl.answer(m)
		return
	}
	s := w.sks[m.sk]
	if m.bump {
		w.tracef("term bump of sk%d to %d", m.sk, m.term)
	} else {
		w.tracef("membership call to sk%d: %s", m.sk, m.conf)
	}
	if !s.up() {
		return // connection refused: the controller sends it again
	}
	if m.bump {
		w.ctlNet = append(w.ctlNet, s.termBump(m))
		return
	}
	w.ctlNet = append(w.ctlNet, s.membership(m))
}
