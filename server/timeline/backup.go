package timeline

import (
	"sync/atomic"
	"time"

	"github.com/safekeeper/safekeeper/proto"
)

// The archive's side of a timeline: backup_lsn (how far its WAL is in
// the archive, durable in the timeline's store) and the notifications the
// uploader (server/backup) runs on. The uploader is the registry's
// Config.Backup; without one, nothing here moves and retention ignores
// backup_lsn.

// BackupNotifier is told when a timeline's state changed (a commit, an
// election), never blocking: the uploader looks at the timeline soon
// after.
type BackupNotifier interface {
	Changed(t *Timeline)
}

// backupState is a timeline's archive state.
type backupState struct {
	lsn atomic.Uint64 // backup_lsn
	// pending: the notifier was told of a change it has not taken yet
	// (TakeBackupChange): further changes need not tell it again, so a
	// commit costs one atomic load here while the uploader is behind.
	pending atomic.Bool
	// wakeAt: a change below this commit_lsn does not tell the notifier
	// (it has nothing to do until then, or until a timer of its own);
	// 0: every change tells it.
	wakeAt atomic.Uint64
	// behindSince is when commit_lsn was first seen above backup_lsn
	// (unix nanoseconds; 0: caught up), for the lag in seconds.
	behindSince atomic.Int64
}

// notifyBackup tells the notifier of a change to commit_lsn commit,
// unless it has one pending or asked to hear only of a higher one.
func (t *Timeline) notifyBackup(commit proto.LSN) {
	if t.notify == nil || t.backup.pending.Load() || uint64(commit) < t.backup.wakeAt.Load() {
		return
	}
	if t.backup.pending.CompareAndSwap(false, true) {
		t.notify.Changed(t)
	}
}

// WakeBackupAt asks to be told of changes only once commit_lsn reaches
// lsn (0: of every change). The uploader calls it after a pass: until the
// segment it holds is complete, the partial upload's timer is enough.
func (t *Timeline) WakeBackupAt(lsn proto.LSN) { t.backup.wakeAt.Store(uint64(lsn)) }

// TakeBackupChange is the uploader taking the pending change: it reads
// the state after this, and the next change tells it again.
func (t *Timeline) TakeBackupChange() { t.backup.pending.Store(false) }

// BackupLSN is how far the timeline's WAL is in the archive: every byte
// from the archive's start up to it is stored there (0: nothing yet).
func (t *Timeline) BackupLSN() proto.LSN { return proto.LSN(t.backup.lsn.Load()) }

// SetBackupLSN records a higher backup_lsn, durably first, and asks for a
// retention pass (WAL below it may now go). A lower one is ignored.
func (t *Timeline) SetBackupLSN(lsn proto.LSN) error {
	if lsn <= t.BackupLSN() {
		return nil
	}
	if err := t.store.SaveBackupLSN(lsn); err != nil {
		return err
	}
	t.backup.lsn.Store(uint64(lsn))
	t.repl.kickRetention()
	return nil
}

// BackupLag is commit_lsn minus backup_lsn, and how long backup_lsn has
// been below commit_lsn (0 when caught up).
func (t *Timeline) BackupLag(commit proto.LSN) (bytes uint64, d time.Duration) {
	b := t.BackupLSN()
	if commit <= b {
		return 0, 0
	}
	if since := t.backup.behindSince.Load(); since != 0 {
		d = time.Since(time.Unix(0, since))
	}
	return uint64(commit - b), d
}

// MarkBackup records whether the archive is behind commit_lsn now (the
// uploader calls it as it looks at the timeline).
func (t *Timeline) MarkBackup(behind bool) {
	if !behind {
		t.backup.behindSince.Store(0)
	} else if t.backup.behindSince.Load() == 0 {
		t.backup.behindSince.CompareAndSwap(0, time.Now().UnixNano())
	}
}
