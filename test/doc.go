// Package test holds the socket-level tests of the safekeeper binary: a test
// proposer, written from README_PROTO.md, drives `safekeeper run` over
// loopback (walpush_test.go, failures_test.go); stock replication clients —
// pg_receivewal, a hot standby, a pglogrepl consumer — read WAL back
// (serving_test.go); `safekeeper sync` runs against real safekeepers
// (sync_test.go). Each test starts its own processes on ports bound at :0
// and data directories under t.TempDir. The harness lives in test/harness,
// PostgreSQL in test/pgtest; the end-to-end pipeline is test/e2e, the crash
// loops test/chaos, the deterministic simulation test/sim.
package test
