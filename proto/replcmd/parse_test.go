package replcmd

import (
	"errors"
	"reflect"
	"testing"
)

func TestReplGrammar(t *testing.T) {
	cases := []struct {
		q    string
		want Command
		kind error // ErrSyntax or ErrUnsupported, when want is nil
	}{
		// What stock clients send (docs/serving.md, the command table).
		{"IDENTIFY_SYSTEM", IdentifySystem{}, nil},
		{"IDENTIFY_SYSTEM;", IdentifySystem{}, nil},
		{"  IDENTIFY_SYSTEM ; ", IdentifySystem{}, nil},
		{"SHOW data_directory_mode", Show{Var: "data_directory_mode"}, nil},
		{"SHOW wal_segment_size", Show{Var: "wal_segment_size"}, nil},
		{`SHOW "Wal_Segment_Size"`, Show{Var: "wal_segment_size"}, nil},
		{"SHOW sk.tenant", Show{Var: "sk.tenant"}, nil},
		{"TIMELINE_HISTORY 2", TimelineHistory{TLI: 2}, nil},
		{"TIMELINE_HISTORY 0", nil, ErrSyntax},
		{"TIMELINE_HISTORY 99999999999", nil, ErrSyntax},
		{"READ_REPLICATION_SLOT myslot", ReadSlot{Slot: "myslot"}, nil},
		{"READ_REPLICATION_SLOT MySlot", ReadSlot{Slot: "myslot"}, nil},
		{`CREATE_REPLICATION_SLOT "s1" PHYSICAL`, CreateSlot{Slot: "s1"}, nil},
		{`CREATE_REPLICATION_SLOT "pg_walreceiver_123" TEMPORARY PHYSICAL (RESERVE_WAL)`, CreateSlot{Slot: "pg_walreceiver_123", Temporary: true, ReserveWAL: true}, nil},
		{`CREATE_REPLICATION_SLOT s PHYSICAL RESERVE_WAL`, CreateSlot{Slot: "s", ReserveWAL: true}, nil},
		{`CREATE_REPLICATION_SLOT s PHYSICAL (reserve_wal false)`, CreateSlot{Slot: "s"}, nil},
		{`CREATE_REPLICATION_SLOT s PHYSICAL (reserve_wal 'on')`, CreateSlot{Slot: "s", ReserveWAL: true}, nil},
		{`CREATE_REPLICATION_SLOT s PHYSICAL (reserve_wal 'o')`, nil, ErrSyntax},
		{`CREATE_REPLICATION_SLOT s PHYSICAL (two_phase)`, nil, ErrSyntax},
		{`CREATE_REPLICATION_SLOT s LOGICAL pgoutput`, nil, ErrUnsupported},
		{`CREATE_REPLICATION_SLOT s`, nil, ErrSyntax},
		{`CREATE_REPLICATION_SLOT "a""b" PHYSICAL`, CreateSlot{Slot: `a"b`}, nil},
		{`DROP_REPLICATION_SLOT "s1"`, DropSlot{Slot: "s1"}, nil},
		{`DROP_REPLICATION_SLOT s1 WAIT`, DropSlot{Slot: "s1", Wait: true}, nil},
		{"START_REPLICATION 0/A9000000 TIMELINE 1", StartReplication{Start: 0xA9000000, TLI: 1}, nil},
		{`START_REPLICATION SLOT "s" 0/BF000000 TIMELINE 2`, StartReplication{Slot: "s", Start: 0xBF000000, TLI: 2}, nil},
		{"START_REPLICATION SLOT s PHYSICAL 1/0", StartReplication{Slot: "s", Start: 1 << 32}, nil},
		{"START_REPLICATION PHYSICAL 0/1000000", StartReplication{Start: 0x1000000}, nil},
		{"START_REPLICATION 0/1000000 TIMELINE 1 (term '5')", StartReplication{Start: 0x1000000, TLI: 1, Term: 5, HasTerm: true}, nil},
		{"START_REPLICATION 0/1000000 (TERM 7);", StartReplication{Start: 0x1000000, Term: 7, HasTerm: true}, nil},
		{"START_REPLICATION 0/1000000 (term 'x')", nil, ErrSyntax},
		{"START_REPLICATION 0/1000000 (term '0')", nil, ErrSyntax},
		{"START_REPLICATION 0/1000000 (speed 'fast')", nil, ErrSyntax},
		{"START_REPLICATION 0/1000000 TIMELINE 0", nil, ErrSyntax},
		{"START_REPLICATION 0/1000000 TIMELINE", nil, ErrSyntax},
		{"START_REPLICATION 123456789/0", nil, ErrSyntax},
		{"START_REPLICATION", nil, ErrSyntax},
		{"START_REPLICATION SLOT s LOGICAL 0/0", nil, ErrUnsupported},
		{"START_REPLICATION 0/0 extra", nil, ErrSyntax},
		{"TIMELINE_STATUS", TimelineStatus{}, nil},
		{"START_WAL_PUSH", StartWALPush{AllowTimelineCreation: true}, nil},
		{"start_wal_push;", StartWALPush{AllowTimelineCreation: true}, nil},
		{"START_WAL_PUSH (allow_timeline_creation 'false')", StartWALPush{}, nil},
		{"START_WAL_PUSH (ALLOW_TIMELINE_CREATION off);", StartWALPush{}, nil},
		{"START_WAL_PUSH (allow_timeline_creation 'true')", StartWALPush{AllowTimelineCreation: true}, nil},
		{"START_WAL_PUSH (allow_timeline_creation)", StartWALPush{AllowTimelineCreation: true}, nil},
		{"START_WAL_PUSH (allow_timeline_creation 'maybe')", nil, ErrSyntax},
		{"START_WAL_PUSH (allow_timeline_creation 'false', sync_replication_slots 'on')", StartWALPush{SyncReplicationSlots: true}, nil},
		{"START_WAL_PUSH (sync_replication_slots)", StartWALPush{AllowTimelineCreation: true, SyncReplicationSlots: true}, nil},
		{"START_WAL_PUSH (sync_replication_slots 'x')", nil, ErrSyntax},
		{"START_WAL_PUSH (proto_version '3')", nil, ErrSyntax},
		{"START_WAL_PUSH (allow_timeline_creation 'false'", nil, ErrSyntax},
		{"BASE_BACKUP", nil, ErrUnsupported},
		// Keywords are case-sensitive: anything else is SQL.
		{"identify_system", SQL{Text: "identify_system"}, nil},
		{"SELECT 1", SQL{Text: "SELECT 1"}, nil},
		{"select 'unterminated", SQL{Text: "select 'unterminated"}, nil},
		{"", Empty{}, nil},
		{" ; ", Empty{}, nil},
		{"IDENTIFY_SYSTEM 'x", nil, ErrSyntax},
		{`READ_REPLICATION_SLOT ""`, nil, ErrSyntax},
	}
	for _, c := range cases {
		got, err := Parse(c.q)
		if c.want != nil {
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Errorf("%q: got %#v, %v; want %#v", c.q, got, err, c.want)
			}
			continue
		}
		var e *Error
		if got != nil || !errors.As(err, &e) || !errors.Is(err, c.kind) || e.Kind != c.kind {
			t.Errorf("%q: got %#v, %v; want an *Error of kind %v", c.q, got, err, c.kind)
		}
	}
}

// TestErrorMessages pins the text a client is told for each refusal: the
// scanner's and parser's errors start "syntax error: ", the checks of a
// well-formed command's arguments do not (as the server has always sent
// them).
func TestErrorMessages(t *testing.T) {
	cases := []struct{ q, msg string }{
		{`SHOW "x`, "syntax error: unterminated quoted identifier"},
		{`SHOW ""`, "syntax error: zero-length delimited identifier"},
		{"IDENTIFY_SYSTEM 'x", "syntax error: unterminated quoted string"},
		{"START_REPLICATION 0/", `syntax error: invalid LSN "0/"`},
		{"START_REPLICATION 123456789/0", `syntax error: invalid streaming start location "123456789/0"`},
		{"START_REPLICATION 0/0 extra", `syntax error: at or near "extra"`},
		{"IDENTIFY_SYSTEM #", `syntax error: at or near "#"`},
		{"START_REPLICATION", "syntax error: unexpected end of command"},
		{"TIMELINE_HISTORY 99999999999", "syntax error: number 99999999999 out of range"},
		{"TIMELINE_HISTORY 0", "invalid timeline 0"},
		{"START_REPLICATION 0/0 TIMELINE 0", "invalid timeline 0"},
		{"CREATE_REPLICATION_SLOT s PHYSICAL (two_phase)", "unrecognized option: two_phase"},
		{"START_REPLICATION 0/0 (speed 'fast')", "unrecognized option: speed"},
		{"CREATE_REPLICATION_SLOT s PHYSICAL (reserve_wal 'maybe')", "reserve_wal requires a Boolean value"},
		{"START_REPLICATION 0/0 (term 'x')", `term requires a positive integer value, got "x"`},
		{"BASE_BACKUP", "BASE_BACKUP is not supported by a safekeeper: take base backups from the primary"},
		{"CREATE_REPLICATION_SLOT s LOGICAL pgoutput", "logical replication slots are not supported by a safekeeper"},
		{"START_REPLICATION SLOT s LOGICAL 0/0", "logical replication is not supported by a safekeeper"},
	}
	for _, c := range cases {
		_, err := Parse(c.q)
		var e *Error
		if !errors.As(err, &e) || e.Message != c.msg || err.Error() != c.msg {
			t.Errorf("%q: got %v, want message %q", c.q, err, c.msg)
		}
	}
}
