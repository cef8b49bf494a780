package backup

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/timeline"
	"github.com/safekeeper/safekeeper/storage/archive"
	"github.com/safekeeper/safekeeper/storage/remote"
)

// Defaults of Config.
const (
	DefaultJobs            = 4
	DefaultPartialInterval = 10 * time.Second
	DefaultTakeover        = 3 * time.Second
	// errorLogInterval: a timeline's store errors are logged at most this
	// often (the metric counts each).
	errorLogInterval = time.Minute
	// tickInterval is how often the timelines waiting for a time are
	// looked at.
	tickInterval = 100 * time.Millisecond
	// maxBackoff bounds the wait before a timeline's next attempt after
	// an error.
	maxBackoff = 30 * time.Second
	// opTimeout bounds one object's upload or check.
	opTimeout = 2 * time.Minute
)

// Config configures an Uploader.
type Config struct {
	Store remote.Storage
	Codec *archive.Codec
	// NodeID is this safekeeper's node id (its place in the turn order).
	NodeID uint64
	// Jobs bounds the segments uploaded at once, over all timelines.
	Jobs int
	// PartialInterval is how often the unfinished segment is uploaded
	// while it changes.
	PartialInterval time.Duration
	// Takeover bounds the delay before this safekeeper does work another
	// may be doing (see the package comment).
	Takeover time.Duration
	// Retention: WAL stored in the archive longer ago than this is
	// deleted from it (archive.Prune by age: whole segments, oldest first,
	// never the newest partial nor a history file); 0 keeps it all.
	Retention time.Duration
	Logger    *slog.Logger
	Metrics   *Metrics
}

// Metrics are the uploader's server-wide instruments.
type Metrics struct {
	Uploaded    prometheus.Counter     // bytes written to the store
	WALUploaded prometheus.Counter     // WAL bytes those hold, uncompressed
	Segments    prometheus.Counter     // whole segments this safekeeper uploaded
	Errors      *prometheus.CounterVec // by kind: store, conflict, local
}

// NewMetrics makes the instruments (the HTTP API registers them).
func NewMetrics() *Metrics {
	m := &Metrics{
		Uploaded: prometheus.NewCounter(prometheus.CounterOpts{Name: "safekeeper_backup_uploaded_bytes_total",
			Help: "Bytes this safekeeper wrote to the archive (compressed, with headers)."}),
		WALUploaded: prometheus.NewCounter(prometheus.CounterOpts{Name: "safekeeper_backup_wal_bytes_total",
			Help: "WAL bytes, uncompressed, in the objects this safekeeper wrote to the archive."}),
		Segments: prometheus.NewCounter(prometheus.CounterOpts{Name: "safekeeper_backed_up_segments_total",
			Help: "Whole WAL segments this safekeeper uploaded to the archive."}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "safekeeper_backup_errors_total",
			Help: "Archive uploads that failed, by kind: store (unreachable, an error status, credentials), conflict (an object of that name holds other WAL: a split brain), local (this safekeeper could not read the WAL)."}, []string{"kind"}),
	}
	for _, k := range []string{"store", "conflict", "local"} {
		m.Errors.WithLabelValues(k)
	}
	return m
}

// Collectors are the instruments, for registration.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Uploaded, m.WALUploaded, m.Segments, m.Errors}
}

// Uploader uploads the WAL of a registry's timelines.
type Uploader struct {
	cfg Config
	log *slog.Logger
	reg *timeline.Registry

	jobs chan struct{} // a token per segment upload under way

	mu    sync.Mutex
	state map[proto.TimelineKey]*tlState
	ready []*tlState    // changed, not running, no wait pending
	wake  chan struct{} // capacity 1: the dispatcher looks again
	stop  chan struct{}
	wg    sync.WaitGroup
	ctx   context.Context
	halt  context.CancelFunc
	// errLogged is when a store error was last logged (any timeline).
	errLogged time.Time
}

// tlState is the uploader's view of one timeline. Fields other than t are
// guarded by Uploader.mu, but for those only the timeline's pass touches
// while running is set.
type tlState struct {
	t        *timeline.Timeline
	changed  bool      // notified since the last pass started
	running  bool      // a pass runs
	queued   bool      // in ready
	backoff  time.Time // no pass before (after an error)
	timer    time.Time // a pass then even without a change (the partial's timer, a turn); zero: none
	delay    time.Duration
	failures int

	// Owned by the running pass:
	pendingSeg   proto.LSN // the lowest segment not archived...
	pendingSince time.Time // ...complete since
	active       bool      // this safekeeper uploaded the last segments it found missing
	othersAt     time.Time // when a pass last found segments another safekeeper stored
	seenPartial  proto.LSN // the newest partial's end, as last listed...
	seenAt       time.Time // ...first seen then
	ownPartial   proto.LSN // the end of the partial this safekeeper wrote last
	partialAt    time.Time // when this safekeeper last looked at partials
	histories    map[uint32]bool
	prunedAt     time.Time // the archive retention's last pass
}

// New returns an uploader of reg's timelines; Start starts it.
func New(reg *timeline.Registry, cfg Config) *Uploader {
	if cfg.Jobs <= 0 {
		cfg.Jobs = DefaultJobs
	}
	if cfg.PartialInterval <= 0 {
		cfg.PartialInterval = DefaultPartialInterval
	}
	if cfg.Takeover <= 0 {
		cfg.Takeover = DefaultTakeover
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Uploader{
		cfg: cfg, log: cfg.Logger, reg: reg, jobs: make(chan struct{}, cfg.Jobs),
		state: map[proto.TimelineKey]*tlState{}, wake: make(chan struct{}, 1), stop: make(chan struct{}),
		ctx: ctx, halt: cancel,
	}
}

// SetRegistry names the registry whose timelines are uploaded (the
// registry is made with the uploader as its Config.Backup, so after it).
func (u *Uploader) SetRegistry(reg *timeline.Registry) { u.reg = reg }

// Start runs the dispatcher.
func (u *Uploader) Start() {
	u.wg.Add(1)
	go u.dispatch()
}

// Close stops the uploader: uploads under way are cancelled (what they
// did not finish is not in the archive and backup_lsn did not move past
// it), and Close returns when they have returned.
func (u *Uploader) Close() {
	u.mu.Lock()
	select {
	case <-u.stop:
		u.mu.Unlock()
		return
	default:
	}
	close(u.stop)
	u.mu.Unlock()
	u.halt()
	u.wg.Wait()
}

// Changed is the timelines' BackupNotifier: t's state changed. A
// timeline calls it once until a pass takes the change
// (Timeline.TakeBackupChange).
func (u *Uploader) Changed(t *timeline.Timeline) {
	u.mu.Lock()
	s := u.stateOf(t)
	s.changed = true
	u.readyLocked(s)
	u.mu.Unlock()
}

// readyLocked queues s for a pass now if it changed, runs none and waits
// for nothing. mu held.
func (u *Uploader) readyLocked(s *tlState) {
	if !s.changed || s.running || s.queued || time.Now().Before(s.backoff) {
		return
	}
	s.queued = true
	u.ready = append(u.ready, s)
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// stateOf returns t's state, made at first sight. mu held.
func (u *Uploader) stateOf(t *timeline.Timeline) *tlState {
	s := u.state[t.Key()]
	if s == nil || s.t != t {
		s = &tlState{t: t, delay: u.turnDelay(t.Key()), changed: true}
		u.state[t.Key()] = s
		u.readyLocked(s)
	}
	return s
}

// turnDelay is this safekeeper's delay for timeline key: a hash of the
// node id and the timeline, scaled into [Takeover/2, Takeover). The floor
// leaves the active uploader, which does not wait, time to store a new
// segment before the others look for it: a delay near zero had one of
// them store most segments a second time.
func (u *Uploader) turnDelay(key proto.TimelineKey) time.Duration {
	h := fnv.New64a()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], u.cfg.NodeID)
	h.Write(b[:])
	h.Write(key.TenantID[:])
	h.Write(key.TimelineID[:])
	half := u.cfg.Takeover / 2
	return half + time.Duration(h.Sum64()%uint64(u.cfg.Takeover-half))
}

// dispatch starts a pass for every timeline that changed or whose wait is
// over, one pass per timeline at a time; every PartialInterval it also
// looks at every running timeline (those opened at start and not written
// to since still have WAL to archive) and forgets the stopped ones.
func (u *Uploader) dispatch() {
	defer u.wg.Done()
	tick := time.NewTicker(tickInterval)
	defer tick.Stop()
	var lastScan, lastTick time.Time
	for {
		select {
		case <-u.stop:
			return
		case <-u.wake:
		case <-tick.C:
		}
		now := time.Now()
		if now.Sub(lastScan) >= u.cfg.PartialInterval && u.reg != nil {
			lastScan = now
			running := u.reg.Running()
			u.mu.Lock()
			alive := make(map[*timeline.Timeline]bool, len(running))
			for _, t := range running {
				alive[t] = true
				u.stateOf(t)
			}
			for k, s := range u.state {
				if !alive[s.t] && !s.running {
					delete(u.state, k)
				}
			}
			u.mu.Unlock()
		}
		u.mu.Lock()
		start := func(s *tlState) {
			s.queued = false
			if s.running || now.Before(s.backoff) || (!s.changed && (s.timer.IsZero() || now.Before(s.timer))) {
				return // running, backing off, or nothing new and no timer due
			}
			s.changed, s.running, s.timer = false, true, time.Time{}
			s.t.TakeBackupChange()
			u.wg.Add(1)
			go u.runPass(s)
		}
		ready := u.ready
		u.ready = nil
		for _, s := range ready {
			start(s)
		}
		if now.Sub(lastTick) >= tickInterval {
			// The timelines whose wait is over.
			lastTick = now
			for _, s := range u.state {
				if !s.timer.IsZero() || (s.changed && !s.backoff.IsZero()) {
					start(s)
				}
			}
		}
		u.mu.Unlock()
	}
}

func (u *Uploader) runPass(s *tlState) {
	defer u.wg.Done()
	again, err := u.pass(s)
	if err == nil && again <= 0 && s.t.BackupLSN() < s.t.State().CommitLSN {
		// Commits came while the pass ran, within the segment: setWake
		// waits for the segment's end, so the partial's timer looks again
		// (a pass that found the archive caught up armed none).
		again = u.cfg.PartialInterval
	}
	if err == nil {
		u.setWake(s.t)
	} else {
		s.t.WakeBackupAt(0)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	s.running = false
	switch {
	case err != nil && u.ctx.Err() == nil:
		s.failures++
		wait := min(time.Second<<min(s.failures-1, 5), maxBackoff)
		s.backoff, s.changed = time.Now().Add(wait), true // the retry is a pass like a change's
		u.logError(s, err, wait)
	case err != nil:
	default:
		s.failures, s.backoff = 0, time.Time{}
		if again > 0 {
			s.timer = time.Now().Add(again)
		}
	}
	u.readyLocked(s) // changed while the pass ran
}

// setWake tells t which commit_lsn is worth a pass: with the archive
// caught up, any higher one; behind it, the end of the segment commit_lsn
// is in (whole segments go at once; the partial upload has its timer).
// Commits below it cost the timeline one comparison and the uploader
// nothing.
func (u *Uploader) setWake(t *timeline.Timeline) {
	st := t.State()
	seg := uint64(st.WalSegSize)
	if seg == 0 || st.TimelineStartLSN == 0 {
		t.WakeBackupAt(0)
		return
	}
	wake := st.CommitLSN.SegmentStart(seg) + proto.LSN(seg)
	if t.BackupLSN() >= st.CommitLSN {
		wake = st.CommitLSN + 1
	}
	t.WakeBackupAt(wake)
	// A commit that came while the pass ended, compared against the old
	// threshold, must not be lost.
	if t.State().CommitLSN >= wake {
		t.WakeBackupAt(0)
		u.Changed(t)
	}
}

// logError logs an upload error: a conflict every time (it never heals by
// itself), others at most once a minute over all timelines.
func (u *Uploader) logError(s *tlState, err error, retry time.Duration) {
	l := s.t.Log()
	switch {
	case errors.Is(err, archive.ErrConflict):
		u.cfg.Metrics.Errors.WithLabelValues("conflict").Inc()
		l.Error("ARCHIVE CONFLICT: an object in the archive holds other WAL than this safekeeper's; backup_lsn stops here until an operator looks (split brain, or two clusters writing one prefix)",
			"err", err, "retry_in", retry.String())
	case errors.Is(err, errLocal):
		u.cfg.Metrics.Errors.WithLabelValues("local").Inc()
		l.Warn("archive upload: cannot read local WAL", "err", err, "retry_in", retry.String())
	default:
		u.cfg.Metrics.Errors.WithLabelValues("store").Inc()
		if now := time.Now(); now.Sub(u.errLogged) >= errorLogInterval {
			u.errLogged = now
			l.Warn("archive upload failed; the WAL not yet in the archive stays on local disk (disk limits protect the disk); retrying with backoff",
				"store", u.cfg.Store.String(), "backup_lsn", s.t.BackupLSN(), "err", err, "retry_in", retry.String())
		}
	}
}

// errLocal marks errors reading this safekeeper's own WAL.
var errLocal = errors.New("local WAL")

// pass archives what it can of one timeline and returns when to look
// again without a change (0: at the next change).
func (u *Uploader) pass(s *tlState) (time.Duration, error) {
	t := s.t
	st := t.State()
	if st.TimelineStartLSN == 0 || st.CommitLSN <= st.TimelineStartLSN || st.WalSegSize == 0 {
		return 0, nil
	}
	seg := uint64(st.WalSegSize)
	commit := st.CommitLSN
	t.MarkBackup(t.BackupLSN() < commit)
	ar := archive.Open(u.cfg.Store, u.cfg.Codec, t.Key())
	var ends []proto.PgTimelineEnd
	if len(st.PgHistory) > 0 {
		var err error
		if ends, err = proto.ParsePgHistory(st.PgTimeline, st.PgHistory); err != nil {
			return 0, fmt.Errorf("%w: the stored history of PostgreSQL timeline %d does not parse: %v", errLocal, st.PgTimeline, err)
		}
	}
	if err := u.putHistories(s, ar, &st, ends); err != nil {
		return 0, err
	}
	tliOf := func(at proto.LSN) uint32 { return proto.PgSegmentTimeline(ends, st.PgTimeline, at, seg) }

	// Whole segments, from the one holding backup_lsn (or the archive's
	// start: the first segment this timeline holds from its first byte).
	from := t.BackupLSN()
	if from == 0 {
		from = max(st.TimelineStartLSN, st.RemovedUpTo, t.RemovedUpTo())
		if from.SegmentOffset(seg) != 0 {
			from = from.SegmentStart(seg) + proto.LSN(seg)
		}
	}
	first := from.SegmentStart(seg)
	if first+proto.LSN(seg) <= commit {
		// WAL a prune deleted (archive retention, `archive prune`) is not
		// stored again: the archive starts after it now.
		ctx, cancel := context.WithTimeout(u.ctx, opTimeout)
		pruned, err := ar.PrunedTo(ctx)
		cancel()
		if err != nil {
			return 0, err
		}
		if pruned > first {
			first = min(pruned, commit).SegmentStart(seg)
			if err := t.SetBackupLSN(first); err != nil {
				return 0, fmt.Errorf("%w: %v", errLocal, err)
			}
		}
	}
	if first+proto.LSN(seg) <= commit {
		if s.pendingSeg != first || s.pendingSince.IsZero() {
			s.pendingSeg, s.pendingSince = first, time.Now()
		}
		// This safekeeper's turn: it uploaded the last segments itself
		// (the one working goes on without waiting), or its delay passed.
		mine := s.active || time.Since(s.pendingSince) >= s.delay
		direct := s.active
		if !mine && first+2*proto.LSN(seg) <= commit && time.Since(s.othersAt) > othersWindow {
			// A backlog (more than the segment just completed) and nobody
			// else at work (no partial object stored lately, nor the
			// segment before the backlog), as after a restart: it need not
			// wait for a turn, nor look for each segment before storing
			// it. One segment alone waits: after a quiet spell the partial
			// is old because nothing changed, not because its uploader is
			// gone, and the turn keeps the others from storing that
			// segment with it. So do segments that complete together
			// after a stall of the WAL, while another safekeeper has been
			// seen storing them (within othersWindow): its partials and
			// segments stopped with the WAL, not because it is gone, and
			// the turn lets it go on alone (if it is gone, the turn hands
			// them over all the same, a few seconds later). The shortcut
			// is for a backlog found at start or after a long silence.
			prev := ""
			if first >= st.TimelineStartLSN.SegmentStart(seg)+proto.LSN(seg) {
				prev = ar.SegmentName(proto.SegmentFileName(tliOf(first-proto.LSN(seg)), first-proto.LSN(seg), seg))
			}
			idle, err := u.archiveIdle(ar, prev)
			if err != nil {
				return 0, err
			}
			mine, direct = idle, idle
		}
		done, uploaded, err := u.segments(ar, t, &st, first, commit, mine, direct, tliOf)
		switch {
		case uploaded > 0:
			s.active = true
		case done > 0:
			s.active = false // another safekeeper stored them
			s.othersAt = time.Now()
		}
		first += proto.LSN(uint64(done) * seg)
		if done > 0 {
			// The first segment not in the archive now is a new one, and
			// so is this safekeeper's wait for it, which starts when a
			// pass finds it complete. Carried over from the segments
			// another stored, the wait would be long over by then, and
			// this one would store the segment while the active uploader
			// does too (an active uploader goes on without a wait).
			s.pendingSince = time.Time{}
		}
		if err != nil {
			return 0, err
		}
		if first+proto.LSN(seg) <= commit {
			// Not archived yet and not this safekeeper's turn: look again
			// when it comes (soon, if it came while the checks ran). The
			// partial waits: backup_lsn never passes a missing segment.
			return max(s.delay-time.Since(s.pendingSince), 0) + 10*time.Millisecond, nil
		}
	}
	u.retain(s, ar)

	// The unfinished segment, up to commit_lsn.
	if commit.SegmentOffset(seg) == 0 || t.BackupLSN() >= commit {
		t.MarkBackup(t.BackupLSN() < commit)
		return 0, nil
	}
	wait, err := u.partial(s, ar, t, &st, tliOf(commit))
	t.MarkBackup(t.BackupLSN() < commit)
	return wait, err
}

// segments archives the whole segments from first up to commit, a window
// of them at a time (at most Jobs uploads at once over all timelines, each
// a token taken before its WAL is read): each is checked in the archive,
// and uploaded if it is not there and upload is set. They are taken in
// order as they finish, backup_lsn moving over each, and the first that
// is not there (or fails) ends it; those still running then finish, and
// what they stored a later pass finds. It returns how many from first are
// in the archive, contiguously, and how many of those it uploaded.
//
// direct (this safekeeper stored the segments before these) skips the
// look into the archive before each upload: the store refuses a name that
// exists, and Put then compares its content.
func (u *Uploader) segments(ar *archive.Archive, t *timeline.Timeline, st *acceptor.State, first, commit proto.LSN, upload, direct bool, tliOf func(proto.LSN) uint32) (done, uploaded int, err error) {
	seg := proto.LSN(st.WalSegSize)
	type result struct {
		there, uploaded bool
		err             error
	}
	var window []chan result
	next := first
	stop := false
	launch := func() {
		at, out := next, make(chan result, 1)
		next += seg
		window = append(window, out)
		go func() {
			select {
			case u.jobs <- struct{}{}:
			case <-u.ctx.Done():
				out <- result{err: u.ctx.Err()}
				return
			}
			var r result
			r.there, r.uploaded, r.err = u.segment(ar, t, st, at, upload, direct, tliOf(at))
			<-u.jobs
			out <- r
		}()
	}
	// backup_lsn is stored every few segments, not after each (an fsync
	// each), and where it ends.
	saved := 0
	save := func() error {
		if done == saved {
			return nil
		}
		saved = done
		if err := t.SetBackupLSN(first + proto.LSN(done)*seg); err != nil {
			return fmt.Errorf("%w: %v", errLocal, err)
		}
		return nil
	}
	for {
		for !stop && len(window) < 2*u.cfg.Jobs && next+seg <= commit && u.ctx.Err() == nil {
			launch()
		}
		if len(window) == 0 {
			break
		}
		r := <-window[0]
		window = window[1:]
		switch {
		case stop:
			continue // after the first gap: only waited for
		case r.err != nil || !r.there:
			stop, err = true, r.err
			continue
		}
		done++
		if r.uploaded {
			uploaded++
		}
		if done-saved >= 8 {
			if err := save(); err != nil {
				stop = true
				for _, w := range window {
					<-w
				}
				return done, uploaded, err
			}
		}
	}
	if serr := save(); serr != nil && err == nil {
		err = serr
	}
	return done, uploaded, err
}

// segment makes sure the segment at start is in the archive: there
// already (with this safekeeper's content), or uploaded now if upload is
// set. It reports whether it is there, and whether this call stored it.
func (u *Uploader) segment(ar *archive.Archive, t *timeline.Timeline, st *acceptor.State, start proto.LSN, upload, direct bool, tli uint32) (there, uploaded bool, err error) {
	ctx, cancel := context.WithTimeout(u.ctx, opTimeout)
	defer cancel()
	seg := uint64(st.WalSegSize)
	name := ar.SegmentName(proto.SegmentFileName(tli, start, seg))
	err = remote.ErrNotFound
	var h archive.Header
	if !(direct && upload) {
		h, _, err = ar.Head(ctx, name)
	}
	switch {
	case err == nil:
		// Stored by another safekeeper (or by this one before a crash):
		// checked against the local WAL when it is still here.
		content, rerr := readSegment(t, start, seg)
		if rerr != nil {
			// Not here any more (retention, a pull): the archive's
			// header vouches for it.
			return h.Kind == archive.KindSegment && h.Start == start && h.SystemID == st.SystemID, false, nil
		}
		want := archive.Header{Kind: archive.KindSegment, SystemID: st.SystemID, PgTimeline: tli, SegSize: uint32(seg), Start: start, Length: seg}
		want.Sum = sumOf(content)
		releaseSegment(content)
		if !h.Same(want) {
			return false, false, fmt.Errorf("%w: %s holds %s..%s sha256 %x, this safekeeper has sha256 %x", archive.ErrConflict, name, h.Start, h.End(), h.Sum[:8], want.Sum[:8])
		}
		return true, false, nil
	case errors.Is(err, remote.ErrNotFound):
	default:
		return false, false, err
	}
	if !upload {
		return false, false, nil
	}
	content, err := readSegment(t, start, seg)
	if err != nil {
		return false, false, err
	}
	// Put reads content only while it encodes it: the object it stores is
	// a buffer of its own.
	size, existed, err := ar.Put(ctx, name, archive.Header{Kind: archive.KindSegment, SystemID: st.SystemID, PgTimeline: tli, SegSize: uint32(seg), Start: start}, content)
	releaseSegment(content)
	if err != nil {
		return false, false, err
	}
	if !existed {
		u.cfg.Metrics.Uploaded.Add(float64(size))
		u.cfg.Metrics.WALUploaded.Add(float64(seg))
		u.cfg.Metrics.Segments.Inc()
		t.Log().Debug("archived segment", "segment", proto.SegmentFileName(tli, start, seg), "bytes", size)
	}
	return true, !existed, nil
}

// partial uploads the unfinished segment up to commit_lsn when it is this
// safekeeper's turn (see the package comment), and returns when to look
// again.
func (u *Uploader) partial(s *tlState, ar *archive.Archive, t *timeline.Timeline, st *acceptor.State, tli uint32) (time.Duration, error) {
	commit := st.CommitLSN
	seg := uint64(st.WalSegSize)
	now := time.Now()
	if !s.partialAt.IsZero() && now.Sub(s.partialAt) < u.cfg.PartialInterval {
		return u.cfg.PartialInterval - now.Sub(s.partialAt), nil
	}
	s.partialAt = now
	ctx, cancel := context.WithTimeout(u.ctx, opTimeout)
	defer cancel()
	parts, err := ar.Partials(ctx)
	if err != nil {
		return 0, err
	}
	var newest proto.LSN
	if len(parts) > 0 {
		newest = parts[len(parts)-1].End
	}
	start := commit.SegmentStart(seg)
	if newest >= commit {
		return 0, u.adopt(t, min(newest, commit), start)
	}
	if newest != s.seenPartial {
		s.seenPartial, s.seenAt = newest, now
	}
	// Another safekeeper keeps the partial fresh: not this one's turn.
	if newest != 0 && newest != s.ownPartial && now.Sub(s.seenAt) < u.cfg.PartialInterval+s.delay {
		if err := u.adopt(t, newest, start); err != nil {
			return 0, err
		}
		return u.cfg.PartialInterval + s.delay - now.Sub(s.seenAt), nil
	}
	if newest == 0 && now.Sub(s.seenAt) < s.delay {
		return s.delay - now.Sub(s.seenAt), nil
	}
	content, err := readWAL(t, start, uint64(commit-start))
	if err != nil {
		return 0, err
	}
	name := ar.PartialName(proto.SegmentFileName(tli, start, seg), commit)
	size, existed, err := ar.Put(ctx, name, archive.Header{Kind: archive.KindPartial, SystemID: st.SystemID, PgTimeline: tli, SegSize: uint32(seg), Start: start}, content)
	if err != nil {
		return 0, err
	}
	if !existed {
		u.cfg.Metrics.Uploaded.Add(float64(size))
		u.cfg.Metrics.WALUploaded.Add(float64(len(content)))
	}
	s.ownPartial, s.seenPartial, s.seenAt = commit, commit, now
	if err := u.adopt(t, commit, start); err != nil { // only over whole segments all there
		return 0, err
	}
	// The older partials are superseded (their WAL is a prefix of this
	// one's, or in whole segments now).
	for _, p := range parts {
		if p.End < commit {
			if err := u.cfg.Store.Delete(ctx, p.Name); err != nil {
				return 0, err
			}
		}
	}
	return u.cfg.PartialInterval, nil
}

// retainEvery is how often a timeline's archive retention runs: a tenth
// of the retention, between a second and an hour.
func retainEvery(r time.Duration) time.Duration { return min(max(r/10, time.Second), time.Hour) }

// retain runs the archive retention of a timeline when it is due (every
// safekeeper does: deletes of what another deleted are no error).
func (u *Uploader) retain(s *tlState, ar *archive.Archive) {
	if u.cfg.Retention <= 0 || time.Since(s.prunedAt) < retainEvery(u.cfg.Retention) {
		return
	}
	s.prunedAt = time.Now()
	ctx, cancel := context.WithTimeout(u.ctx, opTimeout)
	defer cancel()
	res, err := archive.Prune(ctx, ar, archive.PruneOptions{OlderThan: u.cfg.Retention})
	if len(res.Deleted) > 0 {
		s.t.Log().Info("archive retention deleted old WAL", "objects", len(res.Deleted), "bytes", res.DeletedBytes,
			"archive_start", res.Start, "archive_retention", u.cfg.Retention.String())
	}
	if err != nil && u.ctx.Err() == nil {
		u.cfg.Metrics.Errors.WithLabelValues("store").Inc()
		s.t.Log().Warn("archive retention failed; retrying later", "err", err)
	}
}

// othersWindow is how long after finding segments another safekeeper
// stored a pass does not take the archive for idle (see pass).
const othersWindow = time.Minute

// archiveIdle reports whether no safekeeper has stored a partial object
// of the timeline, nor the segment prev ("": none), lately (within a
// partial interval and a turn): then no uploader is at work and this one
// need not wait for its turn. Clocks: the store's modification time
// against this machine's, with that margin.
func (u *Uploader) archiveIdle(ar *archive.Archive, prev string) (bool, error) {
	ctx, cancel := context.WithTimeout(u.ctx, opTimeout)
	defer cancel()
	recent := func(m time.Time) bool { return time.Since(m) < u.cfg.PartialInterval+u.cfg.Takeover }
	parts, err := ar.Partials(ctx)
	if err != nil {
		return false, err
	}
	for _, p := range parts {
		if recent(p.Modified) {
			return false, nil
		}
	}
	if prev != "" {
		o, err := u.cfg.Store.Stat(ctx, prev)
		switch {
		case errors.Is(err, remote.ErrNotFound): // pruned, or never stored
		case err != nil:
			return false, err
		case recent(o.Modified):
			return false, nil
		}
	}
	return true, nil
}

// adopt moves backup_lsn to end, the end of a partial another safekeeper
// wrote, when every segment below it is in the archive (backup_lsn has
// reached the partial's segment start).
func (u *Uploader) adopt(t *timeline.Timeline, end, segStart proto.LSN) error {
	if t.BackupLSN() < segStart {
		return nil
	}
	if err := t.SetBackupLSN(end); err != nil {
		return fmt.Errorf("%w: %v", errLocal, err)
	}
	return nil
}

func sumOf(b []byte) [32]byte { return sha256.Sum256(b) }

// readWAL reads n bytes of the timeline's WAL from start.
func readWAL(t *timeline.Timeline, start proto.LSN, n uint64) ([]byte, error) {
	return readWALInto(t, start, n, make([]byte, n))
}

// segmentBufs holds segment-sized buffers between uploads: a fresh 16 MiB
// per segment is zeroed by the runtime and faulted in by the kernel, a
// few percent of an upload's CPU.
var segmentBufs sync.Pool

// readSegment is readWAL of a whole segment into a buffer from
// segmentBufs; the caller gives it back with releaseSegment once nothing
// refers to it.
func readSegment(t *timeline.Timeline, start proto.LSN, seg uint64) ([]byte, error) {
	var buf []byte
	if p, ok := segmentBufs.Get().(*[]byte); ok && uint64(cap(*p)) >= seg {
		buf = (*p)[:seg]
	} else {
		buf = make([]byte, seg)
	}
	b, err := readWALInto(t, start, seg, buf)
	if err != nil {
		releaseSegment(buf)
	}
	return b, err
}

func releaseSegment(buf []byte) { segmentBufs.Put(&buf) }

// readWALInto is readWAL into buf (n bytes long).
func readWALInto(t *timeline.Timeline, start proto.LSN, n uint64, buf []byte) ([]byte, error) {
	for off := uint64(0); off < n; {
		m, err := t.ReadWAL(start+proto.LSN(off), buf[off:min(n, off+1<<20)])
		if err != nil {
			return nil, fmt.Errorf("%w: read %s: %v", errLocal, start+proto.LSN(off), err)
		}
		if m == 0 {
			return nil, fmt.Errorf("%w: WAL ends at %s, below %s", errLocal, start+proto.LSN(off), start+proto.LSN(n))
		}
		off += uint64(m)
	}
	return buf, nil
}

// putHistories stores the history files of the timeline's PostgreSQL
// timeline and its ancestors, once per process each.
func (u *Uploader) putHistories(s *tlState, ar *archive.Archive, st *acceptor.State, ends []proto.PgTimelineEnd) error {
	if st.PgTimeline < 2 || len(st.PgHistory) == 0 || s.histories[st.PgTimeline] {
		return nil
	}
	ctx, cancel := context.WithTimeout(u.ctx, opTimeout)
	defer cancel()
	put := func(tli uint32, content []byte) error {
		_, _, err := ar.Put(ctx, ar.HistoryName(tli), archive.Header{Kind: archive.KindHistory, SystemID: st.SystemID, PgTimeline: tli}, content)
		return err
	}
	for _, e := range ends {
		if e.TLI < 2 {
			continue
		}
		b, ok := proto.PgHistoryPrefix(st.PgHistory, e.TLI)
		if !ok {
			return fmt.Errorf("%w: the history of PostgreSQL timeline %d has no line for its ancestor %d", errLocal, st.PgTimeline, e.TLI)
		}
		if err := put(e.TLI, b); err != nil {
			return err
		}
	}
	if err := put(st.PgTimeline, st.PgHistory); err != nil {
		return err
	}
	if s.histories == nil {
		s.histories = map[uint32]bool{}
	}
	s.histories[st.PgTimeline] = true
	return nil
}
