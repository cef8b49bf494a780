package acceptor

import (
	"slices"

	"github.com/safekeeper/safekeeper/proto"
)

// State is the persisted control state of one timeline on one safekeeper
// (Neon's TimelinePersistentState). Every decision the acceptor makes is
// recorded here and made durable before any reply that depends on it.
type State struct {
	TenantID   proto.ID
	TimelineID proto.ID

	// Fixed at creation from the first ServerInfo.
	SystemID   uint64 // the primary's database system identifier
	PgVersion  uint32 // PG_VERSION_NUM of the primary at creation
	WalSegSize uint32 // bytes
	PgTimeline uint32 // PostgreSQL TLI

	// VotedFor is the highest ballot this safekeeper voted for (term 0: never).
	VotedFor proto.Ballot
	// History is the term history adopted from the last ProposerElected.
	History proto.TermHistory
	// TimelineStartLSN is where this timeline's WAL starts (0: no WAL yet).
	TimelineStartLSN proto.LSN
	// FlushLSN is the end of the last complete WAL record that is durable.
	// WAL above it is discarded on restart.
	FlushLSN proto.LSN
	// CommitLSN is the highest LSN known committed on a quorum; ≤ FlushLSN,
	// never decreases.
	CommitLSN proto.LSN
	// TruncateLSN is the proposer's horizon: WAL below it is on every
	// safekeeper and no longer needed for recovery among them.
	TruncateLSN proto.LSN
	// RemovedUpTo is the start of the oldest WAL still retained (WAL below it
	// was removed by retention); 0 if nothing was removed.
	RemovedUpTo proto.LSN
	// PgHistory is PgTimeline's history file as PostgreSQL wrote it (empty
	// for timeline 1, which has none): recorded when a proposer of a
	// promoted primary switched the timeline to PgTimeline (README_PROTO.md,
	// "PostgreSQL timeline switches"). Its lines give where each ancestor
	// timeline ended.
	PgHistory []byte
	// Configuration is the timeline's membership as this safekeeper knows
	// it (README_PROTO.md, "Membership and generations"): stored with the
	// vote, replaced only by one of a higher generation. Generation 0: none
	// (a timeline of a fixed address list).
	Configuration proto.Configuration
}

// Clone returns a deep copy of s.
func (s State) Clone() State {
	s.History = s.History.Clone()
	s.PgHistory = slices.Clone(s.PgHistory)
	s.Configuration = s.Configuration.Clone()
	return s
}

// LastLogTerm is the term of the last history entry that starts at or below
// FlushLSN (0 if none): the term of the WAL this safekeeper ends with.
func (s *State) LastLogTerm() uint64 {
	return s.History.Upto(s.FlushLSN).LastTerm()
}

// Storage is what the acceptor needs from the disk of one timeline. WAL writes
// and truncations are staged; Commit makes them and the state durable in one
// atomic step. A crash before Commit returns loses staged changes entirely; a
// crash after keeps them entirely.
type Storage interface {
	// WriteWAL stages data at lsn. Writes are contiguous: lsn is always the
	// end of the previous write or truncation. A Storage may keep data
	// until the next Commit returns (storage.Timeline keeps large writes
	// rather than copying them), so the caller leaves it unchanged until
	// then.
	WriteWAL(lsn proto.LSN, data []byte) error
	// TruncateWAL stages removal of all WAL at and above lsn.
	TruncateWAL(lsn proto.LSN) error
	// Commit durably stores everything staged and s (fsync) before it returns.
	// On error nothing staged since the last successful Commit is durable,
	// and it is all dropped.
	Commit(s State) error
	// Load reads back the state of the last successful Commit: what a
	// Session rebuilds its Acceptor from after a storage failure.
	Load() (State, error)
}
