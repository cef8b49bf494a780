// Package server is the safekeeper process minus its command line: it
// accepts PostgreSQL-protocol connections, runs each timeline's WAL push
// protocol through one acceptor.Session per timeline, serves the WAL back
// to replication clients, keeps their slots and removes WAL nobody needs.
// cmd/safekeeper turns flags into a Config and runs New, Serve and
// Shutdown; nothing else of the process lives there.
//
// # What it owns, file by file
//
//   - server.go: Config, New/Serve/Shutdown, one goroutine per accepted
//     connection (startup through proto/pgwire, then the query loop).
//   - conns.go: connection slots (MaxConnections): the connections still in
//     their startup in arrival order, the oldest evicted when a new one
//     arrives at the limit; the deadline caps of a shutdown and an eviction.
//   - registry.go: the running timelines; opening one from disk or creating
//     it, single-flight per timeline and outside the server-wide lock (an
//     open may fsync); opening every stored timeline at start, in the
//     background with a few workers; choosing the timeline a reader means.
//   - timeline.go: a timeline's owner goroutine. It alone drives the
//     timeline's acceptor.Session, feeding it what the push connections'
//     readers queue (a bounded channel: backpressure reaches TCP), and acts
//     on each Ready: publish the new durable state to readers, then queue
//     the replies.
//   - walpush.go: a START_WAL_PUSH stream: its reader (decode, route the
//     greeting to its timeline, queue every message for the owner) and its
//     writer (batch queued replies into one socket write).
//   - commands.go: query mode — the commands of proto/replcmd
//     (IDENTIFY_SYSTEM, TIMELINE_STATUS, SHOW, ...), run or refused.
//   - walsender.go: a START_REPLICATION stream (XLogData up to commit_lsn,
//     or flush_lsn for a term reader; keepalives, wal_sender_timeout, the
//     WalSndDone-like end at shutdown).
//   - readers.go: the timeline's readers and their feedback (relayed to the
//     proposer in every SafeKeeperResponse).
//   - slots.go: physical replication slots, persistent and temporary.
//   - retention.go: the WAL removal horizon and its goroutine.
//   - errors.go: every error's SQLSTATE — the acceptor's, the grammar's,
//     slot names' — in one place (the wire transport, proto/pgwire, knows
//     none of them).
//
// The protocol decisions are not here: they are acceptor.Session's (and
// acceptor.Acceptor's), which is pure, so that the deterministic simulation
// (test/sim) runs exactly the code this server runs.
//
// # A connection's life
//
//  1. Accept: the socket takes a slot, evicting the oldest connection still
//     in its startup if all are held (conns.go; Shutdown caps its writes).
//  2. Startup: pgwire answers SSLRequest/GSSENCRequest, reads the startup
//     packet, the password is checked; bad parameters are FATAL before
//     AuthenticationOk. Just before it the connection is trusted: no longer
//     evictable.
//  3. Query mode: commands.go runs each query until the client leaves or a
//     stream starts.
//  4. A stream: START_WAL_PUSH (walpush.go, until CopyDone, an error or a
//     dropped socket; the owner first makes durable and answers what the
//     connection sent) or START_REPLICATION (walsender.go). CopyDone goes
//     back to 3.
//  5. Close: temporary slots are dropped.
//
// # Debugging
//
// Every log line of a timeline carries timeline=tenant_id/timeline_id, of a
// connection remote= and application_name=. TIMELINE_STATUS on any
// connection shows a timeline's durable state as the owner last published
// it. Storage failures are logged once when they stop a timeline and again
// when it recovers.
package server
