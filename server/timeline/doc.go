// Package timeline is the timeline host of a safekeeper: the running
// timelines of one database, each with the one goroutine that drives its
// WAL push protocol, its readers and slots, and the retention that removes
// WAL nobody needs.
//
// # What it owns, file by file
//
//   - registry.go: Registry, the running timelines under their own lock;
//     opening one from disk or creating it (single-flight per timeline and
//     outside the lock: an open may fsync), opening every stored one at
//     start in the background with a few workers (OpenStored), stopping
//     them at shutdown (Stop, Close).
//   - timeline.go: Timeline and its owner. The owner alone drives the
//     timeline's acceptor.Session; it is state under a lock, run by the
//     push connection's reader whose message it is (Handle: step, and
//     group-commit once no further message is already here; run to
//     completion, no hand-off per message; the reader not reading
//     meanwhile is the backpressure that reaches TCP), and by one
//     background goroutine for timers, slot reports and the stop. It acts
//     on each Ready: publish the new durable state to readers (Status),
//     then hand each reply to its connection through Replies, the one
//     interface it calls per reply.
//   - delete.go: the connections bound to a timeline (Bind) and the delete
//     of a timeline or a tenant (Registry.Delete, DeleteTenant).
//   - readers.go: the replication streams (Reader) and their feedback
//     (relayed to the proposer in every SafeKeeperResponse); lag.go, their
//     lag in time.
//   - slots.go, slotsync.go: physical replication slots, persistent and
//     temporary, and their copies on the other safekeepers through the
//     proposer.
//   - retention.go: the WAL removal horizon and its goroutine.
//   - budget.go: the WAL budget the push readers take from and the owners
//     give back to (Config.MaxBufferedWAL).
//   - errors.go: the refusals, as sentinels (ErrNotFound, ErrBusy,
//     ErrLimit, the slots').
//
// # Lifecycle
//
// NewRegistry on an open storage.DB; OpenStored at start; Open or
// OpenOrCreate for each connection that names a timeline, Bind for as long
// as it uses it; Delete at an operator's word. At shutdown Stop refuses
// every open, create and delete; once the connections that feed the owners
// have ended, Close waits for the opens under way and stops every owner,
// which persists what it holds in memory. The caller closes the database.
//
// # Why the boundary sits here
//
// A timeline's state and its rules (the session's Ready, slots, retention,
// budgets) are one room; the ways in — the PostgreSQL wire protocol
// (package server) and the HTTP API (server/httpapi) — are others. This
// package imports neither proto/pgwire nor server/httpapi (a test checks):
// it speaks in proto messages, acceptor states and its own errors, and the
// front doors give those their SQLSTATEs and HTTP statuses. So a new way
// in (WAL backup, a peer's pull over HTTP, membership on etcd) reads and
// drives timelines through this package without touching the wire code.
// The protocol decisions are not here either: they are acceptor.Session's,
// which is pure, so that the deterministic simulation (test/sim) runs
// exactly the code the owner runs.
package timeline
