package sim

import (
	"bytes"
	"fmt"
	"slices"
	"sort"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proposer/session"
	"github.com/safekeeper/safekeeper/proto"
)

// checker holds what the invariants need to remember across steps: the
// committed WAL, who got which votes, what each acceptor looked like.
// check runs after every step; reply, granted, elected and proposerCommit
// run at the moment their event happens. See docs/correctness.md.
type checker struct {
	w *World

	// commit is the highest commit_lsn any proposer or acceptor ever
	// reported; committed holds the WAL below it, from the timeline start,
	// and commitHist the history it was committed under.
	commit     proto.LSN
	committed  []byte
	commitHist proto.TermHistory
	// byTerm[k] = (term, lsn): WAL below lsn was committed in a term ≤ term
	// (sorted by term, lsn a running maximum).
	byTerm []termCommit

	// grants[term] lists, per proposer uuid, the safekeepers that granted
	// that ballot; electedBy[term] is the uuid that won term.
	grants    map[uint64][]grant
	electedBy map[uint64]proto.ID
	elections int

	sks []skSeen
}

type termCommit struct {
	term uint64
	lsn  proto.LSN
}

// committedBy is how far WAL was committed in terms up to term: any
// proposer of a later term must continue it, and any acceptor whose WAL is
// from term or later holds it unchanged below its flush_lsn.
func (c *checker) committedBy(term uint64) proto.LSN {
	k := sort.Search(len(c.byTerm), func(i int) bool { return c.byTerm[i].term > term }) - 1
	if k < 0 {
		return 0
	}
	return c.byTerm[k].lsn
}

func (c *checker) noteCommit(term uint64, lsn proto.LSN) {
	k := sort.Search(len(c.byTerm), func(i int) bool { return c.byTerm[i].term >= term })
	if k == len(c.byTerm) || c.byTerm[k].term != term {
		c.byTerm = slices.Insert(c.byTerm, k, termCommit{term: term})
	}
	c.byTerm[k].lsn = max(c.byTerm[k].lsn, lsn)
	for j := 1; j < len(c.byTerm); j++ {
		c.byTerm[j].lsn = max(c.byTerm[j].lsn, c.byTerm[j-1].lsn)
	}
}

// grant is who granted one proposer's ballot of a term, and in which
// generation its connections greeted (its session's configuration, by
// whose quorums the grants count).
type grant struct {
	uuid proto.ID
	gen  uint64
	sks  []bool
}

// skSeen is what the checker saw of one acceptor at the previous step.
type skSeen struct {
	// last durable state seen
	flush, commit proto.LSN
	voted         proto.Ballot
	hist          proto.TermHistory
	// ackTerm, ackFlush: the highest flush_lsn it acknowledged in a
	// SafeKeeperResponse while its WAL was of term ackTerm (its history's
	// last term).
	ackTerm  uint64
	ackFlush proto.LSN
	// verified: WAL [start, verified) was compared with the WAL its history
	// names; agreed: [start, agreed) with the committed WAL.
	verified, agreed proto.LSN
	// gen is the generation of its stored configuration.
	gen uint64
}

func newChecker(w *World) *checker {
	return &checker{w: w, grants: map[uint64][]grant{}, electedBy: map[uint64]proto.ID{}}
}

// check runs the per-step invariants over every acceptor.
func (c *checker) check() {
	w := c.w
	if w.err != nil {
		return
	}
	if len(c.sks) == 0 {
		c.sks = make([]skSeen, len(w.sks))
		for i := range c.sks {
			c.sks[i].verified, c.sks[i].agreed = w.tlStart, w.tlStart
		}
	}
	for _, p := range w.props {
		if p.active() {
			c.proposerCommit(p)
		}
	}
	c.checkConfigurations()
	if w.err != nil {
		return
	}
	for i, s := range w.sks {
		if s.disk == nil {
			continue // it does not hold the timeline
		}
		st := s.disk.state
		if s.sess != nil {
			// The acceptor's state is its durable state: it commits
			// before it changes (style rule 3).
			if a := s.sess.State(); !sameState(&a, &st) && !c.w.cfg.NoReplyDurabilityCheck {
				w.violate(InvPersistThenReply, "invariant 7 (decisions are durable before use): sk%d acts on state voted_for %s flush %s commit %s in %s, its disk has voted_for %s flush %s commit %s in %s",
					i, a.VotedFor, a.FlushLSN, a.CommitLSN, a.Configuration, st.VotedFor, st.FlushLSN, st.CommitLSN, st.Configuration)
				return
			}
			// What readers are served from may hold commit_lsn and
			// truncate_lsn ahead of the disk (persisted lazily), never
			// behind it and never above the durable flush_lsn: WAL
			// served is durable here.
			if m := s.sess.InMem(); m.CommitLSN < st.CommitLSN || m.CommitLSN > st.FlushLSN ||
				m.TruncateLSN < st.TruncateLSN || m.TruncateLSN > m.CommitLSN {
				w.violate(InvCommitBounds, "invariant 3 (in memory): sk%d serves commit_lsn %s truncate_lsn %s; durable commit_lsn %s truncate_lsn %s flush_lsn %s",
					i, m.CommitLSN, m.TruncateLSN, st.CommitLSN, st.TruncateLSN, st.FlushLSN)
				return
			}
			if m := s.sess.InMem(); m.CommitLSN > c.commit {
				w.violate(InvAgreement, "invariant 4: sk%d serves commit_lsn %s above everything committed %s", i, m.CommitLSN, c.commit)
				return
			}
		}
		c.checkSK(i, s, &st)
		if w.err != nil {
			return
		}
	}
}

func sameState(a, b *acceptor.State) bool {
	return a.VotedFor == b.VotedFor && a.FlushLSN == b.FlushLSN && a.CommitLSN == b.CommitLSN &&
		a.TruncateLSN == b.TruncateLSN && a.TimelineStartLSN == b.TimelineStartLSN && a.History.Equal(b.History) &&
		a.Configuration.Equal(b.Configuration)
}

// checkConfigurations checks the configurations every safekeeper stores
// and every proposer proposes in: each is the one the store created for its
// generation (invariant 8), and no safekeeper's generation ever decreases,
// also across crash-restart (invariant 10).
func (c *checker) checkConfigurations() {
	w := c.w
	same := func(conf proto.Configuration) bool {
		if conf.Generation == 0 {
			return conf.Validate() == nil
		}
		if w.store == nil {
			return false
		}
		stored, ok := w.store.get(conf.Generation)
		return ok && stored.Equal(conf)
	}
	for i, s := range w.sks {
		if s.disk == nil {
			continue
		}
		conf := s.disk.state.Configuration
		if !same(conf) {
			w.violate(InvOneConfigurationPerGeneration, "invariant 8 (one configuration per generation): sk%d stores %s, which the store did not create", i, conf)
			return
		}
		seen := &c.sks[i]
		if conf.Generation < seen.gen && !w.cfg.NoGenerationCheck {
			w.violate(InvGenerationNeverDecreases, "invariant 10 (a safekeeper never moves to a lower generation): sk%d went from generation %d to %s",
				i, seen.gen, conf)
			return
		}
		seen.gen = conf.Generation
	}
	for _, p := range w.props {
		if !same(p.conf) {
			w.violate(InvOneConfigurationPerGeneration, "invariant 8 (one configuration per generation): p%d proposes in %s, which the store did not create", p.idx, p.conf)
			return
		}
	}
}

// inGeneration reports whether safekeeper s may grant a vote or acknowledge
// WAL on connection c in state r (invariant 11, rule 9): c greeted in the
// generation r holds, and s is a member (or new member) of it.
func inGeneration(s *server, c *conn, r *acceptor.State) bool {
	g := &r.Configuration
	return g.Generation == c.gen && (g.Generation == 0 || g.IsMember(s.cfg.NodeID))
}

func (c *checker) checkSK(i int, s *server, st *acceptor.State) {
	w := c.w
	seen := &c.sks[i]
	// 3. commit_lsn ≤ flush_lsn; commit_lsn never decreases (the disk
	// survives crashes, so this covers restarts); truncate_lsn ≤ commit_lsn;
	// voted_for.term never decreases.
	if st.CommitLSN > st.FlushLSN {
		w.violate(InvCommitBounds, "invariant 3 (commit_lsn ≤ flush_lsn): sk%d commit_lsn %s above flush_lsn %s", i, st.CommitLSN, st.FlushLSN)
		return
	}
	if st.CommitLSN < seen.commit {
		w.violate(InvCommitBounds, "invariant 3 (commit_lsn never decreases): sk%d commit_lsn went from %s to %s", i, seen.commit, st.CommitLSN)
		return
	}
	if st.TruncateLSN > st.CommitLSN {
		w.violate(InvCommitBounds, "invariant 3: sk%d truncate_lsn %s above commit_lsn %s", i, st.TruncateLSN, st.CommitLSN)
		return
	}
	if st.VotedFor.Term < seen.voted.Term {
		w.violate(InvOneProposerPerTerm, "invariant 2 (votes are never forgotten): sk%d voted_for went from %s to %s", i, seen.voted, st.VotedFor)
		return
	}
	// 5. term histories strictly ascend, start where the timeline starts,
	// name only elected terms, and end at or below voted_for.term.
	histChanged := !st.History.Equal(seen.hist)
	if histChanged {
		if err := c.checkHistory(st.History, st.TimelineStartLSN); err != nil {
			w.violate(InvHistories, "invariant 5 (term histories ascend): sk%d: %v", i, err)
			return
		}
	}
	if st.History.LastTerm() > st.VotedFor.Term {
		w.violate(InvHistories, "invariant 5: sk%d history ends with term %d above voted_for %s", i, st.History.LastTerm(), st.VotedFor)
		return
	}
	// 1. No acceptor drops committed WAL it holds: flush_lsn only moves
	// back through a ProposerElected truncation, never below its own
	// commit_lsn, and a ProposerElected of term T never truncates WAL that
	// was committed in a term ≤ T where the acceptor holds it (its history
	// agrees with the committed one there). A ProposerElected of a term
	// below the committing one may: that proposer is stale, a quorum voted
	// above it, and this acceptor was not in the quorum that holds the
	// commit (it never learned it: the truncation is above its commit_lsn).
	// Seed 2518 found this case; see docs/correctness.md.
	if st.FlushLSN < seen.flush {
		held := min(seen.flush, c.committedBy(st.History.LastTerm()), diverge(seen.hist, c.commitHist))
		if st.FlushLSN < held || st.FlushLSN < seen.commit {
			w.violate(InvCommittedWAL, "invariant 1 (committed WAL is never truncated): sk%d flush_lsn went from %s to %s in term %d, dropping WAL committed below %s (its commit_lsn %s)",
				i, seen.flush, st.FlushLSN, st.History.LastTerm(), max(held, seen.commit), seen.commit)
			return
		}
	}
	// An acknowledged flush_lsn stays until a ProposerElected of a higher
	// term truncates: the proposer counts it toward commit_lsn (rule 6).
	if st.FlushLSN < seen.ackFlush && st.History.LastTerm() == seen.ackTerm {
		w.violate(InvCommittedWAL, "invariant 1 (acknowledged WAL stays): sk%d acknowledged flush_lsn %s in term %d, now has %s in the same term",
			i, seen.ackFlush, seen.ackTerm, st.FlushLSN)
		return
	}
	// Where its WAL changed, re-verify from the first changed byte.
	if histChanged || st.FlushLSN < seen.flush {
		d := min(diverge(seen.hist, st.History), st.FlushLSN)
		seen.verified = max(w.tlStart, min(seen.verified, d))
		seen.agreed = max(w.tlStart, min(seen.agreed, d))
	}
	if histChanged {
		seen.hist = st.History.Clone()
	}
	seen.flush, seen.commit, seen.voted = st.FlushLSN, st.CommitLSN, st.VotedFor
	if st.TimelineStartLSN == 0 {
		return
	}
	// 6. Log matching: every byte below flush_lsn is the byte the term its
	// history names there wrote.
	if seen.verified < st.FlushLSN {
		want, err := w.wal.read(st.History, seen.verified, st.FlushLSN)
		if err != nil {
			w.violate(InvLogMatching, "invariant 6 (log matching): sk%d: %v", i, err)
			return
		}
		got := s.disk.bytes(seen.verified, st.FlushLSN)
		if got == nil {
			w.violate(InvLogMatching, "invariant 6: sk%d holds no WAL for %s..%s below its flush_lsn", i, seen.verified, st.FlushLSN)
			return
		}
		if k := firstDiff(got, want); k >= 0 {
			w.violate(InvLogMatching, "invariant 6 (log matching): sk%d byte at %s differs from the WAL of term %d its history names there",
				i, seen.verified+proto.LSN(k), st.History[cover(st.History, seen.verified+proto.LSN(k))].Term)
			return
		}
		seen.verified = st.FlushLSN
	}
	// 4. Committed WAL is identical on every acceptor that holds it: below
	// its own commit_lsn, and below whatever was committed in terms up to
	// the term of its last WAL (an acceptor still on an older term may hold
	// a losing tail there until the next ProposerElected truncates it).
	to := min(st.FlushLSN, max(st.CommitLSN, c.committedBy(st.LastLogTerm())))
	if to > c.commit {
		w.violate(InvAgreement, "invariant 4: sk%d commit_lsn %s above everything committed %s", i, st.CommitLSN, c.commit)
		return
	}
	if seen.agreed < to {
		got := s.disk.bytes(seen.agreed, to)
		want := c.committed[seen.agreed-w.tlStart : to-w.tlStart]
		if k := firstDiff(got, want); k >= 0 || got == nil {
			w.violate(InvAgreement, "invariant 4 (all acceptors agree below commit_lsn %s): sk%d differs from the committed WAL at %s",
				c.commit, i, seen.agreed+proto.LSN(max(k, 0)))
			return
		}
		seen.agreed = to
	}
}

// checkHistory checks that h ascends strictly, starts at the timeline start,
// and names only terms some proposer won.
func (c *checker) checkHistory(h proto.TermHistory, tlStart proto.LSN) error {
	for k := range h {
		if k > 0 && (h[k].Term <= h[k-1].Term || h[k].StartLSN < h[k-1].StartLSN) {
			return fmt.Errorf("history %v: entry %d does not ascend", h, k)
		}
		if _, ok := c.electedBy[h[k].Term]; !ok {
			return fmt.Errorf("history %v names term %d, which no proposer won", h, h[k].Term)
		}
	}
	if len(h) > 0 && h[0].StartLSN != tlStart {
		return fmt.Errorf("history %v does not start at timeline_start_lsn %s", h, tlStart)
	}
	return nil
}

// diverge is the first LSN at which histories a and b name different terms
// (^0 if none): the first byte that may differ between two WALs that each
// follow their history.
func diverge(a, b proto.TermHistory) proto.LSN {
	best := ^proto.LSN(0)
	for _, h := range []proto.TermHistory{a, b} {
		for _, e := range h {
			x := e.StartLSN
			ka, kb := cover(a, x), cover(b, x)
			if ka < 0 || kb < 0 || a[ka].Term != b[kb].Term {
				best = min(best, x)
			}
		}
	}
	return best
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for k := range min(len(a), len(b)) {
		if a[k] != b[k] {
			return k
		}
	}
	return min(len(a), len(b))
}

// proposerCommit takes p's commit_lsn into the committed WAL (invariant 1:
// what was committed under one history never changes under another).
func (c *checker) proposerCommit(p *simProposer) {
	if !p.elected() || p.sess.Core().CommitLSN() <= c.commit {
		return
	}
	c.raiseCommit(p.sess.Core().Ballot().Term, p.sess.Core().CommitLSN(), p.sess.Core().Election().History, fmt.Sprintf("p%d (term %d)", p.idx, p.sess.Core().Ballot().Term))
}

// raiseCommit records that WAL below to, following history h, was committed
// in term.
func (c *checker) raiseCommit(term uint64, to proto.LSN, h proto.TermHistory, who string) {
	w := c.w
	if c.commit > 0 {
		if d := diverge(c.commitHist, h); d < c.commit {
			w.violate(InvCommittedWAL, "invariant 1 (committed WAL never changes): %s commits up to %s under history %v, which differs at %s from history %v committed up to %s",
				who, to, h, d, c.commitHist, c.commit)
			return
		}
	}
	from := max(c.commit, w.tlStart)
	more, err := w.wal.read(h, from, to)
	if err != nil {
		w.violate(InvLogMatching, "invariant 6: %s committed WAL that was never written: %v", who, err)
		return
	}
	c.committed = append(c.committed, more...)
	c.commit, c.commitHist = to, h.Clone()
	c.noteCommit(term, to)
}

// reply checks a reply at the moment a safekeeper sends it: what it reports
// was durable when the session produced it (invariant 7: persist, then
// reply — rules 2 and 6): it is one of the states the disk held since the
// server last sent replies. A commit_lsn it reports joins the committed WAL.
//
// A SafeKeeperResponse acknowledges WAL: it must also be sent in a state in
// which the safekeeper is a member of the generation its connection greeted
// in (invariant 11).
func (c *checker) reply(s *server, conn *conn, m proto.Message) {
	var voted proto.Ballot
	var flush, commit proto.LSN
	var conf *proto.Configuration
	response := false
	switch m := m.(type) {
	case *proto.SafeKeeperInfo:
		voted, flush, commit, conf = m.VotedFor, m.FlushLSN, m.CommitLSN, &m.Configuration
	case *proto.SafeKeeperResponse:
		voted, flush, commit, response = proto.Ballot{Term: m.Term}, m.FlushLSN, m.CommitLSN, true
	}
	st := &s.disk.state
	found, member := false, false
	for k := range s.disk.recent {
		r := &s.disk.recent[k]
		match := (voted == r.VotedFor || response && voted.Term == r.VotedFor.Term) && flush == r.FlushLSN && commit == r.CommitLSN &&
			(conf == nil || conf.Equal(r.Configuration))
		if match {
			st, found = r, true
		}
		if match || c.w.cfg.NoReplyDurabilityCheck {
			member = member || inGeneration(s, conn, r)
		}
	}
	if !found && !c.w.cfg.NoReplyDurabilityCheck {
		c.w.violate(InvPersistThenReply, "invariant 7 (persist, then reply): sk%d replies voted_for %s flush %s commit %s; durable: voted_for %s flush %s commit %s",
			s.idx, voted, flush, commit, st.VotedFor, st.FlushLSN, st.CommitLSN)
		return
	}
	if response && !member {
		c.w.violate(InvMembersOnly, "invariant 11 (only members acknowledge WAL, in their generation): sk%d acknowledges flush %s on conn%d greeted in generation %d; it holds %s",
			s.idx, flush, conn.id, conn.gen, s.disk.state.Configuration)
		return
	}
	if response && len(c.sks) > 0 {
		seen := &c.sks[s.idx]
		// The WAL acknowledged is of the term of its history (a deposed
		// sender's response carries voted_for.term, a later term).
		if t := st.History.LastTerm(); t != seen.ackTerm {
			seen.ackTerm, seen.ackFlush = t, 0
		}
		seen.ackFlush = max(seen.ackFlush, flush)
	}
	if commit > c.commit {
		c.raiseCommit(st.History.LastTerm(), commit, st.History, fmt.Sprintf("sk%d", s.idx))
	}
}

// granted records a vote sent (invariant 2: no two uuids ever hold a quorum
// of grants for the same term — counted from the grants the safekeepers
// sent, whether or not the proposer received them).
//
// A quorum is counted in the configuration of the generation the grants'
// connections greeted in (the proposer's session's); in generation 0, a
// majority of all safekeepers. A grant must also be sent in a state in
// which the safekeeper is a member of that generation (invariant 11).
func (c *checker) granted(s *server, conn *conn, b proto.Ballot) {
	w := c.w
	gs := c.grants[b.Term]
	k := -1
	for j := range gs {
		if gs[j].uuid == b.UUID && gs[j].gen == conn.gen {
			k = j
		}
	}
	if k < 0 {
		gs = append(gs, grant{uuid: b.UUID, gen: conn.gen, sks: make([]bool, len(w.sks))})
		k = len(gs) - 1
	}
	gs[k].sks[s.idx] = true
	c.grants[b.Term] = gs
	var winners []proto.ID
	for _, g := range gs {
		if c.quorum(g) && !slices.Contains(winners, g.uuid) {
			winners = append(winners, g.uuid)
		}
	}
	if len(winners) > 1 {
		w.violate(InvOneProposerPerTerm, "invariant 2 (at most one proposer per term): term %d granted by a quorum to both %s and %s", b.Term, winners[0], winners[1])
	}
	durable, member := false, false
	for k := range s.disk.recent {
		r := &s.disk.recent[k]
		if r.VotedFor == b || c.w.cfg.NoReplyDurabilityCheck {
			durable = durable || r.VotedFor == b
			member = member || inGeneration(s, conn, r)
		}
	}
	if !c.w.cfg.NoReplyDurabilityCheck && !durable {
		w.violate(InvPersistThenReply, "invariant 7 (persist, then reply): sk%d grants %s, its disk says voted_for %s", s.idx, b, s.disk.state.VotedFor)
		return
	}
	if !member {
		w.violate(InvMembersOnly, "invariant 11 (only members vote, in their generation): sk%d grants %s on conn%d greeted in generation %d; it holds %s",
			s.idx, b, conn.id, conn.gen, s.disk.state.Configuration)
	}
}

// quorum reports whether g's grants make a quorum of its generation's
// configuration.
func (c *checker) quorum(g grant) bool {
	if g.gen == 0 {
		n := 0
		for _, v := range g.sks {
			if v {
				n++
			}
		}
		return n > len(g.sks)/2
	}
	conf, ok := c.w.store.get(g.gen)
	if !ok {
		c.w.violate(Harness, "grants in generation %d, which the store never created", g.gen)
		return false
	}
	return isQuorum(conf, func(id uint64) bool { return id >= 1 && int(id) <= len(g.sks) && g.sks[id-1] })
}

// elected checks an election when it happens: one winner per term, and
// leader completeness — the new term starts at or above everything
// committed and its history agrees with the committed history below that.
func (c *checker) elected(p *simProposer, e *session.Election) bool {
	c.elections++
	if u, ok := c.electedBy[e.Term]; ok && u != p.uuid {
		c.w.violate(InvOneProposerPerTerm, "invariant 2 (at most one proposer per term): term %d won by %s and by %s", e.Term, u, p.uuid)
		return false
	}
	c.electedBy[e.Term] = p.uuid
	// A proposer elected in a term below one that already committed is
	// harmless (a quorum voted above it, so it can write nothing); one
	// above must carry everything committed before it.
	before := c.committedBy(e.Term - 1)
	if e.TermStartLSN < before {
		c.w.violate(InvCommittedWAL, "invariant 1 (committed WAL is never truncated): p%d elected in term %d starts its WAL at %s, below %s committed in earlier terms (donor sk%d)",
			p.idx, e.Term, e.TermStartLSN, before, e.Donor)
		return false
	}
	if d := diverge(c.commitHist, e.History); d < before {
		c.w.violate(InvCommittedWAL, "invariant 1 (committed WAL never changes): p%d elected in term %d with history %v, which differs at %s from the committed history %v (committed before it: %s)",
			p.idx, e.Term, e.History, d, c.commitHist, before)
		return false
	}
	return true
}
