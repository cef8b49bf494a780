// Package ingest holds the benchmark harnesses of one safekeeper process:
// how fast it makes pushed WAL durable (TestBenchIngest, make bench-ingest)
// and how it scales to many timelines and a reader far behind
// (TestBenchScale, make bench-scale). Both run the real binary
// (test/harness), fsync on, with default options, and report next to each
// figure the target set for it and whether it is met. They write their
// report, with the machine and the exact command, between the markers of
// docs/performance.md (BENCH_WRITE_DOC=0 skips that).
//
// Without -bench.ingest or -bench.scale the tests skip at once, so make
// test only compiles and vets them.
//
// What it owns:
//
//   - Client (client.go): a benchmark proposer on one START_WAL_PUSH
//     stream. Greet, Vote and Campaign run the handshake of
//     the WAL push protocol (README_PROTO.md); Stream pushes WAL with a bounded window of
//     unanswered SafeKeeperRequests (walproposer keeps up to 256), writing
//     several per writev when the window allows and the WAL straight from
//     the caller's buffer, and checks every response (term, flush_lsn
//     monotonic and reaching the end).
//   - GenerateWAL (wal.go): real PostgreSQL 15 WAL (proto/xlog/xlogtest):
//     the safekeeper decodes page and record headers and checks xl_crc on
//     ingest, so synthetic zeros would be refused.
//   - Reader (reader.go): a physical replication client (pgconn, pglogrepl)
//     that verifies what it receives against the WAL pushed.
//   - Measurements (proc.go, trace.go, dd.go): /proc/PID/io (wchar,
//     syscw), /proc/PID/status (VmRSS, RssAnon, RssFile, VmHWM),
//     /proc/PID/stat CPU time, syscall counts from perf stat (started
//     disabled and enabled through its control FIFO, so it counts exactly
//     the stream) or strace -c, and the dd oflag=dsync baseline.
//   - Reports (report.go): Markdown tables, medians, the docs section.
//
// Method, common to both: the machine is shared and noisy, so every figure
// is paired with a baseline run alternately round by round (BENCH_ROUNDS,
// default 3) and the report gives medians with their min–max; each
// measured pass gets a fresh process and data directory under the test's
// temporary directory, removed right after it. Traced passes are separate
// and not timed. Sizes scale down with environment variables, listed in
// the Makefile targets.
//
// Lifecycle: processes, tracers and temporary directories are stopped and
// removed by t.Cleanup, also when a test fails; a failed test logs the tail
// of the safekeeper's log.
package ingest
