package storage

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// goldenNode is the node record of node id 7, field by field; the CRC-32C
// was computed independently. Changing the encoding must fail this test:
// bump nodeVersion and keep a decoder for the old version instead.
const goldenNode = "534b4e44" + // magic "SKND"
	"00000001" + // version 1
	"0000000000000007" + // node_id
	"e6a39142" // crc32c

func TestNodeRecordGolden(t *testing.T) {
	want, _ := hex.DecodeString(goldenNode)
	if got := encodeNodeID(nil, 7); !bytes.Equal(got, want) {
		t.Fatalf("encodeNodeID:\n got %x\nwant %x", got, want)
	}
	if got := encodeNodeID([]byte("prefix"), 7); !bytes.Equal(got[6:], want) {
		t.Fatalf("encodeNodeID with a non-empty dst: %x", got[6:])
	}
	if id, err := decodeNodeID(want); id != 7 || err != nil {
		t.Fatalf("decodeNodeID(golden) = %d, %v", id, err)
	}
	for name, damage := range map[string]func([]byte) []byte{
		"empty":     func([]byte) []byte { return nil },
		"truncated": func(b []byte) []byte { return b[:len(b)-1] },
		"long":      func(b []byte) []byte { return append(b, 0) },
		"magic":     func(b []byte) []byte { b[0] = 'X'; return recrc(b) },
		"version":   func(b []byte) []byte { b[7] = 2; return recrc(b) },
		"id bit":    func(b []byte) []byte { b[15] ^= 1; return b },
		"crc":       func(b []byte) []byte { b[len(b)-1] ^= 0x80; return b },
	} {
		if _, err := decodeNodeID(damage(bytes.Clone(want))); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

func FuzzDecodeNodeID(f *testing.F) {
	golden, _ := hex.DecodeString(goldenNode)
	f.Add(golden)
	f.Add([]byte("SKND"))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := decodeNodeID(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if re := encodeNodeID(nil, id); !bytes.Equal(re, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, re)
		}
	})
}

// TestNodeIDClaimedOnceSurvivesReopen: the first claim records the id; it
// survives a reopen (rule 11), a later claim of another id leaves it as it
// is and reports it, and read-only opens see it but cannot claim.
func TestNodeIDClaimedOnceSurvivesReopen(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	if id, ok, err := db.NodeID(); ok || err != nil {
		t.Fatalf("new database: NodeID = %d, %v, %v; want none", id, ok, err)
	}
	if got, err := db.ClaimNodeID(7); got != 7 || err != nil {
		t.Fatalf("first ClaimNodeID(7) = %d, %v", got, err)
	}
	if got, err := db.ClaimNodeID(7); got != 7 || err != nil {
		t.Fatalf("ClaimNodeID(7) again = %d, %v", got, err)
	}
	db.Close()

	db = openTest(t, path, Options{})
	if got, err := db.ClaimNodeID(8); got != 7 || err != nil {
		t.Fatalf("after reopen: ClaimNodeID(8) = %d, %v; want the recorded 7", got, err)
	}
	db.Close()

	ro := openTest(t, path, Options{ReadOnly: true})
	if id, ok, err := ro.NodeID(); id != 7 || !ok || err != nil {
		t.Fatalf("read-only NodeID = %d, %v, %v; want 7", id, ok, err)
	}
	if _, err := ro.ClaimNodeID(9); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("ClaimNodeID on a read-only DB = %v, want ErrReadOnly", err)
	}
}

// TestNodeIDAdoptedByOldDatabase: a database written before the node record
// existed (a timeline, no meta/node_id) adopts the first id claimed.
func TestNodeIDAdoptedByOldDatabase(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	if _, err := db.CreateTimeline(testState(1)); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db = openTest(t, path, Options{})
	if _, ok, err := db.NodeID(); ok || err != nil {
		t.Fatalf("old database: NodeID ok=%v, %v; want none", ok, err)
	}
	if got, err := db.ClaimNodeID(3); got != 3 || err != nil {
		t.Fatalf("ClaimNodeID(3) = %d, %v", got, err)
	}
	if _, _, err := db.OpenTimeline(testState(1).TenantID, testState(1).TimelineID); err != nil {
		t.Fatalf("timeline after the claim: %v", err)
	}
}

// TestNodeIDCorruptRecordRefused: a damaged record is an error wrapping
// ErrCorrupt, never read as "no id" (which would adopt a new one).
func TestNodeIDCorruptRecordRefused(t *testing.T) {
	path := testPath(t)
	db := openTest(t, path, Options{})
	if _, err := db.ClaimNodeID(7); err != nil {
		t.Fatal(err)
	}
	if err := db.bolt.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyNodeID, []byte("SKND"))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ClaimNodeID(8); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ClaimNodeID over a damaged record = %v, want ErrCorrupt", err)
	}
	if _, _, err := db.NodeID(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("NodeID of a damaged record = %v, want ErrCorrupt", err)
	}
}
