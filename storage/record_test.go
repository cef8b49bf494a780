package storage

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// recordCase is one record kind with a valid record of it and its decoder.
type recordCase struct {
	kind   recordKind
	name   string // how the decoder's errors name the record
	valid  []byte
	decode func([]byte) error
}

func recordCases() []recordCase {
	st := goldenState()
	return []recordCase{
		{controlRecord, "control record", encodeState(nil, &st), func(b []byte) error {
			_, err := decodeState(b)
			return err
		}},
		{nodeRecord, "node record", encodeNodeID(nil, 7), func(b []byte) error {
			_, err := decodeNodeID(b)
			return err
		}},
		{slotRecord, `slot "x" record`, encodeSlot(nil, &Slot{Name: "x", RestartLSN: 0x1_0000_2000, RestartTLI: 3}), func(b []byte) error {
			_, err := decodeSlot("x", b)
			return err
		}},
	}
}

// TestRecordDamage applies each damage to a valid record of each kind: the
// framing and the record's decoder must refuse it with ErrCorrupt, and the
// decoder's error must name the record and say what is wrong (the one
// wording the framing gives all three).
func TestRecordDamage(t *testing.T) {
	for _, d := range []struct {
		name   string
		damage func(k recordKind, b []byte) []byte
		want   string
	}{
		{"empty", func(recordKind, []byte) []byte { return nil }, "truncated"},
		{"header only", func(_ recordKind, b []byte) []byte { return b[:8] }, "truncated"},
		{"truncated", func(k recordKind, b []byte) []byte { return b[:recordOverhead+k.bodyLen-1] }, "truncated"},
		{"bad magic", func(_ recordKind, b []byte) []byte { b[0] ^= 0x20; return recrc(b) }, "bad magic"},
		{"wrong version", func(_ recordKind, b []byte) []byte { b[7]++; return recrc(b) }, "unknown version"},
		{"flipped CRC byte", func(_ recordKind, b []byte) []byte { b[len(b)-2] ^= 0xff; return b }, "CRC-32C mismatch"},
		{"flipped body byte", func(k recordKind, b []byte) []byte { b[8+k.bodyLen/2] ^= 0x01; return b }, "CRC-32C mismatch"},
	} {
		for _, c := range recordCases() {
			t.Run(d.name+"/"+c.name, func(t *testing.T) {
				b := d.damage(c.kind, bytes.Clone(c.valid))
				if _, err := c.kind.open(b); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("open(%x) = %v, want ErrCorrupt", b, err)
				}
				err := c.decode(b)
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("decode(%x) = %v, want ErrCorrupt", b, err)
				}
				if msg := err.Error(); !strings.Contains(msg, c.name+" ") || !strings.Contains(msg, d.want) {
					t.Fatalf("error %q: want it to name the %s and say %q", msg, c.name, d.want)
				}
			})
		}
	}
}

// TestRecordTrailingByte: a fixed-length record with a byte more (CRC
// recomputed) has the wrong length; the control record's framing takes it
// (its length is variable) and its decoder refuses the history length.
func TestRecordTrailingByte(t *testing.T) {
	for _, c := range recordCases() {
		b := recrc(append(bytes.Clone(c.valid), 0))
		want := "has wrong length"
		if c.kind.variable {
			want = "holds"
		}
		err := c.decode(b)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.name+" "+want) {
			t.Errorf("%s with a trailing byte: %v, want ErrCorrupt saying %q", c.name, err, want)
		}
	}
}

// TestRecordEveryBitFlip: the CRC-32C catches every single-bit error, in
// the framing and in the body, of every kind.
func TestRecordEveryBitFlip(t *testing.T) {
	for _, c := range recordCases() {
		for i := range len(c.valid) * 8 {
			b := bytes.Clone(c.valid)
			b[i/8] ^= 1 << (i % 8)
			if err := c.decode(b); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%s with bit %d flipped: %v, want ErrCorrupt", c.name, i, err)
			}
		}
	}
}

// TestRecordAppendPanicsOnBodyLength: a body of the wrong length is a bug of
// ours, not bad input.
func TestRecordAppendPanicsOnBodyLength(t *testing.T) {
	for _, c := range recordCases() {
		short := c.kind.bodyLen - 1
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: append of a %d-byte body did not panic", c.kind.name, short)
				}
			}()
			c.kind.append(nil, func(dst []byte) []byte { return append(dst, make([]byte, short)...) })
		}()
	}
}

// FuzzRecordOpen: for every kind, open never panics, every error wraps
// ErrCorrupt and names the record, and whatever it accepts has a body of
// the kind's length and is exactly what append writes around that body.
func FuzzRecordOpen(f *testing.F) {
	for _, c := range recordCases() {
		f.Add(c.valid)
		f.Add(c.valid[:recordOverhead])
		f.Add(recrc(append(bytes.Clone(c.valid), 0)))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, k := range []recordKind{controlRecord, nodeRecord, slotRecord} {
			body, err := k.open(b)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), k.name) {
					t.Fatalf("%s: error %v does not wrap ErrCorrupt or name the record", k.name, err)
				}
				continue
			}
			if len(body) < k.bodyLen || !k.variable && len(body) != k.bodyLen {
				t.Fatalf("%s: accepted a %d-byte body, want %d", k.name, len(body), k.bodyLen)
			}
			if re := k.append(nil, func(dst []byte) []byte { return append(dst, body...) }); !bytes.Equal(re, b) {
				t.Fatalf("%s: re-framing differs:\n in %x\nout %x", k.name, b, re)
			}
		}
	})
}
