package xlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/safekeeper/safekeeper/proto"
)

// Record descriptions, as PostgreSQL 15's pg_waldump prints them after
// "desc: ": the record type's name (rm_identify), a space, then what the
// resource manager's rm_desc (src/backend/access/rmgrdesc/*desc.c) makes of
// the record's main data, then the block references (BlockRefs, the short
// form of xlogdesc.c's XLogRecGetBlockRefInfo).
//
// The main data is a C struct of the resource manager, little-endian and
// laid out as gcc lays it out on x86-64 and arm64 (the offsets below are
// those of PostgreSQL 15's headers). rm_desc trusts it; the decoders here
// do not: data shorter than the fields read, or counts that run past its
// end, are a *DescError, never a read out of range.

// ErrMalformedData is wrapped by the *DescError of a record whose main (or
// block) data is too short or inconsistent for its record type.
var ErrMalformedData = errors.New("xlog: malformed record data")

// ErrNotDescribed is returned by Description for a record of a resource
// manager whose descriptions are not decoded (Described reports false).
var ErrNotDescribed = errors.New("xlog: resource manager not described")

// DescError is a record whose data cannot be described: it wraps
// ErrMalformedData. The WAL itself is valid (the record passed its CRC and
// DecodeRecord's checks); only the resource manager's payload is not what
// its record type says.
type DescError struct {
	LSN    proto.LSN // the record's start
	Reason string    // e.g. "main data is 3 bytes, xl_heap_update needs 14"
}

func (e *DescError) Error() string {
	return fmt.Sprintf("xlog: record at %s: %s", e.LSN, e.Reason)
}

// Unwrap returns ErrMalformedData.
func (e *DescError) Unwrap() error { return ErrMalformedData }

// describers are the resource managers whose rm_desc is implemented.
var describers = map[uint8]func(d *descr) error{
	RMXLogID:    describeXLog,
	rmXact:      describeXact,
	rmSmgr:      describeSmgr,
	rmClog:      describeClog,
	rmDbase:     describeDbase,
	rmRelMap:    describeRelMap,
	rmStandby:   describeStandby,
	rmHeap2:     describeHeap2,
	rmHeap:      describeHeap,
	rmBtree:     describeBtree,
	rmSeq:       describeSeq,
	rmLogicalMs: describeLogicalMsg,
}

// Described reports whether Description decodes the records of resource
// manager rmid: XLOG, Transaction, Storage, CLOG, Database, RelMap,
// Standby, Heap2, Heap, Btree, Sequence and LogicalMessage.
func Described(rmid uint8) bool {
	_, ok := describers[rmid]
	return ok
}

// RecordType returns the record type's name as pg_waldump prints it:
// rm_identify's ("CHECKPOINT_ONLINE", "COMMIT", "HOT_UPDATE+INIT"), or
// "UNKNOWN (%x)" with xl_info & ~XLR_INFO_MASK.
func RecordType(r *Record) string {
	if name, ok := Identify(r.RmID, r.Info); ok {
		return name
	}
	return fmt.Sprintf("UNKNOWN (%x)", r.Info&XLRRmgrInfoMask)
}

// TimestampFormat prints a PostgreSQL TimestampTz (microseconds since
// 2000-01-01 00:00:00 UTC) as pg_waldump's timestamptz_to_str does: in its
// local time zone, "%Y-%m-%d %H:%M:%S", ".%06d" of the microseconds (C's
// truncating remainder, negative before 2000) and the zone's abbreviation.
// The caller gives it (the CLI reads the local zone); this package reads no
// clock and no zone files. UTCTimestamp prints in UTC.
type TimestampFormat func(ts int64) string

// Description returns what PostgreSQL 15's rm_desc prints for r (the text
// between the record type's name and the block references; empty for
// record types it says nothing about, like XLOG FPI or SWITCH). Commit
// times and other timestamps print with tsf, as pg_waldump prints them in
// its local time zone (nil: UTCTimestamp). Errors: ErrNotDescribed for a
// resource manager not decoded here, a *DescError for malformed data.
func Description(r *Record, tsf TimestampFormat) (string, error) {
	fn, ok := describers[r.RmID]
	if !ok {
		return "", ErrNotDescribed
	}
	if tsf == nil {
		tsf = UTCTimestamp
	}
	d := &descr{r: r, data: r.MainData, tsf: tsf}
	if err := fn(d); err != nil {
		return "", err
	}
	return d.b.String(), nil
}

// Describe returns what pg_waldump prints after "desc: " and before the
// block references: RecordType(r), a space, Description(r, loc). Where
// there is no description it says so in angle brackets, which pg_waldump
// never prints: "<not decoded>" for a resource manager not decoded here,
// "<malformed: REASON>" for data that does not fit its record type.
func Describe(r *Record, tsf TimestampFormat) string {
	desc, err := Description(r, tsf)
	var de *DescError
	switch {
	case errors.Is(err, ErrNotDescribed):
		desc = "<not decoded>"
	case errors.As(err, &de):
		desc = "<malformed: " + de.Reason + ">"
	case err != nil:
		desc = "<malformed: " + err.Error() + ">"
	}
	return RecordType(r) + " " + desc
}

// BlockRefs returns the block references of r as pg_waldump prints them
// after the description (XLogRecGetBlockRefInfo, short form): for each,
// ", blkref #ID: rel SPC/DB/REL", " fork NAME" off the main fork, " blk N",
// and " FPW" for an image redo applies or " FPW for WAL verification".
func BlockRefs(r *Record) string {
	var b strings.Builder
	for _, blk := range r.Blocks {
		fmt.Fprintf(&b, ", blkref #%d: rel %s", blk.ID, blk.Rel)
		if blk.Fork != 0 {
			fmt.Fprintf(&b, " fork %s", blk.ForkName())
		}
		fmt.Fprintf(&b, " blk %d", blk.Block)
		if blk.Image != nil {
			if blk.Image.Apply() {
				b.WriteString(" FPW")
			} else {
				b.WriteString(" FPW for WAL verification")
			}
		}
	}
	return b.String()
}

// descr is one record being described: its data, read with bounds checks,
// and the text so far.
type descr struct {
	r    *Record
	data []byte // the bytes the fields are read from: main data, or a block's data
	what string // what data is, for errors: "" is the main data
	tsf  TimestampFormat
	b    strings.Builder
}

func (d *descr) printf(format string, args ...any) { fmt.Fprintf(&d.b, format, args...) }
func (d *descr) str(s string)                      { d.b.WriteString(s) }

// need checks that data holds n bytes for the struct named what.
func (d *descr) need(n int, what string) error {
	if n < 0 || len(d.data) < n {
		src := "main data"
		if d.what != "" {
			src = d.what
		}
		if n < 0 {
			return d.malformed("%s: %s has a negative length", src, what)
		}
		return d.malformed("%s is %d bytes, %s needs %d", src, len(d.data), what, n)
	}
	return nil
}

func (d *descr) malformed(format string, args ...any) error {
	return &DescError{LSN: d.r.LSN, Reason: fmt.Sprintf(format, args...)}
}

// The readers below read at an offset need has checked.
func (d *descr) u8(off int) uint8   { return d.data[off] }
func (d *descr) u16(off int) uint16 { return binary.LittleEndian.Uint16(d.data[off:]) }
func (d *descr) u32(off int) uint32 { return binary.LittleEndian.Uint32(d.data[off:]) }
func (d *descr) i32(off int) int32  { return int32(d.u32(off)) }
func (d *descr) u64(off int) uint64 { return binary.LittleEndian.Uint64(d.data[off:]) }
func (d *descr) i64(off int) int64  { return int64(d.u64(off)) }

// relFileNode reads a RelFileNode (spcNode, dbNode, relNode) at off.
func (d *descr) relFileNode(off int) RelFileNode {
	return RelFileNode{Spc: d.u32(off), DB: d.u32(off + 4), Rel: d.u32(off + 8)}
}

// cString reads a NUL-terminated string starting at off, ending by end.
func (d *descr) cString(off, end int, what string) (string, error) {
	if end > len(d.data) {
		end = len(d.data)
	}
	if off > end {
		return "", d.malformed("%s starts past the end of the data", what)
	}
	i := strings.IndexByte(string(d.data[off:end]), 0)
	if i < 0 {
		return "", d.malformed("%s is not NUL-terminated", what)
	}
	return string(d.data[off : off+i]), nil
}

// count checks that n items of size bytes fit from off, as a C loop over
// them would read, and returns the offset after them.
func (d *descr) count(off int, n int64, size int, what string) (int, error) {
	if n < 0 {
		return 0, d.malformed("%s: count %d", what, n)
	}
	end := int64(off) + n*int64(size)
	if end > int64(len(d.data)) {
		src := "main data"
		if d.what != "" {
			src = d.what
		}
		return 0, d.malformed("%s is %d bytes, %d %s need %d", src, len(d.data), n, what, end)
	}
	return int(end), nil
}

// lsn formats an LSN as the rmgrdesc functions of PostgreSQL 15 do
// (%X/%X, LSN_FORMAT_ARGS).
func lsnString(l uint64) string { return proto.LSN(l).String() }

// postgresEpochUnix is the Unix time of 2000-01-01 00:00:00 UTC, the
// epoch of TimestampTz ((POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) *
// SECS_PER_DAY).
const postgresEpochUnix = 946684800

// PostgresEpochUnix is the Unix time of 2000-01-01 00:00:00 UTC, the
// epoch of TimestampTz.
const PostgresEpochUnix = postgresEpochUnix

// UTCTimestamp is TimestampFormat in UTC, computed here (the civil date of
// a day count, Howard Hinnant's days_from_civil inverted), without the
// time package.
func UTCTimestamp(ts int64) string {
	secs := ts/1_000_000 + postgresEpochUnix // truncating, as the C code does
	days, rem := secs/86400, secs%86400
	if rem < 0 {
		days, rem = days-1, rem+86400
	}
	z := days + 719468
	era := z / 146097
	if z < 0 && z%146097 != 0 {
		era--
	}
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	y := yoe + era*400
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d := doy - (153*mp+2)/5 + 1
	m := mp + 3
	if m > 12 {
		m -= 12
	}
	if m <= 2 {
		y++
	}
	return fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d.%06d UTC", y, m, d, rem/3600, rem%3600/60, rem%60, ts%1_000_000)
}

// Tablespace OIDs relpath knows (pg_tablespace.dat).
const (
	defaultTablespaceOID = 1663
	globalTablespaceOID  = 1664
)

// tablespaceVersionDirectory is TABLESPACE_VERSION_DIRECTORY of PostgreSQL
// 15.x: "PG_" PG_MAJORVERSION "_" CATALOG_VERSION_NO.
const tablespaceVersionDirectory = "PG_15_202209061"

// relPath is relpathperm (common/relpath.c GetRelationPath with
// InvalidBackendId): a relation fork's file path relative to the data
// directory.
func relPath(n RelFileNode, fork int32) string {
	suffix := ""
	if fork != 0 {
		suffix = "_" + forkName(fork)
	}
	switch n.Spc {
	case globalTablespaceOID:
		return fmt.Sprintf("global/%d%s", n.Rel, suffix)
	case defaultTablespaceOID:
		return fmt.Sprintf("base/%d/%d%s", n.DB, n.Rel, suffix)
	default:
		return fmt.Sprintf("pg_tblspc/%d/%s/%d/%d%s", n.Spc, tablespaceVersionDirectory, n.DB, n.Rel, suffix)
	}
}

// forkName is forkNames[fork], or the number for one PostgreSQL does not
// have (where it would read past its array).
func forkName(fork int32) string {
	if fork >= 0 && int(fork) < len(ForkNames) {
		return ForkNames[fork]
	}
	return fmt.Sprintf("%d", fork)
}

// boolString is C's b ? "true" : "false".
func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}
