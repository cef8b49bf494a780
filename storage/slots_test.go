package storage

import (
	"bytes"
	"encoding/hex"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
)

func slotTestTimeline(t *testing.T, path string) (*DB, *Timeline) {
	t.Helper()
	db, err := Open(path, Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	st := acceptor.State{TenantID: proto.ID{0x51}, TimelineID: proto.ID{0x52}, SystemID: 1, PgVersion: 150018, WalSegSize: 1 << 20, PgTimeline: 1}
	tl, _, err := db.OpenTimeline(st.TenantID, st.TimelineID)
	if errors.Is(err, ErrNoTimeline) {
		tl, err = db.CreateTimeline(st)
	}
	if err != nil {
		t.Fatal(err)
	}
	return db, tl
}

func TestSlotGoldenBytes(t *testing.T) {
	got := encodeSlot(nil, &Slot{Name: "x", RestartLSN: 0x1_0000_2000, RestartTLI: 3})
	const want = "534b534c" + "00000001" + "0000000100002000" + "00000003"
	if hex.EncodeToString(got[:len(got)-4]) != want {
		t.Fatalf("encoding %x, want %s + crc", got, want)
	}
	back, err := decodeSlot("x", got)
	if err != nil || back != (Slot{Name: "x", RestartLSN: 0x1_0000_2000, RestartTLI: 3}) {
		t.Fatalf("decode: %+v, %v", back, err)
	}
	damage := map[string]func(b []byte) []byte{
		"magic":     func(b []byte) []byte { b[0] ^= 1; return b },
		"version":   func(b []byte) []byte { b[7] = 2; return b },
		"crc":       func(b []byte) []byte { b[10] ^= 0x80; return b },
		"truncated": func(b []byte) []byte { return b[:len(b)-1] },
		"long":      func(b []byte) []byte { return append(b, 0) },
	}
	for name, f := range damage {
		b := f(append([]byte(nil), got...))
		if _, err := decodeSlot("x", b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

// goldenSlot is the slot record of Slot{"x", 0/100002000, 3}, field by field;
// the CRC-32C was computed independently (bitwise, polynomial 0x82F63B78).
// Changing the encoding must fail this test: bump the slot record version and
// keep a decoder for the old version instead.
const goldenSlot = "534b534c" + // magic "SKSL"
	"00000001" + // version 1
	"0000000100002000" + // restart_lsn
	"00000003" + // restart_tli
	"f65b5a86" // crc32c

func TestSlotRecordGoldenCRC(t *testing.T) {
	want, _ := hex.DecodeString(goldenSlot)
	s := Slot{Name: "x", RestartLSN: 0x1_0000_2000, RestartTLI: 3}
	if got := encodeSlot(nil, &s); !bytes.Equal(got, want) {
		t.Fatalf("encodeSlot:\n got %x\nwant %x", got, want)
	}
	if got := encodeSlot([]byte("prefix"), &s); !bytes.Equal(got[6:], want) {
		t.Fatalf("encodeSlot with a non-empty dst: %x", got[6:])
	}
}

// FuzzDecodeSlot: the decoder never panics, every error wraps ErrCorrupt,
// and whatever it accepts re-encodes to the same bytes.
func FuzzDecodeSlot(f *testing.F) {
	golden, _ := hex.DecodeString(goldenSlot)
	f.Add(golden)
	f.Add([]byte("SKSL"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeSlot("x", b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if s.Name != "x" {
			t.Fatalf("decoded name %q, want %q", s.Name, "x")
		}
		if re := encodeSlot(nil, &s); !bytes.Equal(re, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, re)
		}
	})
}

// TestSlotsSurviveReopen: a slot's creation, update and drop are durable
// decisions (rule 11: rebuild from disk, nothing forgotten).
func TestSlotsSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "safekeeper.db")
	db, tl := slotTestTimeline(t, path)
	if s, err := tl.Slots(); err != nil || len(s) != 0 {
		t.Fatalf("new timeline slots %v, %v", s, err)
	}
	for _, s := range []Slot{{Name: "b", RestartLSN: 0x2000000, RestartTLI: 1}, {Name: "a"}, {Name: "gone"}} {
		if err := tl.CreateSlot(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := tl.CreateSlot(Slot{Name: "a"}); !errors.Is(err, ErrSlotExists) {
		t.Fatalf("duplicate: %v", err)
	}
	if err := tl.SaveSlot(Slot{Name: "a", RestartLSN: 0x3000000, RestartTLI: 1}); err != nil {
		t.Fatal(err)
	}
	if err := tl.DropSlot("gone"); err != nil {
		t.Fatal(err)
	}
	if err := tl.DropSlot("gone"); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("second drop: %v", err)
	}
	if err := tl.SaveSlot(Slot{Name: "gone"}); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("save of a dropped slot: %v", err)
	}
	for _, bad := range []string{"", strings.Repeat("s", MaxSlotNameLen+1), "Bad-Name"} {
		if err := tl.CreateSlot(Slot{Name: bad}); !errors.Is(err, ErrBadState) || !errors.Is(err, proto.ErrBadSlotName) {
			t.Fatalf("slot name %q: %v", bad, err)
		}
	}
	// WAL commits and removal do not touch the slots.
	st := acceptor.State{TenantID: proto.ID{0x51}, TimelineID: proto.ID{0x52}, SystemID: 1, PgVersion: 150018, WalSegSize: 1 << 20, PgTimeline: 1}
	if err := tl.WriteWAL(0x1000000, make([]byte, 3<<20)); err != nil {
		t.Fatal(err)
	}
	st.FlushLSN = 0x1300000
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	if err := tl.RemoveWAL(0x1200000); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db, tl = slotTestTimeline(t, path)
	defer db.Close()
	got, err := tl.Slots()
	want := []Slot{{Name: "a", RestartLSN: 0x3000000, RestartTLI: 1}, {Name: "b", RestartLSN: 0x2000000, RestartTLI: 1}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("after reopen: %+v, %v; want %+v", got, err, want)
	}
	if tl.RemovedUpTo() != 0x1200000 {
		t.Fatalf("removed_up_to %s", tl.RemovedUpTo())
	}
}
