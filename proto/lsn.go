package proto

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// LSN is a byte position in PostgreSQL's write-ahead log (XLogRecPtr): a u64
// counted from the start of the WAL of a cluster. Its text form is PostgreSQL's
// pg_lsn form "%X/%X": the high and low 32 bits in upper-case hex.
type LSN uint64

// InvalidLSN is PostgreSQL's InvalidXLogRecPtr.
const InvalidLSN LSN = 0

// ErrBadLSN is returned by ParseLSN for text that is not "X/X".
var ErrBadLSN = errors.New("proto: invalid LSN")

// String formats l as "%X/%X", e.g. "16/B374D848".
func (l LSN) String() string {
	return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l))
}

// MarshalText is the "X/X" form, so LSNs read the same in JSON (HTTP
// bodies, JSON logs) as everywhere else.
func (l LSN) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText parses the "X/X" form (ParseLSN).
func (l *LSN) UnmarshalText(b []byte) error {
	v, err := ParseLSN(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// ParseLSN parses the "%X/%X" form (either case, each half 1–8 hex digits).
// It returns an error wrapping ErrBadLSN for anything else.
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok || len(hi) == 0 || len(hi) > 8 || len(lo) == 0 || len(lo) > 8 {
		return 0, fmt.Errorf("%w: %q", ErrBadLSN, s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: %q", ErrBadLSN, s)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: %q", ErrBadLSN, s)
	}
	return LSN(h<<32 | l), nil
}

// SegmentStart returns the start of the WAL segment of size segSize (a power of
// two) that holds l.
func (l LSN) SegmentStart(segSize uint64) LSN { return l &^ LSN(segSize-1) }

// SegmentOffset returns l's byte offset within its segment of size segSize.
func (l LSN) SegmentOffset(segSize uint64) uint64 { return uint64(l) & (segSize - 1) }

// SegmentNo returns PostgreSQL's XLogSegNo of l for segments of size segSize.
func (l LSN) SegmentNo(segSize uint64) uint64 { return uint64(l) / segSize }

// SegmentFileName returns the pg_wal file name of the segment holding l on
// timeline tli: TTTTTTTTXXXXXXXXYYYYYYYY (XLogFileName in xlog_internal.h).
func SegmentFileName(tli uint32, l LSN, segSize uint64) string {
	segNo := l.SegmentNo(segSize)
	perID := uint64(0x100000000) / segSize
	return fmt.Sprintf("%08X%08X%08X", tli, segNo/perID, segNo%perID)
}
