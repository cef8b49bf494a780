package storage

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/safekeeper/safekeeper/proto"
)

// backup_lsn: how far the timeline's WAL is in the archive.
//
// The timeline bucket's "backup" key holds a backup record (absent: 0),
// integers big-endian:
//
//	magic "SKBK" | version u32 (1) | backup_lsn u64 | crc32c u32
//
// Each save is its own small write transaction (fsynced unless
// Options.UnsafeNoFsync): it moves once per segment archived, or per
// partial upload, never per commit.

var keyBackup = []byte("backup")

var backupRecord = recordKind{
	name:    "backup record",
	magic:   [4]byte{'S', 'K', 'B', 'K'},
	version: 1,
	bodyLen: 8,
}

// BackupLSN is the timeline's stored backup_lsn (0: nothing archived yet).
func (t *Timeline) BackupLSN() (proto.LSN, error) {
	var lsn proto.LSN
	err := t.db.bolt.View(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTimelines).Bucket(t.key[:])
		if tb == nil {
			return fmt.Errorf("%w: %s", ErrNoTimeline, t.Key())
		}
		v := tb.Get(keyBackup)
		if v == nil {
			return nil
		}
		body, err := backupRecord.open(v)
		if err != nil {
			return err
		}
		lsn = proto.LSN(binary.BigEndian.Uint64(body))
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("storage: backup_lsn of timeline %s: %w", t.Key(), err)
	}
	return lsn, nil
}

// SaveBackupLSN stores backup_lsn durably.
func (t *Timeline) SaveBackupLSN(lsn proto.LSN) error {
	if err := t.db.checkOpen(); err != nil {
		return err
	}
	err := t.db.bolt.Update(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTimelines).Bucket(t.key[:])
		if tb == nil {
			return fmt.Errorf("%w: %s", ErrNoTimeline, t.Key())
		}
		return tb.Put(keyBackup, backupRecord.append(nil, func(b []byte) []byte {
			return binary.BigEndian.AppendUint64(b, uint64(lsn))
		}))
	})
	if err != nil {
		return fmt.Errorf("storage: save backup_lsn of timeline %s: %w", t.Key(), err)
	}
	return nil
}
