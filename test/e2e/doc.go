// Package e2e runs the whole pipeline on real input, every part a real
// process on loopback: a stock PostgreSQL 15 primary (test/pgtest) whose
// synchronous_standby_names names the proposer, the proposer (`safekeeper
// propose`, streaming from a physical slot with a 1 MiB buffer) and three
// safekeepers (`safekeeper run`), started by test/harness.
//
// What it checks, against the primary itself:
//
//   - TestEndToEnd: pgbench through the pipeline with no failed
//     transaction while one safekeeper is killed -9 and restarted mid-run
//     (it catches up through a second replication stream from the
//     primary); an acknowledged commit is on at least two safekeepers after
//     all three are killed -9 at once; commit_lsn reaches the primary's
//     final flush on every safekeeper; the primary's slot follows the
//     lowest flush_lsn and never passes it; `safekeeper sync` with the
//     proposer stopped prints an LSN at or past that flush and leaves it
//     committed on a quorum; `safekeeper wal export` refuses a running
//     server's data directory, and once the servers are stopped every
//     complete segment it writes is byte-identical to the primary's pg_wal.
//   - TestCommitReachesSafekeepersPromptly: after a synchronous commit on
//     an idle primary every safekeeper reports the new commit_lsn at once,
//     not at the proposer's next heartbeat.
//
// A safekeeper's state is read with a greeting (ServerInfo, then the
// SafeKeeperInfo answer) or TIMELINE_STATUS, neither of which changes it.
//
// Lifecycle: each test starts its own cluster (startCluster) and
// t.Cleanup stops it. The tests need the PostgreSQL 15 binaries (see
// test/pgtest) and take tens of seconds, so -short skips them.
//
// Why the boundary sits here: the unit and simulation tests check each rule
// with fakes; only here do real PostgreSQL, real clients and real processes
// meet, so what docs/correctness.md promises (acknowledged commits survive,
// WAL is the primary's byte for byte) is checked as an operator would see
// it. The package holds tests only; this file exists for its documentation.
package e2e
