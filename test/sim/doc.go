// Package sim is the deterministic simulation of the WAL push protocol: the
// real acceptor.Session (over acceptor.MemStorage) of every safekeeper and
// the real proposer/session.Session (around its Core) of every proposer, 3 to
// 6 safekeepers and 2–3 competing proposers, driven single-threaded over an
// in-memory network by one seeded PRNG (math/rand/v2, PCG). No goroutines,
// no clock, no map iteration inside a run: a seed is a run, and a failing
// seed replays exactly. Seven seeds in eight run in configurations
// (README_PROTO.md, "Membership and generations"): 5 or 6 safekeepers, 3 of
// them members, and a controller that changes the members while the faults
// go on; the eighth runs in generation 0 (every safekeeper, a fixed list).
//
// No decision of either side is copied here: the pieces are transport and
// faults around the two sessions, and the configuration store and the
// controller, which are no protocol code under test.
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
//   - membership.go: the configuration store (compare-and-swap per
//     generation, as etcd does for the fleet) and the controller that
//     changes the members (joint configuration, pushes, sync position and
//     term, term bump, catch-up, final configuration or rollback; crashes
//     and hand-over), its calls to the safekeepers being messages that can
//     be lost.
//   - check.go: the invariants, checked after every step and at every reply;
//     violation.go: the typed failure (*Violation, by Invariant).
//   - sim.go: the world, the step scheduler, the fault mix, the trace.
//
// The planted-bug test that proves the simulation can fail lives in
// acceptor/planted_test.go: it plants bugs through Config.NewSession,
// Config.WrapStorage, Config.ProposerHooks and the controller's
// Config.ControllerSkipsCatchUp.
//
// docs/correctness.md lists the invariants, why each protocol rule is
// needed, and how to replay a seed:
//
//	go test ./test/sim -run 'TestSim$' -seed=N
package sim
