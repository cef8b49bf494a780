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
// at a time; the setup reports their rate. Then two primaries, A and B
// (PostgreSQL 15, pgbench scale BENCH_SCALE each), each with one more
// timeline assigned through etcd to three safekeepers of its own (1, 2, 3
// and 4, 5, 6; `timeline create --members`), so that neither primary's
// commits wait on the other's fsyncs.
//
// Rounds: BENCH_ROUNDS cycles (an even number; after one unreported
// paired round of BENCH_WARMUP seconds), each of two rounds of
// BENCH_SECONDS:
//
//   - paired: pgbench -c BENCH_CLIENTS on both primaries at once; one
//     proposer with --etcd-endpoints only (it reads the configuration and
//     watches it), the other with --safekeepers (the members' addresses as
//     resolved from etcd once); A goes through etcd in odd cycles, B in
//     even ones;
//   - etcd-low: one primary alone through etcd at pgbench -c
//     BENCH_CLIENTS_LOW: a second commit rate for etcd's writes.
//
// Why side by side: on this shared machine a round's TPS moves by 10–30%
// from one half-minute to the next, so rounds run one after the other
// (the first version of this benchmark) put a difference of a few percent
// out of reach even with twelve cycles. Two primaries under load at once
// see the same machine; what still differs between them (where their files
// landed, their safekeepers) cancels over a pair of cycles, since each
// primary runs through etcd in one and statically in the other.
//
// Every round starts fresh proposers (application_name and slot
// proposer, --proposer-lease 0: the previous one stopped), waits until
// each is its primary's synchronous standby, truncates pgbench_history,
// checkpoints and waits a quiet spell. Around pgbench (and over an idle
// window of BENCH_IDLE seconds before the rounds: both proposers running
// through etcd, no pgbench) etcd's own /metrics are read:
// etcd_server_proposals_committed_total (Raft proposals),
// etcd_mvcc_put_total, etcd_mvcc_txn_total, etcd_mvcc_delete_total,
// etcd_mvcc_range_total, and the lease keepalives, which in etcd 3.4 are
// not Raft proposals (the leader renews a lease in memory):
// etcd_debugging_lease_renewed_total and the gRPC messages on
// LeaseKeepAlive streams (grpc_server_msg_received_total). Each delta is
// divided by the window's wall time.
//
// Figures: per configuration the median over rounds of each rate and of
// TPS; the TPS ratio etcd/static is, for each cycle, the etcd primary's
// TPS over the static one's in the paired round; for each pair of cycles
// the geometric mean of the two; the result the median over pairs. CPU
// per transaction (the proposer; a primary's servers: its postmaster tree,
// proposer and safekeepers) the same way. Goals: etcd's writes a handful
// per second and the same at both commit rates; TPS ≥ 0.98×. The results,
// the machine, the method and the command replace the bench-fleet section
// of docs/performance.md (BENCH_WRITE_DOC=0: not).
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
