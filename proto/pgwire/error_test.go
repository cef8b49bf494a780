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
