package storage

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

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
	slot := Slot{Name: "x", RestartLSN: 0x1_0000_2000, RestartTLI: 3, Incarnation: 0x0102030405060708}
	got := encodeSlot(nil, &slot)
	const want = "534b534c" + "00000002" + "0000000100002000" + "00000003" + "0102030405060708"
	if hex.EncodeToString(got[:len(got)-4]) != want {
		t.Fatalf("encoding %x, want %s + crc", got, want)
	}
	back, err := decodeSlot("x", got)
	if err != nil || back != slot {
		t.Fatalf("decode: %+v, %v", back, err)
	}
	damage := map[string]func(b []byte) []byte{
		"magic":     func(b []byte) []byte { b[0] ^= 1; return b },
		"version":   func(b []byte) []byte { b[7] = 3; return b },
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

// goldenSlot is the slot record of Slot{"x", 0/100002000, 3, incarnation
// 0x0102030405060708}, field by field, and goldenSlotV1 version 1's record
// of it (no incarnation), as builds before slots were copied between
// safekeepers wrote it; the CRC-32Cs were computed independently (bitwise,
// polynomial 0x82F63B78). Changing the encoding must fail this test: bump
// the slot record version and keep a decoder for the old version instead.
const (
	goldenSlot = "534b534c" + // magic "SKSL"
		"00000002" + // version 2
		"0000000100002000" + // restart_lsn
		"00000003" + // restart_tli
		"0102030405060708" + // incarnation
		"69989c60" // crc32c
	goldenSlotV1 = "534b534c" + // magic "SKSL"
		"00000001" + // version 1
		"0000000100002000" + // restart_lsn
		"00000003" + // restart_tli
		"f65b5a86" // crc32c
	// goldenTombstone is the tombstone record of a slot dropped at
	// unix microsecond 0x0005fa0b3c1e4000.
	goldenTombstone = "534b5354" + // magic "SKST"
		"00000001" + // version 1
		"0005fa0b3c1e4000" + // dropped_at
		"b0f98413" // crc32c
)

func TestSlotRecordGoldenCRC(t *testing.T) {
	want, _ := hex.DecodeString(goldenSlot)
	s := Slot{Name: "x", RestartLSN: 0x1_0000_2000, RestartTLI: 3, Incarnation: 0x0102030405060708}
	if got := encodeSlot(nil, &s); !bytes.Equal(got, want) {
		t.Fatalf("encodeSlot:\n got %x\nwant %x", got, want)
	}
	if got := encodeSlot([]byte("prefix"), &s); !bytes.Equal(got[6:], want) {
		t.Fatalf("encodeSlot with a non-empty dst: %x", got[6:])
	}
	// Version 1 reads as incarnation 0.
	v1, _ := hex.DecodeString(goldenSlotV1)
	if back, err := decodeSlot("x", v1); err != nil || back != (Slot{Name: "x", RestartLSN: 0x1_0000_2000, RestartTLI: 3}) {
		t.Fatalf("decode of a version 1 record: %+v, %v", back, err)
	}
	if got := encodeSlotV1(nil, &s); !bytes.Equal(got, v1) {
		t.Fatalf("encodeSlotV1:\n got %x\nwant %x", got, v1)
	}
	wantTS, _ := hex.DecodeString(goldenTombstone)
	ts := SlotTombstone{Name: "x", Incarnation: 9, DroppedAt: time.UnixMicro(0x0005fa0b3c1e4000)}
	if got := encodeTombstone(nil, &ts); !bytes.Equal(got, wantTS) {
		t.Fatalf("encodeTombstone:\n got %x\nwant %x", got, wantTS)
	}
	if back, err := decodeTombstone(tombstoneKey("x", 9), wantTS); err != nil || !back.DroppedAt.Equal(ts.DroppedAt) || back.Name != "x" || back.Incarnation != 9 {
		t.Fatalf("decodeTombstone: %+v, %v", back, err)
	}
	for name, key := range map[string][]byte{"no separator": []byte("x"), "short incarnation": []byte("x\x00\x01")} {
		if _, err := decodeTombstone(key, wantTS); !errors.Is(err, ErrCorrupt) {
			t.Errorf("tombstone key %s: %v, want ErrCorrupt", name, err)
		}
	}
}

// FuzzDecodeSlot: the decoder never panics, every error wraps ErrCorrupt,
// and whatever it accepts re-encodes, in the version it was read in, to the
// same bytes.
func FuzzDecodeSlot(f *testing.F) {
	for _, g := range []string{goldenSlot, goldenSlotV1} {
		b, _ := hex.DecodeString(g)
		f.Add(b)
	}
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
		re := encodeSlot(nil, &s)
		if b[7] == 1 {
			re = encodeSlotV1(nil, &s)
		}
		if !bytes.Equal(re, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, re)
		}
	})
}

// FuzzDecodeTombstone: likewise for tombstone records and their keys.
func FuzzDecodeTombstone(f *testing.F) {
	b, _ := hex.DecodeString(goldenTombstone)
	f.Add(tombstoneKey("x", 9), b)
	f.Fuzz(func(t *testing.T, key, b []byte) {
		ts, err := decodeTombstone(key, b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if re := encodeTombstone(nil, &ts); !bytes.Equal(re, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, re)
		}
		if rk := tombstoneKey(ts.Name, ts.Incarnation); !bytes.Equal(rk, key) {
			t.Fatalf("key re-encoding differs:\n in %x\nout %x", key, rk)
		}
	})
}

// TestSlotUpdatesAndTombstonesSurviveReopen: UpdateSlots stores puts,
// drops and tombstones in one transaction, and they are there after a
// reopen; a version 1 record stored by an older build is read with
// incarnation 0 and rewritten as version 2 by a put.
func TestSlotUpdatesAndTombstonesSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "safekeeper.db")
	db, tl := slotTestTimeline(t, path)
	// As an older build left it: a version 1 record.
	if err := db.bolt.Update(func(tx *bolt.Tx) error {
		sb, err := tx.Bucket(bucketTimelines).Bucket(tl.key[:]).CreateBucketIfNotExists(bucketSlots)
		if err != nil {
			return err
		}
		return sb.Put([]byte("old"), encodeSlotV1(nil, &Slot{RestartLSN: 0x3000000, RestartTLI: 1}))
	}); err != nil {
		t.Fatal(err)
	}
	at := time.UnixMicro(time.Now().UnixMicro())
	if err := tl.UpdateSlots(SlotUpdate{
		Put:           []Slot{{Name: "a", RestartLSN: 0x1000000, RestartTLI: 1, Incarnation: 11}, {Name: "b", Incarnation: 12}},
		PutTombstones: []SlotTombstone{{Name: "a", Incarnation: 10, DroppedAt: at}, {Name: "z", Incarnation: 1, DroppedAt: at}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := tl.UpdateSlots(SlotUpdate{Drop: []string{"b", "never"}, PutTombstones: []SlotTombstone{{Name: "b", Incarnation: 12, DroppedAt: at}},
		DropTombstones: []SlotTombstone{{Name: "z", Incarnation: 1}}}); err != nil {
		t.Fatal(err)
	}
	if err := tl.UpdateSlots(SlotUpdate{Put: []Slot{{Name: "Bad"}}}); !errors.Is(err, ErrBadState) {
		t.Fatalf("a bad slot name: %v, want ErrBadState", err)
	}
	db.Close()
	db, tl = slotTestTimeline(t, path)
	defer db.Close()
	slots, err := tl.Slots()
	want := []Slot{{Name: "a", RestartLSN: 0x1000000, RestartTLI: 1, Incarnation: 11}, {Name: "old", RestartLSN: 0x3000000, RestartTLI: 1}}
	if err != nil || !reflect.DeepEqual(slots, want) {
		t.Fatalf("slots after reopen: %+v, %v; want %+v", slots, err, want)
	}
	tss, err := tl.SlotTombstones()
	if err != nil || len(tss) != 2 || tss[0].Name != "a" || tss[0].Incarnation != 10 || !tss[0].DroppedAt.Equal(at) ||
		tss[1].Name != "b" || tss[1].Incarnation != 12 {
		t.Fatalf("tombstones after reopen: %+v, %v", tss, err)
	}
	if err := tl.UpdateSlots(SlotUpdate{Put: []Slot{{Name: "old", RestartLSN: 0x3000000, RestartTLI: 1, Incarnation: 5}}}); err != nil {
		t.Fatal(err)
	}
	if err := db.bolt.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketTimelines).Bucket(tl.key[:]).Bucket(bucketSlots).Get([]byte("old"))
		if binary.BigEndian.Uint32(v[4:]) != 2 {
			return fmt.Errorf("rewritten record is version %d", binary.BigEndian.Uint32(v[4:]))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
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
