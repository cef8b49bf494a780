package storage

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// The record framing. Every record this package persists (the control
// record, the node record, the slot records) is framed the same way, all
// integers big-endian:
//
//	magic [4] | version u32 | body | crc32c u32 (Castagnoli, over all the
//	bytes before it)
//
// A recordKind describes one kind of record; its append writes the framing
// around a body the caller appends, its open checks the framing and returns
// the body. The body layout is each record's own (control.go, node.go,
// slots.go). open refuses, with an error wrapping ErrCorrupt that names the
// record, in this order: a wrong length (truncated, or longer than a fixed
// record), a wrong magic, an unknown version, a CRC mismatch.

// recordOverhead is the length of the framing around a body: magic 4,
// version 4, crc 4.
const recordOverhead = 4 + 4 + 4

// castagnoli is the CRC-32C table (the polynomial PostgreSQL uses for WAL).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recordKind describes one kind of framed record.
type recordKind struct {
	// name names the record in errors: "node record".
	name string
	// magic opens every record of the kind.
	magic [4]byte
	// version is the one body layout this build writes and reads; open
	// refuses any other rather than guess.
	version uint32
	// bodyLen is the length of the body: exactly, or, if variable, at least
	// (the body's fixed part; its decoder checks the rest).
	bodyLen  int
	variable bool
}

// append appends a record of kind k to dst: the magic and the version, then
// whatever body appends to the slice it is given, then the CRC-32C of the
// record (not of anything in dst before it). A body of the wrong length is
// a bug in the caller and panics.
func (k recordKind) append(dst []byte, body func([]byte) []byte) []byte {
	start := len(dst)
	dst = append(dst, k.magic[:]...)
	dst = binary.BigEndian.AppendUint32(dst, k.version)
	dst = body(dst)
	if n := len(dst) - start - 8; n < k.bodyLen || !k.variable && n != k.bodyLen {
		panic(fmt.Sprintf("storage: %s body is %d bytes, want %d", k.name, n, k.bodyLen))
	}
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// open checks that src is one whole, intact record of kind k and returns its
// body, which aliases src (a decoder copies what it keeps: src is often a
// bbolt slice, valid only inside its transaction).
func (k recordKind) open(src []byte) ([]byte, error) {
	want := recordOverhead + k.bodyLen
	switch {
	case len(src) < want && k.variable:
		return nil, k.corrupt("truncated: %d bytes, want at least %d", len(src), want)
	case len(src) < want:
		return nil, k.corrupt("truncated: %d bytes, want %d", len(src), want)
	case len(src) > want && !k.variable:
		return nil, k.corrupt("has wrong length: %d bytes, want %d", len(src), want)
	case [4]byte(src[:4]) != k.magic:
		return nil, k.corrupt("has bad magic %q, want %q", src[:4], k.magic[:])
	}
	if v := binary.BigEndian.Uint32(src[4:]); v != k.version {
		return nil, k.corrupt("has unknown version %d, this build reads version %d", v, k.version)
	}
	end := len(src) - 4
	if stored, computed := binary.BigEndian.Uint32(src[end:]), crc32.Checksum(src[:end], castagnoli); stored != computed {
		return nil, k.corrupt("CRC-32C mismatch: stored %08x, computed %08x", stored, computed)
	}
	return src[8:end], nil
}

// corrupt returns an error wrapping ErrCorrupt that says what is wrong with
// a record of kind k.
func (k recordKind) corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s %s", ErrCorrupt, k.name, fmt.Sprintf(format, args...))
}
