package acceptor

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
)

// Config is the fixed configuration of an acceptor.
type Config struct {
	// NodeID is this safekeeper's configured node id, reported in
	// SafeKeeperInfo.safekeeper_id.
	NodeID uint64
}

// Acceptor is the state machine of one timeline on one safekeeper: the
// acceptor of the WAL push protocol, rules 1–8 of README_PROTO.md. It is
// not safe for concurrent use: one owner per timeline drives it, one call at a time.
//
// Durability order: every method that answers with a decision (a vote, a
// state report, a truncation) first commits all staged WAL and the new state
// through Storage.Commit and only then returns the reply. Append only stages
// WAL; its SafeKeeperResponse comes from Flush, after the commit.
//
// commit_lsn and truncate_lsn that arrive without WAL (a heartbeat, or the
// proposer's broadcast of a new commit_lsn) are not committed one by one:
// the acceptor keeps them in memory (Neon's "inmem" state, see InMem) until
// Persist, the next commit of WAL, a vote or an election stores them. They
// are facts about the quorum, not decisions of this node, so losing them in a
// crash loses nothing: commit_lsn comes back as the durable value, still at
// or below flush_lsn, and the proposer sends it again. What this node reports
// to a proposer (SafeKeeperInfo, SafeKeeperResponse) is always the durable
// value, so a reported commit_lsn never decreases, also across restarts.
type Acceptor struct {
	cfg   Config
	store Storage
	st    State // durable state: what the last Commit stored
	// inmem is st with the commit_lsn and truncate_lsn known in memory:
	// at or above st's, never above st.FlushLSN.
	inmem State
	// walStaged: WAL was staged (written or truncated) since the last Commit.
	walStaged bool
	// version counts changes of inmem (commits included), so a caller can
	// tell whether there is a new state to publish.
	version uint64

	dec      *xlog.Decoder // record boundaries of staged WAL; nil until the timeline has WAL
	writeLSN proto.LSN     // end of staged WAL in the current term
	// proposerCommit is the highest commit_lsn a proposer of the current term
	// sent; the durable CommitLSN follows it as far as FlushLSN allows.
	proposerCommit proto.LSN
	truncateLSN    proto.LSN // highest truncate_lsn sent
	pending        int       // SafeKeeperRequests staged since the last Flush
	dirty          bool      // staged WAL or state not yet committed
	failed         error     // set after a storage failure; sticky
	commits        uint64    // successful Commits: the durable state's version
	hooks          hooks     // planted bugs (hooks.go); zero in production
}

// NewState returns the initial state of a timeline created by m (rule 1).
func NewState(m *proto.ServerInfo) State {
	return State{
		TenantID:   m.TenantID,
		TimelineID: m.TimelineID,
		SystemID:   m.SystemID,
		PgVersion:  m.PgVersion,
		WalSegSize: m.WalSegSize,
		PgTimeline: m.PgTimeline,
		// The configuration the timeline is created in (generation 0
		// when the proposer knows none).
		Configuration: m.Configuration.Clone(),
	}
}

// New rebuilds an acceptor from the durable state st of its timeline (after
// creation or a reboot). WAL above st.FlushLSN — an incomplete record or
// bytes never acknowledged — is discarded, durably, before New returns.
func New(cfg Config, st State, store Storage) (*Acceptor, error) {
	return newAcceptor(cfg, st, store, hooks{})
}

func newAcceptor(cfg Config, st State, store Storage, h hooks) (*Acceptor, error) {
	a := &Acceptor{cfg: cfg, store: store, st: st.Clone(), inmem: st.Clone(), hooks: h}
	if st.CommitLSN > st.FlushLSN {
		return nil, fmt.Errorf("%w: persisted commit_lsn %s above flush_lsn %s", ErrStorage, st.CommitLSN, st.FlushLSN)
	}
	a.resetWAL(st.FlushLSN)
	a.proposerCommit = st.CommitLSN
	a.truncateLSN = st.TruncateLSN
	if err := store.TruncateWAL(st.FlushLSN); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	if err := store.Commit(a.st.Clone()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	a.commits++
	return a, nil
}

func (a *Acceptor) resetWAL(at proto.LSN) {
	a.writeLSN = at
	a.dec = nil
	if a.st.TimelineStartLSN != 0 {
		a.dec = xlog.NewDecoder(at, uint64(a.st.WalSegSize))
	}
}

// State returns a copy of the durable state.
func (a *Acceptor) State() State { return a.st.Clone() }

// InMem returns a copy of the state to serve readers from: the durable state
// with the commit_lsn and truncate_lsn known in memory, which may be ahead of
// the disk until Persist. WAL up to its CommitLSN is durable here (it is at
// or below the durable flush_lsn) and committed on a quorum.
func (a *Acceptor) InMem() State { return a.inmem.Clone() }

// Unpersisted reports whether InMem holds a commit_lsn or truncate_lsn that
// is not durable yet: the caller should Persist within 100 ms.
func (a *Acceptor) Unpersisted() bool {
	return a.inmem.CommitLSN != a.st.CommitLSN || a.inmem.TruncateLSN != a.st.TruncateLSN
}

// Persist commits whatever is staged, and the commit_lsn and truncate_lsn
// kept in memory. It is a no-op when nothing is unpersisted.
func (a *Acceptor) Persist() error {
	if err := a.flushStaged(); err != nil {
		return err
	}
	if !a.Unpersisted() {
		return nil
	}
	return a.commit(a.inmem.Clone())
}

// WriteLSN returns the end of the WAL staged in the current term (the
// position the next SafeKeeperRequest must begin at).
func (a *Acceptor) WriteLSN() proto.LSN { return a.writeLSN }

// Pending returns how many SafeKeeperRequests await the next Flush.
func (a *Acceptor) Pending() int { return a.pending }

// Info is the SafeKeeperInfo for the durable state.
func (a *Acceptor) Info() *proto.SafeKeeperInfo {
	return &proto.SafeKeeperInfo{
		ProtocolVersion:  proto.ProtocolVersion,
		SafekeeperID:     a.cfg.NodeID,
		VotedFor:         a.st.VotedFor,
		LastLogTerm:      a.st.LastLogTerm(),
		FlushLSN:         a.st.FlushLSN,
		CommitLSN:        a.st.CommitLSN,
		TruncateLSN:      a.st.TruncateLSN,
		TimelineStartLSN: a.st.TimelineStartLSN,
		History:          a.st.History.Upto(a.st.FlushLSN).Clone(),
		Configuration:    a.st.Configuration.Clone(),
	}
}

// ServerInfo handles a proposer's greeting (rule 1): it checks that m matches
// the timeline and answers with the current state. The timeline itself is
// created by the caller (see NewState) before the acceptor exists. A
// configuration of a higher generation than the stored one is adopted,
// durably, before the answer (rule 9); a lower one is answered with the
// stored configuration, which the proposer adopts.
func (a *Acceptor) ServerInfo(m *proto.ServerInfo) (*proto.SafeKeeperInfo, error) {
	if err := a.flushStaged(); err != nil {
		return nil, err
	}
	if err := a.CheckServerInfo(m); err != nil {
		return nil, err
	}
	if _, err := a.SetConfiguration(m.Configuration); err != nil {
		return nil, err
	}
	return a.Info(), nil
}

// Configuration is the timeline's configuration as stored.
func (a *Acceptor) Configuration() proto.Configuration { return a.st.Configuration.Clone() }

// SetConfiguration adopts c if its generation is above the stored one,
// durably (rule 9): a safekeeper never goes back to an older generation,
// and a lower one is ignored (switched false). The same generation with
// other members is refused (ErrConfigurationConflict in a
// *ConfigurationError): a generation names one configuration.
func (a *Acceptor) SetConfiguration(c proto.Configuration) (switched bool, err error) {
	if err := a.flushStaged(); err != nil {
		return false, err
	}
	if err := c.Validate(); err != nil {
		return false, fmt.Errorf("%w: configuration: %v", ErrProtocol, err)
	}
	cur := a.st.Configuration
	switch {
	case c.Generation < cur.Generation && !a.hooks.acceptOlderGeneration:
		return false, nil
	case c.Generation == cur.Generation:
		if !c.Equal(cur) {
			return false, &ConfigurationError{Err: ErrConfigurationConflict, Configuration: cur.Clone(),
				Msg: fmt.Sprintf("configuration %s differs from the stored %s of the same generation", c, cur)}
		}
		return false, nil
	}
	next := a.inmem.Clone()
	next.Configuration = c.Clone()
	if err := a.commit(next); err != nil {
		return false, err
	}
	return true, nil
}

// TermBump raises voted_for to term, durably, if it is below (a vote for
// the ballot (term, zero uuid), which no proposer owns): a membership
// change raises the new members to the highest term their old peers
// voted for before they may form a quorum alone, so that a proposer
// elected by them picks a term above every earlier one (README_PROTO.md,
// "Membership and generations"). It returns the term before.
func (a *Acceptor) TermBump(term uint64) (previous uint64, err error) {
	if err := a.flushStaged(); err != nil {
		return 0, err
	}
	previous = a.st.VotedFor.Term
	if term <= previous {
		return previous, nil
	}
	next := a.inmem.Clone()
	next.VotedFor = proto.Ballot{Term: term}
	return previous, a.commit(next)
}

// CheckGeneration reports whether a connection greeted in generation gen
// may still act on the timeline (rule 9): not when the stored generation is
// higher (ErrStaleGeneration), nor when this safekeeper is not a member of
// the stored configuration (ErrNotMember). Both are *ConfigurationError.
func (a *Acceptor) CheckGeneration(gen uint64) error {
	cur := &a.st.Configuration
	switch {
	case gen < cur.Generation && !a.hooks.acceptOlderGeneration:
		return &ConfigurationError{Err: ErrStaleGeneration, Configuration: cur.Clone(),
			Msg: fmt.Sprintf("the connection greeted in generation %d, the timeline is in %s", gen, cur)}
	case cur.Generation > 0 && !cur.IsMember(a.cfg.NodeID):
		return &ConfigurationError{Err: ErrNotMember, Configuration: cur.Clone(),
			Msg: fmt.Sprintf("safekeeper %d is not a member of %s", a.cfg.NodeID, cur)}
	}
	return nil
}

// CheckServerInfo reports whether m describes this timeline: same tenant and
// timeline ids, system_id, PostgreSQL major version, wal_seg_size and TLI.
// Errors wrap ErrIncompatible.
func (a *Acceptor) CheckServerInfo(m *proto.ServerInfo) error {
	s := &a.st
	switch {
	case m.TenantID != s.TenantID || m.TimelineID != s.TimelineID:
		return fmt.Errorf("%w: ServerInfo for %s/%s sent to timeline %s/%s", ErrIncompatible, m.TenantID, m.TimelineID, s.TenantID, s.TimelineID)
	case m.SystemID != s.SystemID:
		return fmt.Errorf("%w: system_id %d differs from the timeline's %d", ErrIncompatible, m.SystemID, s.SystemID)
	case m.PgVersion/10000 != s.PgVersion/10000:
		return fmt.Errorf("%w: PostgreSQL major version %d differs from the timeline's %d", ErrIncompatible, m.PgVersion/10000, s.PgVersion/10000)
	case m.WalSegSize != s.WalSegSize:
		return fmt.Errorf("%w: wal_seg_size %d differs from the timeline's %d", ErrIncompatible, m.WalSegSize, s.WalSegSize)
	case m.PgTimeline < s.PgTimeline:
		// A primary of an older PostgreSQL timeline (the one before a
		// promotion, back again) must not write on.
		return fmt.Errorf("%w: pg_timeline %d is older than the timeline's %d: a standby was promoted since", ErrIncompatible, m.PgTimeline, s.PgTimeline)
	}
	// A newer pg_timeline is a promoted primary: it switches the timeline
	// once its TimelineHistory checks out (Acceptor.TimelineHistory).
	return nil
}

// pgSwitch is a PostgreSQL timeline switch a connection asks for: its
// ServerInfo named timeline TLI, newer than the stored one, and its
// TimelineHistory says the stored timeline ended at ParentEnd.
type pgSwitch struct {
	TLI       uint32
	Content   []byte
	ParentEnd proto.LSN // where the stored timeline ended; ^0 for a timeline without WAL yet adopting its history
}

// view is info as the new timeline sees this safekeeper: WAL past
// ParentEnd belongs to the old timeline only (the promoted standby never
// had it) and is not counted, so an election never picks it and
// ProposerElected truncates it.
func (sw *pgSwitch) view(info *proto.SafeKeeperInfo) {
	if sw == nil || info.FlushLSN <= sw.ParentEnd {
		return
	}
	info.FlushLSN = sw.ParentEnd
	info.History = info.History.Upto(sw.ParentEnd).Clone()
	info.LastLogTerm = info.History.LastTerm()
	info.CommitLSN = min(info.CommitLSN, sw.ParentEnd)
	info.TruncateLSN = min(info.TruncateLSN, info.CommitLSN)
}

// TimelineHistory checks the history file of PostgreSQL timeline m.PgTimeline
// (named by the connection's ServerInfo) against the stored timeline and
// returns the switch it asks for, nil if none: the stored timeline must be
// an ancestor, ending at or above commit_lsn (else the promoted primary
// lacks committed WAL), and the stored history a prefix of the new one.
func (a *Acceptor) TimelineHistory(named uint32, m *proto.TimelineHistory) (*pgSwitch, error) {
	s := &a.st
	if m.PgTimeline != named {
		return nil, fmt.Errorf("%w: TimelineHistory of PostgreSQL timeline %d after a ServerInfo naming %d", ErrProtocol, m.PgTimeline, named)
	}
	if named == s.PgTimeline {
		switch {
		case bytes.Equal(m.Content, s.PgHistory):
			return nil, nil
		case len(s.PgHistory) == 0 && s.TimelineStartLSN == 0:
			// A timeline created by a primary already past timeline 1:
			// its history is recorded with the first ProposerElected.
			return &pgSwitch{TLI: named, Content: bytes.Clone(m.Content), ParentEnd: ^proto.LSN(0)}, nil
		}
		return nil, fmt.Errorf("%w: the history of PostgreSQL timeline %d differs from the one this timeline recorded", ErrIncompatible, named)
	}
	ends, err := proto.ParsePgHistory(named, m.Content)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if s.PgTimeline > 1 && len(s.PgHistory) > 0 {
		stored, err := proto.ParsePgHistory(s.PgTimeline, s.PgHistory)
		if err != nil {
			return nil, fmt.Errorf("%w: the stored history of timeline %d: %w", ErrStorage, s.PgTimeline, err)
		}
		for i, e := range stored {
			if i >= len(ends) || ends[i] != e {
				return nil, fmt.Errorf("%w: PostgreSQL timeline %d's history does not continue timeline %d's", ErrIncompatible, named, s.PgTimeline)
			}
		}
	}
	var parentEnd proto.LSN
	found := false
	for _, e := range ends {
		if e.TLI == s.PgTimeline {
			parentEnd, found = e.End, true
		}
	}
	switch {
	case !found:
		return nil, fmt.Errorf("%w: PostgreSQL timeline %d does not descend from this timeline's %d", ErrIncompatible, named, s.PgTimeline)
	case a.inmem.CommitLSN > parentEnd:
		return nil, fmt.Errorf("%w: PostgreSQL timeline %d branched off timeline %d at %s, below its commit_lsn %s: the promoted primary lacks committed WAL",
			ErrIncompatible, named, s.PgTimeline, parentEnd, a.inmem.CommitLSN)
	}
	return &pgSwitch{TLI: named, Content: bytes.Clone(m.Content), ParentEnd: parentEnd}, nil
}

// RequestVote handles a vote request (rule 2). All staged WAL is made durable
// first. The vote is granted iff the candidate's term is above voted_for's, or
// the candidate is voted_for itself (the same proposer reconnecting); a grant
// is committed before RequestVote returns. Granted: the verdict (equal to the
// candidate) and the fresh state the proposer must elect with. Refused: the
// verdict (the stored voted_for) and an error wrapping ErrVoteRefused.
func (a *Acceptor) RequestVote(m *proto.RequestVote) (*proto.VoteResponse, *proto.SafeKeeperInfo, error) {
	if err := a.flushStaged(); err != nil {
		return nil, nil, err
	}
	c := m.Candidate
	if c.Term == 0 {
		return nil, nil, fmt.Errorf("%w: RequestVote for term 0", ErrProtocol)
	}
	if c.Term <= a.st.VotedFor.Term && c != a.st.VotedFor {
		return &proto.VoteResponse{VotedFor: a.st.VotedFor}, nil,
			fmt.Errorf("%w: candidate %s, already voted for %s", ErrVoteRefused, c, a.st.VotedFor)
	}
	if c != a.st.VotedFor {
		next := a.inmem.Clone() // the vote also persists commit_lsn and truncate_lsn
		next.VotedFor = c
		if err := a.commit(next); err != nil {
			return nil, nil, err
		}
	}
	return &proto.VoteResponse{VotedFor: c}, a.Info(), nil
}

// ProposerElected handles the elected proposer's first message (rule 4).
// from is the ballot the connection was granted. The acceptor recomputes the
// common point of its WAL with the proposer's history and refuses a
// start_streaming_at that differs (ErrCommonPointMismatch) or lies below
// commit_lsn (ErrTruncateCommitted); otherwise it truncates its WAL at
// start_streaming_at, adopts the history and commits both in one step.
func (a *Acceptor) ProposerElected(from proto.Ballot, m *proto.ProposerElected) error {
	return a.proposerElected(from, m, nil)
}

// proposerElected is ProposerElected for a connection that may switch the
// PostgreSQL timeline (sw non-nil): the common point is computed on the
// WAL the new timeline shares (up to sw.ParentEnd), and the switch is
// recorded in the same commit.
func (a *Acceptor) proposerElected(from proto.Ballot, m *proto.ProposerElected, sw *pgSwitch) error {
	if err := a.flushStaged(); err != nil {
		return err
	}
	if sw != nil && a.st.PgTimeline >= sw.TLI && sw.ParentEnd != ^proto.LSN(0) {
		// Another connection switched the timeline meanwhile.
		if a.st.PgTimeline != sw.TLI || !bytes.Equal(a.st.PgHistory, sw.Content) {
			return fmt.Errorf("%w: the timeline is on PostgreSQL timeline %d now", ErrIncompatible, a.st.PgTimeline)
		}
		sw = nil
	}
	if err := a.checkTerm(from, m.Term, "ProposerElected"); err != nil {
		return err
	}
	if err := m.History.Validate(); err != nil || len(m.History) == 0 || m.History.LastTerm() != m.Term {
		return fmt.Errorf("%w: ProposerElected history must ascend and end with term %d", ErrProtocol, m.Term)
	}
	if m.TimelineStartLSN == 0 || m.History[0].StartLSN != m.TimelineStartLSN {
		return fmt.Errorf("%w: ProposerElected timeline_start_lsn %s must be non-zero and equal the history's first start_lsn %s",
			ErrProtocol, m.TimelineStartLSN, m.History[0].StartLSN)
	}
	if a.st.TimelineStartLSN != 0 && m.TimelineStartLSN != a.st.TimelineStartLSN {
		return fmt.Errorf("%w: ProposerElected timeline_start_lsn %s, this timeline starts at %s",
			ErrProtocol, m.TimelineStartLSN, a.st.TimelineStartLSN)
	}
	flush := a.st.FlushLSN
	if sw != nil {
		flush = min(flush, sw.ParentEnd) // WAL past it is the old timeline's only
	}
	cp := a.st.History.Upto(flush).CommonPoint(flush, m.History)
	empty := a.st.TimelineStartLSN == 0 || a.st.FlushLSN <= a.st.TimelineStartLSN
	if empty {
		cp = m.TimelineStartLSN // no WAL yet: everything starts at the timeline start
	}
	// joining: a safekeeper that holds no WAL may start at a later segment
	// boundary instead (README_PROTO.md, "Joining late"): the WAL below it
	// is committed and held by its peers, which may have removed what lies
	// before; it holds the timeline from there, as if it had removed the
	// rest.
	joining := empty && m.StartStreamingAt > cp && m.StartStreamingAt.SegmentOffset(uint64(a.st.WalSegSize)) == 0
	if cp != m.StartStreamingAt && !joining && !a.hooks.skipCommonPointCheck {
		return fmt.Errorf("%w: start_streaming_at %s, but this safekeeper's WAL agrees with the proposer's history up to %s",
			ErrCommonPointMismatch, m.StartStreamingAt, cp)
	}
	if m.StartStreamingAt < a.inmem.CommitLSN {
		return fmt.Errorf("%w: start_streaming_at %s is below commit_lsn %s", ErrTruncateCommitted, m.StartStreamingAt, a.inmem.CommitLSN)
	}
	next := a.inmem.Clone()
	next.History = m.History.Clone()
	next.TimelineStartLSN = m.TimelineStartLSN
	next.FlushLSN = m.StartStreamingAt
	next.TruncateLSN = min(next.TruncateLSN, next.CommitLSN)
	if joining {
		next.RemovedUpTo = max(next.RemovedUpTo, m.StartStreamingAt) // nothing held below it: 58P01 for readers
	}
	if sw != nil {
		if m.StartStreamingAt > sw.ParentEnd {
			return fmt.Errorf("%w: start_streaming_at %s is past where PostgreSQL timeline %d branched off (%s)",
				ErrCommonPointMismatch, m.StartStreamingAt, sw.TLI, sw.ParentEnd)
		}
		next.PgTimeline, next.PgHistory = sw.TLI, bytes.Clone(sw.Content)
	}
	if err := a.store.TruncateWAL(m.StartStreamingAt); err != nil {
		return a.fail(err)
	}
	if err := a.commit(next); err != nil {
		return err
	}
	a.resetWAL(m.StartStreamingAt)
	a.proposerCommit = a.st.CommitLSN
	return nil
}

// checkTerm checks that a message of term from a connection granted ballot
// from may act on this timeline now.
func (a *Acceptor) checkTerm(from proto.Ballot, term uint64, what string) error {
	v := a.st.VotedFor
	switch {
	case term < v.Term:
		return fmt.Errorf("%w: %s of term %d, this safekeeper voted for term %d", ErrStaleTerm, what, term, v.Term)
	case term > v.Term:
		return fmt.Errorf("%w: %s of term %d, which this safekeeper did not vote for (voted for %s)", ErrProtocol, what, term, v)
	case from != v:
		return fmt.Errorf("%w: %s from %s, but term %d belongs to %s", ErrProtocol, what, from, term, v)
	}
	return nil
}

// Append stages one SafeKeeperRequest (rule 5). Its SafeKeeperResponse comes
// from the next Flush. A sender from a lower term is deposed: nothing is
// written and the response (from Flush as well, so responses stay in order)
// carries the higher term. m.WAL goes to Storage.WriteWAL, which may keep
// it until the next Flush returns.
func (a *Acceptor) Append(m *proto.SafeKeeperRequest) error {
	if a.failed != nil {
		return a.failed
	}
	if m.Sender.Term < a.st.VotedFor.Term {
		a.pending++ // deposed: answered with the higher term, nothing written
		return nil
	}
	if err := a.checkTerm(m.Sender, m.Sender.Term, "SafeKeeperRequest"); err != nil {
		return err
	}
	if a.st.History.LastTerm() != a.st.VotedFor.Term || a.dec == nil {
		return fmt.Errorf("%w: SafeKeeperRequest before ProposerElected of term %d", ErrProtocol, a.st.VotedFor.Term)
	}
	if m.EndLSN != m.BeginLSN {
		if m.BeginLSN != a.writeLSN {
			return fmt.Errorf("%w: SafeKeeperRequest begin_lsn %s, but the write position is %s", ErrProtocol, m.BeginLSN, a.writeLSN)
		}
		saved := *a.dec // Decoder is a value type: restore it if m is refused
		if err := a.dec.Feed(m.WAL); err != nil {
			*a.dec = saved
			return fmt.Errorf("%w: SafeKeeperRequest %s..%s: %w", ErrProtocol, m.BeginLSN, m.EndLSN, err)
		}
		if err := a.store.WriteWAL(m.BeginLSN, m.WAL); err != nil {
			return a.fail(err)
		}
		a.writeLSN = m.EndLSN
		a.walStaged = true
	}
	a.proposerCommit = max(a.proposerCommit, m.CommitLSN)
	a.truncateLSN = max(a.truncateLSN, m.TruncateLSN)
	a.pending++
	a.dirty = true
	return nil
}

// Flush commits all staged WAL together with the new flush_lsn, commit_lsn
// and truncate_lsn in one durable step (rule 6) and returns the
// SafeKeeperResponse that answers each of the n requests staged since the
// last Flush, in order. n is 0 when nothing was staged. Requests that
// carried no WAL only move commit_lsn and truncate_lsn in memory (see
// Acceptor): then nothing is committed, and the response reports the
// durable values.
func (a *Acceptor) Flush() (resp *proto.SafeKeeperResponse, n int, err error) {
	if err := a.flushStaged(); err != nil {
		return nil, 0, err
	}
	n, a.pending = a.pending, 0
	return &proto.SafeKeeperResponse{
		Term:      a.st.VotedFor.Term,
		FlushLSN:  a.st.FlushLSN,
		CommitLSN: a.st.CommitLSN,
	}, n, nil
}

// flushStaged commits what Append staged, if anything: staged WAL with the
// new positions, or, when no WAL was staged, the positions in memory only.
func (a *Acceptor) flushStaged() error {
	if a.failed != nil {
		return a.failed
	}
	if !a.dirty {
		return nil
	}
	next := a.inmem.Clone()
	if a.dec != nil {
		next.FlushLSN = max(next.FlushLSN, a.dec.RecordEnd())
	}
	next.CommitLSN = max(next.CommitLSN, min(a.proposerCommit, next.FlushLSN))
	next.TruncateLSN = max(next.TruncateLSN, min(a.truncateLSN, next.CommitLSN))
	if !a.walStaged {
		// FlushLSN is unchanged: with no WAL staged no record can end.
		if next.CommitLSN != a.inmem.CommitLSN || next.TruncateLSN != a.inmem.TruncateLSN {
			a.inmem = next
			a.version++
		}
		a.dirty = false
		return nil
	}
	return a.commit(next)
}

func (a *Acceptor) commit(next State) error {
	if err := a.store.Commit(next.Clone()); err != nil {
		return a.fail(err)
	}
	// st and inmem may share next's History: nothing changes a State in
	// place (every change starts from a Clone, State and InMem hand out
	// clones).
	a.st, a.inmem = next, next
	a.dirty, a.walStaged = false, false
	a.commits++
	a.version++
	return nil
}

func (a *Acceptor) fail(err error) error {
	if !errors.Is(err, ErrStorage) {
		err = fmt.Errorf("%w: %w", ErrStorage, err)
	}
	a.failed = err
	return err
}
