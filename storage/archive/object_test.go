package archive

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

// TestHeaderGoldenBytes pins the object header's layout: a change to it
// is a format change (a new version), never a silent one.
func TestHeaderGoldenBytes(t *testing.T) {
	h := Header{Kind: KindPartial, Compressed: true, SystemID: 0x0102030405060708, PgTimeline: 2, SegSize: 1 << 24,
		Start: 0x1_0300_0000, Length: 0x1234}
	for i := range h.Sum {
		h.Sum[i] = byte(i)
	}
	got := hex.EncodeToString(h.append(nil))
	want := "534b574100010001" + "02000000" + "0102030405060708" + "00000002" + "01000000" + "0000000103000000" + "0000000000001234" +
		"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f" + "90dffa8b"
	if got != want {
		t.Fatalf("header bytes\n got %s\nwant %s", got, want)
	}
	b, _ := hex.DecodeString(want)
	back, err := ParseHeader(b)
	if err != nil || back != h {
		t.Fatalf("ParseHeader: %+v, %v; want %+v", back, err, h)
	}
	if back.End() != proto.LSN(0x1_0300_1234) {
		t.Fatalf("End %s", back.End())
	}
}

// TestParseHeaderRefuses: each damage is ErrCorrupt.
func TestParseHeaderRefuses(t *testing.T) {
	good := Header{Kind: KindSegment, SystemID: 1, PgTimeline: 1, SegSize: 1 << 20, Start: 1 << 20, Length: 1 << 20}.append(nil)
	recrc := func(b []byte) []byte { return Header{}.fix(b) }
	for name, damage := range map[string]func([]byte) []byte{
		"short":             func(b []byte) []byte { return b[:HeaderLen-1] },
		"magic":             func(b []byte) []byte { b[0] = 'X'; return b },
		"crc":               func(b []byte) []byte { b[HeaderLen-1] ^= 1; return b },
		"version":           func(b []byte) []byte { b[5] = 9; return recrc(b) },
		"flags":             func(b []byte) []byte { b[7] = 0x80; return recrc(b) },
		"kind":              func(b []byte) []byte { b[8] = 7; return recrc(b) },
		"segment size":      func(b []byte) []byte { b[26] = 3; return recrc(b) },
		"start mid-segment": func(b []byte) []byte { b[35] = 1; return recrc(b) },
		"short segment":     func(b []byte) []byte { b[43] = 1; b[42] = 0; return recrc(b) },
	} {
		if _, err := ParseHeader(damage(bytes.Clone(good))); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

// fix recomputes the header CRC of b (for tests that damage a field and
// want only that field's check to fire).
func (Header) fix(b []byte) []byte {
	h := b[:HeaderLen-4]
	return append(h[:len(h):len(h)], crcBytes(h)...)
}

// FuzzDecode: whatever bytes an object holds, Decode returns an error or
// content that matches its header; it never panics.
func FuzzDecode(f *testing.F) {
	c := &Codec{Compress: true}
	obj, _ := c.Encode(Header{Kind: KindPartial, SystemID: 7, PgTimeline: 1, SegSize: 1 << 20}, []byte("some WAL bytes"))
	f.Add(obj)
	plain, _ := (&Codec{}).Encode(Header{Kind: KindHistory, PgTimeline: 2}, []byte("1\t0/3000000\tno recovery target specified\n"))
	f.Add(plain)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, content, err := c.Decode("fuzz", b)
		if err == nil && uint64(len(content)) != h.Length {
			t.Fatalf("decoded %d bytes, header says %d", len(content), h.Length)
		}
	})
}
