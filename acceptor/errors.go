package acceptor

import "errors"

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
	// ErrStorage: the storage failed; the acceptor refuses every further
	// message and must be rebuilt from what is durable (58030).
	ErrStorage = errors.New("acceptor: storage failure")
)
