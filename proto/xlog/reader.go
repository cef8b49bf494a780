package xlog

import (
	"encoding/binary"
	"fmt"

	"github.com/safekeeper/safekeeper/proto"
)

// Reader assembles whole WAL records from WAL bytes fed to it in any split,
// as xlogreader.c's XLogReadRecord does: it follows records across page
// (and segment) boundaries, checks every page header it crosses and every
// record header (xl_tot_len, xl_rmid, xl_prev against the previous record's
// start), the CRC, and decodes the record body (DecodeRecord). It does no
// IO: the caller feeds the bytes (Feed) and takes records (Next). It is not
// safe for concurrent use.
//
// Reading starts at a record boundary or at a page start: a page starting
// with XLP_FIRST_IS_CONTRECORD continues a record begun before it, whose
// rest is skipped (over as many pages as it covers). To start anywhere, as
// pg_waldump's XLogFindNextRecord does, feed from the page holding the
// position and set SkipBefore: records that start before it are checked but
// not returned.
//
// Unlike Decoder, a Reader keeps the bytes of the record being assembled
// (up to xl_tot_len, at most MaxRecordSize).
type Reader struct {
	segSize    uint64
	skipBefore proto.LSN

	buf  []byte    // fed bytes from base on; buf[0] is at base
	base proto.LSN // LSN of buf[0]
	fed  proto.LSN // end of the bytes fed (Feed appends here)

	pos     proto.LSN // where the next record (or page header) starts
	started bool      // the first page header's continuation has been dealt with
	prevRec proto.LSN // start of the last record, InvalidLSN before the first
	tli     uint32    // xlp_tli of the last page header checked
	sysid   uint64
	hasSys  bool
	checked proto.LSN // page headers below this were checked already

	rec []byte // the record being assembled
	err error
}

// NewReader returns a reader whose stream starts at start: a record start
// or a page start (see Reader). segSize is the WAL segment size (a power of
// two, at least PageSize). Bad arguments are reported by the first Next.
func NewReader(start proto.LSN, segSize uint64) *Reader {
	r := &Reader{segSize: segSize, base: start, fed: start, pos: start, checked: start}
	switch {
	case segSize < PageSize || segSize&(segSize-1) != 0:
		r.err = &Error{LSN: start, Reason: fmt.Sprintf("WAL segment size %d is not a power of two >= %d", segSize, PageSize)}
	case start%MaxAlign != 0:
		r.err = &Error{LSN: start, Reason: "reader start is not MAXALIGNed, so it is not a record boundary"}
	}
	if start%PageSize != 0 {
		r.started = true // mid-page: a record starts here
	}
	return r
}

// SkipBefore makes Next leave out records that start before lsn (they are
// still read and checked): pg_waldump's XLogFindNextRecord for a start that
// may not be a record boundary, with the reader started at its page.
func (r *Reader) SkipBefore(lsn proto.LSN) { r.skipBefore = lsn }

// Fed returns the end of the bytes fed so far: the next Feed's data starts
// there.
func (r *Reader) Fed() proto.LSN { return r.fed }

// Pos returns where the next record (or the page header before it) starts:
// after the last record returned, its End.
func (r *Reader) Pos() proto.LSN { return r.pos }

// Feed appends the next WAL bytes, which start at Fed(). It copies data.
// Bytes the reader knows it will not need (the zero-filled rest of a segment
// after XLOG_SWITCH) are dropped.
func (r *Reader) Feed(data []byte) {
	at := r.fed
	r.fed += proto.LSN(len(data))
	if at < r.base {
		skip := min(uint64(r.base-at), uint64(len(data)))
		data = data[skip:]
	}
	r.buf = append(r.buf, data...)
}

// bytes returns the fed bytes [at, at+n), or ok false if they are not all
// fed yet.
func (r *Reader) bytes(at proto.LSN, n int) ([]byte, bool) {
	if at < r.base {
		panic(fmt.Sprintf("xlog: reader asked for %s, below its buffer at %s", at, r.base))
	}
	off := uint64(at - r.base)
	if off+uint64(n) > uint64(len(r.buf)) {
		return nil, false
	}
	return r.buf[off : off+uint64(n)], true
}

// consume drops the buffered bytes below r.pos.
func (r *Reader) consume() {
	if r.pos <= r.base {
		return
	}
	n := uint64(r.pos - r.base)
	if n >= uint64(len(r.buf)) {
		r.buf = r.buf[:0]
	} else {
		// Compact only once the dead prefix is large, so that small
		// records do not copy the buffer each time.
		if n > 1<<20 || n > uint64(len(r.buf))/2 {
			r.buf = append(r.buf[:0], r.buf[n:]...)
		} else {
			r.buf = r.buf[n:]
		}
	}
	r.base = r.pos
}

// Next returns the next record, ok false if the bytes fed so far end before
// it is complete (feed more and call again), or an error: an *Error
// (wrapping ErrInvalidWAL; ErrRecordCRC for a checksum mismatch) naming the
// LSN of the bad record or page, returned again by every later call. The
// record's slices (MainData, block data) are valid until the next Feed or
// Next. A record is returned once its last byte is fed; its MAXALIGN
// padding need not be.
func (r *Reader) Next() (rec *Record, ok bool, err error) {
	for {
		if r.err != nil {
			return nil, false, r.err
		}
		rec, ok := r.next()
		if r.err != nil || !ok {
			return nil, false, r.err
		}
		if rec.LSN >= r.skipBefore {
			return rec, true, nil
		}
	}
}

func (r *Reader) fail(at proto.LSN, format string, args ...any) {
	r.err = &Error{LSN: at, Reason: fmt.Sprintf(format, args...)}
}

// pageHeader returns the header of the page starting at page, checked
// (once) as XLogReaderValidatePageHeader does; ok false if not all fed.
func (r *Reader) pageHeader(page proto.LSN) (info uint16, remLen uint32, size int, ok bool) {
	short, ok := r.bytes(page, SizeOfXLogShortPHD)
	if !ok {
		return 0, 0, 0, false
	}
	info = binary.LittleEndian.Uint16(short[2:])
	size = SizeOfXLogShortPHD
	if info&XLPLongHeader != 0 {
		size = SizeOfXLogLongPHD
	}
	h, ok := r.bytes(page, size)
	if !ok {
		return 0, 0, 0, false
	}
	remLen = binary.LittleEndian.Uint32(h[16:])
	if page < r.checked {
		return info, remLen, size, true
	}
	if reason := checkPageHeader(h, page, r.segSize, r.tli, r.sysid, r.hasSys); reason != "" {
		r.fail(page, "%s", reason)
		return 0, 0, 0, false
	}
	if info&XLPLongHeader != 0 {
		r.sysid, r.hasSys = binary.LittleEndian.Uint64(h[24:]), true
	}
	r.tli = binary.LittleEndian.Uint32(h[4:])
	r.checked = page + PageSize
	return info, remLen, size, true
}

// next reads the record at r.pos (after the page header there, if any).
func (r *Reader) next() (*Record, bool) {
	for {
		if uint64(r.pos)%PageSize != 0 {
			break
		}
		page := r.pos
		info, remLen, size, ok := r.pageHeader(page)
		if !ok {
			return nil, false
		}
		if !r.started && info&XLPFirstIsContRecord != 0 {
			// The tail of a record begun before the start: skip it, over
			// whole pages if it fills this one (XLogFindNextRecord).
			if uint64(AlignUp(proto.LSN(remLen))) >= PageSize-uint64(size) {
				r.pos = page + PageSize
			} else {
				r.pos = page + proto.LSN(size) + AlignUp(proto.LSN(remLen))
				r.started = true
			}
			r.consume()
			continue
		}
		r.started = true
		if info&XLPFirstIsContRecord != 0 && info&XLPFirstIsOverwriteContRecord == 0 {
			r.fail(page, "contrecord is requested by %s", page+proto.LSN(size))
			return nil, false
		}
		r.pos = page + proto.LSN(size)
		r.consume()
	}

	start := r.pos
	// xl_tot_len is on the record's first page: a record starts MAXALIGNed
	// after a page header, so at least 8 bytes of its page are left.
	lenb, ok := r.bytes(start, 4)
	if !ok {
		return nil, false
	}
	tot := binary.LittleEndian.Uint32(lenb)
	switch {
	case tot < SizeOfXLogRecord:
		r.fail(start, "invalid record length: expected at least %d, got %d", SizeOfXLogRecord, tot)
		return nil, false
	case tot > MaxRecordSize:
		r.fail(start, "record length %d too long", tot)
		return nil, false
	}
	r.rec = r.rec[:0]
	at := start
	headerChecked := false
	for need := int(tot); need > 0; {
		if off := uint64(at) % PageSize; off == 0 {
			info, remLen, size, ok := r.pageHeader(at)
			if !ok {
				return nil, false
			}
			if info&XLPFirstIsOverwriteContRecord != 0 {
				// The record was lost in a crash and the page overwritten
				// (xlogreader: "overwritten contrecord"): a new record
				// starts after this page's header; xl_prev still names
				// the record before the lost one.
				r.pos = at + proto.LSN(size)
				r.consume()
				return r.next()
			}
			if info&XLPFirstIsContRecord == 0 {
				r.fail(at, "there is no contrecord flag (record at %s continues)", start)
				return nil, false
			}
			if remLen == 0 || int(remLen) != need {
				r.fail(at, "invalid contrecord length %d (expected %d)", remLen, need)
				return nil, false
			}
			at += proto.LSN(size)
		}
		n := min(need, int(PageSize-uint64(at)%PageSize))
		b, ok := r.bytes(at, n)
		if !ok {
			return nil, false
		}
		r.rec = append(r.rec, b...)
		at += proto.LSN(n)
		need -= n
		if !headerChecked && len(r.rec) >= SizeOfXLogRecord {
			headerChecked = true
			if !r.checkHeader(start) {
				return nil, false
			}
		}
	}
	rec, err := DecodeRecord(start, r.rec)
	if err != nil {
		r.err = err
		return nil, false
	}
	rec.End = AlignUp(at)
	if rec.IsSwitch() && rec.End.SegmentOffset(r.segSize) != 0 {
		rec.End = rec.End.SegmentStart(r.segSize) + proto.LSN(r.segSize)
	}
	r.prevRec = start
	r.pos = rec.End
	r.consume()
	return rec, true
}

// checkHeader is ValidXLogRecordHeader's check of the rmgr id and xl_prev.
func (r *Reader) checkHeader(start proto.LSN) bool {
	if err := checkRmID(start, r.rec[17]); err != nil {
		r.err = err
		return false
	}
	prev := proto.LSN(binary.LittleEndian.Uint64(r.rec[8:]))
	switch {
	case r.prevRec != proto.InvalidLSN && prev != r.prevRec:
		r.fail(start, "record with incorrect prev-link %s (expected %s)", prev, r.prevRec)
		return false
	case r.prevRec == proto.InvalidLSN && prev >= start:
		r.fail(start, "record with incorrect prev-link %s", prev)
		return false
	}
	return true
}
