package storage

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"reflect"
	"strings"
	"testing"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
)

func goldenState() acceptor.State {
	var s acceptor.State
	for i := range 16 {
		s.TenantID[i] = byte(i)
		s.TimelineID[i] = byte(0x10 + i)
		s.VotedFor.UUID[i] = byte(0xa0 + i)
	}
	s.SystemID = 0x0102030405060708
	s.PgVersion = 150018
	s.WalSegSize = 16 << 20
	s.PgTimeline = 1
	s.VotedFor.Term = 7
	s.TimelineStartLSN = 0x1000028
	s.FlushLSN = 0x1234560
	s.CommitLSN = 0x1234500
	s.TruncateLSN = 0x1200000
	s.RemovedUpTo = 0x1000000
	s.History = proto.TermHistory{{Term: 3, StartLSN: 0x1000028}, {Term: 7, StartLSN: 0x1234000}}
	return s
}

// goldenControl is the control record of goldenState, written out by hand
// field by field; the CRC-32C was computed independently (bitwise, polynomial
// 0x82F63B78). Changing the encoding must fail this test: bump
// controlVersion and keep a decoder for the old version instead.
var goldenControl = strings.Join([]string{
	"534b4353",                         // magic "SKCS"
	"00000001",                         // version 1
	"000102030405060708090a0b0c0d0e0f", // tenant_id
	"101112131415161718191a1b1c1d1e1f", // timeline_id
	"0102030405060708",                 // system_id
	"00024a02",                         // pg_version 150018
	"01000000",                         // wal_seg_size 16 MiB
	"00000001",                         // pg_timeline
	"0000000000000007",                 // voted_for.term
	"a0a1a2a3a4a5a6a7a8a9aaabacadaeaf", // voted_for.uuid
	"0000000001000028",                 // timeline_start_lsn 0/1000028
	"0000000001234560",                 // flush_lsn
	"0000000001234500",                 // commit_lsn
	"0000000001200000",                 // truncate_lsn
	"0000000001000000",                 // removed_up_to
	"00000002",                         // history: 2 entries
	"0000000000000003", "0000000001000028",
	"0000000000000007", "0000000001234000",
	"ad99a6aa", // crc32c
}, "")

func TestControlGolden(t *testing.T) {
	want, err := hex.DecodeString(goldenControl)
	if err != nil {
		t.Fatal(err)
	}
	st := goldenState()
	got := encodeState(nil, &st)
	if !bytes.Equal(got, want) {
		t.Fatalf("encodeState:\n got %x\nwant %x", got, want)
	}
	// encodeState appends: a prefix in dst must not enter the CRC.
	if got := encodeState([]byte("prefix"), &st); !bytes.Equal(got[6:], want) {
		t.Fatalf("encodeState with a non-empty dst:\n got %x\nwant %x", got[6:], want)
	}
	dec, err := decodeState(want)
	if err != nil {
		t.Fatalf("decodeState(golden): %v", err)
	}
	if !reflect.DeepEqual(dec, st) {
		t.Fatalf("decodeState(golden) = %+v, want %+v", dec, st)
	}
	// The decoded state must not alias the input.
	want[len(want)-20] ^= 0xff
	if !reflect.DeepEqual(dec, st) {
		t.Fatal("decoded state aliases its input")
	}
}

func TestControlEmptyHistoryRoundTrip(t *testing.T) {
	st := goldenState()
	st.History = nil
	enc := encodeState(nil, &st)
	if len(enc) != controlFixedLen {
		t.Fatalf("len = %d, want %d", len(enc), controlFixedLen)
	}
	dec, err := decodeState(enc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(dec, st) {
		t.Fatalf("round trip = %+v, want %+v", dec, st)
	}
}

// recrc recomputes the trailing CRC so that only the damage under test is
// seen (not a CRC mismatch).
func recrc(b []byte) []byte {
	binary.BigEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	return b
}

func TestControlDecodeRejects(t *testing.T) {
	golden, err := hex.DecodeString(goldenControl)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		damage func([]byte) []byte
		want   string // word the error must mention, to prove which check fired
	}{
		{"empty", func(b []byte) []byte { return nil }, "truncated"},
		{"torn header", func(b []byte) []byte { return b[:10] }, "truncated"},
		{"torn below fixed part", func(b []byte) []byte { return b[:controlFixedLen-1] }, "truncated"},
		{"torn history", func(b []byte) []byte { return recrc(append(b[:len(b)-12:len(b)-12], 0, 0, 0, 0)) }, "history"},
		{"torn tail", func(b []byte) []byte { return b[:len(b)-1] }, "CRC"},
		{"trailing byte", func(b []byte) []byte { return recrc(append(b[:len(b)-4:len(b)-4], 0, 0, 0, 0, 0)) }, "history"},
		{"history count too large", func(b []byte) []byte {
			binary.BigEndian.PutUint32(b[controlFixedLen-8:], 0xffffffff)
			return recrc(b)
		}, "history"},
		{"bad magic", func(b []byte) []byte { b[0] = 'X'; return recrc(b) }, "magic"},
		{"bad version", func(b []byte) []byte { b[7] = 2; return recrc(b) }, "version"},
		{"flipped bit in body", func(b []byte) []byte { b[50] ^= 0x01; return b }, "CRC"},
		{"zeroed middle", func(b []byte) []byte { clear(b[40:80]); return b }, "CRC"},
		{"flipped bit in CRC", func(b []byte) []byte { b[len(b)-1] ^= 0x80; return b }, "CRC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.damage(bytes.Clone(golden))
			_, err := decodeState(b)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decodeState(%x) error = %v, want ErrCorrupt", b, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not come from the %s check", err, tc.want)
			}
		})
	}
}

// FuzzDecodeState: the decoder never panics, and whatever it accepts
// re-encodes to the same bytes (the encoding is canonical).
func FuzzDecodeState(f *testing.F) {
	golden, _ := hex.DecodeString(goldenControl)
	f.Add(golden)
	empty := goldenState()
	empty.History = nil
	f.Add(encodeState(nil, &empty))
	f.Add([]byte("SKCS"))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := decodeState(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if re := encodeState(nil, &st); !bytes.Equal(re, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, re)
		}
	})
}
