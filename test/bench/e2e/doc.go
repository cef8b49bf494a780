// Package e2e is the end-to-end benchmark (make bench-e2e): what
// quorum durability through safekeepers costs a PostgreSQL 15 primary, next
// to stock synchronous streaming replication, on the same machine, in the
// same run.
//
// One primary (test/pgtest) is benchmarked with pgbench (TPC-B-like, scale
// BENCH_SCALE, BENCH_CLIENTS clients, BENCH_SECONDS per round) under three
// configurations of synchronous replication, round by round in turn (A1,
// A3, B, A1, A3, B, …, BENCH_ROUNDS each), so that the noise of a shared
// machine falls on all three alike. A second pass of rounds, the same way,
// runs pgbench with BENCH_CLIENTS_LOW clients (default 1, -j 1; 0: no
// second pass): with one client nothing competes for the CPU, so its
// latency is the commit path's own. The configurations:
//
//   - A1: one stock standby s1 (pg_basebackup, standby.signal, a physical
//     slot), synchronous_standby_names = 's1'.
//   - A3: three stock standbys, synchronous_standby_names = 'ANY 2 (s1,s2,s3)'.
//   - B: `safekeeper propose` and three `safekeeper run` (test/harness),
//     synchronous_standby_names = 'proposer', as scripts/demo.sh wires them.
//
// Everything is set up once; between rounds the harness changes
// synchronous_standby_names (ALTER SYSTEM, reload) and stops every standby,
// proposer and safekeeper the next configuration does not use, so nothing
// idle streams, replays or burns CPU during a round. Before each round it
// waits until the configuration's members are synchronous and have flushed
// (standbys: replayed) everything, does pgbench's own cleanup (TRUNCATE
// pgbench_history, VACUUM of branches and tellers), a CHECKPOINT, waits
// again, and — for B — restarts the proposer, so that its link stats cover
// the round and not the catch-up after the A rounds.
//
// Per round it reports TPS, commit latency p50/p99 (pgbench -l), the median
// pg_stat_replication.flush_lag of the synchronous standbys (sampled every
// 100 ms), CPU time per transaction of each process group read from /proc
// (utime+stime+cutime+cstime of each process tree, so backends that exited
// count through their parent; pgbench's from its rusage), and for B the
// longest wait for a SafeKeeperResponse (max_response_gap, from the
// proposer's "safekeeper link stats" at SIGTERM). At the end: the median
// per configuration and the median of the per-cycle ratios B/A1 and B/A3,
// for each pass on its own.
//
// Per node (perfstat_test.go): in the first pass's last round of each
// configuration, `perf stat -x, -p PID` counts the CPU time
// (task-clock), context switches and the commit path's system calls
// (fdatasync, fsync, pwrite64, socket reads and writes, futex,
// nanosleep, epoll) of one node of each kind: the walreceiver of standby
// s1 (A1, A3; found by its process title among the standby's
// processes), safekeeper 1 and the proposer (B). perf starts with its
// counters disabled (-D -1) and a control pipe (--control fd:3,4); they
// are enabled, and perf's ack awaited, just before pgbench starts, and
// disabled when it ends. The table divides the counts by the round's
// transactions and by the node's commits of WAL (a walreceiver's
// fdatasyncs, half a safekeeper's: bbolt makes two per transaction).
// Without perf, or where it cannot count (BENCH_PERF=0 also), the report
// says so and the rest goes on.
//
// The medians, the ratios and the per-node table, with the machine, the
// method and the command, replace the bench-e2e section of
// docs/performance.md (BENCH_WRITE_DOC=0: not).
//
// Lifecycle: TestBenchE2E skips unless -bench.e2e is given, so make test
// only compiles and vets it (the parsers' unit tests do run). Everything it
// starts is stopped, and every directory removed, by t.Cleanup, also on
// failure.
//
// Why the boundary sits here: a benchmark is not a test of correctness and
// takes minutes; it reuses test/pgtest and test/harness for the fiddly
// parts (PostgreSQL as the postgres user, ports, the binary, cleanup)
// and owns only the measurement. The package holds tests only; this file
// exists for its documentation.
package e2e
