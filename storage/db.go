package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
)

// Errors of this package. Check them with errors.Is; the returned errors wrap
// them with the details (path, timeline, LSN).
var (
	// ErrLocked: another process (or another DB in this one) holds the
	// database file; Open gave up after Options.Timeout.
	ErrLocked = errors.New("storage: database is locked by another process")
	// ErrTimelineExists: CreateTimeline for a timeline already stored.
	ErrTimelineExists = errors.New("storage: timeline already exists")
	// ErrNoTimeline: the timeline is not stored.
	ErrNoTimeline = errors.New("storage: no such timeline")
	// ErrWALRemoved: the requested WAL is below the oldest WAL retained,
	// because retention removed it or the timeline's WAL starts later.
	ErrWALRemoved = errors.New("storage: requested WAL is not retained")
	// ErrBadLSN: a write, truncation or removal at an LSN that breaks the
	// rules (writes contiguous, nothing below the retention horizon, no
	// removal above the end of WAL).
	ErrBadLSN = errors.New("storage: LSN out of order")
	// ErrBadState: a State that cannot be stored (bad wal_seg_size, ids that
	// do not match the timeline).
	ErrBadState = errors.New("storage: invalid timeline state")
	// ErrCorrupt: stored bytes fail their checks (control record magic,
	// version, CRC-32C or length; unknown database format).
	ErrCorrupt = errors.New("storage: corrupt data")
	// ErrClosed: the DB was closed.
	ErrClosed = errors.New("storage: database closed")
	// ErrReadOnly: a write to a DB opened with Options.ReadOnly.
	ErrReadOnly = errors.New("storage: database opened read-only")
)

// Bucket and key names of the on-disk layout (see doc.go).
var (
	bucketMeta      = []byte("meta")
	keyFormat       = []byte("format")
	bucketTimelines = []byte("timelines")
	keyControl      = []byte("control")
	keyPgHistory    = []byte("pg_history")
	keyConfig       = []byte("configuration")
	bucketWAL       = []byte("wal")
)

// pgHistoryRecord frames a timeline's PostgreSQL history file
// (acceptor.State.PgHistory), stored under pg_history next to the control
// record once the timeline switched past PostgreSQL timeline 1.
var pgHistoryRecord = recordKind{name: "timeline history record", magic: [4]byte{'S', 'K', 'P', 'H'}, version: 1, variable: true}

// configRecord frames a timeline's configuration (acceptor.State.Configuration:
// generation, members, new members, as proto.AppendConfiguration writes
// them), stored under configuration next to the control record, in the
// same transaction. A timeline without the key is in generation 0 (data
// directories from before generations read so).
var configRecord = recordKind{name: "configuration record", magic: [4]byte{'S', 'K', 'M', 'C'}, version: 1, variable: true}

// formatVersion is stored under meta/format. Open refuses other versions.
const formatVersion = 2

// MaxChunkSize is the largest WAL value stored under one key (1 MiB).
const MaxChunkSize = 1 << 20

const (
	defaultTimeout      = time.Second
	defaultSlowCommit   = time.Second
	defaultMaxChunkSize = 256 << 10
	defaultFileMode     = 0o600
)

// Options configure Open. The zero value is the production configuration.
type Options struct {
	// Timeout is how long Open waits for the exclusive file lock before it
	// fails with ErrLocked. 0 means 1 s.
	Timeout time.Duration
	// ReadOnly opens the database with a shared lock for offline readers
	// such as `wal export`. CreateTimeline, Commit and RemoveWAL fail with
	// ErrReadOnly. A
	// read-only Open still fails with ErrLocked while a writer holds the file.
	ReadOnly bool
	// Logger receives slow-commit warnings. nil means discard.
	Logger *slog.Logger
	// SlowCommit is the write-transaction duration (apply + fsync) above
	// which a commit is logged ("slow fsync") with its durations. 0 means
	// 1 s.
	SlowCommit time.Duration
	// OnCommit, if set, is called after every write transaction of the
	// group commit with its timings (for metrics). It runs in the
	// committing goroutine, before the committers are woken: keep it
	// short.
	OnCommit func(CommitStats)
	// MaxChunkSize is the largest WAL value written under one key; contiguous
	// staged writes are packed into chunks of at most this size. 0 means
	// 256 KiB; at most MaxChunkSize (1 MiB).
	MaxChunkSize int
	// FileMode is the mode of a newly created database file. 0 means 0600.
	FileMode os.FileMode
	// UnsafeNoFsync turns off every fsync (bbolt NoSync and NoGrowSync).
	// Commit then returns before data is durable and a power loss or kernel
	// crash loses acknowledged WAL and votes, breaking the protocol's safety.
	// For tests and benchmarks only; never in production.
	UnsafeNoFsync bool
}

func (o Options) withDefaults() (Options, error) {
	if o.Timeout == 0 {
		o.Timeout = defaultTimeout
	}
	if o.SlowCommit == 0 {
		o.SlowCommit = defaultSlowCommit
	}
	if o.MaxChunkSize == 0 {
		o.MaxChunkSize = defaultMaxChunkSize
	}
	if o.FileMode == 0 {
		o.FileMode = defaultFileMode
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	switch {
	case o.Timeout < 0:
		return o, fmt.Errorf("storage: Options.Timeout %v is negative", o.Timeout)
	case o.SlowCommit < 0:
		return o, fmt.Errorf("storage: Options.SlowCommit %v is negative", o.SlowCommit)
	case o.MaxChunkSize < 0 || o.MaxChunkSize > MaxChunkSize:
		return o, fmt.Errorf("storage: Options.MaxChunkSize %d is outside 1..%d", o.MaxChunkSize, MaxChunkSize)
	}
	return o, nil
}

// Stats are counters of a DB since Open.
type Stats struct {
	// Commits is the number of Timeline.Commit calls that succeeded.
	Commits uint64
	// WriteTxs is the number of group-commit write transactions (each one
	// fsync) that carried them. Commits/WriteTxs is the group-commit factor.
	WriteTxs uint64
	// WALBytes is the number of WAL bytes committed.
	WALBytes uint64
}

// DB is one safekeeper's durable storage: a bbolt file holding the control
// state and WAL of every timeline. It is safe for concurrent use.
type DB struct {
	bolt *bolt.DB
	path string // bolt.Path() reads a field Close writes
	opts Options
	log  *slog.Logger

	commits, writeTxs, walBytes atomic.Uint64

	// hooks are set by tests only, at open.
	hooks testHooks

	mu        sync.Mutex
	pending   []*commitReq        // guarded by mu; taken by the leader
	leading   bool                // guarded by mu: a Commit is writing a batch
	idle      sync.Cond           // on mu: broadcast when leading becomes false
	closed    bool                // guarded by mu
	timelines map[tlKey]*Timeline // guarded by mu; one handle per timeline
	closeErr  error               // result of the first Close
	closeOnce sync.Once

	// The zero-filled tail (prealloc.go), the group commit leader's: the
	// file it writes zeros through, how far the file is written, and when
	// a fill last failed.
	zeroFile   *os.File
	zeroInit   bool // zeroedTo was found from the file (SEEK_HOLE)
	zeroedTo   int64
	zeroFailed time.Time
	hwm        int64 // the end of the last page in use, as the last batch began
	// lastBatchBytes is the WAL the last batch wrote.
	lastBatchBytes int
}

// testHooks let tests hold the group commit to build a batch
// deterministically.
type testHooks struct {
	// beforeBatch, if set, is called by the leader of each group commit
	// before it takes the pending requests.
	beforeBatch func()
	// createFault, if set, is called inside CreateTimeline's transaction
	// after the buckets are created; an error aborts the transaction.
	createFault func() error
}

// Open opens or creates the database file at path (conventionally
// DATADIR/safekeeper.db). It takes bbolt's exclusive file lock, or a shared one
// with opts.ReadOnly, and fails with an error wrapping ErrLocked if the lock
// is not free within opts.Timeout.
func Open(path string, opts Options) (*DB, error) {
	return open(path, opts, testHooks{})
}

func open(path string, opts Options, hooks testHooks) (*DB, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	_, statErr := os.Stat(path)
	created := errors.Is(statErr, fs.ErrNotExist)
	bdb, err := bolt.Open(path, opts.FileMode, &bolt.Options{
		Timeout:    opts.Timeout,
		ReadOnly:   opts.ReadOnly,
		NoSync:     opts.UnsafeNoFsync,
		NoGrowSync: opts.UnsafeNoFsync,
		// Map 1 GiB up front (address space, not memory): growing the map
		// means remapping, which waits for every reader and stalls commits.
		InitialMmapSize: 1 << 30,
		// The freelist is rebuilt at Open instead of written by every
		// commit (doc.go, "Durability order"); the map form allocates in
		// O(1) however many pages are free.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s (waited %v)", ErrLocked, path, opts.Timeout)
	}
	if err != nil {
		return nil, openError(path, err)
	}
	if err := checkFormat(bdb, opts.ReadOnly); err != nil {
		_ = bdb.Close()
		return nil, fmt.Errorf("storage: open %s: %w", path, err)
	}
	// bbolt fsyncs the new file, not its name in the directory.
	if created && !opts.ReadOnly && !opts.UnsafeNoFsync {
		if err := SyncDir(filepath.Dir(path)); err != nil {
			_ = bdb.Close()
			return nil, fmt.Errorf("storage: open %s: %w", path, err)
		}
	}
	db := &DB{
		bolt:      bdb,
		path:      bdb.Path(),
		opts:      opts,
		log:       opts.Logger,
		hooks:     hooks,
		timelines: make(map[tlKey]*Timeline),
	}
	db.idle.L = &db.mu
	db.openZeroFile()
	return db, nil
}

// openError is bbolt's error opening path: a file system error as it is
// (it names the path already: "open X: permission denied"), a file that
// is not a valid bbolt database as ErrCorrupt, anything else with the
// path.
func openError(path string, err error) error {
	var pe *fs.PathError
	switch {
	case errors.As(err, &pe):
		return fmt.Errorf("storage: %w", err)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrVersionMismatch), errors.Is(err, berrors.ErrChecksum):
		return fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	}
	return fmt.Errorf("storage: open %s: %w", path, err)
}

// checkFormat creates the top-level buckets of a new file, or checks the
// format version of an existing one.
func checkFormat(bdb *bolt.DB, readOnly bool) error {
	check := func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil || tx.Bucket(bucketTimelines) == nil {
			return fmt.Errorf("%w: not a safekeeper database (no %q or %q bucket)", ErrCorrupt, bucketMeta, bucketTimelines)
		}
		v := meta.Get(keyFormat)
		if len(v) != 4 || binary.BigEndian.Uint32(v) != formatVersion {
			return fmt.Errorf("%w: database format %x, this build reads format %d", ErrCorrupt, v, formatVersion)
		}
		return nil
	}
	if readOnly {
		return bdb.View(check)
	}
	return bdb.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketMeta) == nil && tx.Bucket(bucketTimelines) == nil {
			meta, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			if err := meta.Put(keyFormat, binary.BigEndian.AppendUint32(nil, formatVersion)); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(bucketTimelines); err != nil {
				return err
			}
		}
		return check(tx)
	})
}

// Close waits for commits in flight to finish, then closes the file. Later
// calls on the DB and its timelines fail with ErrClosed (reads with bbolt's
// "database not open").
func (db *DB) Close() error {
	db.closeOnce.Do(func() {
		db.mu.Lock()
		db.closed = true
		for db.leading {
			db.idle.Wait()
		}
		db.mu.Unlock()
		db.saveFreelist()
		db.closeErr = db.bolt.Close()
		if db.zeroFile != nil {
			db.zeroFile.Close()
		}
	})
	return db.closeErr
}

// saveFreelist writes the list of free pages in one last transaction, so
// that the next Open reads it from its page instead of rebuilding it by a
// walk over every page of the file (0.4 s for 512 MiB of WAL, growing with
// the file: a restart's start-up). Only a clean close writes it; the
// first commit after the next Open drops it again (NoFreelistSync), and an
// Open after a crash walks the tree as before. A failure here loses
// nothing: that Open walks the tree too.
func (db *DB) saveFreelist() {
	if db.opts.ReadOnly {
		return
	}
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		// Set inside the write transaction: bbolt's writer lock orders it
		// with every other commit's read of the field.
		tx.DB().NoFreelistSync = false
		return nil
	})
	if err != nil {
		db.log.Warn("could not write the free page list at close; the next start rebuilds it", "path", db.path, "err", err)
	}
}

// Path returns the database file's path.
func (db *DB) Path() string { return db.path }

// Stats returns the DB's counters.
func (db *DB) Stats() Stats {
	return Stats{
		Commits:  db.commits.Load(),
		WriteTxs: db.writeTxs.Load(),
		WALBytes: db.walBytes.Load(),
	}
}

// FileSize returns the size of the database file in bytes (0 if it cannot
// be read).
func (db *DB) FileSize() int64 {
	fi, err := os.Stat(db.path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// AllocatedBytes is the part of the file's size that the file system
// backs (what du counts): bbolt grows the file with ftruncate, so the tail
// it grows ahead is a hole until written, and writing it takes free space
// like any other.
func (db *DB) AllocatedBytes() int64 {
	fi, err := os.Stat(db.path)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return min(fi.Size(), st.Blocks*512)
	}
	return fi.Size()
}

// ReusableBytes returns the bytes inside the database file that new writes
// take before the file grows: bbolt's free pages, the pending ones (freed
// by a commit, reused once no older read transaction runs) and the part
// of the file past the last page in use that the file system backs (bbolt
// grows the file ahead, in steps of up to 16 MiB, as a hole). The file never shrinks, so after retention or a
// timeline's deletion this, not the file's size, says how much room the
// file has. It is a snapshot: pages in use may be taken or freed meanwhile.
// 0 if the DB is closed.
func (db *DB) ReusableBytes() int64 {
	if db.checkOpen() != nil {
		return 0
	}
	var free int64
	err := db.bolt.View(func(tx *bolt.Tx) error {
		// Inside a transaction the file stays mapped (Info needs it).
		st := db.bolt.Stats()
		free = int64(st.FreePageN+st.PendingPageN) * int64(db.bolt.Info().PageSize)
		if tail := db.AllocatedBytes() - tx.Size(); tail > 0 {
			free += tail
		}
		return nil
	})
	if err != nil {
		return 0
	}
	return free
}

// CheckWritable reports whether the DB takes writes: open, not read-only,
// and its directory's file system not read-only or out of space.
func (db *DB) CheckWritable() error {
	if err := db.checkOpen(); err != nil {
		return err
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(db.path), &fs); err != nil {
		return err
	}
	if fs.Flags&unix.ST_RDONLY != 0 {
		return errors.New("storage: the file system is read-only")
	}
	if fs.Bavail == 0 {
		return errors.New("storage: no space left on the file system")
	}
	return nil
}

// tlKey is the 32-byte bucket name of a timeline: tenant_id || timeline_id.
type tlKey [32]byte

func makeKey(tenant, timeline proto.ID) tlKey {
	var k tlKey
	copy(k[:16], tenant[:])
	copy(k[16:], timeline[:])
	return k
}

func (k tlKey) timelineKey() proto.TimelineKey {
	return proto.TimelineKey{TenantID: proto.ID(k[:16]), TimelineID: proto.ID(k[16:])}
}

// Timelines lists the stored timelines in key order (tenant, then timeline).
func (db *DB) Timelines() ([]proto.TimelineKey, error) {
	var out []proto.TimelineKey
	err := db.bolt.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketTimelines).ForEachBucket(func(k []byte) error {
			if len(k) != len(tlKey{}) {
				return fmt.Errorf("%w: timeline bucket name %x is not 32 bytes", ErrCorrupt, k)
			}
			out = append(out, tlKey(k).timelineKey())
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("storage: list timelines: %w", err)
	}
	return out, nil
}

// CreateTimeline stores a new timeline with control state st, in one
// transaction: after a crash the timeline exists with its control state and
// WAL bucket, or not at all. It fails with ErrTimelineExists if the timeline
// is already stored. st.WalSegSize must be a power of two in 1 MiB..1 GiB;
// st.RemovedUpTo must be 0.
func (db *DB) CreateTimeline(st acceptor.State) (*Timeline, error) {
	if err := checkSegSize(st.WalSegSize); err != nil {
		return nil, err
	}
	key := makeKey(st.TenantID, st.TimelineID)
	name := key.timelineKey()
	if st.RemovedUpTo != 0 {
		return nil, fmt.Errorf("%w: timeline %s: new timeline with removed_up_to %s", ErrBadState, name, st.RemovedUpTo)
	}
	if err := db.checkOpen(); err != nil {
		return nil, err
	}
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		tb, err := tx.Bucket(bucketTimelines).CreateBucket(key[:])
		if errors.Is(err, berrors.ErrBucketExists) {
			return fmt.Errorf("%w: %s", ErrTimelineExists, name)
		}
		if err != nil {
			return err
		}
		if _, err := tb.CreateBucket(bucketWAL); err != nil {
			return err
		}
		if db.hooks.createFault != nil {
			if err := db.hooks.createFault(); err != nil {
				return err
			}
		}
		if err := tb.Put(keyControl, encodeState(nil, &st)); err != nil {
			return err
		}
		return writeConfiguration(tb, &acceptor.State{}, &st)
	})
	if err != nil {
		if errors.Is(err, ErrTimelineExists) {
			return nil, err
		}
		return nil, fmt.Errorf("storage: create timeline %s: %w", name, err)
	}
	return db.handle(key, st.WalSegSize, walRange{}, 0), nil
}

// OpenTimeline returns the handle of a stored timeline and its last committed
// control state. It fails with ErrNoTimeline if the timeline is not stored.
// A DB has one handle per timeline: calling OpenTimeline again returns the
// same *Timeline (with the state as committed on disk).
func (db *DB) OpenTimeline(tenant, timeline proto.ID) (*Timeline, acceptor.State, error) {
	key := makeKey(tenant, timeline)
	name := key.timelineKey()
	var (
		st  acceptor.State
		end walRange
	)
	err := db.bolt.View(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTimelines).Bucket(key[:])
		if tb == nil {
			return fmt.Errorf("%w: %s", ErrNoTimeline, name)
		}
		var err error
		if st, err = readControl(tb); err != nil {
			return err
		}
		wal := tb.Bucket(bucketWAL)
		if wal == nil {
			return fmt.Errorf("%w: timeline %s has no %q bucket", ErrCorrupt, name, bucketWAL)
		}
		end = walRangeOf(wal, st.RemovedUpTo)
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrNoTimeline) {
			return nil, acceptor.State{}, err
		}
		return nil, acceptor.State{}, fmt.Errorf("storage: open timeline %s: %w", name, err)
	}
	if err := checkSegSize(st.WalSegSize); err != nil {
		return nil, acceptor.State{}, fmt.Errorf("storage: open timeline %s: %w", name, err)
	}
	return db.handle(key, st.WalSegSize, end, st.RemovedUpTo), st, nil
}

// DeleteTimeline removes timeline tenant/timeline, its control record, WAL,
// history and slots, in one transaction: after a crash it is stored whole or
// not at all. It fails with ErrNoTimeline if it is not stored. The handle
// OpenTimeline or CreateTimeline returned for it must no longer be used
// (its commits then fail with ErrNoTimeline, or, once the timeline is
// created anew, would write to the new one): the caller stops its owner and
// readers first. A later CreateTimeline of the same ids gets a new handle.
func (db *DB) DeleteTimeline(tenant, timeline proto.ID) error {
	key := makeKey(tenant, timeline)
	name := key.timelineKey()
	if err := db.checkOpen(); err != nil {
		return err
	}
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		err := tx.Bucket(bucketTimelines).DeleteBucket(key[:])
		if errors.Is(err, berrors.ErrBucketNotFound) {
			return fmt.Errorf("%w: %s", ErrNoTimeline, name)
		}
		return err
	})
	if err != nil {
		if errors.Is(err, ErrNoTimeline) {
			return err
		}
		return fmt.Errorf("storage: delete timeline %s: %w", name, err)
	}
	db.mu.Lock()
	delete(db.timelines, key)
	db.mu.Unlock()
	return nil
}

// handle returns the one *Timeline of key, creating it with the committed
// WAL end read from disk if it does not exist yet.
func (db *DB) handle(key tlKey, segSize uint32, end walRange, removedUpTo proto.LSN) *Timeline {
	db.mu.Lock()
	defer db.mu.Unlock()
	if t, ok := db.timelines[key]; ok {
		return t
	}
	t := &Timeline{
		db:          db,
		key:         key,
		segSize:     uint64(segSize),
		end:         end,
		writePos:    end,
		removedUpTo: removedUpTo,
	}
	db.timelines[key] = t
	return t
}

// checkOpen returns ErrClosed or ErrReadOnly if db takes no writes.
func (db *DB) checkOpen() error {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.closed {
		return ErrClosed
	}
	if db.opts.ReadOnly {
		return ErrReadOnly
	}
	return nil
}

// readControl decodes the control record of timeline bucket tb.
func readControl(tb *bolt.Bucket) (acceptor.State, error) {
	v := tb.Get(keyControl)
	if v == nil {
		return acceptor.State{}, fmt.Errorf("%w: no control record", ErrCorrupt)
	}
	st, err := decodeState(v)
	if err != nil {
		return st, err
	}
	if h := tb.Get(keyPgHistory); h != nil {
		body, err := pgHistoryRecord.open(h)
		if err != nil {
			return acceptor.State{}, err
		}
		st.PgHistory = bytes.Clone(body)
	}
	if v := tb.Get(keyConfig); v != nil {
		body, err := configRecord.open(v)
		if err != nil {
			return acceptor.State{}, err
		}
		if st.Configuration, err = proto.DecodeConfiguration(body); err != nil {
			return acceptor.State{}, configRecord.corrupt("%v", err)
		}
	}
	return st, nil
}

// writeConfiguration stores s.Configuration next to the control record
// when it differs from old's (it changes only with a membership change).
func writeConfiguration(tb *bolt.Bucket, old, s *acceptor.State) error {
	if old.Configuration.Equal(s.Configuration) {
		return nil
	}
	if s.Configuration.Generation == 0 {
		return tb.Delete(keyConfig)
	}
	return tb.Put(keyConfig, configRecord.append(nil, func(dst []byte) []byte { return proto.AppendConfiguration(dst, s.Configuration) }))
}

// writePgHistory stores s.PgHistory next to the control record when it
// differs from old's (it changes only at a PostgreSQL timeline switch).
func writePgHistory(tb *bolt.Bucket, old, s *acceptor.State) error {
	if bytes.Equal(old.PgHistory, s.PgHistory) {
		return nil
	}
	if len(s.PgHistory) == 0 {
		return tb.Delete(keyPgHistory)
	}
	return tb.Put(keyPgHistory, pgHistoryRecord.append(nil, func(dst []byte) []byte { return append(dst, s.PgHistory...) }))
}

// checkSegSize refuses, with ErrBadState, a wal_seg_size PostgreSQL would
// not accept (proto.ValidSegSize).
func checkSegSize(segSize uint32) error {
	if !proto.ValidSegSize(segSize) {
		return fmt.Errorf("%w: wal_seg_size %d is not a power of two in 1 MiB..1 GiB", ErrBadState, segSize)
	}
	return nil
}

// walRange is the WAL a timeline holds: bytes [first, end). It is empty when
// first == end; then end is where it became empty (the retention horizon, a
// truncation point, or 0 for a timeline never written), and the next write may
// start anywhere at or above the retention horizon.
type walRange struct {
	first, end proto.LSN
}

func (r walRange) empty() bool { return r.first == r.end }

// removed returns r after retention removed the WAL below cut.
func (r walRange) removed(cut proto.LSN) walRange {
	if r.empty() || cut <= r.first {
		return r
	}
	if cut >= r.end {
		return walRange{first: r.end, end: r.end}
	}
	return walRange{first: cut, end: r.end}
}

// step checks op against r, the WAL before it, and returns the WAL after it.
// A write must start at the end of WAL, or anywhere at or above the retention
// horizon if the WAL is empty. A truncation is always allowed: at or below the
// first byte it empties the WAL, at or above the end it changes nothing.
func (r walRange) step(op walOp, removedUpTo proto.LSN) (walRange, error) {
	switch {
	case op.truncate && op.lsn <= r.first:
		return walRange{first: op.lsn, end: op.lsn}, nil
	case op.truncate && op.lsn < r.end:
		return walRange{first: r.first, end: op.lsn}, nil
	case op.truncate:
		return r, nil
	case r.empty() && op.lsn < removedUpTo:
		return r, fmt.Errorf("%w: write at %s is below the removed WAL horizon %s", ErrBadLSN, op.lsn, removedUpTo)
	case r.empty():
		return walRange{first: op.lsn, end: op.end()}, nil
	case op.lsn != r.end:
		return r, fmt.Errorf("%w: write at %s does not start at the end of WAL %s", ErrBadLSN, op.lsn, r.end)
	}
	return walRange{first: r.first, end: op.end()}, nil
}

// commitReq is one Timeline.Commit waiting for its group commit.
type commitReq struct {
	t     *Timeline
	ops   []walOp
	state acceptor.State
	// Set by the leader that committed it, before wake.
	end    walRange
	wrote  int
	err    error
	reqErr bool // err concerns this request only; the others were committed
	done   bool // committed (or failed); false when woken to lead
	wake   chan struct{}
}

// commit is the group commit: it applies r, with every other Commit
// waiting at that moment, in one bbolt write transaction (one fsync), and
// returns when r is durable or has failed (r.err). It fails if the DB is
// closed.
//
// There is no committer goroutine: the first caller that finds no
// transaction in progress leads. It takes every pending request (its own
// among them), writes them, wakes their callers, and hands the lead to the
// first request that arrived meanwhile, which then does the same. Requests
// that arrive while a transaction is being written wait for the next one, so
// fsyncs per second stay bounded while the commits per fsync grow with load,
// and no request waits for a timer. With one active timeline this is the
// timeline's owner writing its own transaction: no hand-off to another
// goroutine and back, two wake-ups fewer per commit.
func (db *DB) commit(r *commitReq) error {
	if err := db.checkOpen(); err != nil {
		return err
	}
	r.wake = make(chan struct{}, 1)
	db.mu.Lock()
	if db.closed {
		db.mu.Unlock()
		return ErrClosed
	}
	db.pending = append(db.pending, r)
	if db.leading {
		db.mu.Unlock()
		<-r.wake
		if r.done {
			return nil
		}
		// Woken to lead; db.leading stayed true for us.
	} else {
		db.leading = true
		db.mu.Unlock()
	}
	if db.hooks.beforeBatch != nil {
		db.hooks.beforeBatch()
	}
	db.mu.Lock()
	batch := db.pending
	db.pending = nil
	db.mu.Unlock()
	db.commitBatch(batch) // r is in it
	db.zeroAhead()        // its committers are awake: the next batch waits for this
	db.mu.Lock()
	if len(db.pending) > 0 {
		db.pending[0].wake <- struct{}{} // the next leader
	} else {
		db.leading = false
		db.idle.Broadcast()
	}
	db.mu.Unlock()
	return nil
}

// CommitStats describes one write transaction of the group commit.
type CommitStats struct {
	// Apply is the time spent putting the batch into the transaction's
	// pages in memory: copying WAL into chunks, the control records.
	Apply time.Duration
	// Write is the time spent writing the dirty pages and the meta page to
	// the file, each followed by fdatasync: the disk's part (bbolt's
	// TxStats.WriteTime).
	Write time.Duration
	// Commits is the number of timeline Commits in the transaction, WALBytes
	// the WAL they wrote.
	Commits  int
	WALBytes int
	Err      error
}

// commitBatch applies batch in one write transaction and wakes its callers.
// A request that breaks the LSN rules is refused alone, before it changes
// anything; any other error aborts the transaction and fails every request:
// none of them is durable.
func (db *DB) commitBatch(batch []*commitReq) {
	start := time.Now()
	var walBytes int
	var txStats bolt.TxStats
	// db.bolt.Update, written out to read the transaction's write time.
	err := func() error {
		tx, err := db.bolt.Begin(true)
		if err != nil {
			return err
		}
		defer tx.Rollback() // after Commit: ErrTxClosed, nothing done
		timelines := tx.Bucket(bucketTimelines)
		for _, r := range batch {
			r.err, r.reqErr, r.wrote = nil, false, 0
			if err := r.apply(timelines, db.opts.MaxChunkSize); err != nil {
				if !r.reqErr {
					return err
				}
				r.err = err
				continue
			}
			walBytes += r.wrote
		}
		db.hwm = tx.Size() // before this commit's pages: zeroAhead's hint
		err = tx.Commit()
		txStats = tx.Stats()
		return err
	}()
	elapsed := time.Since(start)
	db.lastBatchBytes = walBytes
	write := txStats.GetWriteTime()
	db.writeTxs.Add(1)
	if elapsed > db.opts.SlowCommit {
		db.log.Warn("slow fsync", "duration", elapsed, "write_and_fsync", write, "commits", len(batch), "wal_bytes", walBytes, "err", err)
	}
	if db.opts.OnCommit != nil {
		db.opts.OnCommit(CommitStats{Apply: elapsed - write, Write: write, Commits: len(batch), WALBytes: walBytes, Err: err})
	}
	// Count first, then wake the committers: a caller that reads Stats
	// after its Commit returned sees that commit counted.
	var ok uint64
	for _, r := range batch {
		if err != nil {
			r.err = fmt.Errorf("storage: commit timeline %s: %w", r.t.key.timelineKey(), err)
		} else if r.err == nil {
			ok++
		}
	}
	if err == nil {
		db.commits.Add(ok)
		db.walBytes.Add(uint64(walBytes))
	}
	for _, r := range batch {
		r.done = true
		r.wake <- struct{}{}
	}
}

// apply performs r inside tx: checks, then the staged truncations and writes
// in order, then the control record. It sets r.end to the resulting WAL range.
// Errors from the checks set r.reqErr and come before any change.
func (r *commitReq) apply(timelines *bolt.Bucket, maxChunk int) error {
	t := r.t
	name := t.key.timelineKey()
	tb := timelines.Bucket(t.key[:])
	if tb == nil {
		r.reqErr = true
		return fmt.Errorf("%w: %s", ErrNoTimeline, name)
	}
	old, err := readControl(tb)
	if err != nil {
		return fmt.Errorf("timeline %s: %w", name, err)
	}
	wal := tb.Bucket(bucketWAL)
	if wal == nil {
		return fmt.Errorf("%w: timeline %s has no %q bucket", ErrCorrupt, name, bucketWAL)
	}
	// The retention horizon is owned by storage (RemoveWAL), not the
	// caller, with one exception: a timeline that holds no WAL takes a
	// higher one, a segment boundary, from the caller (a safekeeper joining
	// late: it holds the timeline from there).
	want := r.state.RemovedUpTo.SegmentStart(t.segSize)
	r.state.RemovedUpTo = old.RemovedUpTo
	pos := walRangeOf(wal, old.RemovedUpTo)
	if want > old.RemovedUpTo && pos.empty() {
		r.state.RemovedUpTo = want
		pos = walRange{first: want, end: want}
	}
	for _, op := range r.ops {
		if pos, err = pos.step(op, r.state.RemovedUpTo); err != nil {
			r.reqErr = true
			return fmt.Errorf("timeline %s: %w", name, err)
		}
	}

	// Reduce the ops to their net effect, one cut of the stored chunks and
	// the staged bytes that survive later truncations, so each bucket sees
	// its deletes before its puts and no cursor walks a half-emptied tree
	// (bbolt's Cursor.Last can loop over leaves emptied in the same tx).
	var (
		cut    proto.LSN
		hasCut bool
		writes []walOp
	)
	for _, op := range r.ops {
		if !op.truncate {
			writes = append(writes, op)
			continue
		}
		for len(writes) > 0 && writes[len(writes)-1].lsn >= op.lsn {
			writes = writes[:len(writes)-1]
		}
		if n := len(writes); n > 0 {
			// Stored chunks end at or below writes[0].lsn <= op.lsn: untouched.
			if w := &writes[n-1]; w.end() > op.lsn {
				w.data = w.data[:op.lsn-w.lsn]
			}
			continue
		}
		if !hasCut || op.lsn < cut {
			cut, hasCut = op.lsn, true
		}
	}
	if hasCut {
		if err := truncateWAL(wal, cut); err != nil {
			return err
		}
	}
	for _, w := range writes {
		if err := putExtents(wal, w.lsn, w.data, t.segSize, maxChunk); err != nil {
			return err
		}
		r.wrote += len(w.data)
	}
	if err := tb.Put(keyControl, encodeState(nil, &r.state)); err != nil {
		return err
	}
	if err := writePgHistory(tb, &old, &r.state); err != nil {
		return err
	}
	if err := writeConfiguration(tb, &old, &r.state); err != nil {
		return err
	}
	r.end = pos
	return nil
}
