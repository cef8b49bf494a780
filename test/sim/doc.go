// Package sim is the deterministic simulation of the WAL push protocol: the
// real acceptor.Session (over acceptor.MemStorage) of every safekeeper and
// the real proposer/session.Session (around its Core) of every proposer, 3 or
// 5 safekeepers and 2–3 competing proposers, driven single-threaded over an
// in-memory network by one seeded PRNG (math/rand/v2, PCG). No goroutines,
// no clock, no map iteration inside a run: a seed is a run, and a failing
// seed replays exactly.
//
// No decision of either side is copied here: the pieces are transport and
// faults around the two sessions.
//
//   - server.go: a safekeeper process — decoding, the group flush when the
//     world schedules it, carrying out each Ready; crash (kill -9:
//     MemStorage.Crash) and restart on the same disk (acceptor.NewSession
//     from what is durable).
//   - proposer.go: a walproposer's IO around the proposer's Session — connecting
//     and greeting, its term's WAL as the session's WALSource, the election
//     timeout, the session's clock (a step is a millisecond).
//   - net.go: TCP-like connections; faults are explicit (cut, proposer
//     close with frames still in flight, duplicated frame, slow links).
//   - wal.go: every term's WAL (xlogtest records), standing in for the
//     primary's pg_wal, and the reference the checker compares against.
//   - disk.go: a recorder in front of MemStorage so the checker can read
//     durable WAL cheaply, cross-checked with MemStorage at every restart;
//     a full disk (every commit fails) is a fault.
//   - check.go: the invariants, checked after every step and at every reply;
//     violation.go: the typed failure (*Violation, by Invariant).
//   - sim.go: the world, the step scheduler, the fault mix, the trace.
//
// The planted-bug test that proves the simulation can fail lives in
// acceptor/planted_test.go: it plants bugs through Config.NewSession and
// Config.WrapStorage.
//
// docs/correctness.md lists the invariants, why each protocol rule is
// needed, and how to replay a seed:
//
//	go test ./test/sim -run 'TestSim$' -seed=N
package sim
