package storage

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The node record: which safekeeper (node id) a database belongs to.
//
// The meta bucket holds it under "node_id", all integers big-endian:
//
//	magic "SKND" | version u32 (1) | node_id u64 |
//	crc32c u32 (Castagnoli, over all the bytes before it)
//
// ClaimNodeID writes it once, in its own fsynced transaction (unless
// Options.UnsafeNoFsync), and nothing ever changes it: the WAL and the
// votes in the database were given as that node, and serving them under
// another id would let one node's votes count twice in a quorum. A
// database written before the record existed has none; the first
// ClaimNodeID adopts the id it is given. A decoder refuses a wrong magic,
// an unknown version, a CRC mismatch or a wrong length, with an error
// wrapping ErrCorrupt. Older builds ignore the key (the database format is
// unchanged).

var keyNodeID = []byte("node_id")

// nodeRecord is the framing of the node record; the body is node_id u64.
var nodeRecord = recordKind{
	name:    "node record",
	magic:   [4]byte{'S', 'K', 'N', 'D'},
	version: nodeVersion,
	bodyLen: 8,
}

const nodeVersion = 1

func encodeNodeID(dst []byte, id uint64) []byte {
	return nodeRecord.append(dst, func(dst []byte) []byte {
		return binary.BigEndian.AppendUint64(dst, id)
	})
}

func decodeNodeID(src []byte) (uint64, error) {
	body, err := nodeRecord.open(src)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(body), nil
}

// readNodeID returns the node id recorded in meta; ok is false if none is.
func readNodeID(meta *bolt.Bucket) (id uint64, ok bool, err error) {
	v := meta.Get(keyNodeID)
	if v == nil {
		return 0, false, nil
	}
	id, err = decodeNodeID(v) // copies out of the transaction
	return id, err == nil, err
}

// NodeID returns the node id recorded in the database; ok is false when none
// is recorded yet. It works on a read-only DB too.
func (db *DB) NodeID() (id uint64, ok bool, err error) {
	err = db.bolt.View(func(tx *bolt.Tx) error {
		id, ok, err = readNodeID(tx.Bucket(bucketMeta))
		return err
	})
	if err != nil {
		return 0, false, fmt.Errorf("storage: node id of %s: %w", db.Path(), err)
	}
	return id, ok, nil
}

// ClaimNodeID records id as the database's node id if none is recorded yet,
// durably, and returns the recorded id: id itself, or the id recorded
// earlier, which it leaves as it is. Whether a different recorded id is an
// error is the caller's decision.
func (db *DB) ClaimNodeID(id uint64) (recorded uint64, err error) {
	if err := db.checkOpen(); err != nil {
		return 0, err
	}
	err = db.bolt.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		stored, ok, err := readNodeID(meta)
		if err != nil {
			return err
		}
		if ok {
			recorded = stored
			return nil
		}
		recorded = id
		return meta.Put(keyNodeID, encodeNodeID(nil, id))
	})
	if err != nil {
		return 0, fmt.Errorf("storage: node id of %s: %w", db.Path(), err)
	}
	return recorded, nil
}
