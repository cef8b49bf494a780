// Package fleetbench is the fleet's benchmark (make bench-fleet): what a
// fleet registered in etcd costs etcd, and what finding the safekeepers
// through etcd costs the primary's commits.
//
// Setup: one real etcd member (test/etcdtest, etcd 3.4), BENCH_SAFEKEEPERS
// safekeepers (`safekeeper run --etcd-endpoints --zone`) in BENCH_ZONES
// zones, registered under leases of BENCH_LEASE_TTL seconds (the
// default's 10), and BENCH_TIMELINES timelines placed and created on
// their members. The timelines are placed in-process, for speed, by the
// two steps `safekeeper timeline create --etcd-endpoints --system-id` takes
// (fleet.Client.Place, then proposer.CreateTimeline on the members), four
// at a time; the setup reports their rate. Then one more timeline for the
// primary (PostgreSQL 15, pgbench scale BENCH_SCALE), placed the same way
// with the primary's own system id.
//
// Rounds: three configurations alternate, the order rotated by one each
// cycle, over BENCH_ROUNDS cycles of BENCH_SECONDS of pgbench each (after
// one unreported round of BENCH_WARMUP seconds per configuration):
//
//   - static: the proposer with --safekeepers, the members' addresses as
//     resolved from etcd once; pgbench -c BENCH_CLIENTS;
//   - etcd: the proposer with --etcd-endpoints only (it reads the
//     configuration and watches it); pgbench -c BENCH_CLIENTS;
//   - etcd-low: the same proposer, pgbench -c BENCH_CLIENTS_LOW: a second
//     commit rate for etcd's writes.
//
// Every round starts a fresh proposer (application_name and slot
// proposer, --proposer-lease 0: the previous one stopped), waits until it
// is the synchronous standby, truncates pgbench_history, checkpoints and
// waits a quiet spell. Around pgbench (and over an idle window of
// BENCH_IDLE seconds before the rounds: the proposer running, no
// pgbench) etcd's own /metrics are read: etcd_server_proposals_committed_total
// (Raft proposals), etcd_mvcc_put_total, etcd_mvcc_txn_total,
// etcd_mvcc_delete_total, etcd_mvcc_range_total, and the lease keepalives,
// which in etcd 3.4 are not Raft proposals (the leader renews a lease in
// memory): etcd_debugging_lease_renewed_total and the gRPC messages on
// LeaseKeepAlive streams (grpc_server_msg_received_total). Each delta is
// divided by the window's wall time.
//
// Figures: per configuration the median over rounds of each rate and of
// TPS; the TPS ratio etcd/static is the median of the per-cycle ratios
// (adjacent rounds, so the machine's drift cancels). Goals: etcd's writes
// a handful per second and the same at both commit rates; TPS ≥ 0.98×.
// The results, the machine, the method and the command replace the
// bench-fleet section of docs/performance.md (BENCH_WRITE_DOC=0: not).
//
// Lifecycle: TestBenchFleet skips unless -bench.fleet is given, so make
// test only compiles and vets it. Every process and directory it starts
// goes with t.Cleanup, also on failure.
//
// Why the boundary sits here: a benchmark is not a test of correctness
// and takes minutes; it reuses test/etcdtest, test/pgtest and
// test/harness and owns only the measurement. The package holds tests
// only; this file exists for its documentation.
package fleetbench
