package proto

import (
	"bytes"
	"errors"
	"testing"
)

// A history file as PostgreSQL 15 writes it for timeline 3.
const pgHistory3 = "1\t0/3000158\tno recovery target specified\n\n2\t0/5A0B2C8\tno recovery target specified\n"

func TestParsePgHistory(t *testing.T) {
	got, err := ParsePgHistory(3, []byte(pgHistory3))
	if err != nil || len(got) != 2 || got[0] != (PgTimelineEnd{1, 0x3000158}) || got[1] != (PgTimelineEnd{2, 0x5A0B2C8}) {
		t.Fatalf("ParsePgHistory = %v, %v", got, err)
	}
	if _, err := ParsePgHistory(3, []byte("# comment\n  1\t0/10\tx\n")); err != nil {
		t.Fatalf("comments and leading blanks: %v", err)
	}
	for _, bad := range []string{"", "# only a comment\n", "3\t0/10\tx\n", "2\t0/20\tx\n1\t0/30\tx\n", "1\t0/30\tx\n2\t0/20\tx\n", "1 garbage\n", "x\t0/10\n"} {
		if _, err := ParsePgHistory(3, []byte(bad)); err == nil {
			t.Errorf("ParsePgHistory(3, %q) accepted", bad)
		}
	}
}

func TestPgHistoryPrefix(t *testing.T) {
	// 00000002.history as PostgreSQL wrote it: timeline 3's first line,
	// without the separating newline writeTimeLineHistory added after it.
	if p, ok := PgHistoryPrefix([]byte(pgHistory3), 2); !ok || string(p) != "1\t0/3000158\tno recovery target specified\n" {
		t.Fatalf("prefix for timeline 2: %q %v", p, ok)
	}
	for _, tli := range []uint32{1, 3, 4} {
		if _, ok := PgHistoryPrefix([]byte(pgHistory3), tli); ok {
			t.Errorf("timeline %d has no history file inside timeline 3's", tli)
		}
	}
}

// TestPgTimelineOfWAL: in timeline 3's history (1 ends at 0/3000158, 2 at
// 0/5A0B2C8), the WAL below a switch point belongs to the timeline that
// ended there, the switch point itself to the next; a segment is named for
// the timeline its WAL belongs to, except the segment of a switch point,
// which has the new timeline's name.
func TestPgTimelineOfWAL(t *testing.T) {
	ends, err := ParsePgHistory(3, []byte(pgHistory3))
	if err != nil {
		t.Fatal(err)
	}
	const seg = 16 << 20
	for _, c := range []struct {
		lsn      LSN
		tli      uint32
		end      LSN
		fileName string
	}{
		{0x1000000, 1, 0x3000158, "000000010000000000000001"},
		{0x2FFFFFF, 1, 0x3000158, "000000010000000000000002"},
		{0x3000000, 1, 0x3000158, "000000020000000000000003"}, // timeline 1's WAL, in the switch segment
		{0x3000157, 1, 0x3000158, "000000020000000000000003"},
		{0x3000158, 2, 0x5A0B2C8, "000000020000000000000003"},
		{0x4FFFFFF, 2, 0x5A0B2C8, "000000020000000000000004"},
		{0x5A0B2C7, 2, 0x5A0B2C8, "000000030000000000000005"},
		{0x5A0B2C8, 3, 0, "000000030000000000000005"},
		{0x9000000, 3, 0, "000000030000000000000009"},
	} {
		tli, end := PgTimelineAt(ends, 3, c.lsn)
		name := SegmentFileName(PgSegmentTimeline(ends, 3, c.lsn, seg), c.lsn, seg)
		if tli != c.tli || end != c.end || name != c.fileName {
			t.Errorf("%s: timeline %d ending at %s, segment %s; want %d ending at %s, %s", c.lsn, tli, end, name, c.tli, c.end, c.fileName)
		}
	}
	if tli, end := PgTimelineAt(nil, 1, 0x1000000); tli != 1 || end != 0 {
		t.Errorf("timeline 1 without a history: %d, %s", tli, end)
	}
}

func TestTimelineHistoryRoundTrip(t *testing.T) {
	m := &TimelineHistory{PgTimeline: 3, Content: []byte(pgHistory3)}
	got, err := DecodeProposerMessage(m.Encode(nil))
	if err != nil || got.(*TimelineHistory).PgTimeline != 3 || !bytes.Equal(got.(*TimelineHistory).Content, m.Content) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for _, bad := range []*TimelineHistory{{PgTimeline: 1, Content: []byte("1\t0/1\tx\n")}, {PgTimeline: 2, Content: []byte("nonsense")}} {
		if _, err := DecodeProposerMessage(bad.Encode(nil)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%+v: %v, want ErrMalformed", bad, err)
		}
	}
	if _, err := DecodeProposerMessage(m.Encode(nil)[:10]); !errors.Is(err, ErrMalformed) {
		t.Errorf("truncated: %v", err)
	}
}
