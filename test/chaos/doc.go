// Package chaos runs crash loops with real processes: a stock PostgreSQL 15
// primary whose commits wait for the proposer (`safekeeper propose`) as its
// synchronous standby, three safekeepers (`safekeeper run`), a hot standby
// fed by a safekeeper, and a bank-transfer workload whose total balance is
// invariant. The tests kill -9 safekeepers, the proposer and the primary,
// start two proposers at once, partition a safekeeper behind a
// fault-injecting proxy (harness.Proxy), fill a safekeeper's disk and
// restore a base backup with `safekeeper wal fetch` as its only WAL source
// after the primary's host is lost, and then check what docs/correctness.md
// promises: every commit the primary
// acknowledged is present (on the standby, on a quorum), the total balance
// is unchanged, and every safekeeper's WAL is byte-identical to the
// primary's pg_wal.
//
// It owns nothing but tests; the package exists so `make chaos` can run
// the long crash loop alone:
//
//	go test ./test/chaos -run TestChaos -chaos.duration=10m -timeout 0 -v
//
// Every random choice comes from one seeded PRNG; the seed is logged at the
// start and -chaos.seed=N replays the same schedule of faults (the timing of
// real processes still varies). Tests never sleep to wait for a condition:
// they wait with harness.WaitFor and a deadline; only the fault schedule
// itself (the pause between two faults) is a timer.
package chaos
