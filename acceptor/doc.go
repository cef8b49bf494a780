// Package acceptor is the safekeeper's side of the WAL push protocol as a
// pure state machine: the acceptor of a Paxos-like election whose log is
// PostgreSQL's WAL (Neon's safekeeper.rs, the walkeeper protocol's acceptor).
//
// It owns the rules of README_PROTO.md (numbered as there): timeline
// checks on ServerInfo (1), strict-term voting with the same ballot
// re-granted (2), the common point of term histories (3, proto.TermHistory.CommonPoint),
// ProposerElected with the common-point check, the refusal below commit_lsn
// and the truncation (4), contiguous appends, the commit_lsn rule and deposed
// senders (5), record-aligned flush_lsn and one response per request (6).
//
// Two layers. Acceptor is the state machine of one timeline: one method per
// message. Session wraps it for all of a timeline's connections at once —
// the per-connection message order and granted ballot, the group commit
// (Step stages requests, Flush commits them in one Storage.Commit and
// answers each), the end-of-stream flush and the storage-failure path
// (stop, refuse greetings, rebuild from Storage.Load). Session is the one
// entry point: the server's timeline owner and the simulation (test/sim)
// both drive it and act on the Ready each call returns — publish its State,
// then send its Out.
//
// It does no IO of its own: no sockets, no files, no clock. It persists
// through the Storage interface it declares, implemented by package storage
// on bbolt and by MemStorage for tests and the simulation. That boundary is
// what lets the same code run in a deterministic simulation and behind a
// real socket.
//
// Durability order: staged WAL is made durable (Storage.Commit) before any
// reply that depends on it. RequestVote commits staged WAL and then the vote
// before returning the verdict; ProposerElected commits the truncation and
// the adopted history in one step; Append only stages, and Flush commits the
// WAL together with the new flush_lsn and commit_lsn before returning the
// SafeKeeperResponse. A Storage error makes the acceptor refuse everything
// (ErrStorage): what is durable is then only what the last successful
// Commit stored, and a new acceptor must be built from it (New).
//
// Lifecycle: NewState for a new timeline; New (or NewSession) rebuilds from
// durable state after creation or reboot, discarding WAL past flush_lsn.
//
// Test hooks: hooks.go plants known safety bugs for the planted-bug test
// (planted_test.go), which proves the simulation can fail; production code
// never sets them.
package acceptor
