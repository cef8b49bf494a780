// Package server is the safekeeper process minus its command line: the
// process shell and its front door. It accepts PostgreSQL-protocol
// connections, authenticates them, runs query mode, the WAL push streams
// and the walsenders, and hands every timeline matter to the timeline host
// (server/timeline) and every HTTP request to the HTTP API
// (server/httpapi). cmd/safekeeper turns flags into a Config and runs New,
// Serve and Shutdown; nothing else of the process lives there.
//
// # What it owns, file by file
//
//   - server.go: Config, New/Serve/Shutdown, one goroutine per accepted
//     connection (startup through proto/pgwire, then the query loop).
//   - conns.go: connection slots (MaxConnections), under Server.mu (the
//     timelines have the registry's own lock): the connections still in
//     their startup in arrival order, the oldest evicted when a new one
//     arrives at the limit; the deadline caps of a shutdown and an
//     eviction. limits.go: the other limits and the disk circuit breaker.
//   - tls.go, authn.go: the certificate (reloaded) and token
//     authentication on the PostgreSQL port.
//   - resolve.go: the timeline a connection means — the one a greeting
//     names (created if it may be), the one a reader's startup options
//     name — opened through the registry.
//   - walpush.go: a START_WAL_PUSH stream: its reader (decode, route the
//     greeting to its timeline, queue every message for the timeline's
//     owner) and its writer (batch the replies the owner queues,
//     timeline.Replies, into one socket write).
//   - commands.go: query mode — the commands of proto/replcmd
//     (IDENTIFY_SYSTEM, TIMELINE_STATUS, SHOW, the slot commands, ...), run
//     or refused.
//   - walsender.go: a START_REPLICATION stream (XLogData up to commit_lsn,
//     or flush_lsn for a term reader; keepalives, wal_sender_timeout, the
//     WalSndDone-like end at shutdown); the client's feedback goes to its
//     timeline's Reader.
//   - errors.go: every error's SQLSTATE — the acceptor's, the grammar's,
//     slot names', the timeline host's refusals (fromTimeline) — in one
//     place (the wire transport, proto/pgwire, knows none of them).
//   - http.go: the HTTP API built on the registry and httpHost, what the
//     API reads of the process. memory.go: returning memory after a burst
//     (the database mapping, the heap, pgwire's buffers: process-wide).
//
// The timelines are not here: server/timeline holds them (the registry,
// each timeline's owner, readers, slots, retention, the WAL
// budget), behind an API that speaks no wire protocol. The protocol
// decisions are not here either: they are acceptor.Session's (and
// acceptor.Acceptor's), which is pure, so that the deterministic
// simulation (test/sim) runs exactly the code this server runs.
//
// Why the boundary sits here: the front door changes with the ways in
// (TLS, tokens, limits, the wire protocol's quirks), the timeline host with
// what a timeline does (backup, membership); each can change without the
// other, and a test (test/purity_test.go) keeps server/timeline from
// importing the wire transport or the HTTP API.
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
//  5. Close: temporary slots are dropped, the connection unbinds from its
//     timeline.
//
// # Start and shutdown
//
// New makes the data directory, listens (both ports) before it touches the
// database, opens the database and claims it for Config.NodeID. Serve
// accepts and has the registry open every stored timeline in the
// background. Shutdown stops the registry's opens and deletes, stops
// accepting, cuts every connection's reads and caps its writes, waits for
// the connections (each push stream's owner first makes durable and
// answers what it sent), stops the HTTP API, closes the registry (the
// opens under way, then every owner) and the database.
//
// # Debugging
//
// Every log line of a timeline carries timeline=tenant_id/timeline_id, of a
// connection remote= and application_name=. TIMELINE_STATUS on any
// connection shows a timeline's durable state as the owner last published
// it. Storage failures are logged once when they stop a timeline and again
// when it recovers.
package server
