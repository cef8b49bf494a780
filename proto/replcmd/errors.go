package replcmd

import (
	"errors"
	"fmt"
)

// The kinds of refusal; every error of Parse is an *Error wrapping one.
var (
	// ErrSyntax: the query starts with a command keyword but is not a
	// well-formed command, or an argument is one the grammar refuses (a TLI
	// of 0, an unknown option). The server answers 42601 (syntax_error).
	ErrSyntax = errors.New("replcmd: syntax error")
	// ErrUnsupported: a well-formed command a safekeeper does not run
	// (BASE_BACKUP, logical replication). The server answers 0A000
	// (feature_not_supported).
	ErrUnsupported = errors.New("replcmd: not supported")
)

// Error is a query Parse refuses. Find it with errors.As; tell its kind
// with errors.Is(err, ErrSyntax) or errors.Is(err, ErrUnsupported).
type Error struct {
	// Kind is ErrSyntax or ErrUnsupported.
	Kind error
	// Message is the text the client is told (PostgreSQL's, where
	// PostgreSQL has one); Error returns it as it is.
	Message string
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns e.Kind.
func (e *Error) Unwrap() error { return e.Kind }

// syntaxErr is the error of a query that does not scan or parse: its
// message starts "syntax error: ", as the server has always sent it.
func syntaxErr(format string, args ...any) *Error {
	return &Error{Kind: ErrSyntax, Message: "syntax error: " + fmt.Sprintf(format, args...)}
}

// invalidErr is the error of a well-formed command with an argument the
// grammar refuses (repl_gram.y's ereport with ERRCODE_SYNTAX_ERROR): its
// message has no "syntax error: " prefix.
func invalidErr(format string, args ...any) *Error {
	return &Error{Kind: ErrSyntax, Message: fmt.Sprintf(format, args...)}
}

// unsupported is the error of a command a safekeeper does not run.
func unsupported(format string, args ...any) *Error {
	return &Error{Kind: ErrUnsupported, Message: fmt.Sprintf(format, args...)}
}
