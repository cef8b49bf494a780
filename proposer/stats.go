package proposer

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proposer/session"
	"github.com/safekeeper/safekeeper/proto"
)

// Stats is what a running proposer shows an operator (Config.Stats): its
// state (the one /readyz reports), the term, the positions — the
// primary's end of WAL, what the proposer reported to it as write and
// flush, the quorum's commit_lsn and truncate_lsn — how long the oldest WAL
// no quorum is known to hold has waited, and, per safekeeper link, its
// state, flush_lsn, responses, refusals and reconnects.
//
// Run writes it where it already has the values: its owner goroutine
// with atomic stores (two per SafeKeeperResponse, one per XLogData from the
// primary, a few per commit_lsn advance; the rest on state changes), the
// link goroutines when a connection starts or ends. Snapshot reads it from
// any goroutine; nothing on the proposer's side waits for a reader. It
// imports no HTTP or Prometheus code: cmd/safekeeper serves the snapshots
// (docs/proposer.md, "Monitoring").
type Stats struct {
	quorum int
	addrs  []string
	links  []linkStats

	term       atomic.Uint64
	generation atomic.Uint64 // of the configuration Run proposes in
	commit     atomic.Uint64 // the term's commit_lsn (Core)
	truncate   atomic.Uint64
	flush      atomic.Uint64 // flush reported to the primary (its pg_stat_replication.flush_lsn)
	write      atomic.Uint64 // write reported to the primary: the end of WAL received
	primaryEnd atomic.Uint64 // the primary's end of WAL, as it last told us
	// oldestWait: when (UnixNano) the oldest WAL not reported flushed
	// arrived from the primary; 0 while there is none.
	oldestWait atomic.Int64
	elected    atomic.Bool  // the session is elected and streams from the primary
	primary    atomic.Int32 // primaryUnknown, primaryUp, primaryDown
	leaseWait  atomic.Bool

	mu         sync.Mutex
	primaryErr string       // why the primary is down
	sessionErr string       // how the last session ended, until the primary is connected again
	lease      LiveProposer // the proposer waited for, while leaseWait

	// waits is owned by Run's goroutine (the sessions' owner), not read
	// by Snapshot: it publishes oldestWait.
	waits walWaits
}

// The primary's state in Stats.primary.
const (
	primaryUnknown int32 = iota // not connected, and the last attempt did not fail on it
	primaryUp
	primaryDown
)

// linkStats is one safekeeper link's part of Stats. conn is written by the
// link's goroutine, phase by the owner; a connection shows its session
// phase while conn is linkConnected.
type linkStats struct {
	conn      atomic.Int32 // linkConn*
	phase     atomic.Int32 // the session's session.Phase of the current connection
	id        atomic.Uint64
	flush     atomic.Uint64
	responses atomic.Uint64
	attempts  atomic.Uint64 // connection attempts; reconnects are the ones after the first

	mu       sync.Mutex
	refusals map[string]uint64
	lastErr  string
}

// The link goroutine's part of a link's state.
const (
	linkConnDown int32 = iota
	linkConnConnecting
	linkConnConnected
	linkConnRefused
)

// NewStats returns the Stats of a proposer with these safekeepers (as
// Config.Safekeepers lists them).
func NewStats(safekeepers []string) *Stats {
	return &Stats{quorum: len(safekeepers)/2 + 1, addrs: slices.Clone(safekeepers), links: make([]linkStats, len(safekeepers))}
}

// State is the proposer's state as a whole, the code /readyz answers.
type State string

// The proposer's states.
const (
	// StateStreaming: elected, streaming the primary's WAL, with a quorum
	// of safekeepers streaming (/readyz 200).
	StateStreaming State = "streaming"
	// StateNoQuorum: connected to the primary, but fewer than a quorum of
	// safekeepers stream: campaigning, or the quorum was lost; also
	// between two sessions (terms) when the last one ended for another
	// reason than the primary.
	StateNoQuorum State = "no_quorum"
	// StateNoPrimary: not connected to the primary: connecting, or the
	// last attempt failed (its error says why: unreachable, refusing, or
	// failing at the slot).
	StateNoPrimary State = "no_primary"
	// StateWaitingLease: another proposer streams to the timeline; this
	// one waits until it stops (Config.ProposerLease).
	StateWaitingLease State = "waiting_lease"
)

// States lists every State.
var States = []State{StateStreaming, StateNoQuorum, StateNoPrimary, StateWaitingLease}

// LinkState is the state of the link to one safekeeper.
type LinkState string

// The states of a safekeeper link, in the order a connection goes
// through them.
const (
	// LinkDown: not connected: the last attempt failed (LinkStatus.LastError
	// says how) and the next waits for its backoff, or no session runs.
	LinkDown LinkState = "down"
	// LinkConnecting: connecting and greeting (ServerInfo sent, its
	// SafeKeeperInfo awaited).
	LinkConnecting LinkState = "connecting"
	// LinkGreeted: greeted; the campaign waits for a quorum of greetings.
	LinkGreeted LinkState = "greeted"
	// LinkVoting: asked for its vote.
	LinkVoting LinkState = "voting"
	// LinkStreaming: sent ProposerElected, gets WAL.
	LinkStreaming LinkState = "streaming"
	// LinkParked: cannot join this term (it voted for another candidate,
	// or its start would be below its commit_lsn); it sits the term out.
	LinkParked LinkState = "parked"
	// LinkRefused: it refused this primary's ServerInfo for good (another
	// system id, PostgreSQL major or segment size); not retried in this
	// session.
	LinkRefused LinkState = "refused"
)

// LinkStates lists every LinkState.
var LinkStates = []LinkState{LinkDown, LinkConnecting, LinkGreeted, LinkVoting, LinkStreaming, LinkParked, LinkRefused}

// RefusedVote is the LinkStatus.Refusals reason of a vote refused during
// a campaign (the others are SQLSTATEs).
const RefusedVote = "vote_refused"

// Status is a snapshot of Stats.
type Status struct {
	State State
	// Reason says why the state is not StateStreaming ("" when it is).
	Reason string
	Term   uint64
	// Generation is the generation of the configuration the proposer
	// proposes in (0: none).
	Generation uint64
	Quorum     int // safekeepers a quorum needs, ⌊n/2⌋+1
	// CommitLSN and TruncateLSN are the term's commit_lsn and truncate_lsn,
	// sent to the safekeepers (their commit_lsn follows).
	CommitLSN, TruncateLSN proto.LSN
	// FlushLSN and WriteLSN are what the proposer last reported to the
	// primary in a standby status update: its pg_stat_replication's
	// flush_lsn (quorum durable; what synchronous commits wait for) and
	// write_lsn (received).
	FlushLSN, WriteLSN proto.LSN
	// PrimaryFlushLSN is the primary's end of WAL as it last told the
	// proposer (IDENTIFY_SYSTEM, then each XLogData's and keepalive's WAL
	// end), at least the end of the WAL received.
	PrimaryFlushLSN proto.LSN
	// LagBytes is PrimaryFlushLSN minus FlushLSN: WAL the primary has that
	// no quorum is known to hold (0 until the first flush report: a new
	// timeline reports 0/0 until its first commit).
	LagBytes uint64
	// Lag is how long the oldest WAL received from the primary and not yet
	// reported flushed has waited; 0 when there is none.
	Lag         time.Duration
	Safekeepers []LinkStatus
}

// LinkStatus is one safekeeper link in a Status.
type LinkStatus struct {
	Addr string // as configured
	// ID is the safekeeper_id it greeted with; 0 before its first greeting.
	ID    uint64
	State LinkState
	// FlushLSN is its last known flush_lsn (greeting, vote, responses).
	FlushLSN proto.LSN
	// Responses counts its SafeKeeperResponses (acknowledgments).
	Responses uint64
	// Reconnects counts connection attempts after the first.
	Reconnects uint64
	// Refusals counts by reason the connections it ended with an
	// ErrorResponse (its SQLSTATE: 53100 disk, 28P01 token, 22023 another
	// cluster's timeline, ...) and the votes it refused (RefusedVote).
	Refusals map[string]uint64
	// LastError is how its last connection or attempt ended ("" if none
	// did).
	LastError string
}

// Snapshot returns the current Status; now is the clock Lag is measured
// against.
func (s *Stats) Snapshot(now time.Time) Status {
	st := Status{
		Term: s.term.Load(), Generation: s.generation.Load(), Quorum: s.quorum,
		CommitLSN: proto.LSN(s.commit.Load()), TruncateLSN: proto.LSN(s.truncate.Load()),
		FlushLSN: proto.LSN(s.flush.Load()), WriteLSN: proto.LSN(s.write.Load()),
		PrimaryFlushLSN: proto.LSN(s.primaryEnd.Load()),
	}
	st.PrimaryFlushLSN = max(st.PrimaryFlushLSN, st.WriteLSN)
	if st.FlushLSN != 0 && st.PrimaryFlushLSN > st.FlushLSN {
		st.LagBytes = uint64(st.PrimaryFlushLSN - st.FlushLSN)
	}
	if at := s.oldestWait.Load(); at != 0 {
		st.Lag = max(0, now.Sub(time.Unix(0, at)))
	}
	streaming, connected := 0, 0
	var missing []string
	for i := range s.links {
		l := &s.links[i]
		ls := LinkStatus{Addr: s.addrs[i], ID: l.id.Load(), State: l.state(), FlushLSN: proto.LSN(l.flush.Load()), Responses: l.responses.Load()}
		if a := l.attempts.Load(); a > 1 {
			ls.Reconnects = a - 1
		}
		l.mu.Lock()
		ls.Refusals, ls.LastError = maps.Clone(l.refusals), l.lastErr
		l.mu.Unlock()
		switch ls.State {
		case LinkStreaming:
			streaming++
			connected++
		case LinkGreeted, LinkVoting, LinkParked:
			connected++
			missing = append(missing, ls.Addr+" "+string(ls.State))
		default:
			m := ls.Addr + " " + string(ls.State)
			if ls.LastError != "" {
				m += ": " + ls.LastError
			}
			missing = append(missing, m)
		}
		st.Safekeepers = append(st.Safekeepers, ls)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.leaseWait.Load():
		st.State = StateWaitingLease
		st.Reason = "waiting until another proposer stops streaming to the timeline: " + s.lease.String()
	case s.primary.Load() == primaryDown:
		st.State, st.Reason = StateNoPrimary, "no primary connection: "+s.primaryErr
	case s.primary.Load() == primaryUnknown && s.sessionErr != "":
		st.State, st.Reason = StateNoQuorum, "the last term ended ("+s.sessionErr+"); starting a new one"
	case s.primary.Load() == primaryUnknown:
		st.State, st.Reason = StateNoPrimary, "connecting to the primary"
	case !s.elected.Load():
		st.State = StateNoQuorum
		st.Reason = fmt.Sprintf("electing: %d of %d safekeepers connected, a quorum is %d", connected, len(s.links), s.quorum)
	case streaming < s.quorum:
		st.State = StateNoQuorum
		st.Reason = fmt.Sprintf("%d of %d safekeepers streaming, a quorum is %d", streaming, len(s.links), s.quorum)
	default:
		st.State = StateStreaming
	}
	if st.State == StateNoQuorum && len(missing) > 0 && s.primary.Load() == primaryUp {
		st.Reason += "; not streaming: " + strings.Join(missing, "; ")
	}
	return st
}

// state is the link's LinkState.
func (l *linkStats) state() LinkState {
	switch l.conn.Load() {
	case linkConnConnecting:
		return LinkConnecting
	case linkConnRefused:
		return LinkRefused
	case linkConnConnected:
		switch session.Phase(l.phase.Load()) {
		case session.PhaseGreeted:
			return LinkGreeted
		case session.PhaseVoting:
			return LinkVoting
		case session.PhaseStreaming:
			return LinkStreaming
		case session.PhaseParked:
			return LinkParked
		}
		return LinkConnecting // greeted, and the owner has not taken it yet
	}
	return LinkDown
}

// The link goroutines' hooks (skLinks; Sync's links have no Stats).

// dialing: link i starts a connection attempt.
func (s *Stats) dialing(i int) {
	if s == nil {
		return
	}
	l := &s.links[i]
	l.attempts.Add(1)
	l.conn.Store(linkConnConnecting)
}

// greeted: link i's connection greeted as safekeeper_id id.
func (s *Stats) greeted(i int, id uint64) {
	if s == nil {
		return
	}
	l := &s.links[i]
	l.id.Store(id)
	l.conn.Store(linkConnConnected)
}

// ended: link i's connection (or attempt) ended with err; forGood: it
// refused our ServerInfo for good and the link stops.
func (s *Stats) ended(i int, err error, forGood bool) {
	if s == nil {
		return
	}
	l := &s.links[i]
	l.mu.Lock()
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if l.refusals == nil {
			l.refusals = map[string]uint64{}
		}
		l.refusals[pe.Code]++
	}
	if err != nil {
		l.lastErr = endText(err)
	}
	l.mu.Unlock()
	if forGood {
		l.conn.Store(linkConnRefused)
	} else {
		l.conn.Store(linkConnDown)
	}
}

// The owner's hooks (driver).

// refusedVote counts a vote safekeeper i refused during a campaign.
func (s *Stats) refusedVote(i int) {
	l := &s.links[i]
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refusals == nil {
		l.refusals = map[string]uint64{}
	}
	l.refusals[RefusedVote]++
}

// primaryConnected: the session reached the primary, whose end of WAL is
// at end.
func (s *Stats) primaryConnected(end proto.LSN) {
	s.mu.Lock()
	s.primaryErr, s.sessionErr = "", ""
	s.mu.Unlock()
	s.primaryEnd.Store(uint64(end)) // fresh: a primary rewound or replaced may be behind the last one
	s.primary.Store(primaryUp)
}

// primaryFailed: connecting to the primary, or its stream, failed with err.
func (s *Stats) primaryFailed(err error) {
	s.mu.Lock()
	s.primaryErr = endText(err)
	s.mu.Unlock()
	s.primary.Store(primaryDown)
}

// sessionEnded: a session (driver.run) returned err; its links are
// stopped. What it showed of them is reset: the next session connects
// anew.
func (s *Stats) sessionEnded(err error) {
	s.elected.Store(false)
	for i := range s.links {
		s.links[i].phase.Store(int32(session.PhaseDown))
		if s.links[i].conn.Load() != linkConnDown {
			s.links[i].conn.Store(linkConnDown)
		}
	}
	if s.primary.Load() == primaryUp {
		s.mu.Lock()
		if err != nil {
			s.sessionErr = endText(err)
		}
		s.mu.Unlock()
		s.primary.Store(primaryUnknown)
	}
}

// waitingFor: Run waits for proposer l (ok) before it campaigns, or no
// longer waits (!ok).
func (s *Stats) waitingFor(l LiveProposer, ok bool) {
	s.mu.Lock()
	s.lease = l
	s.mu.Unlock()
	s.leaseWait.Store(ok)
}

// walWaits remembers when WAL arrived from the primary, so that the
// proposer can tell how long the oldest WAL not yet reported flushed has
// waited (Stats.Lag). It keeps at most walWaitSamples arrivals, in LSN
// order; when full, the newest is overwritten (as PostgreSQL's
// walsender LagTracker does), so the oldest, the one the lag is read
// from, stays exact. Owned by Run's goroutine.
type walWaits struct {
	ring    [walWaitSamples]walWait
	head, n int
	done    proto.LSN // the highest end reported flushed: the oldest sample covers WAL from here
}

type walWait struct {
	end proto.LSN
	at  time.Time
}

const walWaitSamples = 1024

// arrived records WAL up to end received at at. It reports whether it is
// now the oldest (nothing was waiting).
func (w *walWaits) arrived(end proto.LSN, at time.Time) (oldest bool) {
	if end <= w.done {
		return false // re-sent WAL a quorum has
	}
	if w.n > 0 {
		last := (w.head + w.n - 1) % len(w.ring)
		if end <= w.ring[last].end {
			return false // re-sent WAL (a new session): it waits since it first came
		}
		if w.n == len(w.ring) {
			w.ring[last] = walWait{end: end, at: at}
			return false
		}
	}
	w.ring[(w.head+w.n)%len(w.ring)] = walWait{end: end, at: at}
	w.n++
	return w.n == 1
}

// flushed forgets the WAL up to upto, reported flushed, and returns when
// the oldest WAL still waiting arrived (zero if none is).
func (w *walWaits) flushed(upto proto.LSN) time.Time {
	w.done = max(w.done, upto)
	for w.n > 0 && w.ring[w.head].end <= upto {
		w.head = (w.head + 1) % len(w.ring)
		w.n--
	}
	if w.n == 0 {
		return time.Time{}
	}
	return w.ring[w.head].at
}

// truncate forgets WAL above end, the end of WAL of the primary a new
// session connected to: WAL it does not have (lost with a primary that
// was replaced or rewound) no longer waits. It returns when the oldest
// WAL still waiting arrived (zero if none is).
func (w *walWaits) truncate(end proto.LSN) time.Time {
	for w.n > 0 {
		last := (w.head + w.n - 1) % len(w.ring)
		if w.ring[last].end <= end {
			break
		}
		from := w.done // where the WAL of the last sample starts
		if w.n > 1 {
			from = w.ring[(last+len(w.ring)-1)%len(w.ring)].end
		}
		if from >= end {
			w.n-- // all of it above end
			continue
		}
		w.ring[last].end = end // the WAL up to end still waits
		break
	}
	if w.n == 0 {
		return time.Time{}
	}
	return w.ring[w.head].at
}

// publishWait stores the oldest wait in Stats (zero: none).
func (s *Stats) publishWait(at time.Time) {
	if at.IsZero() {
		s.oldestWait.Store(0)
		return
	}
	s.oldestWait.Store(at.UnixNano())
}

// configuration records the configuration Run proposes in.
func (s *Stats) configuration(c proto.Configuration) { s.generation.Store(c.Generation) }
