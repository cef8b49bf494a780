package xlog

import (
	"encoding/binary"
	"fmt"

	"github.com/safekeeper/safekeeper/proto"
)

// Record body layout of PostgreSQL 15 (access/xlogrecord.h), decoded as
// xlogreader.c's DecodeXLogRecord does.
const (
	// XLRMaxBlockID is XLR_MAX_BLOCK_ID: block references have ids 0..32.
	XLRMaxBlockID = 32
	// XLRBlockIDDataShort is XLR_BLOCK_ID_DATA_SHORT: main data, u8 length.
	XLRBlockIDDataShort = 255
	// XLRBlockIDDataLong is XLR_BLOCK_ID_DATA_LONG: main data, u32 length.
	XLRBlockIDDataLong = 254
	// XLRBlockIDOrigin is XLR_BLOCK_ID_ORIGIN: a u16 replication origin.
	XLRBlockIDOrigin = 253
	// XLRBlockIDTopLevelXID is XLR_BLOCK_ID_TOPLEVEL_XID: a u32 xid.
	XLRBlockIDTopLevelXID = 252

	// BkpBlockForkMask is BKPBLOCK_FORK_MASK: the fork number's bits of
	// fork_flags.
	BkpBlockForkMask = 0x0F
	// BkpBlockHasImage is BKPBLOCK_HAS_IMAGE: a block image follows.
	BkpBlockHasImage = 0x10
	// BkpBlockHasData is BKPBLOCK_HAS_DATA: the block has data_length bytes
	// of data.
	BkpBlockHasData = 0x20
	// BkpBlockWillInit is BKPBLOCK_WILL_INIT: redo reinitializes the page.
	BkpBlockWillInit = 0x40
	// BkpBlockSameRel is BKPBLOCK_SAME_REL: no RelFileNode follows, the
	// previous block's is meant.
	BkpBlockSameRel = 0x80

	// BkpImageHasHole is BKPIMAGE_HAS_HOLE: the image leaves out a hole.
	BkpImageHasHole = 0x01
	// BkpImageApply is BKPIMAGE_APPLY: redo restores the image (else it is
	// for wal_consistency_checking only).
	BkpImageApply = 0x02
	// BkpImageCompressPGLZ is BKPIMAGE_COMPRESS_PGLZ.
	BkpImageCompressPGLZ = 0x04
	// BkpImageCompressLZ4 is BKPIMAGE_COMPRESS_LZ4.
	BkpImageCompressLZ4 = 0x08
	// BkpImageCompressZSTD is BKPIMAGE_COMPRESS_ZSTD.
	BkpImageCompressZSTD = 0x10
	bkpImageCompressed   = BkpImageCompressPGLZ | BkpImageCompressLZ4 | BkpImageCompressZSTD

	// BlockSize is BLCKSZ, the relation page size in bytes.
	BlockSize = 8192

	// RMMaxBuiltinID is RM_MAX_BUILTIN_ID; custom rmgr ids are 128..255.
	RMMaxBuiltinID = 21
	rmMinCustomID  = 128

	sizeOfBlockHeader         = 4  // XLogRecordBlockHeader: id, fork_flags, data_length
	sizeOfBlockImageHeader    = 5  // XLogRecordBlockImageHeader: length, hole_offset, bimg_info
	sizeOfBlockCompressHeader = 2  // XLogRecordBlockCompressHeader: hole_length
	sizeOfRelFileNode         = 12 // spcNode, dbNode, relNode
)

// ForkNames are PostgreSQL's fork names by fork number (forkNames[]).
var ForkNames = [...]string{"main", "fsm", "vm", "init"}

// RelFileNode names a relation's storage: tablespace, database, relation.
type RelFileNode struct {
	Spc, DB, Rel uint32
}

func (n RelFileNode) String() string { return fmt.Sprintf("%d/%d/%d", n.Spc, n.DB, n.Rel) }

// BlockImage is a full-page image's header (XLogRecordBlockImageHeader and,
// for a compressed image with a hole, XLogRecordBlockCompressHeader).
type BlockImage struct {
	Len        uint16 // bytes of the image in the record (bimg_len)
	HoleOffset uint16
	HoleLength uint16 // BLCKSZ - Len for an uncompressed image
	Info       uint8  // bimg_info: BKPIMAGE_* flags
}

// Apply reports whether redo restores the image (BKPIMAGE_APPLY); an image
// without it is for wal_consistency_checking.
func (i BlockImage) Apply() bool { return i.Info&BkpImageApply != 0 }

// Compressed reports whether the image is compressed (pglz, lz4 or zstd).
func (i BlockImage) Compressed() bool { return i.Info&bkpImageCompressed != 0 }

// BlockRef is one block reference of a record.
type BlockRef struct {
	ID      uint8 // block id, 0..XLRMaxBlockID
	Fork    uint8 // fork number (fork_flags & BKPBLOCK_FORK_MASK)
	Flags   uint8 // fork_flags
	Rel     RelFileNode
	Block   uint32 // BlockNumber
	DataLen uint16 // bytes of block data
	Image   *BlockImage
	// Data and ImageData are the block's data and image bytes, slices of
	// the record's bytes.
	Data, ImageData []byte
}

// ForkName returns the fork's name ("main", "fsm", "vm", "init"), or its
// number for one PostgreSQL does not know.
func (b BlockRef) ForkName() string {
	if int(b.Fork) < len(ForkNames) {
		return ForkNames[b.Fork]
	}
	return fmt.Sprintf("%d", b.Fork)
}

// Record is one decoded WAL record.
type Record struct {
	LSN    proto.LSN // start of the record (ReadRecPtr)
	End    proto.LSN // EndRecPtr: the MAXALIGNed end; the next segment's start for XLOG_SWITCH
	TotLen uint32    // xl_tot_len
	XID    uint32    // xl_xid
	Prev   proto.LSN // xl_prev
	Info   uint8     // xl_info
	RmID   uint8     // xl_rmid
	CRC    uint32    // xl_crc

	Blocks      []BlockRef // in block id order (ids may have gaps)
	Origin      uint16     // replication origin, if HasOrigin
	HasOrigin   bool
	TopLevelXID uint32 // top-level xid of a subtransaction, if HasTopLevelXID
	// HasTopLevelXID: the record carries XLR_BLOCK_ID_TOPLEVEL_XID.
	HasTopLevelXID bool
	MainData       []byte // a slice of the record's bytes
}

// FPILen is the bytes of full-page images in the record: what pg_waldump
// subtracts from xl_tot_len for "rec" and counts as "FPI size".
func (r *Record) FPILen() int {
	n := 0
	for _, b := range r.Blocks {
		if b.Image != nil {
			n += int(b.Image.Len)
		}
	}
	return n
}

// IsSwitch reports whether r is an XLOG_SWITCH record.
func (r *Record) IsSwitch() bool {
	return r.RmID == RMXLogID && r.Info&XLRRmgrInfoMask == XLogSwitch
}

// DecodeRecord decodes one whole record: its XLogRecord header followed by
// the rest of its xl_tot_len bytes (page headers removed), which lies at
// lsn. It checks the header (length, resource manager id) and the CRC, then
// decodes the body as DecodeXLogRecord: block references, replication
// origin, top-level xid, main data. Slices of the returned record point
// into rec. Errors are *Error, naming lsn; a CRC mismatch wraps
// ErrRecordCRC.
func DecodeRecord(lsn proto.LSN, rec []byte) (*Record, error) {
	if len(rec) < SizeOfXLogRecord {
		return nil, &Error{LSN: lsn, Reason: fmt.Sprintf("invalid record length: expected at least %d, got %d", SizeOfXLogRecord, len(rec))}
	}
	r := &Record{
		LSN:    lsn,
		TotLen: binary.LittleEndian.Uint32(rec[0:]),
		XID:    binary.LittleEndian.Uint32(rec[4:]),
		Prev:   proto.LSN(binary.LittleEndian.Uint64(rec[8:])),
		Info:   rec[16],
		RmID:   rec[17],
		CRC:    binary.LittleEndian.Uint32(rec[offXLCRC:]),
	}
	if int(r.TotLen) != len(rec) {
		return nil, &Error{LSN: lsn, Reason: fmt.Sprintf("record length %d does not match xl_tot_len %d", len(rec), r.TotLen)}
	}
	if err := checkRmID(lsn, r.RmID); err != nil {
		return nil, err
	}
	if got := RecordCRC(rec, rec[SizeOfXLogRecord:]); got != r.CRC {
		return nil, &Error{LSN: lsn, Err: ErrRecordCRC,
			Reason: fmt.Sprintf("incorrect resource manager data checksum in record: got %08X, xl_crc %08X", got, r.CRC)}
	}
	if err := r.decodeBody(rec[SizeOfXLogRecord:]); err != nil {
		return nil, err
	}
	return r, nil
}

// checkRmID is RmgrIdIsValid: a built-in or a custom resource manager.
func checkRmID(lsn proto.LSN, id uint8) error {
	if id > RMMaxBuiltinID && id < rmMinCustomID {
		return &Error{LSN: lsn, Reason: fmt.Sprintf("invalid resource manager ID %d", id)}
	}
	return nil
}

// decodeBody decodes the block headers, then assigns the block data, images
// and main data that follow them, in that order.
func (r *Record) decodeBody(body []byte) error {
	p := body
	short := func() error {
		return &Error{LSN: r.LSN, Reason: "record with invalid length"}
	}
	take := func(n int) ([]byte, bool) {
		if len(p) < n {
			return nil, false
		}
		b := p[:n]
		p = p[n:]
		return b, true
	}
	var (
		dataTotal uint64
		mainLen   uint64
		lastRel   *RelFileNode
		maxID     = -1
	)
	for uint64(len(p)) > dataTotal {
		id := p[0]
		p = p[1:]
		switch {
		case id == XLRBlockIDDataShort:
			b, ok := take(1)
			if !ok {
				return short()
			}
			mainLen = uint64(b[0])
		case id == XLRBlockIDDataLong:
			b, ok := take(4)
			if !ok {
				return short()
			}
			mainLen = uint64(binary.LittleEndian.Uint32(b))
		case id == XLRBlockIDOrigin:
			b, ok := take(2)
			if !ok {
				return short()
			}
			r.Origin, r.HasOrigin = binary.LittleEndian.Uint16(b), true
			continue
		case id == XLRBlockIDTopLevelXID:
			b, ok := take(4)
			if !ok {
				return short()
			}
			r.TopLevelXID, r.HasTopLevelXID = binary.LittleEndian.Uint32(b), true
			continue
		case id <= XLRMaxBlockID:
			if int(id) <= maxID {
				return &Error{LSN: r.LSN, Reason: fmt.Sprintf("out-of-order block_id %d", id)}
			}
			maxID = int(id)
			h, ok := take(sizeOfBlockHeader - 1)
			if !ok {
				return short()
			}
			blk := BlockRef{ID: id, Flags: h[0], Fork: h[0] & BkpBlockForkMask, DataLen: binary.LittleEndian.Uint16(h[1:])}
			hasData := blk.Flags&BkpBlockHasData != 0
			switch {
			case hasData && blk.DataLen == 0:
				return &Error{LSN: r.LSN, Reason: "BKPBLOCK_HAS_DATA set, but no data included"}
			case !hasData && blk.DataLen != 0:
				return &Error{LSN: r.LSN, Reason: fmt.Sprintf("BKPBLOCK_HAS_DATA not set, but data length is %d", blk.DataLen)}
			}
			dataTotal += uint64(blk.DataLen)
			if blk.Flags&BkpBlockHasImage != 0 {
				ih, ok := take(sizeOfBlockImageHeader)
				if !ok {
					return short()
				}
				img := &BlockImage{Len: binary.LittleEndian.Uint16(ih[0:]), HoleOffset: binary.LittleEndian.Uint16(ih[2:]), Info: ih[4]}
				hasHole := img.Info&BkpImageHasHole != 0
				if img.Compressed() {
					if hasHole {
						ch, ok := take(sizeOfBlockCompressHeader)
						if !ok {
							return short()
						}
						img.HoleLength = binary.LittleEndian.Uint16(ch)
					}
				} else {
					img.HoleLength = uint16(BlockSize - int(img.Len)) // wraps as PostgreSQL's uint16 does
				}
				dataTotal += uint64(img.Len)
				switch {
				case hasHole && (img.HoleOffset == 0 || img.HoleLength == 0 || img.Len == BlockSize):
					return &Error{LSN: r.LSN, Reason: fmt.Sprintf("BKPIMAGE_HAS_HOLE set, but hole offset %d length %d block image length %d",
						img.HoleOffset, img.HoleLength, img.Len)}
				case !hasHole && (img.HoleOffset != 0 || img.HoleLength != 0):
					return &Error{LSN: r.LSN, Reason: fmt.Sprintf("BKPIMAGE_HAS_HOLE not set, but hole offset %d length %d", img.HoleOffset, img.HoleLength)}
				case img.Compressed() && img.Len == BlockSize:
					return &Error{LSN: r.LSN, Reason: fmt.Sprintf("BKPIMAGE_COMPRESSED set, but block image length %d", img.Len)}
				case !hasHole && !img.Compressed() && img.Len != BlockSize:
					return &Error{LSN: r.LSN, Reason: fmt.Sprintf("neither BKPIMAGE_HAS_HOLE nor BKPIMAGE_COMPRESSED set, but block image length is %d", img.Len)}
				}
				blk.Image = img
			}
			if blk.Flags&BkpBlockSameRel == 0 {
				b, ok := take(sizeOfRelFileNode)
				if !ok {
					return short()
				}
				blk.Rel = RelFileNode{Spc: binary.LittleEndian.Uint32(b[0:]), DB: binary.LittleEndian.Uint32(b[4:]), Rel: binary.LittleEndian.Uint32(b[8:])}
			} else {
				if lastRel == nil {
					return &Error{LSN: r.LSN, Reason: "BKPBLOCK_SAME_REL set but no previous rel"}
				}
				blk.Rel = *lastRel
			}
			b, ok := take(4)
			if !ok {
				return short()
			}
			blk.Block = binary.LittleEndian.Uint32(b)
			r.Blocks = append(r.Blocks, blk)
			lastRel = &r.Blocks[len(r.Blocks)-1].Rel
			continue
		default:
			return &Error{LSN: r.LSN, Reason: fmt.Sprintf("invalid block_id %d", id)}
		}
		// Main data: by convention the last header.
		dataTotal += mainLen
		break
	}
	if uint64(len(p)) != dataTotal {
		return short()
	}
	for i := range r.Blocks {
		b := &r.Blocks[i]
		if b.Image != nil {
			b.ImageData, p = p[:b.Image.Len], p[b.Image.Len:]
		}
		if b.DataLen > 0 {
			b.Data, p = p[:b.DataLen], p[b.DataLen:]
		}
	}
	if mainLen > 0 {
		r.MainData = p[:mainLen]
	}
	return nil
}
