package timeline

import (
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

// Offline access to a stopped safekeeper's data directory, for the
// command-line tools: inspect (Inspect), wal dump --data-dir (OpenWAL),
// wal export (Export) and timeline pull (pull.go). Each opens the
// database itself and fails at once (ErrInUse) when a running safekeeper
// holds it; the reading ones open it read-only and never write.

// DatabaseFile is the name of the database in a data directory.
const DatabaseFile = "safekeeper.db"

var (
	// ErrInUse: a running safekeeper (or another tool) holds the data
	// directory's database. It is storage.ErrLocked.
	ErrInUse = storage.ErrLocked
	// ErrExportRange: Export's upto is outside what the timeline holds.
	// It is storage.ErrExportRange.
	ErrExportRange = storage.ErrExportRange
)

// offlineLockWait is how long an offline open waits for the database's
// lock before it fails with ErrInUse.
const offlineLockWait = 200 * time.Millisecond

func openOffline(dir string, readOnly bool) (*storage.DB, error) {
	return storage.Open(filepath.Join(dir, DatabaseFile), storage.Options{ReadOnly: readOnly, Timeout: offlineLockWait})
}

// Inspection is what a data directory holds.
type Inspection struct {
	NodeID    *uint64 // nil: none recorded
	Timelines []Stored
	// StoredCount is how many timelines are stored, those match left
	// out too.
	StoredCount int
}

// Stored is one timeline as stored: its durable state, the WAL it holds,
// its persistent slots.
type Stored struct {
	State       acceptor.State
	RemovedUpTo proto.LSN // no WAL below
	WALEndLSN   proto.LSN // the end of the WAL stored
	Slots       []storage.Slot
}

// Inspect reads dir's database read-only: the node id and every timeline
// match accepts (nil: all).
func Inspect(dir string, match func(proto.TimelineKey) bool) (*Inspection, error) {
	db, err := openOffline(dir, true)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	out := &Inspection{Timelines: []Stored{}}
	if id, ok, err := db.NodeID(); err != nil {
		return nil, err
	} else if ok {
		out.NodeID = &id
	}
	keys, err := db.Timelines()
	if err != nil {
		return nil, err
	}
	out.StoredCount = len(keys)
	for _, k := range keys {
		if match != nil && !match(k) {
			continue
		}
		tl, st, err := db.OpenTimeline(k.TenantID, k.TimelineID)
		if err != nil {
			return nil, fmt.Errorf("timeline %s: %w", k, err)
		}
		slots, err := tl.Slots()
		if err != nil {
			return nil, fmt.Errorf("timeline %s: %w", k, err)
		}
		out.Timelines = append(out.Timelines, Stored{State: st, RemovedUpTo: max(st.RemovedUpTo, tl.RemovedUpTo()), WALEndLSN: tl.EndLSN(), Slots: slots})
	}
	return out, nil
}

// StoredWAL is a stored timeline's WAL, read from a stopped safekeeper's
// data directory (OpenWAL).
type StoredWAL struct {
	db *storage.DB
	tl *storage.Timeline
	// State is the timeline's durable state; RemovedUpTo is where its WAL
	// starts after retention.
	State       acceptor.State
	RemovedUpTo proto.LSN
}

// OpenWAL opens timeline key of dir's database read-only; the caller
// closes it. A timeline not stored is ErrNotFound.
func OpenWAL(dir string, key proto.TimelineKey) (*StoredWAL, error) {
	db, err := openOffline(dir, true)
	if err != nil {
		return nil, err
	}
	tl, st, err := db.OpenTimeline(key.TenantID, key.TimelineID)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &StoredWAL{db: db, tl: tl, State: st, RemovedUpTo: max(st.RemovedUpTo, tl.RemovedUpTo())}, nil
}

// ReadWAL reads stored WAL from pos into buf (storage.Timeline.ReadWAL).
func (w *StoredWAL) ReadWAL(pos proto.LSN, buf []byte) (int, error) { return w.tl.ReadWAL(pos, buf) }

// Close closes the database.
func (w *StoredWAL) Close() error { return w.db.Close() }

// Export writes timeline key's committed WAL in dir's database as segment
// files in outDir (storage.ExportWithProgress: up to commit_lsn or upto;
// progress on w and through progress).
func Export(dir string, key proto.TimelineKey, outDir string, upto *proto.LSN, w io.Writer, progress func(done, total int64)) error {
	return storage.ExportWithProgress(filepath.Join(dir, DatabaseFile), key, outDir, upto, w, progress)
}
