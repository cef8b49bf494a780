// Package session is what the walproposer decides in one session — one
// term — with no IO at all: the Core (term choice, election, start points,
// commit_lsn, truncate_lsn, the deposed check), the Session around it (each
// safekeeper connection's place in the protocol, when to campaign and
// elect, what to send when) and the SlotMerge (the replication slot tables
// of the safekeepers, merged). The WAL push protocol and its rules are in
// README_PROTO.md; docs/proposer.md has the reasoning.
//
// Like acceptor, and like etcd raft's RawNode, it does no IO, reads no
// clock, draws no random numbers, starts no goroutine and logs nothing
// (test/purity_test.go holds it to that): a message or a tick goes in; out
// comes a Ready with the messages to send, the connections to drop,
// whether commit_lsn advanced, whether to elect now, and the events an
// operator should hear of. Time comes in through Session.Tick, in the
// caller's clock; WAL through the WALSource the caller hands New.
// Safekeepers are named by their index in the configured list.
//
// Lifecycle: New for each term (Run starts a new session, with LastTerm
// above every term it saw, after every failure); Greeted for each greeted
// connection; Receive for each message; Elect once a Ready says Elect;
// Pump, PumpAll and Tick as WAL arrives and time passes; Disconnected
// when a connection breaks. The caller carries out each Ready in order:
// its Events logged, Sends sent, Drop closed.
//
// The boundary sits where the IO starts, so that the same code runs behind
// real sockets (proposer.Run and proposer.Sync, which own the connections,
// the WAL buffer, the catch-up streams and the clock) and inside the
// deterministic simulation (test/sim), which drives it with simulated ones
// and replays any run from its seed. It is named for its lifecycle: all
// of its state lives for one session and is dropped with it.
package session
