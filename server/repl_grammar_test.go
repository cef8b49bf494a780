package server

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/safekeeper/safekeeper/proto/pgwire"
)

func TestReplGrammar(t *testing.T) {
	cases := []struct {
		q    string
		want replCmd
		code string // SQLSTATE of the error, when want is nil
	}{
		// What stock clients send (replication-clients.md section 2).
		{"IDENTIFY_SYSTEM", cmdIdentifySystem{}, ""},
		{"IDENTIFY_SYSTEM;", cmdIdentifySystem{}, ""},
		{"  IDENTIFY_SYSTEM ; ", cmdIdentifySystem{}, ""},
		{"SHOW data_directory_mode", cmdShow{Var: "data_directory_mode"}, ""},
		{"SHOW wal_segment_size", cmdShow{Var: "wal_segment_size"}, ""},
		{`SHOW "Wal_Segment_Size"`, cmdShow{Var: "wal_segment_size"}, ""},
		{"SHOW sk.tenant", cmdShow{Var: "sk.tenant"}, ""},
		{"TIMELINE_HISTORY 2", cmdTimelineHist{TLI: 2}, ""},
		{"TIMELINE_HISTORY 0", nil, pgwire.SyntaxError},
		{"TIMELINE_HISTORY 99999999999", nil, pgwire.SyntaxError},
		{"READ_REPLICATION_SLOT myslot", cmdReadSlot{Slot: "myslot"}, ""},
		{"READ_REPLICATION_SLOT MySlot", cmdReadSlot{Slot: "myslot"}, ""},
		{`CREATE_REPLICATION_SLOT "s1" PHYSICAL`, cmdCreateSlot{Slot: "s1"}, ""},
		{`CREATE_REPLICATION_SLOT "pg_walreceiver_123" TEMPORARY PHYSICAL (RESERVE_WAL)`, cmdCreateSlot{Slot: "pg_walreceiver_123", Temporary: true, ReserveWAL: true}, ""},
		{`CREATE_REPLICATION_SLOT s PHYSICAL RESERVE_WAL`, cmdCreateSlot{Slot: "s", ReserveWAL: true}, ""},
		{`CREATE_REPLICATION_SLOT s PHYSICAL (reserve_wal false)`, cmdCreateSlot{Slot: "s"}, ""},
		{`CREATE_REPLICATION_SLOT s PHYSICAL (reserve_wal 'on')`, cmdCreateSlot{Slot: "s", ReserveWAL: true}, ""},
		{`CREATE_REPLICATION_SLOT s PHYSICAL (two_phase)`, nil, pgwire.SyntaxError},
		{`CREATE_REPLICATION_SLOT s LOGICAL pgoutput`, nil, pgwire.FeatureNotSupported},
		{`CREATE_REPLICATION_SLOT s`, nil, pgwire.SyntaxError},
		{`CREATE_REPLICATION_SLOT "a""b" PHYSICAL`, cmdCreateSlot{Slot: `a"b`}, ""},
		{`DROP_REPLICATION_SLOT "s1"`, cmdDropSlot{Slot: "s1"}, ""},
		{`DROP_REPLICATION_SLOT s1 WAIT`, cmdDropSlot{Slot: "s1", Wait: true}, ""},
		{"START_REPLICATION 0/A9000000 TIMELINE 1", cmdStartRepl{Start: 0xA9000000, TLI: 1}, ""},
		{`START_REPLICATION SLOT "s" 0/BF000000 TIMELINE 2`, cmdStartRepl{Slot: "s", Start: 0xBF000000, TLI: 2}, ""},
		{"START_REPLICATION SLOT s PHYSICAL 1/0", cmdStartRepl{Slot: "s", Start: 1 << 32}, ""},
		{"START_REPLICATION PHYSICAL 0/1000000", cmdStartRepl{Start: 0x1000000}, ""},
		{"START_REPLICATION 0/1000000 TIMELINE 1 (term '5')", cmdStartRepl{Start: 0x1000000, TLI: 1, Term: 5, HasTerm: true}, ""},
		{"START_REPLICATION 0/1000000 (TERM 7);", cmdStartRepl{Start: 0x1000000, Term: 7, HasTerm: true}, ""},
		{"START_REPLICATION 0/1000000 (term 'x')", nil, pgwire.SyntaxError},
		{"START_REPLICATION 0/1000000 (term '0')", nil, pgwire.SyntaxError},
		{"START_REPLICATION 0/1000000 (speed 'fast')", nil, pgwire.SyntaxError},
		{"START_REPLICATION 0/1000000 TIMELINE 0", nil, pgwire.SyntaxError},
		{"START_REPLICATION 0/1000000 TIMELINE", nil, pgwire.SyntaxError},
		{"START_REPLICATION 123456789/0", nil, pgwire.SyntaxError},
		{"START_REPLICATION", nil, pgwire.SyntaxError},
		{"START_REPLICATION SLOT s LOGICAL 0/0", nil, pgwire.FeatureNotSupported},
		{"START_REPLICATION 0/0 extra", nil, pgwire.SyntaxError},
		{"TIMELINE_STATUS", cmdTimelineStatus{}, ""},
		{"START_WAL_PUSH", cmdStartWALPush{}, ""},
		{"start_wal_push;", cmdStartWALPush{}, ""},
		{"BASE_BACKUP", nil, pgwire.FeatureNotSupported},
		// Keywords are case-sensitive: anything else is SQL.
		{"identify_system", cmdSQL{Text: "identify_system"}, ""},
		{"SELECT 1", cmdSQL{Text: "SELECT 1"}, ""},
		{"select 'unterminated", cmdSQL{Text: "select 'unterminated"}, ""},
		{"", cmdEmpty{}, ""},
		{" ; ", cmdEmpty{}, ""},
		{"IDENTIFY_SYSTEM 'x", nil, pgwire.SyntaxError},
		{`READ_REPLICATION_SLOT ""`, nil, pgwire.SyntaxError},
	}
	for _, c := range cases {
		got, err := parseReplCommand(c.q)
		if c.want != nil {
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Errorf("%q: got %#v, %v; want %#v", c.q, got, err, c.want)
			}
			continue
		}
		var pe *pgwire.Error
		if !errors.As(err, &pe) || pe.Code != c.code {
			t.Errorf("%q: got %#v, %v; want SQLSTATE %s", c.q, got, err, c.code)
		}
	}
}

func FuzzReplGrammar(f *testing.F) {
	for _, s := range []string{
		"IDENTIFY_SYSTEM", "SHOW wal_segment_size", "TIMELINE_HISTORY 2", `CREATE_REPLICATION_SLOT "s" TEMPORARY PHYSICAL (RESERVE_WAL)`,
		"START_REPLICATION SLOT s PHYSICAL 0/1000000 TIMELINE 1 (term '5')", `DROP_REPLICATION_SLOT "x" WAIT`,
		"READ_REPLICATION_SLOT a", "select 1", `"`, "'", "0/", "START_REPLICATION ( , )",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		cmd, err := parseReplCommand(q)
		if err != nil {
			var pe *pgwire.Error
			if !errors.As(err, &pe) || pe.Code == "" {
				t.Fatalf("%q: error without SQLSTATE: %v", q, err)
			}
			return
		}
		if cmd == nil {
			t.Fatalf("%q: nil command and nil error", q)
		}
		switch c := cmd.(type) {
		case cmdStartRepl:
			if c.HasTerm != (c.Term != 0) {
				t.Fatalf("%q: term %d, has %v", q, c.Term, c.HasTerm)
			}
		case cmdCreateSlot:
			if c.Slot == "" {
				t.Fatalf("%q: empty slot name", q)
			}
		case cmdSQL:
			if strings.TrimSpace(c.Text) == "" {
				t.Fatalf("%q: empty SQL", q)
			}
		}
	})
}

func TestNextChunkCutsOnPages(t *testing.T) {
	cases := []struct{ pos, limit, want uint64 }{
		{0x1000000, 0x1000100, 0x1000100},               // short: up to the limit
		{0x1000000, 0x1000000 + maxSendSize, 0x1020000}, // exactly 128 KiB
		{0x1000000, 0x1000000 + maxSendSize + 1, 0x1020000},
		{0x1000010, 0x2000000, 0x1020000},               // limited and unaligned: cut to a page
		{0x1001ff0, 0x2000000, 0x1020000},               // start near a page end
		{0x1000010, 0x1000010 + maxSendSize, 0x1020010}, // not limited: not cut
		{0xFFFF0000, 0x1_0001_0000, 0x1_0001_0000},      // across the 4 GiB line
	}
	for _, c := range cases {
		got := uint64(nextChunk(lsn(c.pos), lsn(c.limit)))
		if got != c.want {
			t.Errorf("nextChunk(%#x, %#x) = %#x, want %#x", c.pos, c.limit, got, c.want)
		}
		if got-c.pos > maxSendSize || got <= c.pos {
			t.Errorf("nextChunk(%#x, %#x) = %#x: size %d", c.pos, c.limit, got, got-c.pos)
		}
	}
}

func TestRetentionHorizon(t *testing.T) {
	const seg = 1 << 20
	base := retentionInputs{SegSize: seg, CommitLSN: 0x900000, TruncateLSN: 0x800000, ConsumerSeen: true, RemoteConsistent: 0x750000}
	with := func(f func(*retentionInputs)) retentionInputs { in := base; f(&in); return in }
	cases := []struct {
		name string
		in   retentionInputs
		want uint64
	}{
		{"consumer bounds, rounded down to a segment", base, 0x700000},
		{"no consumer since start: nothing", with(func(in *retentionInputs) { in.ConsumerSeen = false }), 0},
		{"truncate_lsn bounds", with(func(in *retentionInputs) { in.TruncateLSN = 0x512345 }), 0x500000},
		{"commit_lsn bounds", with(func(in *retentionInputs) { in.CommitLSN, in.RemoteConsistent = 0x312345, 0x900000 }), 0x300000},
		{"slot bounds", with(func(in *retentionInputs) { in.SlotRestart = []lsn{0x800000, 0x2fffff} }), 0x200000},
		{"active reader keeps its segment", with(func(in *retentionInputs) { in.ReaderPos = []lsn{0x400001} }), 0x400000},
		{"no truncate_lsn: nothing", with(func(in *retentionInputs) { in.TruncateLSN = 0 }), 0},
	}
	for _, c := range cases {
		if got := uint64(retentionHorizon(c.in)); got != c.want {
			t.Errorf("%s: %#x, want %#x", c.name, got, c.want)
		}
	}
}
