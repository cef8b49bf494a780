// Package pgwire is the server side of the PostgreSQL frontend/backend
// protocol 3.0 for the safekeeper: connection startup, the simple query
// cycle, result sets, errors with SQLSTATEs, CopyBoth streaming and the
// physical replication stream messages carried inside CopyData.
//
// # What it owns, and why the boundary sits here
//
// It is the only package that imports github.com/jackc/pgproto3/v2, which is
// end-of-life upstream: replacing it later (by pgx/v5's pgproto3 or by hand
// written codecs) touches this package alone. The rest of the server speaks
// in Go values (query strings, Columns, *Error, CopyData payloads,
// XLogData/StandbyStatusUpdate/...) and never sees a pgproto3 type.
// It also owns the one catalogue of SQLSTATE codes (sqlstate.go).
//
// It does not parse replication commands, hold timeline state or decode WAL
// push protocol messages (package proto does); it moves bytes and frames.
//
// # Connection lifecycle
//
//  1. Startup. Accept reads the first packet with exact-size reads. An
//     SSLRequest is answered 'N' (or 'S' and a TLS handshake when
//     AcceptOptions.TLSConfig is set), a GSSENCRequest 'N'; the client then
//     sends its next packet on the same socket. A CancelRequest ends here
//     (ErrCancelRequest). A StartupMessage yields a *Conn whose Params hold
//     user, database, replication, options, application_name...; a bad
//     packet is answered with a FATAL ErrorResponse. Helpers for the
//     parameters: ParseOptions, ParseReplication, ParseBool.
//  2. Authentication decision (the caller's). Reject with SendError
//     (severity FATAL), Flush, Close; or accept with Ready, which sends
//     AuthenticationOk, ParameterStatus (see WalsenderParams),
//     BackendKeyData and ReadyForQuery. AcceptOptions.StartupTimeout bounds
//     phases 1 and 2 together; Ready lifts it.
//  3. Query loop. ReadQuery returns each simple Query's text (io.EOF on
//     Terminate). The caller answers with SendRows / SendCommandComplete /
//     SendError and ends every cycle with SendReadyForQuery. The extended
//     query protocol is refused by ReadQuery itself, as the walsender does
//     (by message type: those bodies are never decoded). Malformed input
//     gets PostgreSQL's answers: a message type it does not take is a
//     FATAL *Error "invalid frontend message type N" (close); a Query read
//     whole but malformed is an ERROR *Error ("invalid string in message",
//     "invalid message format") after which the connection goes on.
//  4. Streaming. StartCopyBoth, then CopyData both ways: ReadCopy on the
//     reader side (ErrCopyDone when the client ends its half); SendCopyData,
//     SendXLogData, SendKeepalive on the writer side; SendCopyDone to end the
//     server's half. The stream ends as docs/serving.md describes:
//     CopyDone both ways, then CommandComplete(s) and ReadyForQuery; back to
//     phase 3.
//  5. End. io.EOF from a read (Terminate, or a close at a message
//     boundary), a FATAL *Error (then SendError, Flush, Close) or Close from
//     the server.
//
// # Concurrency
//
// A Conn has one reader and any number of writers:
//
//   - ReadQuery and ReadCopy use only the receive side of the pgproto3
//     Backend. Call them from one goroutine (the connection's reader). A
//     read deadline (SetReadDeadline) may expire and the read be retried: a
//     partly received message is kept. Close from another goroutine unblocks
//     a read.
//   - Every Send* method and Flush may be called from any goroutine. Send*
//     append encoded messages to an output buffer under a mutex; Flush swaps
//     the buffer out and writes it in one syscall, serialised by a second
//     mutex, so Send* calls do not wait for a write in progress unless the
//     buffer passed AcceptOptions.WriteBufferSize. Ready and
//     SendReadyForQuery flush by themselves; everything else waits for
//     Flush. Messages of one Send* call (SendRows) stay contiguous; the order
//     between goroutines is the callers' business.
//   - ReadQuery may itself write (the answers described on it), through
//     the same buffer and mutexes.
//   - Payloads returned by ReadCopy are copies and may cross goroutines;
//     pgproto3 reuses its message values on every Receive, so nothing else
//     read from the Backend leaves this package.
//
// # Debugging
//
// Every ErrorResponse and NoticeResponse sent goes through ClientText: the
// client sees no Go package names ("acceptor: ", "storage: "); the server's
// log, which has the error value, keeps them.
//
// Errors read from the client carry a SQLSTATE (*Error, errors.As). To see the
// bytes on the wire, capture with tcpdump/Wireshark on the safekeeper port
// (the "pgsql" dissector decodes every message, including CopyData) or
// connect with psql "replication=true" and try IDENTIFY_SYSTEM.
package pgwire
