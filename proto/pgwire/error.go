package pgwire

import (
	"errors"
	"fmt"
	"strings"
)

// Severities of ErrorResponse and NoticeResponse messages (the S and V
// fields), as PostgreSQL spells them.
const (
	SeverityError   = "ERROR"
	SeverityFatal   = "FATAL"
	SeverityPanic   = "PANIC"
	SeverityWarning = "WARNING"
	SeverityNotice  = "NOTICE"
	SeverityDebug   = "DEBUG"
	SeverityInfo    = "INFO"
	SeverityLog     = "LOG"
)

// Error is an error with a SQLSTATE, sent to the client as an ErrorResponse by
// [Conn.SendError]. Find it in a chain with errors.As.
type Error struct {
	// Severity is SeverityError when empty. SeverityFatal tells the client
	// the server closes the connection after this message.
	Severity string
	// Code is the SQLSTATE, one of the constants in sqlstate.go.
	Code string
	// Message is the primary, one-line message (the M field).
	Message string
	// Detail is an optional secondary message (the D field).
	Detail string
	// Hint is an optional suggestion (the H field).
	Hint string

	cause error
}

// Errorf returns an *Error with severity ERROR, the SQLSTATE code and a
// message formatted by fmt.Sprintf rules. A %w verb wraps its operand: it is
// reachable through errors.Is/As (Unwrap) and its text is part of the message.
func Errorf(code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	e := &Error{Code: code, Message: err.Error()}
	switch err.(type) {
	case interface{ Unwrap() error }, interface{ Unwrap() []error }:
		e.cause = err // a %w was given: keep the chain reachable
	}
	return e
}

// Error formats e like pgconn.PgError does: "SEVERITY: message (SQLSTATE code)".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.severity())
	b.WriteString(": ")
	b.WriteString(e.Message)
	if e.Detail != "" {
		b.WriteString(" (")
		b.WriteString(e.Detail)
		b.WriteString(")")
	}
	b.WriteString(" (SQLSTATE ")
	b.WriteString(e.Code)
	b.WriteString(")")
	return b.String()
}

// Unwrap returns the error wrapped by a %w verb given to Errorf, if any.
func (e *Error) Unwrap() error { return e.cause }

func (e *Error) severity() string {
	if e.Severity == "" {
		return SeverityError
	}
	return e.Severity
}

// fatal returns e with severity FATAL (used for errors after which the
// connection cannot continue).
func (e *Error) fatal() *Error {
	e.Severity = SeverityFatal
	return e
}

// ErrMalformed is wrapped by every decoding error of a replication stream
// message (the payload of a CopyData): a wrong length, a bad tag or an invalid
// field. The error itself is an *Error with code ProtocolViolation.
var ErrMalformed = errors.New("pgwire: malformed message")

// malformed returns a ProtocolViolation *Error wrapping ErrMalformed. The
// client sees only the formatted message.
func malformed(format string, args ...any) *Error {
	return &Error{Code: ProtocolViolation, Message: fmt.Sprintf(format, args...), cause: ErrMalformed}
}

// asError turns any error into the *Error to put on the wire: the first
// *Error in err's chain, else InternalError with err's text.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if err == nil {
		return &Error{Code: InternalError, Message: "unknown error"}
	}
	return &Error{Code: InternalError, Message: err.Error()}
}

// cstring makes s safe for a NUL-terminated protocol field: a NUL inside
// would cut the field short and desynchronise the client's parser.
func cstring(s string) string {
	if strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(s, "\x00", "\\0")
}

// ourPackages are the Go packages of this module whose names start their
// errors' texts ("storage: timeline not found").
var ourPackages = []string{"acceptor", "auth", "httpapi", "pgwire", "proposer", "proto", "replcmd", "server", "storage", "timeline", "xlog"}

// ClientText is msg as a client is shown it: without the Go package names
// that start it or one of its parts (after ": ", "; " or a new line):
// "acceptor: storage failure: storage: write: no space left" becomes
// "storage failure: write: no space left". They tell a developer where an
// error came from and mean nothing to a user; the log keeps the full text.
// It is applied where a message leaves the process: every ErrorResponse
// and NoticeResponse this package sends, the HTTP API's JSON errors and
// the CLI's error line.
func ClientText(msg string) string {
	var b strings.Builder
	for rest := msg; ; {
		rest = trimPackages(rest)
		i, n := nextPart(rest)
		if i < 0 {
			b.WriteString(rest)
			return b.String()
		}
		b.WriteString(rest[:i+n])
		rest = rest[i+n:]
	}
}

// trimPackages removes the package names (with their ": ") that start s,
// as long as something follows.
func trimPackages(s string) string {
	for {
		trimmed := false
		for _, p := range ourPackages {
			if len(s) > len(p)+2 && strings.HasPrefix(s, p) && strings.HasPrefix(s[len(p):], ": ") {
				s, trimmed = s[len(p)+2:], true
			}
		}
		if !trimmed {
			return s
		}
	}
}

// nextPart is where the first separator of parts in s is, and its length
// (-1 for none).
func nextPart(s string) (int, int) {
	at, n := -1, 0
	for _, sep := range []string{": ", "; ", "\n"} {
		if i := strings.Index(s, sep); i >= 0 && (at < 0 || i < at) {
			at, n = i, len(sep)
		}
	}
	return at, n
}
