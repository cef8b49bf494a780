package xlogtest

import (
	"encoding/binary"

	"github.com/safekeeper/safekeeper/proto/xlog"
)

// Block is a block reference for EncodeBody.
type Block struct {
	ID       uint8
	Fork     uint8
	Rel      xlog.RelFileNode
	SameRel  bool // BKPBLOCK_SAME_REL: Rel is not written (the previous block's is meant)
	Block    uint32
	Data     []byte // block data (BKPBLOCK_HAS_DATA when not empty)
	WillInit bool
	// Image is a full-page image: nil for none. ImageInfo holds its
	// bimg_info (BKPIMAGE_APPLY, BKPIMAGE_HAS_HOLE, compression bits),
	// HoleOffset and HoleLength its hole (HoleLength is written only for a
	// compressed image with a hole, as PostgreSQL does).
	Image                  []byte
	ImageInfo              uint8
	HoleOffset, HoleLength uint16
}

// Body is a record body for EncodeBody.
type Body struct {
	Blocks      []Block
	Origin      *uint16
	TopLevelXID *uint32
	Main        []byte
}

// EncodeBody encodes a record body as XLogRecordAssemble does in
// PostgreSQL 15: the block headers (with image headers and RelFileNodes),
// origin, top-level xid and main data headers, then each block's image and
// data, then the main data.
func EncodeBody(b Body) []byte {
	var hdr, data []byte
	for _, blk := range b.Blocks {
		flags := blk.Fork & xlog.BkpBlockForkMask
		if blk.Image != nil {
			flags |= xlog.BkpBlockHasImage
		}
		if len(blk.Data) > 0 {
			flags |= xlog.BkpBlockHasData
		}
		if blk.WillInit {
			flags |= xlog.BkpBlockWillInit
		}
		if blk.SameRel {
			flags |= xlog.BkpBlockSameRel
		}
		hdr = append(hdr, blk.ID, flags)
		hdr = binary.LittleEndian.AppendUint16(hdr, uint16(len(blk.Data)))
		if blk.Image != nil {
			hdr = binary.LittleEndian.AppendUint16(hdr, uint16(len(blk.Image)))
			hdr = binary.LittleEndian.AppendUint16(hdr, blk.HoleOffset)
			hdr = append(hdr, blk.ImageInfo)
			compressed := blk.ImageInfo&(xlog.BkpImageCompressPGLZ|xlog.BkpImageCompressLZ4|xlog.BkpImageCompressZSTD) != 0
			if compressed && blk.ImageInfo&xlog.BkpImageHasHole != 0 {
				hdr = binary.LittleEndian.AppendUint16(hdr, blk.HoleLength)
			}
			data = append(data, blk.Image...)
		}
		if !blk.SameRel {
			hdr = binary.LittleEndian.AppendUint32(hdr, blk.Rel.Spc)
			hdr = binary.LittleEndian.AppendUint32(hdr, blk.Rel.DB)
			hdr = binary.LittleEndian.AppendUint32(hdr, blk.Rel.Rel)
		}
		hdr = binary.LittleEndian.AppendUint32(hdr, blk.Block)
		data = append(data, blk.Data...)
	}
	if b.Origin != nil {
		hdr = append(hdr, xlog.XLRBlockIDOrigin)
		hdr = binary.LittleEndian.AppendUint16(hdr, *b.Origin)
	}
	if b.TopLevelXID != nil {
		hdr = append(hdr, xlog.XLRBlockIDTopLevelXID)
		hdr = binary.LittleEndian.AppendUint32(hdr, *b.TopLevelXID)
	}
	switch {
	case len(b.Main) > 255:
		hdr = append(hdr, xlog.XLRBlockIDDataLong)
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(b.Main)))
	case len(b.Main) > 0:
		hdr = append(hdr, xlog.XLRBlockIDDataShort, byte(len(b.Main)))
	}
	return append(append(hdr, data...), b.Main...)
}
