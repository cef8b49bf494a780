package pgwire

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"
)

func TestError(t *testing.T) {
	e := Errorf(UndefinedFile, "could not open %s: %w", "000000010000000000000002", fs.ErrNotExist)
	if got, want := e.Error(), "ERROR: could not open 000000010000000000000002: file does not exist (SQLSTATE 58P01)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, fs.ErrNotExist) {
		t.Error("%w operand not reachable")
	}
	wrapped := fmt.Errorf("serving: %w", e)
	var got *Error
	if !errors.As(wrapped, &got) || got.Code != UndefinedFile {
		t.Errorf("errors.As through a wrap: %v", got)
	}
	if asError(wrapped) != e {
		t.Error("asError did not find the *Error")
	}
	if x := asError(errors.New("boom")); x.Code != InternalError || x.Message != "boom" {
		t.Errorf("plain error -> %+v", x)
	}
	if Errorf(ProtocolViolation, "plain").Unwrap() != nil {
		t.Error("Unwrap without %w")
	}
	f := &Error{Severity: SeverityFatal, Code: AdminShutdown, Message: "terminating connection due to administrator command", Detail: "d"}
	if got := f.Error(); got != "FATAL: terminating connection due to administrator command (d) (SQLSTATE 57P01)" {
		t.Errorf("Error() = %q", got)
	}
}

// TestClientText: the package names of ours that start a message or one
// of its parts are dropped; everything else stays.
func TestClientText(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"acceptor: storage failure: storage: write: no space left on device", "storage failure: write: no space left on device"},
		{"proposer: storage: no such timeline", "no such timeline"},
		{"no quorum: proposer: a\nproposer: b; server: c", "no quorum: a\nb; c"},
		{"tenant_id: proto: bad id \"x\"", "tenant_id: bad id \"x\""},
		{"timeline pull: storage: locked", "timeline pull: locked"},
		{"the server: storage lost", "the server: storage lost"}, // not a prefix
		{"tls: bad certificate", "tls: bad certificate"},         // not ours
		{"storage: ", "storage: "}, // nothing would be left
		{"", ""},
	} {
		if got := ClientText(c.in); got != c.want {
			t.Errorf("ClientText(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
