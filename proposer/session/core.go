package session

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/safekeeper/safekeeper/proto"
)

// Errors of the session, which proposer.Run and proposer.Sync return too
// (package proposer names them again). Check them with errors.Is /
// errors.As. Their text starts "proposer:", as the operator reads them.
var (
	// ErrDeposed: a safekeeper showed a term above this proposer's ballot
	// after it was elected (in a greeting, a vote verdict or a
	// SafeKeeperResponse): another proposer took over and this one must stop.
	// The error is a *DeposedError.
	ErrDeposed = errors.New("proposer: deposed by a higher term")
	// ErrVoteRefused: a safekeeper refused the vote during the campaign; the
	// caller starts a new campaign, which picks a term above the one shown.
	ErrVoteRefused = errors.New("proposer: vote refused")
	// ErrNoQuorum: fewer than a quorum of safekeepers greeted or granted.
	ErrNoQuorum = errors.New("proposer: no quorum")
	// ErrUpstreamBehind: the primary's WAL ends below WAL a quorum of
	// safekeepers committed, so it cannot continue this timeline.
	ErrUpstreamBehind = errors.New("proposer: primary's WAL ends below the committed WAL")
	// ErrNoWAL: no voter has WAL and no start for a new timeline was given.
	ErrNoWAL = errors.New("proposer: no safekeeper has WAL for this timeline")
	// ErrCannotJoin: a safekeeper's start point would be below its
	// commit_lsn; it would refuse ProposerElected. It sits out this term.
	ErrCannotJoin = errors.New("proposer: safekeeper cannot join this term")
	// ErrDuplicateSafekeeper: two configured addresses reached the same
	// safekeeper (the same safekeeper_id). Counting it twice would let one
	// safekeeper stand for a quorum, so this is a fatal configuration error.
	ErrDuplicateSafekeeper = errors.New("proposer: the same safekeeper is configured twice")
	// ErrNewerConfiguration: a safekeeper holds a newer configuration of
	// the timeline than the session's (README_PROTO.md, rule 9): the
	// session ends, and a new one starts in that configuration. The error
	// is a *ConfigurationError.
	ErrNewerConfiguration = errors.New("proposer: a safekeeper holds a newer configuration")
	// ErrWrongSafekeeper: a safekeeper answered with another safekeeper_id
	// than the configuration expects at its address (Config.IDs); it does
	// not count and its connection is dropped.
	ErrWrongSafekeeper = errors.New("proposer: another safekeeper than the configuration names answers at the address")
)

// ConfigurationError says which safekeeper showed which newer
// configuration.
type ConfigurationError struct {
	Safekeeper    int    // index in the configured list
	Addr          string // its configured address; set by Run and Sync
	Configuration proto.Configuration
	Ours          uint64 // the session's generation
}

func (e *ConfigurationError) Error() string {
	who := e.Addr
	if who == "" {
		who = fmt.Sprintf("#%d", e.Safekeeper)
	}
	return fmt.Sprintf("proposer: safekeeper %s holds %s, newer than our generation %d", who, e.Configuration, e.Ours)
}

// Unwrap returns ErrNewerConfiguration.
func (e *ConfigurationError) Unwrap() error { return ErrNewerConfiguration }

// DeposedError says which safekeeper showed which higher term.
type DeposedError struct {
	Safekeeper int    // index in the configured list
	Addr       string // its configured address; set by Run and Sync (the core knows indexes only)
	Term       uint64 // the term it showed
	Ours       uint64 // this proposer's term
	By         string // who streams to that safekeeper now, if Run found out; "" if not
}

func (e *DeposedError) Error() string {
	return fmt.Sprintf("proposer: deposed: %s", e.Reason())
}

// Reason is the message without the package prefix: which safekeeper
// showed which term, above ours.
func (e *DeposedError) Reason() string {
	who := e.Addr
	if who == "" {
		who = fmt.Sprintf("#%d", e.Safekeeper)
	}
	msg := fmt.Sprintf("safekeeper %s is at term %d, above our term %d", who, e.Term, e.Ours)
	if e.By != "" {
		msg += "; " + e.By
	}
	return msg
}

// Unwrap returns ErrDeposed.
func (e *DeposedError) Unwrap() error { return ErrDeposed }

// Election is the outcome of a won campaign (rule 3).
type Election struct {
	// Term is the elected ballot's term.
	Term uint64
	// Donor is the index of the voter whose WAL the term continues.
	Donor int
	// TimelineStartLSN is where the timeline's WAL starts.
	TimelineStartLSN proto.LSN
	// TermStartLSN is where this term's WAL starts: the donor's flush_lsn
	// (or less, see Core.Elect).
	TermStartLSN proto.LSN
	// History is the proposer's term history; its last entry is
	// (Term, TermStartLSN).
	History proto.TermHistory
	// NewTimeline is true when no voter had WAL and the timeline starts here.
	NewTimeline bool
}

// Core is the pure decision core of the proposer: the election, the term
// choice, the per-safekeeper start points, commit_lsn and truncate_lsn, and
// the deposed check. It does no IO, keeps no clock and starts no goroutine
// (like acceptor.Acceptor and etcd raft's RawNode): the driver feeds it what
// safekeepers said and sends what it returns. Safekeepers are named by their
// index 0..n-1 in the configured list. Not safe for concurrent use.
type Core struct {
	uuid     proto.ID
	quorum   int
	conf     proto.Configuration // generation 0: a majority of all n
	maxTerm  uint64              // highest voted_for.term (or refused verdict) seen
	ballot   proto.Ballot
	election *Election
	sks      []skCore
	commit   proto.LSN
	truncate proto.LSN
	hooks    Hooks
}

// Hooks plant known safety bugs, for the simulation's planted-bug tests
// only: they prove its invariants fail when the protocol is broken. The
// zero value is the correct protocol; production code never sets them.
type Hooks struct {
	// NewMembersOnly: in a joint configuration, commit_lsn counts a
	// majority of the new members only, not of the old ones too. A commit
	// then needs no old majority, so one old majority may still elect a
	// proposer that lacks it (rule 9, joint quorums).
	NewMembersOnly bool
}

// SetHooks plants h (tests only).
func (c *Core) SetHooks(h Hooks) { c.hooks = h }

// skCore is what the core knows about one safekeeper.
type skCore struct {
	id        uint64 // safekeeper_id it answered with (hasID)
	hasID     bool
	greeted   bool
	granted   bool
	fresh     proto.SafeKeeperInfo // the SafeKeeperInfo sent right after the grant
	elected   bool                 // ProposerElected built for the current connection
	start     proto.LSN            // its start_streaming_at in this term
	inTerm    bool                 // answered a request of this term: accepted our ProposerElected
	termFlush proto.LSN            // highest flush_lsn it reported in this term
	known     bool                 // flush below is known
	flush     proto.LSN            // last known flush_lsn
	// joinAt: when this safekeeper holds no WAL, start it here (a segment
	// boundary at or below commit_lsn) instead of the timeline start, whose
	// WAL no source has any more (SetJoinPoint). 0: the timeline start.
	joinAt proto.LSN
	// expect is the safekeeper_id the configuration expects here (0: any).
	expect uint64
}

// NewCore returns a core for n safekeepers and a proposer uuid, in no
// configuration (generation 0): a quorum is a majority of the n.
func NewCore(n int, uuid proto.ID) *Core {
	if n <= 0 {
		panic("proposer: NewCore needs at least one safekeeper")
	}
	return &Core{uuid: uuid, quorum: n/2 + 1, sks: make([]skCore, n)}
}

// Configure puts the core in configuration conf (before any greeting): an
// election and a commit need a majority of each of conf.Groups, by
// safekeeper_id. ids, when not nil, are the safekeeper_id expected at each
// index (0: whichever answers); a greeting with another is
// ErrWrongSafekeeper. The ids of the others are learned from their
// greetings.
func (c *Core) Configure(conf proto.Configuration, ids []uint64) {
	c.conf = conf.Clone()
	for i := range c.sks {
		if i < len(ids) && ids[i] != 0 {
			c.sks[i].expect = ids[i]
		}
	}
}

// Configuration is the core's configuration.
func (c *Core) Configuration() proto.Configuration { return c.conf.Clone() }

// Quorum is ⌊n/2⌋+1: the size of a quorum in generation 0. In a
// configuration, HasQuorum and QuorumLSN count each group apart.
func (c *Core) Quorum() int { return c.quorum }

// Member reports whether safekeeper i counts toward quorums: always in
// generation 0; in a configuration, when its safekeeper_id (known from its
// greeting, or expected) is a member or a new member.
func (c *Core) Member(i int) bool {
	if c.conf.Generation == 0 {
		return true
	}
	id, ok := c.idOf(i)
	return ok && c.conf.IsMember(id)
}

func (c *Core) idOf(i int) (uint64, bool) {
	s := &c.sks[i]
	switch {
	case s.hasID:
		return s.id, true
	case s.expect != 0:
		return s.expect, true
	}
	return 0, false
}

// HasQuorum reports whether the safekeepers for which in holds make a
// quorum: a majority of all n in generation 0, else a majority of the
// members and, in a joint configuration, a majority of the new members too.
func (c *Core) HasQuorum(in func(i int) bool) bool {
	if c.conf.Generation == 0 {
		n := 0
		for i := range c.sks {
			if in(i) {
				n++
			}
		}
		return n >= c.quorum
	}
	for _, group := range c.conf.Groups() {
		n := 0
		for i := range c.sks {
			if id, ok := c.idOf(i); ok && slices.Contains(group, id) && in(i) {
				n++
			}
		}
		if n < len(group)/2+1 {
			return false
		}
	}
	return true
}

// QuorumLSN is the highest position a quorum has reached, given each
// safekeeper's (pos; ok false: none): in generation 0 the quorum-th highest
// of all, else the lowest over the groups of each group's majority-th
// highest. ok is false while no quorum has a position.
func (c *Core) QuorumLSN(pos func(i int) (proto.LSN, bool)) (proto.LSN, bool) {
	if c.conf.Generation == 0 {
		var fl []proto.LSN
		for i := range c.sks {
			if l, ok := pos(i); ok {
				fl = append(fl, l)
			}
		}
		if len(fl) < c.quorum {
			return 0, false
		}
		slices.Sort(fl)
		return fl[len(fl)-c.quorum], true
	}
	q, found := proto.LSN(0), false
	for _, group := range c.conf.Groups() {
		var fl []proto.LSN
		for i := range c.sks {
			if id, ok := c.idOf(i); ok && slices.Contains(group, id) {
				if l, ok := pos(i); ok {
					fl = append(fl, l)
				}
			}
		}
		need := len(group)/2 + 1
		if c.hooks.NewMembersOnly && len(c.conf.Groups()) == 2 && slices.Equal(group, c.conf.Members) {
			continue // PLANTED BUG (Hooks): the old members' majority is not counted
		}
		if len(fl) < need {
			return 0, false
		}
		slices.Sort(fl)
		if l := fl[len(fl)-need]; !found || l < q {
			q, found = l, true
		}
	}
	return q, found
}

// N is the number of safekeepers.
func (c *Core) N() int { return len(c.sks) }

// Ballot is the ballot of the current campaign (term 0 before Campaign).
func (c *Core) Ballot() proto.Ballot { return c.ballot }

// Election returns the election outcome, nil before Elect.
func (c *Core) Election() *Election { return c.election }

// ObserveTerm records a term seen outside a greeting (for instance a
// previous run's term), so the next campaign goes above it.
func (c *Core) ObserveTerm(t uint64) { c.maxTerm = max(c.maxTerm, t) }

// Greeted records safekeeper i's answer to ServerInfo. After the election, a
// voted_for.term above ours means deposed. A safekeeper_id already seen at
// another index is ErrDuplicateSafekeeper: one safekeeper must never count
// twice toward a quorum.
func (c *Core) Greeted(i int, info *proto.SafeKeeperInfo) error {
	for j := range c.sks {
		// safekeeper_id 0 is "not configured" (`safekeeper run` refuses it).
		if j != i && c.sks[j].hasID && info.SafekeeperID != 0 && c.sks[j].id == info.SafekeeperID {
			return fmt.Errorf("%w: safekeepers #%d and #%d both answer as safekeeper_id %d", ErrDuplicateSafekeeper, j, i, info.SafekeeperID)
		}
	}
	s := &c.sks[i]
	if s.expect != 0 && info.SafekeeperID != s.expect {
		return fmt.Errorf("%w: safekeeper #%d answers as safekeeper_id %d, the configuration has %d there", ErrWrongSafekeeper, i, info.SafekeeperID, s.expect)
	}
	if info.Configuration.Generation > c.conf.Generation {
		c.maxTerm = max(c.maxTerm, info.VotedFor.Term)
		return &ConfigurationError{Safekeeper: i, Configuration: info.Configuration.Clone(), Ours: c.conf.Generation}
	}
	s.id, s.hasID = info.SafekeeperID, true
	s.greeted = true
	s.granted, s.elected = false, false
	s.known, s.flush = true, info.FlushLSN
	c.maxTerm = max(c.maxTerm, info.VotedFor.Term)
	if c.ballot.Term != 0 && info.VotedFor.Term > c.ballot.Term {
		return c.deposed(i, info.VotedFor.Term)
	}
	return nil
}

// Greetings is how many safekeepers greeted on their current connection.
func (c *Core) Greetings() int {
	n := 0
	for i := range c.sks {
		if c.sks[i].greeted {
			n++
		}
	}
	return n
}

// Campaign picks the ballot: a term above every voted_for.term seen, owned
// by this proposer's uuid. It needs greetings from a quorum, so that the term
// is above the terms of a quorum (any term a quorum voted for is seen).
func (c *Core) Campaign() (proto.Ballot, error) {
	if c.election != nil {
		panic("proposer: Campaign after Elect")
	}
	if !c.GreetedQuorum() {
		return proto.Ballot{}, fmt.Errorf("%w: %d greeted, need %s", ErrNoQuorum, c.Greetings(), c.need())
	}
	c.ballot = proto.Ballot{Term: c.maxTerm + 1, UUID: c.uuid}
	return c.ballot, nil
}

// Voted records safekeeper i's verdict v and, for a grant, the fresh
// SafeKeeperInfo sent after it (rule 2). A refusal returns ErrVoteRefused
// during the campaign; once elected, a refusal showing a higher term is a
// *DeposedError and one showing another ballot of our own term is
// ErrCannotJoin (that safekeeper sits out the term). It reports whether a
// quorum has now granted.
func (c *Core) Voted(i int, v *proto.VoteResponse, fresh *proto.SafeKeeperInfo) (quorum bool, err error) {
	if c.ballot.Term == 0 {
		panic("proposer: Voted before Campaign")
	}
	if v.VotedFor != c.ballot {
		c.maxTerm = max(c.maxTerm, v.VotedFor.Term)
		if c.election != nil && v.VotedFor.Term == c.ballot.Term {
			// Another candidate of our own term got this vote. It cannot
			// have a quorum (we do, and quorums intersect), so we are not
			// deposed; this safekeeper just cannot join our term.
			return false, fmt.Errorf("%w: safekeeper #%d voted for %s in our term %d", ErrCannotJoin, i, v.VotedFor, c.ballot.Term)
		}
		if c.election != nil {
			return false, c.deposed(i, v.VotedFor.Term)
		}
		return false, fmt.Errorf("%w: safekeeper #%d voted for %s, we asked for %s", ErrVoteRefused, i, v.VotedFor, c.ballot)
	}
	if fresh == nil || fresh.VotedFor != c.ballot {
		return false, fmt.Errorf("proposer: safekeeper #%d granted %s without a fresh SafeKeeperInfo for it", i, c.ballot)
	}
	s := &c.sks[i]
	s.granted = true
	s.fresh = *fresh
	s.fresh.History = fresh.History.Clone()
	s.known, s.flush = true, fresh.FlushLSN
	return c.HasQuorum(c.Granted), nil
}

// GreetedQuorum reports whether a quorum greeted on its current
// connection.
func (c *Core) GreetedQuorum() bool { return c.HasQuorum(func(i int) bool { return c.sks[i].greeted }) }

// need says what a quorum is, for an error.
func (c *Core) need() string {
	if c.conf.Generation == 0 {
		return fmt.Sprintf("%d of %d", c.quorum, len(c.sks))
	}
	var parts []string
	for _, g := range c.conf.Groups() {
		parts = append(parts, fmt.Sprintf("%d of %v", len(g)/2+1, g))
	}
	return strings.Join(parts, " and ")
}

// Grants is how many safekeepers granted the current ballot on their
// current connection.
func (c *Core) Grants() int {
	n := 0
	for i := range c.sks {
		if c.sks[i].granted {
			n++
		}
	}
	return n
}

// Elect decides the election once a quorum granted (rule 3). The donor is
// the voter with the highest (last_log_term, flush_lsn) from its fresh
// SafeKeeperInfo, never by voted_for.term; term_start_lsn is its flush_lsn
// and the history is its history plus (term, term_start_lsn).
//
// upstreamEnd is the end of WAL the driver can stream (the primary's flush
// position). Normally it is at or above the donor's flush_lsn. If it is
// below (the primary lost WAL it had streamed, which only happens without
// fsync), the term starts at the highest commit_lsn among the voters instead
// (a record end every voter that has it agrees on), so the safekeepers'
// uncommitted tail is truncated to what the primary has; if even that is
// above upstreamEnd, Elect fails with ErrUpstreamBehind. Pass ^0 when there
// is no upstream (sync).
//
// newTimelineStart is where the timeline starts when no voter has WAL yet;
// the driver chooses a segment boundary.
func (c *Core) Elect(upstreamEnd, newTimelineStart proto.LSN) (*Election, error) {
	if c.election != nil {
		return c.election, nil
	}
	if !c.HasQuorum(c.Granted) {
		return nil, fmt.Errorf("%w: %d granted, need %s", ErrNoQuorum, c.Grants(), c.need())
	}
	donor := -1
	var maxCommit proto.LSN
	for i := range c.sks {
		s := &c.sks[i]
		if !s.granted {
			continue
		}
		maxCommit = max(maxCommit, s.fresh.CommitLSN)
		if donor < 0 || moreWAL(&s.fresh, &c.sks[donor].fresh) {
			donor = i
		}
	}
	d := &c.sks[donor].fresh
	e := &Election{Term: c.ballot.Term, Donor: donor}
	if d.TimelineStartLSN == 0 {
		if newTimelineStart == 0 {
			return nil, ErrNoWAL
		}
		e.NewTimeline = true
		e.TimelineStartLSN = newTimelineStart
		e.TermStartLSN = newTimelineStart
		e.History = proto.TermHistory{{Term: e.Term, StartLSN: newTimelineStart}}
	} else {
		e.TimelineStartLSN = d.TimelineStartLSN
		e.TermStartLSN = max(d.FlushLSN, d.TimelineStartLSN)
		if upstreamEnd < e.TermStartLSN {
			if upstreamEnd < maxCommit {
				return nil, fmt.Errorf("%w: primary at %s, safekeepers committed up to %s", ErrUpstreamBehind, upstreamEnd, maxCommit)
			}
			e.TermStartLSN = max(maxCommit, d.TimelineStartLSN)
		}
		e.History = append(d.History.Upto(e.TermStartLSN).Clone(), proto.TermSwitch{Term: e.Term, StartLSN: e.TermStartLSN})
		if e.History[0].StartLSN != e.TimelineStartLSN {
			// A donor whose history does not begin at the timeline start
			// would make every ProposerElected a protocol violation.
			return nil, fmt.Errorf("proposer: donor safekeeper #%d history starts at %s, its timeline at %s", donor, e.History[0].StartLSN, e.TimelineStartLSN)
		}
	}
	if err := e.History.Validate(); err != nil {
		return nil, fmt.Errorf("proposer: donor safekeeper #%d: %w", donor, err)
	}
	c.election = e
	return e, nil
}

// moreWAL orders voters for the donor choice: (last_log_term, flush_lsn).
func moreWAL(a, b *proto.SafeKeeperInfo) bool {
	if a.LastLogTerm != b.LastLogTerm {
		return a.LastLogTerm > b.LastLogTerm
	}
	return a.FlushLSN > b.FlushLSN
}

// ProposerElected returns the ProposerElected for safekeeper i, which must
// have granted the ballot on its current connection: start_streaming_at is
// the common point of its fresh history with ours (proto.TermHistory.CommonPoint), or
// the timeline start when it has no WAL. A start below its commit_lsn (it
// would refuse) is ErrCannotJoin.
func (c *Core) ProposerElected(i int) (*proto.ProposerElected, error) {
	e := c.election
	s := &c.sks[i]
	if e == nil || !s.granted {
		panic("proposer: ProposerElected before the election or the grant")
	}
	start := e.TimelineStartLSN
	empty := s.fresh.TimelineStartLSN == 0 || s.fresh.FlushLSN <= s.fresh.TimelineStartLSN
	if !empty {
		start = s.fresh.History.CommonPoint(s.fresh.FlushLSN, e.History)
	} else if s.joinAt > start && s.joinAt <= c.commit {
		start = s.joinAt // it holds no WAL: it joins late (README_PROTO.md)
	}
	if start < s.fresh.CommitLSN {
		return nil, fmt.Errorf("%w: safekeeper #%d: start_streaming_at %s below its commit_lsn %s", ErrCannotJoin, i, start, s.fresh.CommitLSN)
	}
	s.elected = true
	s.start = start
	s.known, s.flush = true, start
	return &proto.ProposerElected{
		Term: e.Term, StartStreamingAt: start, TimelineStartLSN: e.TimelineStartLSN, History: e.History.Clone(),
	}, nil
}

// SetJoinPoint makes safekeeper i, if it holds no WAL at its next
// ProposerElected, start at l (a segment boundary, at most commit_lsn)
// rather than at the timeline start: the WAL below l is on its peers, and
// nobody holds what lies before any more.
func (c *Core) SetJoinPoint(i int, l proto.LSN) { c.sks[i].joinAt = l }

// Response records a SafeKeeperResponse of safekeeper i (after its
// ProposerElected). A term above ours means deposed. It returns whether
// commit_lsn advanced.
func (c *Core) Response(i int, r *proto.SafeKeeperResponse) (advanced bool, err error) {
	if r.Term > c.ballot.Term {
		return false, c.deposed(i, r.Term)
	}
	s := &c.sks[i]
	if !s.elected {
		return false, fmt.Errorf("proposer: SafeKeeperResponse from safekeeper #%d before its ProposerElected", i)
	}
	// A response in our term proves the ProposerElected was accepted: the
	// WAL below its flush_lsn is ours (below start_streaming_at it agrees
	// with our history, above it came from us).
	s.inTerm = true
	s.termFlush = max(s.termFlush, r.FlushLSN)
	s.known, s.flush = true, r.FlushLSN
	old := c.commit
	c.recompute()
	return c.commit > old, nil
}

// recompute applies the commit rule: commit_lsn is the quorum-th highest
// flush_lsn among safekeepers in this term whose flush_lsn is at or past
// term_start_lsn (WAL below the term start may be from a losing term until
// the safekeeper accepted this term's ProposerElected, and a flush_lsn below
// it says nothing about this term's WAL). It never decreases.
func (c *Core) recompute() {
	if c.election == nil {
		return
	}
	if q, ok := c.QuorumLSN(func(i int) (proto.LSN, bool) {
		s := &c.sks[i]
		return s.termFlush, s.inTerm && s.termFlush >= c.election.TermStartLSN
	}); ok {
		c.commit = max(c.commit, q)
	}
	if tr, ok := c.minFlush(); ok {
		c.truncate = max(c.truncate, min(tr, c.commit))
	}
}

// minFlush is the lowest known flush_lsn, false while some safekeeper was
// never heard from (it may have nothing).
func (c *Core) minFlush() (proto.LSN, bool) {
	m := proto.LSN(1<<64 - 1)
	for i := range c.sks {
		if !c.Member(i) {
			continue // not in the configuration: it needs none of this WAL
		}
		if !c.sks[i].known {
			return 0, false
		}
		m = min(m, c.sks[i].flush)
	}
	return m, true
}

// Disconnected forgets safekeeper i's connection-scoped state (greeting,
// grant, ProposerElected). Its durable flush_lsn of this term still counts
// toward commit_lsn: it was acknowledged after fsync.
func (c *Core) Disconnected(i int) {
	s := &c.sks[i]
	s.greeted, s.granted, s.elected = false, false, false
}

// CommitLSN is the quorum commit point: WAL below it is durable on a quorum
// in this term. It never decreases.
func (c *Core) CommitLSN() proto.LSN { return c.commit }

// TruncateLSN is what every safekeeper has: the lowest flush_lsn over all of
// them (0 while one was never heard from), capped at commit_lsn. It never
// decreases.
func (c *Core) TruncateLSN() proto.LSN { return c.truncate }

// StartStreamingAt is safekeeper i's start point in this term (valid after
// ProposerElected(i)).
func (c *Core) StartStreamingAt(i int) proto.LSN { return c.sks[i].start }

// FlushLSN is safekeeper i's last known flush_lsn and whether it is known.
func (c *Core) FlushLSN(i int) (proto.LSN, bool) { return c.sks[i].flush, c.sks[i].known }

// Request builds a SafeKeeperRequest of this term carrying wal at begin
// (empty: a heartbeat) with the current commit_lsn and truncate_lsn. wal is
// not copied.
func (c *Core) Request(begin proto.LSN, wal []byte) *proto.SafeKeeperRequest {
	if len(wal) > proto.MaxWALPerRequest {
		panic("proposer: SafeKeeperRequest above MaxWALPerRequest")
	}
	return &proto.SafeKeeperRequest{
		Sender: c.ballot, BeginLSN: begin, EndLSN: begin + proto.LSN(len(wal)),
		CommitLSN: c.commit, TruncateLSN: c.truncate, WAL: wal,
	}
}

func (c *Core) deposed(i int, term uint64) error {
	c.maxTerm = max(c.maxTerm, term)
	return &DeposedError{Safekeeper: i, Term: term, Ours: c.ballot.Term}
}

// MaxTermSeen is the highest term any safekeeper showed (voted_for.term in a
// greeting, a refused verdict, a response) or ObserveTerm recorded.
func (c *Core) MaxTermSeen() uint64 { return max(c.maxTerm, c.ballot.Term) }

// Granted reports whether safekeeper i granted the ballot on its current
// connection.
func (c *Core) Granted(i int) bool { return c.sks[i].granted }
