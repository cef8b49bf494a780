package timeline

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

// supportedPgMajor is the PostgreSQL major version whose WAL format
// (page magic 0xD110, record layout) proto/xlog decodes.
const supportedPgMajor = 15

// Config configures a Registry. The server fills it from its own Config
// (server.Config documents each limit); zero values are no limit.
type Config struct {
	// NodeID is this safekeeper's node id, the acceptors' NodeId.
	NodeID uint64
	// Logger receives the timelines' logs; nil discards them.
	Logger *slog.Logger
	// MaxTimelines bounds the timelines stored; a greeting that would
	// create one more is refused (ErrLimit). 0: no limit.
	MaxTimelines int
	// MaxSlots bounds the replication slots of a timeline (ErrLimit
	// beyond). 0: no limit.
	MaxSlots int
	// WalKeepSize, MaxPeerWALKeepSize and MaxSlotWALKeepSize are the
	// retention's bounds in bytes (retention.go); MaxSlotWALKeepSize 0: no
	// limit.
	WalKeepSize, MaxPeerWALKeepSize, MaxSlotWALKeepSize int64
	// RetentionInterval is the least time between two WAL removal passes
	// of a timeline.
	RetentionInterval time.Duration
	// MaxBufferedWAL is the WAL budget's size (Budget).
	MaxBufferedWAL int64
	// Metrics are the instruments the owners update; nil: none.
	Metrics *Metrics
	// Recycle takes back the buffers of the messages a group commit took,
	// once it is done (the push stream's reader got them from its
	// transport's pool); nil: they are left to the garbage collector.
	Recycle func([][]byte)
	// Backup is the archive's uploader, told of every timeline's changes;
	// nil: no archive. With one, retention keeps the WAL not yet in the
	// archive (backup_lsn bounds the horizon).
	Backup BackupNotifier
	// Hooks are for tests; the zero value in production.
	Hooks Hooks
}

// Metrics are the instruments the timelines update, owned by the HTTP
// API's metrics (httpapi registers them).
type Metrics struct {
	WriteBytes prometheus.Histogram // WAL bytes per SafeKeeperRequest
	Appends    prometheus.Counter   // SafeKeeperRequests with WAL
	Received   prometheus.Counter   // WAL bytes received
	// Refused counts refusals by reason; the timelines count "timelines"
	// and "slots".
	Refused *prometheus.CounterVec
}

func (m *Metrics) refused(reason string) {
	if m != nil && m.Refused != nil {
		m.Refused.WithLabelValues(reason).Inc()
	}
}

// Hooks are test hooks; each nil or zero in production.
type Hooks struct {
	// BeforeOpen runs before a timeline is opened from disk (outside every
	// lock, in the goroutine that opens it).
	BeforeOpen func(proto.TimelineKey)
	// Storage wraps what a timeline's session writes through (to make it
	// fail like a full disk).
	Storage func(*storage.Timeline) acceptor.Storage
	// OnPublish runs after each publication of a timeline's new state.
	OnPublish func()
	// Create replaces storage.DB.CreateTimeline (to fail like a full disk).
	Create func(acceptor.State) (*storage.Timeline, error)
	// PersistInterval replaces persistInterval (0: the default).
	PersistInterval time.Duration
	// DeleteTimeline replaces storage.DB.DeleteTimeline (to fail like a
	// full disk).
	DeleteTimeline func(tenant, timeline proto.ID) error
}

// Registry holds the running timelines of one database: it opens a
// timeline from disk or creates it (single-flight per timeline, outside
// its lock: an open may fsync), opens every stored one at start
// (OpenStored), deletes them (delete.go), and stops their owners at
// shutdown (Stop, then Close).
type Registry struct {
	cfg    Config
	log    *slog.Logger
	db     *storage.DB
	budget *Budget

	// ret runs the retention passes of every timeline.
	ret *retainer

	mu        sync.Mutex
	stopping  bool
	timelines map[proto.TimelineKey]*Timeline
	opening   map[proto.TimelineKey]*opening // opens in progress
	deleting  map[proto.TimelineKey]struct{} // deletes in progress (delete.go)
	pulling   map[proto.TimelineKey]struct{} // online pulls in progress (pull.go)
	// retiring are the timelines a delete took out of timelines and has
	// not stopped yet: Close stops them too.
	retiring map[*Timeline]struct{}
	// openWG counts the opens under way and the opens at start
	// (OpenStored). Added to under mu and only while not stopping, so
	// Close, after Stop marked stopping under mu, can wait for it before
	// it stops the owners.
	openWG sync.WaitGroup

	removedSegments atomic.Int64 // WAL segments retention removed
}

// NewRegistry returns the registry of db's timelines; none is open yet.
// The caller closes db after Close.
func NewRegistry(db *storage.DB, cfg Config) *Registry {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Registry{
		cfg: cfg, log: cfg.Logger, db: db, budget: NewBudget(cfg.MaxBufferedWAL),
		timelines: map[proto.TimelineKey]*Timeline{}, opening: map[proto.TimelineKey]*opening{}, deleting: map[proto.TimelineKey]struct{}{},
		pulling: map[proto.TimelineKey]struct{}{}, retiring: map[*Timeline]struct{}{},
	}
	r.ret = newRetainer(r)
	return r
}

// Budget is the WAL budget (Config.MaxBufferedWAL) the push streams take
// from and the owners give back to.
func (r *Registry) Budget() *Budget { return r.budget }

// RemovedSegments is how many WAL segments retention removed since the
// registry was made.
func (r *Registry) RemovedSegments() int64 { return r.removedSegments.Load() }

// Keys lists the timelines stored, open or not.
func (r *Registry) Keys() ([]proto.TimelineKey, error) { return r.db.Timelines() }

// Running returns the timelines open now.
func (r *Registry) Running() []*Timeline {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Timeline, 0, len(r.timelines))
	for _, t := range r.timelines {
		out = append(out, t)
	}
	return out
}

// Stop refuses every open, create and delete from now on (ErrStopped):
// the first step of a shutdown. Close finishes it.
func (r *Registry) Stop() {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
}

func (r *Registry) isStopping() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopping
}

// Close waits for the opens under way (new ones are refused once Stop
// ran), then stops retention and every timeline: each persists what it
// holds in memory. Call it after Stop, once the connections that feed the
// owners have ended.
func (r *Registry) Close() {
	r.Stop()
	r.openWG.Wait()
	r.ret.close()
	r.mu.Lock()
	all := make([]*Timeline, 0, len(r.timelines)+len(r.retiring))
	for _, t := range r.timelines {
		all = append(all, t)
	}
	for t := range r.retiring {
		all = append(all, t)
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, t := range all {
		wg.Add(1)
		go func() { // their persists share group commits
			defer wg.Done()
			t.stop()
		}()
	}
	wg.Wait()
}

// Open returns the running timeline key, opening it from disk; it never
// creates one. A timeline that is not stored is a *NotFoundError.
func (r *Registry) Open(key proto.TimelineKey) (*Timeline, error) {
	return r.open(key, nil)
}

// OpenOrCreate returns the running timeline m names, opening it from
// disk or, when it is not stored, creating it from m (atomically,
// README_PROTO.md rule 1).
func (r *Registry) OpenOrCreate(m *proto.ServerInfo) (*Timeline, error) {
	return r.open(proto.TimelineKey{TenantID: m.TenantID, TimelineID: m.TimelineID}, m)
}

// open returns the running timeline key, opening it from disk, or, when
// it is not stored and create (the proposer's greeting) is given,
// creating it from create.
//
// Opening may write and fsync (acceptor.New cuts WAL above flush_lsn), so
// it runs outside r.mu: one slow disk must not stop the other timelines.
// Opens of one timeline are single-flight: the first caller opens, later
// ones wait for it; a caller whose open failed for its own reason (a
// reader finding no timeline where a greeting would create one) does not
// decide for the others, who then try themselves.
func (r *Registry) open(key proto.TimelineKey, create *proto.ServerInfo) (*Timeline, error) {
	for {
		r.mu.Lock()
		if t, ok := r.timelines[key]; ok {
			r.mu.Unlock()
			return t, nil
		}
		if r.stopping {
			r.mu.Unlock()
			return nil, ErrStopped
		}
		if _, ok := r.deleting[key]; ok {
			r.mu.Unlock()
			return nil, &NotFoundError{Key: key, Why: "is being deleted on this safekeeper"}
		}
		if _, ok := r.pulling[key]; ok {
			r.mu.Unlock()
			return nil, &NotFoundError{Key: key, Why: "is being pulled from a peer on this safekeeper"}
		}
		if op, ok := r.opening[key]; ok {
			r.mu.Unlock()
			<-op.done
			if op.err == nil {
				return op.t, nil
			}
			continue
		}
		op := &opening{done: make(chan struct{})}
		r.opening[key] = op
		r.openWG.Add(1) // not stopping (checked above, under mu): Close waits for it
		r.mu.Unlock()

		op.t, op.err = r.load(key, create)
		r.mu.Lock()
		delete(r.opening, key)
		if op.err == nil {
			r.timelines[key] = op.t
		}
		r.mu.Unlock()
		if op.err == nil {
			// WAL committed but not archived (a restart's backlog): the
			// uploader starts on it now, not at its next look over the
			// running timelines.
			if commit := op.t.State().CommitLSN; op.t.BackupLSN() < commit {
				op.t.notifyBackup(commit)
			}
		}
		close(op.done)
		r.openWG.Done()
		return op.t, op.err
	}
}

// openAtStartWorkers bounds the opens OpenStored runs at once. An open is
// a read transaction (the control record, the WAL bucket's ends, the
// slots) and two goroutines started; it writes only to cut WAL above
// flush_lsn. Four keep a cold disk's reads overlapping without taking
// the cores a server that already serves needs.
const openAtStartWorkers = 4

// OpenStored opens every stored timeline in the background, as Neon's
// safekeeper loads its timelines at start, so that their metrics and the
// timeline list are there before any client asks for them; it returns at
// once (nothing, once Stop ran). A client that asks for a timeline not
// yet open opens it itself (single-flight with this). At most
// openAtStartWorkers opens run at once. A timeline that fails to open is
// logged and left for a client's open to retry; one deleted since the
// list was read is skipped; Stop ends it after the opens under way (Close
// waits for it). It logs one line at the end: the count and the time
// taken.
func (r *Registry) OpenStored() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return
	}
	r.openWG.Add(1) // only while not stopping: Close waits for it
	go r.openStored()
}

func (r *Registry) openStored() {
	defer r.openWG.Done()
	start := time.Now()
	keys, err := r.db.Timelines()
	if err != nil {
		if !r.isStopping() {
			r.log.Error("could not list the stored timelines to open them at start; each opens when a client asks for it", "err", err)
		}
		return
	}
	var (
		next                 atomic.Int64
		opened, gone, failed atomic.Int64
		wg                   sync.WaitGroup
	)
	for range min(openAtStartWorkers, len(keys)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(len(keys)) || r.isStopping() {
					return
				}
				key := keys[i]
				_, err := r.Open(key)
				switch {
				case err == nil:
					opened.Add(1)
				case r.isStopping():
					return
				case errors.Is(err, ErrNotFound):
					gone.Add(1) // deleted since the list was read, or being deleted
				default:
					failed.Add(1)
					r.log.Error("could not open timeline at start; a client's open retries it", "tenant_id", key.TenantID.String(),
						"timeline_id", key.TimelineID.String(), "err", err)
				}
			}
		}()
	}
	wg.Wait()
	if r.isStopping() {
		r.log.Info("stopped opening the stored timelines: shutting down", "opened", opened.Load(), "stored", len(keys),
			"duration", time.Since(start).Round(time.Millisecond))
		return
	}
	r.log.Info("opened the stored timelines", "timelines", opened.Load(), "failed", failed.Load(), "deleted", gone.Load(),
		"duration", time.Since(start).Round(time.Millisecond))
}

// opening is an open of a timeline in progress; done is closed when t or
// err is set.
type opening struct {
	done chan struct{}
	t    *Timeline
	err  error
}

// load opens or creates timeline key and starts it. It does not hold r.mu.
func (r *Registry) load(key proto.TimelineKey, create *proto.ServerInfo) (*Timeline, error) {
	if r.cfg.Hooks.BeforeOpen != nil {
		r.cfg.Hooks.BeforeOpen(key)
	}
	store, st, err := r.db.OpenTimeline(key.TenantID, key.TimelineID)
	if errors.Is(err, storage.ErrNoTimeline) {
		if create == nil {
			return nil, &NotFoundError{Key: key, Why: "does not exist on this safekeeper"}
		}
		if r.isStopping() {
			return nil, ErrStopped // no new timeline once shutdown began
		}
		if keys, err := r.db.Timelines(); err == nil && r.cfg.MaxTimelines > 0 && len(keys) >= r.cfg.MaxTimelines {
			r.cfg.Metrics.refused("timelines")
			return nil, &Error{Kind: ErrLimit, Msg: fmt.Sprintf("cannot create timeline %s: this safekeeper holds %d, its --max-timelines is %d",
				key, len(keys), r.cfg.MaxTimelines)}
		}
		if major := create.PgVersion / 10000; major != supportedPgMajor {
			return nil, fmt.Errorf("%w: PostgreSQL major version %d: this safekeeper decodes PostgreSQL %d WAL only",
				acceptor.ErrIncompatible, major, supportedPgMajor)
		}
		st = acceptor.NewState(create)
		if r.cfg.Hooks.Create != nil {
			store, err = r.cfg.Hooks.Create(st)
		} else {
			store, err = r.db.CreateTimeline(st)
		}
		if err == nil {
			r.log.Info("created timeline", "tenant_id", key.TenantID.String(), "timeline_id", key.TimelineID.String(), "system_id", create.SystemID,
				"pg_version", create.PgVersion, "wal_seg_size", create.WalSegSize)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", acceptor.ErrStorage, err)
	}
	return r.start(key, st, store)
}

// start builds the timeline's session; no goroutine starts (the owner's
// runs while it has something to wait for, retention is the retainer's).
func (r *Registry) start(key proto.TimelineKey, st acceptor.State, store *storage.Timeline) (*Timeline, error) {
	var sessStore acceptor.Storage = store
	if r.cfg.Hooks.Storage != nil {
		sessStore = r.cfg.Hooks.Storage(store)
	}
	// The session writes as it starts (acceptor.New durably cuts WAL above
	// flush_lsn). When it cannot — a full disk after a restart — the
	// timeline still opens, read-only: its durable state and committed WAL
	// are served, and the next proposer greeting tries again.
	sess, err := acceptor.NewSession(acceptor.Config{NodeID: r.cfg.NodeID}, st, sessStore)
	if err != nil {
		return nil, err
	}
	if broken := sess.Broken(); broken != nil {
		r.log.Error("timeline opened read-only: storage cannot write; a proposer's next greeting retries",
			"tenant_id", key.TenantID.String(), "timeline_id", key.TimelineID.String(), "flush_lsn", st.FlushLSN, "commit_lsn", st.CommitLSN, "err", broken)
	}
	tlog := r.log.With("tenant_id", key.TenantID.String(), "timeline_id", key.TimelineID.String())
	repl, err := newReplState(store, st.PgTimeline, tlog)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", acceptor.ErrStorage, err)
	}
	repl.maxSlots = r.cfg.MaxSlots
	repl.metrics = r.cfg.Metrics
	backupLSN, err := store.BackupLSN()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", acceptor.ErrStorage, err)
	}
	t := &Timeline{
		key: key, log: tlog, kick: make(chan struct{}, 1),
		state: sess.InMem(), store: store, repl: repl, stopped: make(chan struct{}),
		onPublish: r.cfg.Hooks.OnPublish, persistEvery: persistInterval, budget: r.budget, metrics: r.cfg.Metrics, recycle: r.cfg.Recycle,
	}
	if r.cfg.Hooks.PersistInterval != 0 {
		t.persistEvery = r.cfg.Hooks.PersistInterval
	}
	t.backup.lsn.Store(uint64(backupLSN))
	t.notify = r.cfg.Backup
	t.own = &owner{t: t, sess: sess}
	repl.ret, repl.tl = r.ret, t
	return t, nil
}
