package xlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/safekeeper/safekeeper/proto"
)

// Sizes and constants of PostgreSQL 15's WAL format.
const (
	// PageSize is XLOG_BLCKSZ, the WAL page size in bytes.
	PageSize = 8192
	// PageMagic is XLOG_PAGE_MAGIC of PostgreSQL 15 (xlp_magic).
	PageMagic = 0xD110

	// SizeOfXLogShortPHD is MAXALIGN(sizeof(XLogPageHeaderData)).
	SizeOfXLogShortPHD = 24
	// SizeOfXLogLongPHD is MAXALIGN(sizeof(XLogLongPageHeaderData)).
	SizeOfXLogLongPHD = 40
	// SizeOfXLogRecord is sizeof(XLogRecord), the record header.
	SizeOfXLogRecord = 24
	// MaxAlign is MAXIMUM_ALIGNOF: records start and end on multiples of it.
	MaxAlign = 8
	// MaxRecordSize is the largest xl_tot_len accepted (MaxAllocSize, the
	// limit of xlogreader's record buffer in PostgreSQL 15).
	MaxRecordSize = 0x3fffffff

	// XLPFirstIsContRecord (XLP_FIRST_IS_CONTRECORD): the page starts with
	// xlp_rem_len bytes continuing a record from the previous page.
	XLPFirstIsContRecord = 0x0001
	// XLPLongHeader (XLP_LONG_HEADER): the page has XLogLongPageHeaderData.
	XLPLongHeader = 0x0002
	// XLPBkpRemovable (XLP_BKP_REMOVABLE): backup blocks are optional.
	XLPBkpRemovable = 0x0004
	// XLPFirstIsOverwriteContRecord (XLP_FIRST_IS_OVERWRITE_CONTRECORD):
	// the record that was being continued into this page was lost (crash
	// recovery ended inside it) and is abandoned; a new record starts
	// after this page's header.
	XLPFirstIsOverwriteContRecord = 0x0008
	// xlpAllFlags is XLP_ALL_FLAGS.
	xlpAllFlags = 0x000F

	// RMXLogID is RM_XLOG_ID, the resource manager of xlog.c's records.
	RMXLogID = 0
	// XLogNoop is XLOG_NOOP (xl_info & 0xF0 of RM_XLOG_ID): no effect.
	XLogNoop = 0x20
	// XLogSwitch is XLOG_SWITCH: the rest of the segment is unused.
	XLogSwitch = 0x40
	// XLogOverwriteContrecord is XLOG_OVERWRITE_CONTRECORD, written first
	// on a page with XLP_FIRST_IS_OVERWRITE_CONTRECORD.
	XLogOverwriteContrecord = 0xD0
	// XLRRmgrInfoMask is XLR_RMGR_INFO_MASK: the rmgr's bits of xl_info.
	XLRRmgrInfoMask = 0xF0

	// offXLCRC is offsetof(XLogRecord, xl_crc).
	offXLCRC = 20
)

// ErrInvalidWAL is wrapped by every decoding error.
var ErrInvalidWAL = errors.New("xlog: invalid WAL")

// ErrRecordCRC is wrapped by the error for a record whose xl_crc does not
// match its bytes. It wraps ErrInvalidWAL.
var ErrRecordCRC = fmt.Errorf("%w: record CRC mismatch", ErrInvalidWAL)

// Error is a decoding error: the WAL at LSN is not valid PostgreSQL 15 WAL
// (or not the WAL the decoder was told to expect). It wraps ErrInvalidWAL.
type Error struct {
	LSN    proto.LSN // where the offending page header or record starts
	Reason string    // xlogreader-style description
	// Err is a more specific sentinel wrapping ErrInvalidWAL (ErrRecordCRC),
	// or nil.
	Err error
}

func (e *Error) Error() string { return fmt.Sprintf("xlog: invalid WAL at %s: %s", e.LSN, e.Reason) }

// Unwrap returns Err, or ErrInvalidWAL if Err is nil: either way the error
// wraps ErrInvalidWAL.
func (e *Error) Unwrap() error {
	if e.Err != nil {
		return e.Err
	}
	return ErrInvalidWAL
}

// CRC32C is the Castagnoli table PostgreSQL's pg_crc32c uses.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// RecordCRC returns xl_crc for a record: CRC-32C over the data (all bytes
// after the 24-byte header, page headers excluded) and then over the header
// up to xl_crc (its first 20 bytes). hdr must hold at least 20 bytes.
func RecordCRC(hdr, data []byte) uint32 {
	return crc32.Update(crc32.Update(0, crcTable, data), crcTable, hdr[:offXLCRC])
}

// AlignUp rounds l up to a multiple of MaxAlign (MAXALIGN).
func AlignUp(l proto.LSN) proto.LSN { return (l + MaxAlign - 1) &^ (MaxAlign - 1) }

// state is where in the record layer the next byte belongs (page headers
// are handled separately, see Decoder.inPageHeader).
type state uint8

const (
	stRecStart   state = iota // a record starts at pos (MAXALIGNed)
	stRecHeader               // inside the XLogRecord header
	stRecData                 // inside the record's data
	stForeign                 // inside the tail of a record begun before start
	stPadding                 // MAXALIGN padding after a record, up to skipTo
	stSwitchSkip              // rest of the segment after XLOG_SWITCH, up to skipTo
)

// Decoder tracks WAL record boundaries in a stream of PostgreSQL 15 WAL (see
// the package comment). It is not safe for concurrent use.
type Decoder struct {
	segSize   uint64
	start     proto.LSN
	pos       proto.LSN // end of bytes consumed
	recordEnd proto.LSN // EndRecPtr of the last complete record, or start
	err       error

	// Page header being read; while inPageHeader, pos is inside it.
	inPageHeader bool
	phdr         [SizeOfXLogLongPHD]byte
	phdrGot      int
	phdrLen      int
	seenPage     bool   // a page header has been read since start
	sysid        uint64 // xlp_sysid of the first long header, if haveSysid
	haveSysid    bool
	tli          uint32 // xlp_tli of the last page (0 before the first)

	st        state
	rhdr      [SizeOfXLogRecord]byte
	rhdrGot   int
	recStart  proto.LSN
	remaining uint64 // bytes of the current (or foreign) record not yet fed, header included
	crc       uint32 // running CRC-32C of the record's data
	foreign   bool   // the record finishing is the foreign tail
	isSwitch  bool   // the record finishing is an XLOG_SWITCH
	skipTo    proto.LSN
	prevRec   proto.LSN // start of the last complete record (for xl_prev), or InvalidLSN
}

// NewDecoder returns a decoder whose stream starts at start, which must be a
// record boundary: the end of a record (EndRecPtr) or a page start. segSize is
// the WAL segment size in bytes (a power of two, at least PageSize; PostgreSQL
// allows 1 MiB..1 GiB). Invalid arguments are reported by the first Feed, as
// an error wrapping ErrInvalidWAL.
func NewDecoder(start proto.LSN, segSize uint64) *Decoder {
	d := &Decoder{segSize: segSize, start: start, pos: start, recordEnd: start}
	switch {
	case segSize < PageSize || segSize&(segSize-1) != 0:
		d.err = &Error{LSN: start, Reason: fmt.Sprintf("WAL segment size %d is not a power of two >= %d", segSize, PageSize)}
	case start%MaxAlign != 0:
		d.err = &Error{LSN: start, Reason: "decoder start is not MAXALIGNed, so it is not a record boundary"}
	}
	return d
}

// Pos returns the end of the bytes fed so far (start plus their length), or,
// after an error, the end of the bytes consumed before it.
func (d *Decoder) Pos() proto.LSN { return d.pos }

// RecordEnd returns the end (EndRecPtr) of the last record fully fed,
// including its MAXALIGN padding, or start if no record has ended yet.
// It never points inside a record, and RecordEnd() <= Pos(). For an
// XLOG_SWITCH record it is the next segment start, reached once the rest of
// the segment has been fed.
func (d *Decoder) RecordEnd() proto.LSN { return d.recordEnd }

// Err returns the error that stopped the decoder, or nil.
func (d *Decoder) Err() error { return d.err }

// Feed decodes the next contiguous bytes of WAL, which start at Pos(). Any
// split is fine, down to one byte per call. data is not retained. On
// malformed WAL it returns an *Error wrapping ErrInvalidWAL, and returns that
// same error on every later call.
func (d *Decoder) Feed(data []byte) error {
	for len(data) > 0 && d.err == nil {
		data = data[d.step(data):]
	}
	return d.err
}

func (d *Decoder) fail(at proto.LSN, format string, args ...any) {
	d.err = &Error{LSN: at, Reason: fmt.Sprintf(format, args...)}
}

// step consumes a prefix of data (at least one byte unless it fails) and
// returns its length.
func (d *Decoder) step(data []byte) int {
	if d.st == stSwitchSkip {
		// Not even page headers: PostgreSQL zeroes them after a switch.
		n := int(min(uint64(len(data)), uint64(d.skipTo-d.pos)))
		d.pos += proto.LSN(n)
		if d.pos == d.skipTo {
			d.recordEnd = d.pos
			d.st = stRecStart
		}
		return n
	}
	off := uint64(d.pos) % PageSize
	if off == 0 && !d.inPageHeader {
		d.inPageHeader, d.phdrGot, d.phdrLen = true, 0, SizeOfXLogShortPHD
	}
	if d.inPageHeader {
		return d.readPageHeader(data)
	}
	avail := min(uint64(len(data)), PageSize-off)

	switch d.st {
	case stRecStart:
		d.st, d.recStart, d.rhdrGot = stRecHeader, d.pos, 0
		fallthrough
	case stRecHeader:
		n := min(avail, uint64(SizeOfXLogRecord-d.rhdrGot))
		before := d.rhdrGot
		copy(d.rhdr[d.rhdrGot:], data[:n])
		d.rhdrGot += int(n)
		d.pos += proto.LSN(n)
		if before < 4 && d.rhdrGot >= 4 {
			// xl_tot_len: always on the record's first page, as a record
			// starts MAXALIGNed with at least 8 bytes left on its page.
			tot := binary.LittleEndian.Uint32(d.rhdr[0:])
			if tot < SizeOfXLogRecord {
				d.fail(d.recStart, "invalid record length: expected at least %d, got %d", SizeOfXLogRecord, tot)
				return int(n)
			}
			if tot > MaxRecordSize {
				d.fail(d.recStart, "record length %d too long", tot)
				return int(n)
			}
			d.remaining = uint64(tot) - uint64(d.rhdrGot)
		} else if before >= 4 {
			d.remaining -= n
		}
		if d.rhdrGot == SizeOfXLogRecord {
			d.recordHeaderDone()
		}
		return int(n)
	case stRecData, stForeign:
		n := min(avail, d.remaining)
		if d.st == stRecData {
			d.crc = crc32.Update(d.crc, crcTable, data[:n])
		}
		d.remaining -= n
		d.pos += proto.LSN(n)
		if d.remaining == 0 {
			d.recordDone()
		}
		return int(n)
	case stPadding:
		n := min(avail, uint64(d.skipTo-d.pos))
		d.pos += proto.LSN(n)
		if d.pos == d.skipTo {
			d.complete()
		}
		return int(n)
	}
	panic(fmt.Sprintf("xlog: decoder in unknown state %d", d.st))
}

// recordHeaderDone checks a complete XLogRecord header.
func (d *Decoder) recordHeaderDone() {
	prev := proto.LSN(binary.LittleEndian.Uint64(d.rhdr[8:]))
	switch {
	case d.prevRec != proto.InvalidLSN && prev != d.prevRec:
		d.fail(d.recStart, "record with incorrect prev-link %s (expected %s)", prev, d.prevRec)
		return
	case prev >= d.recStart:
		d.fail(d.recStart, "record with incorrect prev-link %s", prev)
		return
	}
	d.st, d.crc = stRecData, 0
	if d.remaining == 0 {
		d.recordDone()
	}
}

// recordDone is called when the last byte of a record (or of the foreign
// tail) has been consumed.
func (d *Decoder) recordDone() {
	d.foreign = d.st == stForeign
	d.isSwitch = false
	if !d.foreign {
		want := binary.LittleEndian.Uint32(d.rhdr[offXLCRC:])
		if got := crc32.Update(d.crc, crcTable, d.rhdr[:offXLCRC]); got != want {
			d.fail(d.recStart, "incorrect resource manager data checksum in record: got %08X, xl_crc %08X", got, want)
			d.err.(*Error).Err = ErrRecordCRC
			return
		}
		info, rmid := d.rhdr[16], d.rhdr[17]
		d.isSwitch = rmid == RMXLogID && info&XLRRmgrInfoMask == XLogSwitch
	}
	if end := AlignUp(d.pos); end != d.pos {
		d.st, d.skipTo = stPadding, end
		return
	}
	d.complete()
}

// complete is called at the MAXALIGNed end of a record or foreign tail.
func (d *Decoder) complete() {
	d.st = stRecStart
	if d.foreign {
		return // not a record of this stream
	}
	d.prevRec = d.recStart
	if d.isSwitch && d.pos.SegmentOffset(d.segSize) != 0 {
		d.st, d.skipTo = stSwitchSkip, d.pos.SegmentStart(d.segSize)+proto.LSN(d.segSize)
		return
	}
	d.recordEnd = d.pos
}

// readPageHeader consumes bytes of a page header and checks it when complete
// (XLogReaderValidatePageHeader), then applies its continuation flags.
func (d *Decoder) readPageHeader(data []byte) int {
	n := min(len(data), d.phdrLen-d.phdrGot)
	copy(d.phdr[d.phdrGot:], data[:n])
	d.phdrGot += n
	d.pos += proto.LSN(n)
	if d.phdrGot == SizeOfXLogShortPHD && d.phdrLen == SizeOfXLogShortPHD &&
		binary.LittleEndian.Uint16(d.phdr[2:])&XLPLongHeader != 0 {
		d.phdrLen = SizeOfXLogLongPHD
		return n
	}
	if d.phdrGot < d.phdrLen {
		return n
	}
	d.inPageHeader = false

	page := d.pos - proto.LSN(d.phdrLen)
	h := d.phdr[:d.phdrLen]
	if reason := checkPageHeader(h, page, d.segSize, d.tli, d.sysid, d.haveSysid); reason != "" {
		d.fail(page, "%s", reason)
		return n
	}
	info := binary.LittleEndian.Uint16(h[2:])
	remLen := binary.LittleEndian.Uint32(h[16:])
	d.tli = binary.LittleEndian.Uint32(h[4:])
	if info&XLPLongHeader != 0 {
		d.sysid, d.haveSysid = binary.LittleEndian.Uint64(h[24:]), true
	}

	first := !d.seenPage
	d.seenPage = true
	inRecord := d.st == stRecHeader || d.st == stRecData || d.st == stForeign
	switch {
	case inRecord && info&XLPFirstIsOverwriteContRecord != 0:
		// xlogreader: "the continuation record was overwritten with a
		// different record"; restart reading at this page. The partial
		// record never ended, so RecordEnd stays where it was.
		d.st = stRecStart
	case inRecord && info&XLPFirstIsContRecord == 0:
		d.fail(page, "there is no contrecord flag (record at %s continues)", d.recStart)
	case inRecord && (remLen == 0 || uint64(remLen) != d.remaining):
		d.fail(page, "invalid contrecord length %d (expected %d)", remLen, d.remaining)
	case inRecord:
		// Continuation as expected.
	case info&XLPFirstIsContRecord != 0 && first && page == d.start:
		// The stream starts inside a record begun before it: skip its
		// tail (XLogFindNextRecord). It is not a record of ours.
		if remLen == 0 {
			d.fail(page, "invalid contrecord length 0")
			return n
		}
		d.st, d.remaining = stForeign, uint64(remLen)
	case info&XLPFirstIsContRecord != 0:
		d.fail(page, "contrecord is requested by page, but no record is in progress")
	}
	return n
}

// checkPageHeader checks the page header h of the page at page as
// XLogReaderValidatePageHeader does: h holds SizeOfXLogShortPHD bytes, or
// SizeOfXLogLongPHD when xlp_info has XLP_LONG_HEADER. prevTLI is the
// timeline of the page read before (0: none), sysid the system id of the
// long headers read before (if haveSysid). It returns why the header is
// invalid, or "" if it is valid.
func checkPageHeader(h []byte, page proto.LSN, segSize uint64, prevTLI uint32, sysid uint64, haveSysid bool) string {
	magic := binary.LittleEndian.Uint16(h[0:])
	info := binary.LittleEndian.Uint16(h[2:])
	tli := binary.LittleEndian.Uint32(h[4:])
	pageaddr := proto.LSN(binary.LittleEndian.Uint64(h[8:]))
	switch {
	case magic != PageMagic:
		return fmt.Sprintf("invalid magic number %04X in WAL page (want %04X)", magic, PageMagic)
	case info&^xlpAllFlags != 0:
		return fmt.Sprintf("invalid info bits %04X in WAL page", info)
	case pageaddr != page:
		return fmt.Sprintf("unexpected pageaddr %s in WAL page", pageaddr)
	case page.SegmentOffset(segSize) == 0 && info&XLPLongHeader == 0:
		return fmt.Sprintf("invalid info bits %04X in WAL segment: first page lacks XLP_LONG_HEADER", info)
	case tli < prevTLI:
		return fmt.Sprintf("out-of-sequence timeline ID %d (after %d) in WAL page", tli, prevTLI)
	}
	if info&XLPLongHeader == 0 {
		return ""
	}
	hSysid := binary.LittleEndian.Uint64(h[24:])
	hSegSize := binary.LittleEndian.Uint32(h[32:])
	blcksz := binary.LittleEndian.Uint32(h[36:])
	switch {
	case uint64(hSegSize) != segSize:
		return fmt.Sprintf("WAL file has xlp_seg_size %d, expected %d", hSegSize, segSize)
	case blcksz != PageSize:
		return fmt.Sprintf("WAL file has xlp_xlog_blcksz %d, expected %d", blcksz, PageSize)
	case haveSysid && hSysid != sysid:
		return fmt.Sprintf("WAL file is from a different database system: xlp_sysid %d, expected %d", hSysid, sysid)
	}
	return ""
}

// EmptyPages returns WAL bytes [from, to) that hold no record: every page
// starting in the range has a valid page header (a long one at a segment
// start) for timeline tli and system sysid, the rest is zeros. A safekeeper
// serves them for the part of a segment before its timeline's first byte:
// stock clients ask for a whole segment, and a standby checks the header
// of every page it reads (a record's page included), while the records it
// replays start at or after the timeline's start. No record begins in them,
// and none continues into them (xlp_rem_len 0).
func EmptyPages(from, to proto.LSN, segSize uint64, tli uint32, sysid uint64) []byte {
	if to <= from {
		return nil
	}
	out := make([]byte, 0, to-from)
	for page := from &^ (PageSize - 1); page < to; page += PageSize {
		end := min(page+PageSize, to)
		buf := make([]byte, end-page)
		hdr := make([]byte, SizeOfXLogLongPHD)
		info, size := uint16(0), SizeOfXLogShortPHD
		if page.SegmentOffset(segSize) == 0 {
			info, size = XLPLongHeader, SizeOfXLogLongPHD
		}
		binary.LittleEndian.PutUint16(hdr[0:], PageMagic)
		binary.LittleEndian.PutUint16(hdr[2:], info)
		binary.LittleEndian.PutUint32(hdr[4:], tli)
		binary.LittleEndian.PutUint64(hdr[8:], uint64(page))
		if size == SizeOfXLogLongPHD {
			binary.LittleEndian.PutUint64(hdr[24:], sysid)
			binary.LittleEndian.PutUint32(hdr[32:], uint32(segSize))
			binary.LittleEndian.PutUint32(hdr[36:], PageSize)
		}
		copy(buf, hdr[:size])
		lo := max(from, page) - page
		out = append(out, buf[lo:]...)
	}
	return out
}
