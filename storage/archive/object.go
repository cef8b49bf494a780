package archive

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"runtime"
	"sync"

	"filippo.io/age"
	"github.com/klauspost/compress/zstd"
	"github.com/safekeeper/safekeeper/proto"
)

var (
	// ErrCorrupt: an object that is not what its header says (a bad
	// header, content that does not decompress, decrypt or match its
	// checksum). Nothing from it is handed on.
	ErrCorrupt = errors.New("archive: corrupt object")
	// ErrConflict: an object of that name already holds other content:
	// two writers disagree about the WAL (a split brain), or the store
	// was written by another cluster. The existing object is kept.
	ErrConflict = errors.New("archive: object exists with other content")
	// ErrNoIdentity: an encrypted object and no identity to decrypt it.
	ErrNoIdentity = errors.New("archive: object is encrypted and no identity was given")
)

// Kind is what an object holds.
type Kind uint8

const (
	KindSegment Kind = 1 // a whole WAL segment
	KindPartial Kind = 2 // the start of a segment, up to an end below its end
	KindHistory Kind = 3 // a PostgreSQL timeline history file
)

func (k Kind) String() string {
	switch k {
	case KindSegment:
		return "segment"
	case KindPartial:
		return "partial"
	case KindHistory:
		return "history"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Header is the fixed-size start of every object, readable without the
// rest (a ranged read of HeaderLen bytes).
type Header struct {
	Kind Kind
	// Compressed: the content is zstd-compressed; Encrypted: then
	// encrypted to age recipients.
	Compressed, Encrypted bool
	// SystemID is the PostgreSQL cluster's system identifier.
	SystemID uint64
	// PgTimeline is the PostgreSQL timeline the object belongs to.
	PgTimeline uint32
	// SegSize is the WAL segment size.
	SegSize uint32
	// Start is the segment's first LSN (0 for a history file).
	Start proto.LSN
	// Length is the content's length: SegSize for a segment, the WAL
	// bytes from Start for a partial, the file's length for a history.
	Length uint64
	// Sum is the SHA-256 of the content (uncompressed, in the clear).
	Sum [32]byte
}

// End is the LSN after the WAL the object holds (segments and partials).
func (h Header) End() proto.LSN { return h.Start + proto.LSN(h.Length) }

// Same reports whether two headers describe the same content.
func (h Header) Same(o Header) bool {
	return h.Kind == o.Kind && h.SystemID == o.SystemID && h.PgTimeline == o.PgTimeline && h.SegSize == o.SegSize &&
		h.Start == o.Start && h.Length == o.Length && h.Sum == o.Sum
}

// Layout (big-endian): magic "SKWA" | version u16 | flags u16 (1: zstd,
// 2: age) | kind u8 | 3 zero bytes | system_id u64 | pg_timeline u32 |
// seg_size u32 | start_lsn u64 | length u64 | sha256 [32] | crc32c u32 of
// every byte before it.
const (
	HeaderLen     = 80
	headerVersion = 1
	flagZstd      = 1
	flagAge       = 2
)

var (
	headerMagic = [4]byte{'S', 'K', 'W', 'A'}
	castagnoli  = crc32.MakeTable(crc32.Castagnoli)
)

func (h Header) append(dst []byte) []byte {
	start := len(dst)
	dst = append(dst, headerMagic[:]...)
	dst = binary.BigEndian.AppendUint16(dst, headerVersion)
	var flags uint16
	if h.Compressed {
		flags |= flagZstd
	}
	if h.Encrypted {
		flags |= flagAge
	}
	dst = binary.BigEndian.AppendUint16(dst, flags)
	dst = append(dst, byte(h.Kind), 0, 0, 0)
	dst = binary.BigEndian.AppendUint64(dst, h.SystemID)
	dst = binary.BigEndian.AppendUint32(dst, h.PgTimeline)
	dst = binary.BigEndian.AppendUint32(dst, h.SegSize)
	dst = binary.BigEndian.AppendUint64(dst, uint64(h.Start))
	dst = binary.BigEndian.AppendUint64(dst, h.Length)
	dst = append(dst, h.Sum[:]...)
	return append(dst, crcBytes(dst[start:])...)
}

// crcBytes is the CRC-32C of b, big-endian.
func crcBytes(b []byte) []byte {
	return binary.BigEndian.AppendUint32(nil, crc32.Checksum(b, castagnoli))
}

// ParseHeader reads the header at the start of b (at least HeaderLen
// bytes).
func ParseHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderLen {
		return h, fmt.Errorf("%w: %d bytes, shorter than a header (%d)", ErrCorrupt, len(b), HeaderLen)
	}
	b = b[:HeaderLen]
	if !bytes.Equal(b[:4], headerMagic[:]) {
		return h, fmt.Errorf("%w: no archive header (magic %q)", ErrCorrupt, b[:4])
	}
	if got, want := binary.BigEndian.Uint32(b[HeaderLen-4:]), crc32.Checksum(b[:HeaderLen-4], castagnoli); got != want {
		return h, fmt.Errorf("%w: header checksum %08x, computed %08x", ErrCorrupt, got, want)
	}
	if v := binary.BigEndian.Uint16(b[4:]); v != headerVersion {
		return h, fmt.Errorf("%w: header version %d, this build reads %d", ErrCorrupt, v, headerVersion)
	}
	flags := binary.BigEndian.Uint16(b[6:])
	if flags&^(flagZstd|flagAge) != 0 {
		return h, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
	}
	h.Compressed, h.Encrypted = flags&flagZstd != 0, flags&flagAge != 0
	h.Kind = Kind(b[8])
	if h.Kind < KindSegment || h.Kind > KindHistory {
		return h, fmt.Errorf("%w: unknown kind %d", ErrCorrupt, b[8])
	}
	h.SystemID = binary.BigEndian.Uint64(b[12:])
	h.PgTimeline = binary.BigEndian.Uint32(b[20:])
	h.SegSize = binary.BigEndian.Uint32(b[24:])
	h.Start = proto.LSN(binary.BigEndian.Uint64(b[28:]))
	h.Length = binary.BigEndian.Uint64(b[36:])
	copy(h.Sum[:], b[44:76])
	if h.Kind != KindHistory && (h.SegSize == 0 || h.SegSize&(h.SegSize-1) != 0 || h.Length > uint64(h.SegSize) ||
		h.Start.SegmentOffset(uint64(h.SegSize)) != 0 || (h.Kind == KindSegment && h.Length != uint64(h.SegSize))) {
		return h, fmt.Errorf("%w: %s header with segment size %d, start %s, length %d", ErrCorrupt, h.Kind, h.SegSize, h.Start, h.Length)
	}
	if h.Kind == KindHistory && h.Length > maxHistoryLen {
		return h, fmt.Errorf("%w: history of %d bytes", ErrCorrupt, h.Length)
	}
	return h, nil
}

// maxHistoryLen bounds a history file (PostgreSQL's are a line per
// promotion).
const maxHistoryLen = 1 << 20

// Codec encodes and decodes objects: compression on or off, the age
// recipients objects are encrypted to (none: in the clear) and the
// identities encrypted objects are decrypted with.
type Codec struct {
	Compress   bool
	Recipients []age.Recipient
	Identities []age.Identity
}

var (
	encOnce sync.Once
	enc     *zstd.Encoder
)

func encoder() *zstd.Encoder {
	encOnce.Do(func() {
		var err error
		if enc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0))); err != nil {
			panic(err) // only for invalid options
		}
	})
	return enc
}

// Encode returns the object for content described by h (its Length and Sum
// are filled in here).
func (c *Codec) Encode(h Header, content []byte) ([]byte, error) {
	h.Length = uint64(len(content))
	h.Sum = sha256.Sum256(content)
	h.Compressed = c.Compress
	h.Encrypted = len(c.Recipients) > 0
	out := h.append(make([]byte, 0, HeaderLen+len(content)/2+64))
	if !h.Encrypted {
		if h.Compressed {
			return encoder().EncodeAll(content, out), nil // after the header, in place
		}
		return append(out, content...), nil
	}
	payload := content
	if h.Compressed {
		payload = encoder().EncodeAll(content, make([]byte, 0, len(content)/4+64))
	}
	var buf bytes.Buffer
	buf.Write(out)
	w, err := age.Encrypt(&buf, c.Recipients...)
	if err != nil {
		return nil, fmt.Errorf("archive: encrypt: %w", err)
	}
	if _, err := w.Write(payload); err != nil {
		return nil, fmt.Errorf("archive: encrypt: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("archive: encrypt: %w", err)
	}
	return buf.Bytes(), nil
}

// Decode checks an object and returns its header and content; every
// error wraps ErrCorrupt (or ErrNoIdentity). name is for messages.
func (c *Codec) Decode(name string, obj []byte) (Header, []byte, error) {
	var content bytes.Buffer
	h, err := c.DecodeTo(name, bytes.NewReader(obj), &content, func(h Header) { content.Grow(int(min(h.Length, 1<<30))) })
	if err != nil {
		return h, nil, err
	}
	return h, content.Bytes(), nil
}

// DecodeTo is Decode of the object read from r, its content written to w
// as it is decoded: no buffer of the whole content, so a 16 MiB segment
// streams to a file in pieces. sized, if not nil, is called with the
// header once it is read. w holds the content, checked, only if DecodeTo
// returns nil; after an error it may hold part of it or bytes that failed
// the check, and the caller discards them. An error reading r is returned
// as it is; one of the object's, wrapping ErrCorrupt (or ErrNoIdentity).
func (c *Codec) DecodeTo(name string, r io.Reader, w io.Writer, sized func(Header)) (Header, error) {
	src := &sourceReader{r: r}
	var hb [HeaderLen]byte
	if n, err := io.ReadFull(src, hb[:]); err != nil {
		if src.err != nil {
			return Header{}, src.err
		}
		return Header{}, fmt.Errorf("%s: %w: %d bytes, shorter than a header (%d)", name, ErrCorrupt, n, HeaderLen)
	}
	h, err := ParseHeader(hb[:])
	if err != nil {
		return h, fmt.Errorf("%s: %w", name, err)
	}
	if sized != nil {
		sized(h)
	}
	// The reader's error, if it failed, else the object's.
	fail := func(what string, err error) (Header, error) {
		if src.err != nil {
			return h, src.err
		}
		return h, fmt.Errorf("%s: %w: %s: %v", name, ErrCorrupt, what, err)
	}
	var payload io.Reader = src
	if h.Encrypted {
		if len(c.Identities) == 0 {
			return h, fmt.Errorf("%s: %w", name, ErrNoIdentity)
		}
		if payload, err = age.Decrypt(payload, c.Identities...); err != nil {
			return fail("decrypt", err)
		}
	}
	content := payload
	if h.Compressed {
		// The content is at most a segment (1 GiB): a corrupt frame
		// claiming more is refused, not allocated.
		d, err := zstd.NewReader(payload, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<30+1<<20))
		if err != nil {
			return fail("decompress", err)
		}
		defer d.Close()
		content = d
	}
	sum := sha256.New()
	n, err := io.Copy(io.MultiWriter(errWriter{w}, sum), io.LimitReader(content, int64(min(h.Length, 1<<62))+1))
	if err != nil {
		var we *writeError
		if errors.As(err, &we) {
			return h, we.err
		}
		return fail("decode", err)
	}
	if uint64(n) != h.Length {
		return h, fmt.Errorf("%s: %w: %d bytes of content, the header says %d", name, ErrCorrupt, n, h.Length)
	}
	if got := sum.Sum(nil); !bytes.Equal(got, h.Sum[:]) {
		return h, fmt.Errorf("%s: %w: content checksum %x, the header says %x", name, ErrCorrupt, got[:8], h.Sum[:8])
	}
	// Nothing may follow the content (an uncompressed object's bytes past
	// its length are read above and counted).
	return h, nil
}

// sourceReader remembers the error its reader failed with: the store's,
// not the object's.
type sourceReader struct {
	r   io.Reader
	err error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF && s.err == nil {
		s.err = err
	}
	return n, err
}

// errWriter marks its writer's errors as writeErrors: DecodeTo returns
// them as they are, not as the object's.
type errWriter struct{ w io.Writer }

func (e errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		err = &writeError{err}
	}
	return n, err
}

// writeError is an error of DecodeTo's writer.
type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }
