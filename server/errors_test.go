package server

import (
	"errors"
	"testing"

	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/proto/replcmd"
)

func wireOf(t *testing.T, err error) *pgwire.Error {
	t.Helper()
	var pe *pgwire.Error
	if !errors.As(wireError(err), &pe) {
		t.Fatalf("wireError(%v) is not a *pgwire.Error", err)
	}
	return pe
}

// TestWireErrorOfGrammar: a query the command grammar refuses is 42601 or
// 0A000 by its kind, with the grammar's message as it is.
func TestWireErrorOfGrammar(t *testing.T) {
	cases := []struct{ q, code, msg string }{
		{"START_REPLICATION", pgwire.SyntaxError, "syntax error: unexpected end of command"},
		{"TIMELINE_HISTORY 0", pgwire.SyntaxError, "invalid timeline 0"},
		{"BASE_BACKUP", pgwire.FeatureNotSupported, "BASE_BACKUP is not supported by a safekeeper: take base backups from the primary"},
		{"START_REPLICATION SLOT s LOGICAL 0/0", pgwire.FeatureNotSupported, "logical replication is not supported by a safekeeper"},
	}
	for _, c := range cases {
		_, err := replcmd.Parse(c.q)
		if err == nil {
			t.Fatalf("%q parsed", c.q)
		}
		if pe := wireOf(t, err); pe.Code != c.code || pe.Message != c.msg || pe.Hint != "" || pe.Detail != "" {
			t.Errorf("%q: %s %q, want %s %q", c.q, pe.Code, pe.Message, c.code, c.msg)
		}
	}
}
