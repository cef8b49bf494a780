// Package movebench is the benchmark of moving a timeline while it
// commits (make bench-move): how long the primary's commits stall while
// the timeline's members change.
//
// Setup: one real etcd member (test/etcdtest), six safekeepers in three
// zones registered in it, a controller, and a PostgreSQL 15 primary
// (pgbench scale BENCH_SCALE) whose timeline is created on safekeepers
// 1, 2, 3 (`timeline create --members`) and protected by a proposer that
// finds its members through etcd (synchronous_standby_names).
//
// One pgbench run (-c BENCH_CLIENTS, with its per-transaction latency log,
// -l) lasts the whole benchmark. Every BENCH_SECONDS a move is asked with
// `timeline migrate` and waited for: the members alternate between
// {1,2,3} and {4,5,6} (every member replaced: the hardest move), BENCH_MOVES
// times. The windows are the moves (from the command's start to its exit,
// plus one second for the transactions in flight) and the steady spells
// between them: the baseline, in the same run, of what a transaction costs
// when nothing moves.
//
// Figures, from the latency log (a transaction belongs to the window its
// end falls in): per move its duration, transactions and the longest
// transaction; over all moves the longest transaction (p100) and p99,
// against the steady windows' p99 and p100. Goal: p100 during moves under
// 1 s. The results, the machine, the method and the command replace the
// bench-move section of docs/performance.md (BENCH_WRITE_DOC=0: not).
//
// Lifecycle: TestBenchMove skips unless -bench.move is given, so make test
// only compiles and vets it. Every process and directory it starts goes
// with t.Cleanup, also on failure.
package movebench
