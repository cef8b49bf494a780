// Package proto is the vocabulary the safekeeper's parts share: the messages
// of the WAL push protocol (README_PROTO.md) with
// their codecs, and the positions and names every layer speaks of.
//
// What it owns:
//
//   - The WAL push messages, one file per family, each with Tag, Encode and
//     Decode of its CopyData payload (tag byte included): handshake.go
//     (ServerInfo 'i', SafeKeeperInfo 'I'), vote.go (RequestVote 'v',
//     VoteResponse 'n'), elected.go (ProposerElected 'e'), append.go
//     (SafeKeeperRequest 'a', SafeKeeperResponse 'r' with the readers'
//     HotStandbyFeedback and ConsumerFeedback). codec.go has the tags,
//     ProtocolVersion, MaxWALPerRequest, the Message interface and
//     DecodeProposerMessage / DecodeSafeKeeperMessage, which pick the type
//     by tag.
//   - LSN (lsn.go): PostgreSQL's XLogRecPtr, its "%X/%X" text, segments and
//     pg_wal segment file names.
//   - Ids (ids.go): ID (tenant_id, timeline_id, a proposer's uuid), Ballot
//     (a term and the uuid of the proposer owning it, ordered by Compare),
//     TimelineKey.
//   - Term histories (history.go): TermHistory, its ordering rules
//     (Validate) and CommonPoint, where a safekeeper's WAL and a proposer's
//     agree (rule 3 of the protocol).
//   - The replication slot name rule (slotname.go): CheckSlotName,
//     PostgreSQL's ReplicationSlotValidateName, for the server, storage and
//     the CLI alike.
//
// Encoding: integers are big-endian, an LSN is a u64, an id 16 raw bytes, a
// history a u32 count then (term u64, start_lsn u64) pairs. A decoder takes
// a whole payload and refuses a wrong tag, a short or long payload or an
// invalid field with an error wrapping ErrMalformed, which a safekeeper
// answers as a protocol violation (08P01); it never panics on any input.
// The layouts are pinned by golden bytes (TestGoldenBytes) and the decoders
// fuzzed: whatever decodes re-encodes to the same bytes. A decoded
// SafeKeeperRequest's WAL aliases the payload: a caller that keeps it past
// the payload's buffer must copy it (the server reads each payload into a
// private copy).
//
// Lifecycle: none. Everything here is a plain value or a pure function; no
// state, no IO, safe for concurrent use.
//
// Why the boundary sits here: the proposer and the safekeeper must agree on
// every byte, so the messages live in one package both import, and it
// imports only the standard library. The pure acceptor and the
// deterministic simulation (test/sim) use the same codecs as the wire. What
// a message means (a vote granted, a truncation) is the acceptor's rule,
// how payloads travel is proto/pgwire's (PostgreSQL's frontend/backend
// protocol), which SQLSTATE a refusal gets is the server's
// (server/errors.go). Subpackages: xlog (where WAL records end), pgwire
// (the transport), replcmd (the replication command language).
package proto
