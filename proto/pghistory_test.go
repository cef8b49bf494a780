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
