// Package client is the client side of the connections the proposer and
// the command line open, with no decision of the proposer's in it:
//
//   - Conn (conn.go): one START_WAL_PUSH stream to a safekeeper (Dial), the
//     client side of the WAL push protocol (README_PROTO.md), with its
//     batching writer (WriteQueue).
//   - Security (security.go): sslmode, sslrootcert and the password or
//     token file, for every connection to a safekeeper.
//   - Replication (replication.go): a physical replication connection, to
//     the primary (IDENTIFY_SYSTEM, the slot, START_REPLICATION, standby
//     status updates) or to a safekeeper's walsender (a term reader:
//     START_REPLICATION ... (term 'N'), docs/serving.md).
//   - CheckConnString (connstring.go): the primary's connection string,
//     checked for what libpq takes and pgx does not.
//   - ProbeTimeline (probe.go): a safekeeper's TIMELINE_STATUS.
//   - PeerState and CopyWAL (pull.go): the reads of `safekeeper timeline
//     pull` from a peer, which change nothing there.
//
// Package proposer builds Run and Sync on these; proposer/restore (`wal
// fetch`) and the command line use them directly. The boundary sits below
// every decision: what to connect to, when, and what an answer means are
// the callers'. A safekeeper's query commands and its walsender are
// PostgreSQL's protocols, so a replication client serves both. Errors
// carry the "proposer:" prefix the operator has always read.
package client
