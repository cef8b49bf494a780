package proto

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func id(b byte) ID {
	var x ID
	for i := range x {
		x[i] = b + byte(i)
	}
	return x
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGoldenBytes(t *testing.T) {
	cases := []struct {
		name string
		msg  Message
		hex  string
	}{
		{"ServerInfo", &ServerInfo{ProtocolVersion: 2, PgVersion: 150018, SystemID: 0x0102030405060708,
			TenantID: id(0x10), TimelineID: id(0x20), PgTimeline: 1, WalSegSize: 16 << 20, ProposerUUID: id(0x30), WalEnd: 0x16B374D848,
			Configuration: Configuration{Generation: 3, Members: []uint64{1, 2, 3}, NewMembers: []uint64{1, 2, 4}}},
			`69 00000002 00024a02 0102030405060708
			 101112131415161718191a1b1c1d1e1f 202122232425262728292a2b2c2d2e2f
			 00000001 01000000 303132333435363738393a3b3c3d3e3f 00000016b374d848
			 0000000000000003 00000003 0000000000000001 0000000000000002 0000000000000003
			 00000003 0000000000000001 0000000000000002 0000000000000004`},
		{"ServerInfo without a configuration", &ServerInfo{ProtocolVersion: 2, PgVersion: 150018, SystemID: 1, TenantID: id(0x10), TimelineID: id(0x20),
			PgTimeline: 1, WalSegSize: 16 << 20, ProposerUUID: id(0x30)},
			`69 00000002 00024a02 0000000000000001
			 101112131415161718191a1b1c1d1e1f 202122232425262728292a2b2c2d2e2f
			 00000001 01000000 303132333435363738393a3b3c3d3e3f 0000000000000000
			 0000000000000000 00000000 00000000`},
		{"SafeKeeperInfo", &SafeKeeperInfo{ProtocolVersion: 2, SafekeeperID: 7, VotedFor: Ballot{Term: 3, UUID: id(0x30)},
			LastLogTerm: 2, FlushLSN: 0x2000028, CommitLSN: 0x2000010, TruncateLSN: 0x1000000, TimelineStartLSN: 0x1000000,
			History:       TermHistory{{Term: 1, StartLSN: 0x1000000}, {Term: 2, StartLSN: 0x1800000}},
			Configuration: Configuration{Generation: 1, Members: []uint64{7, 8, 9}}},
			`49 00000002 0000000000000007 0000000000000003 303132333435363738393a3b3c3d3e3f
			 0000000000000002 0000000002000028 0000000002000010 0000000001000000 0000000001000000
			 00000002 0000000000000001 0000000001000000 0000000000000002 0000000001800000
			 0000000000000001 00000003 0000000000000007 0000000000000008 0000000000000009 00000000`},
		{"RequestVote", &RequestVote{Candidate: Ballot{Term: 5, UUID: id(0x40)}},
			`76 0000000000000005 404142434445464748494a4b4c4d4e4f`},
		{"NodeId", &VoteResponse{VotedFor: Ballot{Term: 6, UUID: id(0x50)}},
			`6e 0000000000000006 505152535455565758595a5b5c5d5e5f`},
		{"ProposerElected", &ProposerElected{Term: 5, StartStreamingAt: 0x1800000, TimelineStartLSN: 0x1000000,
			History: TermHistory{{Term: 1, StartLSN: 0x1000000}, {Term: 5, StartLSN: 0x2000028}}},
			`65 0000000000000005 0000000001800000 0000000001000000
			 00000002 0000000000000001 0000000001000000 0000000000000005 0000000002000028`},
		{"SafeKeeperRequest", &SafeKeeperRequest{Sender: Ballot{Term: 5, UUID: id(0x40)}, BeginLSN: 0x100, EndLSN: 0x104,
			CommitLSN: 0x80, TruncateLSN: 0x40, WAL: []byte{0xde, 0xad, 0xbe, 0xef}},
			`61 0000000000000005 404142434445464748494a4b4c4d4e4f 0000000000000100 0000000000000104
			 0000000000000080 0000000000000040 deadbeef`},
		{"SafeKeeperResponse", &SafeKeeperResponse{Term: 5, FlushLSN: 0x200, CommitLSN: 0x100,
			HotStandby: HotStandbyFeedback{TS: -2, Xmin: 700, CatalogXmin: 600},
			Consumer:   ConsumerFeedback{TimelineSize: 1 << 20, ReceivedLSN: 0x300, DiskConsistentLSN: 0x280, RemoteConsistentLSN: 0x180, ReplyTime: 42}},
			`72 0000000000000005 0000000000000200 0000000000000100
			 fffffffffffffffe 00000000000002bc 0000000000000258
			 0000000000100000 0000000000000300 0000000000000280 0000000000000180 000000000000002a`},
		{"Slots", &Slots{SlotTable{[]SlotEntry{{Name: "archiver", Incarnation: 0x0102030405060708, RestartLSN: 0x16B374D848, RestartTLI: 2},
			{Name: "old", Incarnation: 9, Dropped: true}}}},
			`6c 00000002
			 08 6172636869766572 0102030405060708 00000016b374d848 00000002 00
			 03 6f6c64 0000000000000009 0000000000000000 00000000 01`},
		{"SafeKeeperSlots", &SafeKeeperSlots{SlotTable{[]SlotEntry{{Name: "a", Incarnation: 1, RestartLSN: 0x1000000, RestartTLI: 1}}}},
			`4c 00000001 01 61 0000000000000001 0000000001000000 00000001 00`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := unhex(t, c.hex)
			got := c.msg.Encode(nil)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("encode:\n got %x\nwant %x", got, want)
			}
			var back Message
			var err error
			if strings.IndexByte("ivealt", want[0]) >= 0 {
				back, err = DecodeProposerMessage(want)
			} else {
				back, err = DecodeSafeKeeperMessage(want)
			}
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(back, c.msg) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", back, c.msg)
			}
			// Every strict prefix and one extra byte are malformed.
			for i := 0; i < len(want); i++ {
				if _, err := decodeAny(want[:i]); !errors.Is(err, ErrMalformed) {
					t.Fatalf("prefix of %d bytes: err %v, want ErrMalformed", i, err)
				}
			}
			if _, err := decodeAny(append(append([]byte(nil), want...), 0)); !errors.Is(err, ErrMalformed) {
				t.Fatalf("trailing byte: err %v, want ErrMalformed", err)
			}
		})
	}
}

func decodeAny(b []byte) (Message, error) {
	if m, err := DecodeProposerMessage(b); err == nil {
		return m, nil
	}
	return DecodeSafeKeeperMessage(b)
}

func TestDecodeRejects(t *testing.T) {
	good := (&ServerInfo{ProtocolVersion: 2, PgVersion: 150018, SystemID: 1, PgTimeline: 1, WalSegSize: 16 << 20}).Encode(nil)
	bad := func(f func(m *ServerInfo)) []byte {
		m := &ServerInfo{ProtocolVersion: 2, PgVersion: 150018, SystemID: 1, PgTimeline: 1, WalSegSize: 16 << 20,
			Configuration: Configuration{Generation: 1, Members: []uint64{1, 2, 3}}}
		f(m)
		return m.Encode(nil)
	}
	cases := map[string][]byte{
		"unknown tag":                {'Z', 0, 0},
		"empty":                      {},
		"protocol version 3":         bad(func(m *ServerInfo) { m.ProtocolVersion = 3 }),
		"member id 0":                bad(func(m *ServerInfo) { m.Configuration.Members[1] = 0 }),
		"member twice":               bad(func(m *ServerInfo) { m.Configuration.NewMembers = []uint64{4, 4} }),
		"generation 0 with members":  bad(func(m *ServerInfo) { m.Configuration.Generation = 0 }),
		"generation 1 no members":    bad(func(m *ServerInfo) { m.Configuration.Members = nil }),
		"too many members":           bad(func(m *ServerInfo) { m.Configuration.Members = make([]uint64, MaxMembers+1) }),
		"segment size 3 MiB":         bad(func(m *ServerInfo) { m.WalSegSize = 3 << 20 }),
		"segment size 512 KiB":       bad(func(m *ServerInfo) { m.WalSegSize = 512 << 10 }),
		"pg_timeline 0":              bad(func(m *ServerInfo) { m.PgTimeline = 0 }),
		"history descending":         (&ProposerElected{Term: 5, History: TermHistory{{Term: 5, StartLSN: 10}, {Term: 4, StartLSN: 20}}}).Encode(nil),
		"history start decreasing":   (&ProposerElected{Term: 5, History: TermHistory{{Term: 4, StartLSN: 20}, {Term: 5, StartLSN: 10}}}).Encode(nil),
		"history not ending in term": (&ProposerElected{Term: 6, History: TermHistory{{Term: 5, StartLSN: 10}}}).Encode(nil),
		"history empty":              (&ProposerElected{Term: 6}).Encode(nil),
		"end before begin":           (&SafeKeeperRequest{BeginLSN: 10, EndLSN: 5}).Encode(nil),
		"WAL length mismatch":        (&SafeKeeperRequest{BeginLSN: 10, EndLSN: 15, WAL: []byte{1, 2, 3}}).Encode(nil),
		"WAL too large":              (&SafeKeeperRequest{BeginLSN: 0, EndLSN: MaxWALPerRequest + 1, WAL: make([]byte, MaxWALPerRequest+1)}).Encode(nil),
		"huge history count":         unhex(t, "65 0000000000000005 0000000000000000 0000000000000000 ffffffff"),
		"slots: bad name":            (&Slots{SlotTable{[]SlotEntry{{Name: "Archiver"}}}}).Encode(nil),
		"slots: empty name":          (&Slots{SlotTable{[]SlotEntry{{Name: ""}}}}).Encode(nil),
		"slots: twice":               (&Slots{SlotTable{[]SlotEntry{{Name: "a", Incarnation: 1}, {Name: "a", Incarnation: 1, RestartLSN: 5}}}}).Encode(nil),
		"slots: tombstone with lsn":  (&Slots{SlotTable{[]SlotEntry{{Name: "a", Dropped: true, RestartLSN: 5}}}}).Encode(nil),
		"slots: unknown flag":        unhex(t, "6c 00000001 01 61 0000000000000001 0000000001000000 00000001 02"),
		"slots: huge count":          unhex(t, "6c 00001001"),
		"slots: count beyond bytes":  unhex(t, "6c 00000002 01 61 0000000000000001 0000000001000000 00000001 00"),
	}
	if _, err := DecodeProposerMessage(good); err != nil {
		t.Fatalf("good ServerInfo: %v", err)
	}
	for name, b := range cases {
		if _, err := DecodeProposerMessage(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
	// A version-1 proposer's greeting (no configuration after wal_end) is
	// refused for its version, not its length, so the message says what
	// to do.
	v1 := unhex(t, `69 00000001 00024a02 0000000000000001
		101112131415161718191a1b1c1d1e1f 202122232425262728292a2b2c2d2e2f
		00000001 01000000 303132333435363738393a3b3c3d3e3f 0000000000000000`)
	if _, err := DecodeProposerMessage(v1); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "protocol_version 1, this safekeeper speaks 2") ||
		!strings.Contains(err.Error(), "upgrade the proposer") {
		t.Errorf("version-1 ServerInfo: %v", err)
	}
	if _, err := DecodeSafeKeeperMessage([]byte{'i'}); !errors.Is(err, ErrMalformed) {
		t.Errorf("proposer tag to safekeeper decoder: %v", err)
	}
}

func TestLSN(t *testing.T) {
	for _, c := range []struct {
		lsn LSN
		s   string
	}{{0, "0/0"}, {0x16B374D848, "16/B374D848"}, {0xFFFFFFFFFFFFFFFF, "FFFFFFFF/FFFFFFFF"}, {0x1000000, "0/1000000"}} {
		if got := c.lsn.String(); got != c.s {
			t.Errorf("%#x: String %q, want %q", uint64(c.lsn), got, c.s)
		}
		if got, err := ParseLSN(c.s); err != nil || got != c.lsn {
			t.Errorf("ParseLSN(%q) = %v, %v", c.s, got, err)
		}
	}
	if got, _ := ParseLSN("16/b374d848"); got != 0x16B374D848 {
		t.Errorf("lower case: %v", got)
	}
	for _, s := range []string{"", "/", "1/", "/1", "1", "1/2/3", "123456789/0", "g/0", "0/-1", " 0/1", "0x1/2"} {
		if _, err := ParseLSN(s); !errors.Is(err, ErrBadLSN) {
			t.Errorf("ParseLSN(%q): err %v, want ErrBadLSN", s, err)
		}
	}
}

func TestSegmentFileName(t *testing.T) {
	if got := SegmentFileName(1, 0xA9000000, 16<<20); got != "0000000100000000000000A9" {
		t.Errorf("16MB: %s", got)
	}
	if got := SegmentFileName(2, 0x1_0000_0000+5<<20, 1<<20); got != "000000020000000100000005" {
		t.Errorf("1MB: %s", got)
	}
}

func TestParseID(t *testing.T) {
	x := id(0xa0)
	got, err := ParseID(strings.ToUpper(x.String()))
	if err != nil || got != x {
		t.Fatalf("ParseID: %v %v", got, err)
	}
	for _, s := range []string{"", "00", strings.Repeat("z", 32), strings.Repeat("0", 33)} {
		if _, err := ParseID(s); !errors.Is(err, ErrBadID) {
			t.Errorf("ParseID(%q): %v", s, err)
		}
	}
}

func TestBallotOrder(t *testing.T) {
	a := Ballot{Term: 2, UUID: id(1)}
	b := Ballot{Term: 2, UUID: id(2)}
	c := Ballot{Term: 3, UUID: id(0)}
	if a.Compare(b) != -1 || b.Compare(c) != -1 || c.Compare(a) != 1 || a.Compare(a) != 0 {
		t.Fatal("ballots must order by term, then uuid bytes")
	}
}

// Rule 3 of the protocol: the common point of a safekeeper's and a
// proposer's term histories.
func TestCommonPoint(t *testing.T) {
	h := func(e ...uint64) TermHistory {
		var r TermHistory
		for i := 0; i < len(e); i += 2 {
			r = append(r, TermSwitch{Term: e[i], StartLSN: LSN(e[i+1])})
		}
		return r
	}
	cases := []struct {
		name  string
		sk    TermHistory
		flush LSN
		prop  TermHistory
		want  LSN
	}{
		{"empty safekeeper agrees at timeline start", nil, 0, h(1, 100, 3, 500), 100},
		{"same last term: safekeeper's flush", h(1, 100), 400, h(1, 100, 3, 500), 400},
		{"safekeeper ahead in old term: proposer's switch", h(1, 100), 700, h(1, 100, 3, 500), 500},
		{"diverged term: end of last common", h(1, 100, 2, 300), 800, h(1, 100, 3, 500), 300},
		{"diverged first term: timeline start", h(2, 100), 800, h(1, 100, 3, 500), 100},
		{"same history as proposer's last term", h(1, 100, 3, 500), 900, h(1, 100, 3, 500), 900},
		{"same term different start is not common", h(1, 100, 3, 600), 900, h(1, 100, 3, 500), 500},
	}
	for _, c := range cases {
		if got := c.sk.CommonPoint(c.flush, c.prop); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestLSNJSON(t *testing.T) {
	b, err := json.Marshal(struct{ L LSN }{0x16B374D848})
	if err != nil || string(b) != `{"L":"16/B374D848"}` {
		t.Fatalf("%s %v", b, err)
	}
	var v struct{ L LSN }
	if err := json.Unmarshal(b, &v); err != nil || v.L != 0x16B374D848 {
		t.Fatalf("%v %v", v, err)
	}
}
