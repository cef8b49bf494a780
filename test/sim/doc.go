// Package sim is the deterministic simulation of the WAL push protocol: the
// real acceptor (acceptor.Acceptor over acceptor.MemStorage) and the real
// proposer decision core (proposer.Core), 3 or 5 safekeepers and 2–3
// competing proposers, driven single-threaded over an in-memory network by
// one seeded PRNG (math/rand/v2, PCG). No goroutines, no clock, no map
// iteration inside a run: a seed is a run, and a failing seed replays
// exactly.
//
// The pieces, each parallel to the real thing:
//
//   - server.go: a safekeeper process — the timeline owner of
//     cmd/safekeeper/server: per-connection message order, group flush,
//     ErrorResponse and close on any acceptor error, flush on EOF; crash
//     (kill -9: MemStorage.Crash) and restart on the same disk
//     (acceptor.New from what is durable).
//   - proposer.go: a walproposer reduced to its decisions, Core making them,
//     structured like proposer/driver.go.
//   - net.go: TCP-like connections; faults are explicit (cut, proposer
//     close with frames still in flight, duplicated frame, slow links).
//   - wal.go: every term's WAL (xlogtest records), standing in for the
//     primary's pg_wal, and the reference the checker compares against.
//   - disk.go: a recorder in front of MemStorage so the checker can read
//     durable WAL cheaply; cross-checked with MemStorage at every restart.
//   - check.go: the invariants, checked after every step and at every reply.
//   - sim.go: the world, the step scheduler, the fault mix, the trace.
//
// docs/correctness.md lists the invariants, why each protocol rule is
// needed, and how to replay a seed:
//
//	go test ./test/sim -run 'TestSim$' -seed=N
package sim
