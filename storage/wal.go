package storage

import (
	"bytes"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/safekeeper/safekeeper/proto"
)

// The WAL of a timeline in bbolt (doc.go, "On-disk layout"): the timeline's
// wal bucket holds one extent per Commit and segment, keyed by the LSN of its
// first byte; an extent is a bucket of chunks keyed by their first LSN.
//
// Why extents: bbolt rewrites, on every commit, the whole leaf that receives
// a new key, and it never splits a leaf of four keys or fewer. With chunks
// directly under wal, every commit rewrote the three or four chunks before
// its own (4.9 bytes written per WAL byte for 128 KiB commits, 7.3 for
// 16 KiB ones). A new extent bucket is a new tree: its chunks are written
// once, and what is rewritten is one small leaf of extent headers (24 bytes
// each, packed with FillPercent 1.0 since the keys only grow) and the path
// above it.

// walFillPercent is the fill of the append-only wal and extent buckets:
// keys only ever grow, so leaves are split full (bbolt's default of 0.5
// leaves every leaf half empty and doubles the pages of a leaf rewrite).
const walFillPercent = 1.0

// lsnKey is the key of an extent or chunk starting at lsn: 8 bytes
// big-endian, so cursor order is LSN order.
func lsnKey(lsn proto.LSN) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), uint64(lsn))
}

func keyLSN(k []byte) proto.LSN { return proto.LSN(binary.BigEndian.Uint64(k)) }

// putExtents stores data, the WAL [lsn, lsn+len(data)), as new extents of
// wal: one per segment it touches, each cut into chunks of at most maxChunk
// bytes. data must stay valid until the transaction ends (bbolt copies values
// when it writes the pages).
func putExtents(wal *bolt.Bucket, lsn proto.LSN, data []byte, segSize uint64, maxChunk int) error {
	wal.FillPercent = walFillPercent
	for len(data) > 0 {
		n := uint64(len(data))
		if rest := segSize - lsn.SegmentOffset(segSize); n > rest {
			n = rest
		}
		ext, err := wal.CreateBucket(lsnKey(lsn))
		if err != nil {
			return fmt.Errorf("extent at %s: %w", lsn, err)
		}
		ext.FillPercent = walFillPercent
		for off := uint64(0); off < n; {
			m := min(n-off, uint64(maxChunk))
			if err := ext.Put(lsnKey(lsn+proto.LSN(off)), data[off:off+m]); err != nil {
				return err
			}
			off += m
		}
		lsn += proto.LSN(n)
		data = data[n:]
	}
	return nil
}

// walRangeOf returns the range of the WAL in bucket wal, or (removedUpTo,
// removedUpTo) if it holds no extent.
func walRangeOf(wal *bolt.Bucket, removedUpTo proto.LSN) walRange {
	c := wal.Cursor()
	lk, _ := c.Last()
	if lk == nil {
		return walRange{first: removedUpTo, end: removedUpTo}
	}
	ck, cv := wal.Bucket(lk).Cursor().Last()
	fk, _ := c.First()
	return walRange{first: keyLSN(fk), end: keyLSN(ck) + proto.LSN(len(cv))}
}

// walCursor walks the chunks of a wal bucket in LSN order, across extents.
// Its slices are valid only inside the transaction.
type walCursor struct {
	wal     *bolt.Bucket
	extents *bolt.Cursor
	chunks  *bolt.Cursor // in the current extent; nil before the first seek
}

func newWALCursor(wal *bolt.Bucket) *walCursor {
	return &walCursor{wal: wal, extents: wal.Cursor()}
}

// seekBelow moves c to the last key at or below k and returns it and its
// value, or nil if there is none.
func seekBelow(c *bolt.Cursor, k []byte) ([]byte, []byte) {
	got, v := c.Seek(k)
	switch {
	case got == nil:
		got, v = c.Last()
	case !bytes.Equal(got, k):
		got, v = c.Prev()
	}
	return got, v
}

// seek positions c at the chunk holding lsn, or the last chunk below it if
// lsn is past the end, and returns its start and bytes; ok is false if no
// chunk starts at or below lsn.
func (c *walCursor) seek(lsn proto.LSN) (start proto.LSN, data []byte, ok bool) {
	key := lsnKey(lsn)
	ek, _ := seekBelow(c.extents, key)
	if ek == nil {
		return 0, nil, false
	}
	c.chunks = c.wal.Bucket(ek).Cursor()
	ck, v := seekBelow(c.chunks, key)
	if ck == nil {
		return 0, nil, false // an empty extent: never written so
	}
	return keyLSN(ck), v, true
}

// next moves c to the chunk after the current one.
func (c *walCursor) next() (start proto.LSN, data []byte, ok bool) {
	k, v := c.chunks.Next()
	if k == nil {
		ek, _ := c.extents.Next()
		if ek == nil {
			return 0, nil, false
		}
		c.chunks = c.wal.Bucket(ek).Cursor()
		if k, v = c.chunks.First(); k == nil {
			return 0, nil, false
		}
	}
	return keyLSN(k), v, true
}

// firstLSN returns the start of the oldest extent, ok false if there is none.
func firstLSN(wal *bolt.Bucket) (proto.LSN, bool) {
	k, _ := wal.Cursor().First()
	if k == nil {
		return 0, false
	}
	return keyLSN(k), true
}

// truncateWAL deletes every extent and chunk at or above lsn and trims the
// chunk that straddles it. All cursor moves in a bucket happen before its
// first change (bbolt's cursors are not stable across changes to the tree).
func truncateWAL(wal *bolt.Bucket, lsn proto.LSN) error {
	key := lsnKey(lsn)
	c := wal.Cursor()
	var doomed [][]byte
	for k, _ := c.Seek(key); k != nil; k, _ = c.Next() {
		doomed = append(doomed, bytes.Clone(k))
	}
	var straddling []byte
	if k, _ := c.Seek(key); k == nil {
		straddling, _ = c.Last()
	} else {
		straddling, _ = c.Prev()
	}
	straddling = bytes.Clone(straddling)
	for _, k := range doomed {
		if err := wal.DeleteBucket(k); err != nil {
			return err
		}
	}
	if straddling == nil {
		return nil
	}
	ext := wal.Bucket(straddling)
	ext.FillPercent = walFillPercent
	ec := ext.Cursor()
	doomed = doomed[:0]
	for k, _ := ec.Seek(key); k != nil; k, _ = ec.Next() {
		doomed = append(doomed, bytes.Clone(k))
	}
	var trimKey, trimmed []byte
	if pk, pv := seekBelow(ec, key); pk != nil {
		if start := keyLSN(pk); start+proto.LSN(len(pv)) > lsn {
			// Copies: bbolt slices are not valid across changes to the tree.
			trimKey, trimmed = bytes.Clone(pk), bytes.Clone(pv[:lsn-start])
		}
	}
	for _, k := range doomed {
		if err := ext.Delete(k); err != nil {
			return err
		}
	}
	if trimKey != nil {
		return ext.Put(trimKey, trimmed)
	}
	return nil
}

// removeBelow deletes every extent that starts below cut, a segment
// boundary: extents never cross one, so each lies wholly below it.
func removeBelow(wal *bolt.Bucket, cut proto.LSN) error {
	var doomed [][]byte
	c := wal.Cursor()
	for k, _ := c.First(); k != nil && keyLSN(k) < cut; k, _ = c.Next() {
		doomed = append(doomed, bytes.Clone(k))
	}
	for _, k := range doomed {
		if err := wal.DeleteBucket(k); err != nil {
			return err
		}
	}
	return nil
}
