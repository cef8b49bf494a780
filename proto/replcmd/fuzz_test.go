package replcmd

import (
	"errors"
	"strings"
	"testing"
)

func FuzzReplGrammar(f *testing.F) {
	for _, s := range []string{
		"IDENTIFY_SYSTEM", "SHOW wal_segment_size", "TIMELINE_HISTORY 2", `CREATE_REPLICATION_SLOT "s" TEMPORARY PHYSICAL (RESERVE_WAL)`,
		"START_REPLICATION SLOT s PHYSICAL 0/1000000 TIMELINE 1 (term '5')", `DROP_REPLICATION_SLOT "x" WAIT`,
		"READ_REPLICATION_SLOT a", "select 1", `"`, "'", "0/", "START_REPLICATION ( , )",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		cmd, err := Parse(q)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || !(errors.Is(err, ErrSyntax) || errors.Is(err, ErrUnsupported)) || e.Message == "" {
				t.Fatalf("%q: error %v is not an *Error of a known kind with a message", q, err)
			}
			if cmd != nil {
				t.Fatalf("%q: command %#v with error %v", q, cmd, err)
			}
			return
		}
		if cmd == nil {
			t.Fatalf("%q: nil command and nil error", q)
		}
		switch c := cmd.(type) {
		case StartReplication:
			if c.HasTerm != (c.Term != 0) {
				t.Fatalf("%q: term %d, has %v", q, c.Term, c.HasTerm)
			}
		case CreateSlot:
			if c.Slot == "" {
				t.Fatalf("%q: empty slot name", q)
			}
		case TimelineHistory:
			if c.TLI == 0 {
				t.Fatalf("%q: timeline 0", q)
			}
		case SQL:
			if strings.TrimSpace(c.Text) == "" {
				t.Fatalf("%q: empty SQL", q)
			}
		}
	})
}
