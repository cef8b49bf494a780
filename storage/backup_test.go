package storage

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
)

// TestBackupLSNSurvivesReopen: backup_lsn is 0 until saved, survives a
// close and reopen and WAL commits, and a damaged record is ErrCorrupt.
func TestBackupLSNSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "safekeeper.db")
	db, tl := slotTestTimeline(t, path)
	if l, err := tl.BackupLSN(); err != nil || l != 0 {
		t.Fatalf("new timeline: backup_lsn %s, %v", l, err)
	}
	if err := tl.SaveBackupLSN(0x1234567); err != nil {
		t.Fatal(err)
	}
	st := acceptor.State{TenantID: proto.ID{0x51}, TimelineID: proto.ID{0x52}, SystemID: 1, PgVersion: 150018, WalSegSize: 1 << 20, PgTimeline: 1}
	if err := tl.WriteWAL(0x1000000, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	st.FlushLSN = 0x1100000
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, tl = slotTestTimeline(t, path)
	if l, err := tl.BackupLSN(); err != nil || l != 0x1234567 {
		t.Fatalf("after reopen: backup_lsn %s, %v", l, err)
	}
	if err := db.bolt.Update(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTimelines).Bucket(tl.key[:])
		v := append([]byte(nil), tb.Get(keyBackup)...)
		v[10] ^= 1
		return tb.Put(keyBackup, v)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := tl.BackupLSN(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("damaged record: %v, want ErrCorrupt", err)
	}
	db.Close()
}

// TestBackupRecordGoldenBytes pins the backup record's layout.
func TestBackupRecordGoldenBytes(t *testing.T) {
	got := hex.EncodeToString(backupRecord.append(nil, func(b []byte) []byte { return binary.BigEndian.AppendUint64(b, 0x0000000103000ABC) }))
	if want := "534b424b00000001" + "0000000103000abc" + "c20d25aa"; got != want {
		t.Fatalf("backup record\n got %s\nwant %s", got, want)
	}
}
