// Package harness runs the real safekeeper binary for integration tests: it
// builds it, starts its processes on loopback, injects process and network
// faults, and waits on conditions with deadlines. The tests under test/
// (test/e2e, test/chaos and the socket-level tests) use it, and package
// tests borrow parts of it (Binary, WaitFor, SyncBuffer); PostgreSQL
// itself is started by test/pgtest.
//
// What it owns:
//
//   - The binary (Binary): ./cmd/safekeeper built once per test process
//     with go build into a temporary directory, or SAFEKEEPER_BIN when set.
//   - Safekeeper processes (StartSafekeeper): `safekeeper run` with a node
//     id, --listen-pg and --listen-http on 127.0.0.1 port 0 (the process
//     binds its own ports and logs them in its "safekeeper listening"
//     line, which ListenAddrs reads) and a fresh data directory (or one
//     the test prepared: NewSafekeeper, started by Start), logging
//     at debug level to a file. Start returns once that line is logged and
//     fails the test if the process exits first. Kill is kill -9, Stop is
//     SIGTERM with a deadline (its exit error is returned), Restart is
//     kill -9 and Start again on the same data directory and the same
//     ports, which the first start got from the kernel (Start says why
//     rebinding them is safe): the crash-restart-on-the-same-disk fault.
//     PID names the running process for what reads /proc (test/bench).
//   - Addresses: a test never picks a port by closing a listener and
//     handing its number on. Servers bind port 0 themselves (the harness
//     reads what they got); RefusedAddr is an address where nothing
//     listens, held by a bound socket that never listens.
//   - Other subcommands (StartProcess): `safekeeper propose`, for one, with
//     the same Kill/Stop/Log, Exited for its exit code and CheckRunning to
//     fail the test when it exited; Run runs a command to its end (sync,
//     timeline create) and returns its exit code and output.
//   - The pipeline: StartSafekeepers (ids 1..n) and Addrs; StartProposer
//     builds propose's command line; WaitSyncStandby waits until it streams
//     as the primary's synchronous standby; StartCluster is all of it, a
//     test/pgtest primary, three safekeepers, the timeline created as an
//     operator does (CreateTimeline) and the proposer protecting the
//     primary.
//   - A safekeeper's state: TIMELINE_STATUS by column name
//     (Safekeeper.TimelineStatus, or StatusRow on a connection the test
//     holds).
//   - A hot standby fed by a safekeeper (StartStandby): a copy of a
//     test/pgtest primary whose primary_conninfo is a safekeeper
//     (Safekeeper.ConnString names the timeline in the startup options).
//   - Network faults (StartProxy): a TCP proxy between a client and one
//     target. Cut resets every open connection; Partition also refuses
//     (Refuse, an RST) or holds (Blackhole, a dropped route) new ones until
//     Heal.
//   - Waiting: WaitFor polls a condition with a growing delay (5 ms up to
//     200 ms) until a deadline and fails the test naming what it waited
//     for. It is the only way the harness waits; nothing sleeps for a fixed
//     time. Context gives a context bounded by a deadline and the test.
//   - SyncBuffer: a bytes.Buffer a logger or a child process may write while
//     the test reads it.
//   - Logs: Tail and TailFile give the last lines of a log for a failure
//     message, LastLine the last line that says something.
//   - /proc: ReadProcStat (parent, state, CPU ticks of a process and its
//     reaped children), CPUTime, ClockTicks and MappedRSS, for the tests
//     and benchmarks that measure the processes they start; CPUModel,
//     MemTotal and LoadAvg for their reports on the machine.
//   - Reports: WriteDocSection rewrites a generated section of a document
//     (the benchmarks' results in docs/performance.md) between its markers.
//
// Lifecycle: everything it starts is stopped by t.Cleanup (processes with
// kill -9, proxies closed), also when the test fails; a failed test logs
// the tail of each process's log.
//
// Why the boundary sits here: integration tests must exercise what an
// operator runs, the binary and its flags, signals and exit codes, not the
// packages behind it; and every such test needs the same careful parts
// (ports the servers bind themselves, no fixed sleeps, cleanup on
// failure, faults that look like real ones). Of this module it imports
// only test/pgtest, for the PostgreSQL servers around our processes; it
// knows the binary only by its command line.
package harness
