// Package perfstat runs `perf stat` attached to a process, with its
// counters started disabled and switched on and off through perf's control
// channel (--control fd:…, -D -1), so that what it counts is exactly a
// benchmark's measured window however long perf takes to attach; and it
// parses perf's CSV output (-x,), the stable form. The benchmarks use it:
// test/bench/ingest for the system calls per request of one safekeeper,
// test/bench/e2e for the per-node table.
//
// Why the boundary sits here: both benchmarks attach perf the same way and
// read the same output; the control protocol (acknowledged commands,
// SIGINT to print) and the parsing live once, with their tests.
package perfstat
