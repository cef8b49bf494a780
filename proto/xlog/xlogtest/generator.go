package xlogtest

import (
	"encoding/binary"
	"fmt"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
)

// Block ids of a record's main data (XLR_BLOCK_ID_DATA_SHORT/_LONG).
const (
	blockIDDataShort = 255
	blockIDDataLong  = 254
)

// Generator appends PostgreSQL 15 WAL records to an in-memory stream. The
// zero value is not usable; use NewGenerator. Methods panic on misuse (they
// are for tests).
type Generator struct {
	segSize uint64
	tli     uint32
	sysid   uint64
	pos     proto.LSN
	prev    proto.LSN // start of the last record: the next xl_prev
	buf     []byte    // bytes since the last Take
	seq     byte
}

// NewGenerator returns a generator whose stream starts at start, which must be
// MAXALIGNed: a page start (the page header is written before the first
// record) or the end of a record in a page whose header the caller already
// has. segSize is the WAL segment size in bytes (a power of two >= 8192),
// tli the timeline (xlp_tli), sysid the database system identifier written in
// long page headers. The first record's xl_prev is InvalidLSN unless SetPrev
// is called.
func NewGenerator(start proto.LSN, segSize uint64, tli uint32, sysid uint64) *Generator {
	if segSize < xlog.PageSize || segSize&(segSize-1) != 0 {
		panic(fmt.Sprintf("xlogtest: bad segment size %d", segSize))
	}
	if start%xlog.MaxAlign != 0 {
		panic(fmt.Sprintf("xlogtest: start %s is not MAXALIGNed", start))
	}
	return &Generator{segSize: segSize, tli: tli, sysid: sysid, pos: start}
}

// SetPrev sets xl_prev of the next record (the start of the record before
// it), for streams that continue existing WAL.
func (g *Generator) SetPrev(prev proto.LSN) { g.prev = prev }

// Pos returns the end of the generated stream: after Record, the record's end
// (EndRecPtr); after Switch, the next segment start.
func (g *Generator) Pos() proto.LSN { return g.pos }

// Bytes returns the bytes generated since the last Take. The slice is valid
// until the next call of a Generator method.
func (g *Generator) Bytes() []byte { return g.buf }

// Take returns the bytes generated since the last Take and forgets them; the
// caller owns the slice.
func (g *Generator) Take() []byte {
	b := g.buf
	g.buf = nil
	return b
}

// Record appends an XLOG_NOOP record with dataLen bytes of main data and
// returns its start and end (EndRecPtr). xl_tot_len is 24 for dataLen 0,
// 24+2+dataLen up to 255, 24+5+dataLen above.
func (g *Generator) Record(dataLen int) (start, end proto.LSN) {
	return g.append(xlog.RMXLogID, xlog.XLogNoop, g.mainData(dataLen))
}

// RecordTotal appends an XLOG_NOOP record whose xl_tot_len is exactly
// totLen (24 or at least 26), and returns its start and end.
func (g *Generator) RecordTotal(totLen int) (start, end proto.LSN) {
	var payload []byte
	switch {
	case totLen == xlog.SizeOfXLogRecord:
	case totLen >= xlog.SizeOfXLogRecord+2 && totLen <= xlog.SizeOfXLogRecord+2+255:
		payload = g.mainData(totLen - xlog.SizeOfXLogRecord - 2)
	case totLen > xlog.SizeOfXLogRecord+2+255:
		payload = g.longMainData(totLen - xlog.SizeOfXLogRecord - 5)
	default:
		panic(fmt.Sprintf("xlogtest: no record has xl_tot_len %d", totLen))
	}
	return g.append(xlog.RMXLogID, xlog.XLogNoop, payload)
}

// Switch appends an XLOG_SWITCH record and zero-fills the rest of its
// segment, page headers included, as PostgreSQL does. end is the next
// segment start (xlogreader's EndRecPtr for a switch).
func (g *Generator) Switch() (start, end proto.LSN) {
	start, end = g.append(xlog.RMXLogID, xlog.XLogSwitch, nil)
	if off := end.SegmentOffset(g.segSize); off != 0 {
		g.buf = append(g.buf, make([]byte, g.segSize-off)...)
		g.pos += proto.LSN(g.segSize - off)
	}
	return start, g.pos
}

// AbortedRecord appends the beginning of a record with dataLen bytes of main
// data, cut at the next page boundary as by a crash, and then what
// PostgreSQL writes after recovery: that page with
// XLP_FIRST_IS_OVERWRITE_CONTRECORD and an XLOG_OVERWRITE_CONTRECORD record
// naming the lost record. The lost record must not fit before the page
// boundary. It returns the lost record's start and the overwrite record's
// start and end.
func (g *Generator) AbortedRecord(dataLen int) (lost, start, end proto.LSN) {
	rec := g.build(xlog.RMXLogID, xlog.XLogNoop, g.mainData(dataLen))
	g.pageHeaderIfDue(0, 0)
	lost = g.pos
	room := int(xlog.PageSize - uint64(g.pos)%xlog.PageSize)
	if len(rec) <= room {
		panic(fmt.Sprintf("xlogtest: a record of %d bytes fits in the %d left on the page", len(rec), room))
	}
	g.buf = append(g.buf, rec[:room]...)
	g.pos += proto.LSN(room)
	// xl_overwrite_contrecord: overwritten LSN, overwrite_time.
	var body [16]byte
	binary.LittleEndian.PutUint64(body[0:], uint64(lost))
	payload := append([]byte{blockIDDataShort, byte(len(body))}, body[:]...)
	g.pageHeaderIfDue(xlog.XLPFirstIsOverwriteContRecord, 0)
	start, end = g.append(xlog.RMXLogID, xlog.XLogOverwriteContrecord, payload)
	return lost, start, end
}

// mainData returns the encoded main data of dataLen bytes.
func (g *Generator) mainData(dataLen int) []byte {
	switch {
	case dataLen < 0:
		panic("xlogtest: negative data length")
	case dataLen == 0:
		return nil
	case dataLen <= 255:
		p := make([]byte, 2+dataLen)
		p[0], p[1] = blockIDDataShort, byte(dataLen)
		g.fill(p[2:])
		return p
	}
	return g.longMainData(dataLen)
}

func (g *Generator) longMainData(dataLen int) []byte {
	p := make([]byte, 5+dataLen)
	p[0] = blockIDDataLong
	binary.LittleEndian.PutUint32(p[1:], uint32(dataLen))
	g.fill(p[5:])
	return p
}

// fill writes a pattern that differs between records.
func (g *Generator) fill(p []byte) {
	g.seq++
	for i := range p {
		p[i] = byte(i) ^ g.seq
	}
}

// build returns a record's bytes: the XLogRecord header with xl_prev and
// xl_crc, then payload.
func (g *Generator) build(rmid, info byte, payload []byte) []byte {
	return g.buildXID(rmid, info, 0, payload)
}

func (g *Generator) buildXID(rmid, info byte, xid uint32, payload []byte) []byte {
	tot := xlog.SizeOfXLogRecord + len(payload)
	if tot > xlog.MaxRecordSize {
		panic("xlogtest: record too long")
	}
	rec := make([]byte, tot)
	binary.LittleEndian.PutUint32(rec[0:], uint32(tot)) // xl_tot_len
	binary.LittleEndian.PutUint32(rec[4:], xid)         // xl_xid
	binary.LittleEndian.PutUint64(rec[8:], uint64(g.prev))
	rec[16], rec[17] = info, rmid
	copy(rec[xlog.SizeOfXLogRecord:], payload)
	binary.LittleEndian.PutUint32(rec[20:], xlog.RecordCRC(rec[:xlog.SizeOfXLogRecord], payload))
	return rec
}

// Raw appends a record of resource manager rmid with xl_info info, xl_xid
// xid and payload as the bytes after its XLogRecord header (EncodeBody
// builds them), and returns its start and end. Nothing checks that the
// payload is a valid record body.
func (g *Generator) Raw(rmid, info byte, xid uint32, payload []byte) (start, end proto.LSN) {
	return g.appendRecord(g.buildXID(rmid, info, xid, payload))
}

// append writes a record across pages and pads it to MAXALIGN.
func (g *Generator) append(rmid, info byte, payload []byte) (start, end proto.LSN) {
	return g.appendRecord(g.build(rmid, info, payload))
}

func (g *Generator) appendRecord(rec []byte) (start, end proto.LSN) {
	g.pageHeaderIfDue(0, 0)
	start = g.pos
	for len(rec) > 0 {
		g.pageHeaderIfDue(xlog.XLPFirstIsContRecord, uint32(len(rec)))
		n := min(len(rec), int(xlog.PageSize-uint64(g.pos)%xlog.PageSize))
		g.buf = append(g.buf, rec[:n]...)
		g.pos += proto.LSN(n)
		rec = rec[n:]
	}
	if pad := int(xlog.AlignUp(g.pos) - g.pos); pad > 0 {
		g.buf = append(g.buf, make([]byte, pad)...)
		g.pos += proto.LSN(pad)
	}
	g.prev = start
	return start, g.pos
}

// pageHeaderIfDue writes a page header if pos is at a page start.
func (g *Generator) pageHeaderIfDue(info uint16, remLen uint32) {
	if uint64(g.pos)%xlog.PageSize != 0 {
		return
	}
	size := xlog.SizeOfXLogShortPHD
	if g.pos.SegmentOffset(g.segSize) == 0 {
		info |= xlog.XLPLongHeader
		size = xlog.SizeOfXLogLongPHD
	}
	h := make([]byte, size)
	binary.LittleEndian.PutUint16(h[0:], xlog.PageMagic)
	binary.LittleEndian.PutUint16(h[2:], info)
	binary.LittleEndian.PutUint32(h[4:], g.tli)
	binary.LittleEndian.PutUint64(h[8:], uint64(g.pos))
	binary.LittleEndian.PutUint32(h[16:], remLen)
	if size == xlog.SizeOfXLogLongPHD {
		binary.LittleEndian.PutUint64(h[24:], g.sysid)
		binary.LittleEndian.PutUint32(h[32:], uint32(g.segSize))
		binary.LittleEndian.PutUint32(h[36:], xlog.PageSize)
	}
	g.buf = append(g.buf, h...)
	g.pos += proto.LSN(size)
}
