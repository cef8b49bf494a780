package acceptor

import (
	"errors"

	"github.com/safekeeper/safekeeper/proto"
)

// Sentinel errors of the acceptor. Every error the acceptor returns wraps
// exactly one of them; the server maps each to its SQLSTATE (README_PROTO.md).
var (
	// ErrProtocol: a message out of order or with values that break a rule of
	// the protocol (SQLSTATE 08P01).
	ErrProtocol = errors.New("acceptor: protocol violation")
	// ErrIncompatible: ServerInfo names another cluster, PostgreSQL major,
	// segment size or TLI than the timeline was created with (22023).
	ErrIncompatible = errors.New("acceptor: incompatible server info")
	// ErrVoteRefused: the candidate's ballot is not above the one this
	// safekeeper voted for (55P03).
	ErrVoteRefused = errors.New("acceptor: vote refused")
	// ErrStaleTerm: a message from a term below the one this safekeeper voted
	// for; its proposer has been deposed (40001).
	ErrStaleTerm = errors.New("acceptor: stale term")
	// ErrCommonPointMismatch: ProposerElected's start_streaming_at differs
	// from the common point the safekeeper computes itself (22000).
	ErrCommonPointMismatch = errors.New("acceptor: common point mismatch")
	// ErrTruncateCommitted: ProposerElected would truncate WAL below
	// commit_lsn (55000).
	ErrTruncateCommitted = errors.New("acceptor: would truncate committed WAL")
	// ErrStaleGeneration: the connection's greeting named an older
	// generation of the timeline's configuration than this safekeeper holds
	// now: a proposer that has not seen a membership change (SQLSTATE
	// SK001). The error is a *ConfigurationError carrying the
	// configuration.
	ErrStaleGeneration = errors.New("acceptor: stale configuration generation")
	// ErrNotMember: this safekeeper is not a member of the timeline's
	// configuration (it was removed, or never added): it takes no part in
	// elections or commits (SK002). A *ConfigurationError.
	ErrNotMember = errors.New("acceptor: not a member of the configuration")
	// ErrConfigurationConflict: a configuration of the generation stored
	// names other members: a generation names one configuration, so one of
	// the two did not come from the configuration store (22023, as a
	// ServerInfo that does not match the timeline). A *ConfigurationError.
	ErrConfigurationConflict = errors.New("acceptor: another configuration of the same generation")
	// ErrStorage: the storage failed; the acceptor refuses every further
	// message and must be rebuilt from what is durable (58030).
	ErrStorage = errors.New("acceptor: storage failure")
)

// ConfigurationError is a refusal for the timeline's configuration
// (ErrStaleGeneration, ErrNotMember, ErrConfigurationConflict): Configuration is the one this
// safekeeper holds, which the server sends along (README_PROTO.md) so that
// the proposer can adopt it.
type ConfigurationError struct {
	Err           error // the sentinel
	Configuration proto.Configuration
	Msg           string
}

func (e *ConfigurationError) Error() string { return e.Err.Error() + ": " + e.Msg }

// Unwrap returns the sentinel.
func (e *ConfigurationError) Unwrap() error { return e.Err }
