package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/server/auth"
	"github.com/safekeeper/safekeeper/storage"
)

// supportedPgMajor is the PostgreSQL major version whose WAL format
// (page magic 0xD110, record layout) proto/xlog decodes.
const supportedPgMajor = 15

// timelineFor returns the running timeline named by m, opening it from disk
// or, if it is new and create is set (START_WAL_PUSH's
// allow_timeline_creation), creating it (atomically, rule 1). A timeline
// that is not stored and may not be created is errNoTimeline's refusal.
func (s *Server) timelineFor(m *proto.ServerInfo, create bool) (*timeline, error) {
	key := proto.TimelineKey{TenantID: m.TenantID, TimelineID: m.TimelineID}
	if !create {
		t, err := s.openTimeline(key, nil)
		var pe *pgwire.Error
		if errors.As(err, &pe) && pe.Code == pgwire.UndefinedObject {
			return nil, errNoTimeline(pe)
		}
		return t, err
	}
	return s.openTimeline(key, m)
}

// errNoTimeline is the refusal of a greeting that names a timeline this
// safekeeper does not hold when its START_WAL_PUSH did not allow creating
// it: undefined_object, as PostgreSQL refuses a missing slot, keeping the
// open's own message (it may say the timeline is being deleted).
func errNoTimeline(open *pgwire.Error) *pgwire.Error {
	e := *open
	e.Detail = "START_WAL_PUSH did not allow timeline creation (allow_timeline_creation false)."
	e.Hint = "Check the tenant and timeline ids; a new timeline is created by a proposer allowed to create it."
	return &e
}

// timelineByKey returns the running timeline key, opening it from disk like
// timelineFor does; it never creates one (readers cannot create timelines).
// A timeline that is not stored is an *pgwire.Error with UndefinedObject.
func (s *Server) timelineByKey(key proto.TimelineKey) (*timeline, error) {
	return s.openTimeline(key, nil)
}

// openTimeline returns the running timeline key, opening it from disk, or,
// when it is not stored and create (the proposer's greeting) is given,
// creating it from create.
//
// Opening may write and fsync (acceptor.New cuts WAL above flush_lsn), so it
// runs outside s.mu, which every accept takes: one slow disk must not stop
// the server. Opens of one timeline are single-flight: the first caller
// opens, later ones wait for it; a caller whose open failed for its own
// reason (a reader finding no timeline where a greeting would create one)
// does not decide for the others, who then try themselves.
func (s *Server) openTimeline(key proto.TimelineKey, create *proto.ServerInfo) (*timeline, error) {
	for {
		s.mu.Lock()
		if t, ok := s.timelines[key]; ok {
			s.mu.Unlock()
			return t, nil
		}
		if s.isStopping() {
			s.mu.Unlock()
			return nil, errShutdown
		}
		if _, ok := s.deleting[key]; ok {
			s.mu.Unlock()
			return nil, pgwire.Errorf(pgwire.UndefinedObject, "timeline %s is being deleted on this safekeeper", key)
		}
		if op, ok := s.opening[key]; ok {
			s.mu.Unlock()
			<-op.done
			if op.err == nil {
				return op.t, nil
			}
			continue
		}
		op := &opening{done: make(chan struct{})}
		s.opening[key] = op
		s.openWG.Add(1) // not stopping (checked above, under mu): Shutdown waits for it
		s.mu.Unlock()

		op.t, op.err = s.open(key, create)
		s.mu.Lock()
		delete(s.opening, key)
		if op.err == nil {
			s.timelines[key] = op.t
		}
		s.mu.Unlock()
		close(op.done)
		s.openWG.Done()
		return op.t, op.err
	}
}

// openAtStartWorkers bounds the opens openStored runs at once. An open is
// a read transaction (the control record, the WAL bucket's ends, the
// slots) and two goroutines started; it writes only to cut WAL above
// flush_lsn. Four keep a cold disk's reads overlapping without taking
// the cores a server that already serves needs.
const openAtStartWorkers = 4

// openStored opens every stored timeline, as Neon's safekeeper loads its
// timelines at start, so that their metrics and the timeline list are there
// before any client asks for them. Serve runs it in the background (it
// counts in openWG): the server serves meanwhile, and a client that asks
// for a timeline not yet open opens it itself (single-flight with this).
// At most openAtStartWorkers opens run at once. A timeline that fails to
// open is logged and left for a client's open to retry; one deleted since
// the list was read is skipped; shutdown stops it after the opens under
// way. It logs one line at the end: the count and the time taken.
func (s *Server) openStored() {
	defer s.openWG.Done()
	start := time.Now()
	keys, err := s.db.Timelines()
	if err != nil {
		if !s.isStopping() {
			s.log.Error("could not list the stored timelines to open them at start; each opens when a client asks for it", "err", err)
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
				if i >= int64(len(keys)) || s.isStopping() {
					return
				}
				key := keys[i]
				_, err := s.timelineByKey(key)
				var pe *pgwire.Error
				switch {
				case err == nil:
					opened.Add(1)
				case s.isStopping():
					return
				case errors.As(err, &pe) && pe.Code == pgwire.UndefinedObject:
					gone.Add(1) // deleted since the list was read, or being deleted
				default:
					failed.Add(1)
					s.log.Error("could not open timeline at start; a client's open retries it", "tenant_id", key.TenantID.String(),
						"timeline_id", key.TimelineID.String(), "err", err)
				}
			}
		}()
	}
	wg.Wait()
	if s.isStopping() {
		s.log.Info("stopped opening the stored timelines: shutting down", "opened", opened.Load(), "stored", len(keys),
			"duration", time.Since(start).Round(time.Millisecond))
		return
	}
	s.log.Info("opened the stored timelines", "timelines", opened.Load(), "failed", failed.Load(), "deleted", gone.Load(),
		"duration", time.Since(start).Round(time.Millisecond))
}

// opening is an open of a timeline in progress; done is closed when t or
// err is set.
type opening struct {
	done chan struct{}
	t    *timeline
	err  error
}

// open opens or creates timeline key and starts it. It does not hold s.mu.
func (s *Server) open(key proto.TimelineKey, create *proto.ServerInfo) (*timeline, error) {
	if s.hooks.beforeOpen != nil {
		s.hooks.beforeOpen(key)
	}
	store, st, err := s.db.OpenTimeline(key.TenantID, key.TimelineID)
	if errors.Is(err, storage.ErrNoTimeline) {
		if create == nil {
			return nil, pgwire.Errorf(pgwire.UndefinedObject, "timeline %s does not exist on this safekeeper", key)
		}
		if s.isStopping() {
			return nil, errShutdown // no new timeline once shutdown began
		}
		if keys, err := s.db.Timelines(); err == nil && len(keys) >= s.cfg.MaxTimelines {
			s.metrics.refused.WithLabelValues("timelines").Inc()
			return nil, pgwire.Errorf(pgwire.ConfigurationLimitExceeded, "cannot create timeline %s: this safekeeper holds %d, its --max-timelines is %d", key, len(keys), s.cfg.MaxTimelines)
		}
		if major := create.PgVersion / 10000; major != supportedPgMajor {
			return nil, fmt.Errorf("%w: PostgreSQL major version %d: this safekeeper decodes PostgreSQL %d WAL only",
				acceptor.ErrIncompatible, major, supportedPgMajor)
		}
		st = acceptor.NewState(create)
		if s.hooks.create != nil {
			store, err = s.hooks.create(st)
		} else {
			store, err = s.db.CreateTimeline(st)
		}
		if err == nil {
			s.log.Info("created timeline", "tenant_id", key.TenantID.String(), "timeline_id", key.TimelineID.String(), "system_id", create.SystemID,
				"pg_version", create.PgVersion, "wal_seg_size", create.WalSegSize)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", acceptor.ErrStorage, err)
	}
	return s.startTimeline(key, st, store)
}

// startTimeline builds the timeline's session and starts its owner and
// retention goroutines.
func (s *Server) startTimeline(key proto.TimelineKey, st acceptor.State, store *storage.Timeline) (*timeline, error) {
	var sessStore acceptor.Storage = store
	if s.hooks.storage != nil {
		sessStore = s.hooks.storage(store)
	}
	// The session writes as it starts (acceptor.New durably cuts WAL above
	// flush_lsn). When it cannot — a full disk after a restart — the
	// timeline still opens, read-only: its durable state and committed WAL
	// are served, and the next proposer greeting tries again.
	sess, err := acceptor.NewSession(acceptor.Config{NodeID: s.cfg.NodeID}, st, sessStore)
	if err != nil {
		return nil, err
	}
	if broken := sess.Broken(); broken != nil {
		s.log.Error("timeline opened read-only: storage cannot write; a proposer's next greeting retries",
			"tenant_id", key.TenantID.String(), "timeline_id", key.TimelineID.String(), "flush_lsn", st.FlushLSN, "commit_lsn", st.CommitLSN, "err", broken)
	}
	tlog := s.log.With("tenant_id", key.TenantID.String(), "timeline_id", key.TimelineID.String())
	repl, err := newReplState(store, st.PgTimeline, tlog)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", acceptor.ErrStorage, err)
	}
	repl.maxSlots = s.cfg.MaxSlots
	repl.refused = s.metrics.refused
	t := &timeline{
		key: key, log: tlog, in: make(chan event, eventQueue),
		state: sess.InMem(), changed: make(chan struct{}), store: store, repl: repl, stopped: make(chan struct{}), retired: make(chan struct{}),
		onPublish: s.hooks.onPublish, persistEvery: persistInterval, walBudget: s.walBudget, metrics: s.metrics,
	}
	if s.hooks.persistInterval != 0 {
		t.persistEvery = s.hooks.persistInterval
	}
	ctx, cancel := context.WithCancel(s.ctx)
	t.cancel = cancel
	s.ownerWG.Add(2)
	go func() {
		defer s.ownerWG.Done()
		t.run(ctx, sess)
	}()
	go func() {
		defer s.ownerWG.Done()
		defer close(t.retired)
		s.runRetention(ctx, t)
		repl.saveAll()
	}()
	return t, nil
}

// resolveTimeline picks the timeline a reader means: the one its startup
// options name, else the only one stored (matching the tenant if only
// tenant_id was given). Otherwise the error names the choices.
//
// With auth on, only the timelines of the token's tenant are candidates
// (a safekeeperdata token sees all).
func (s *Server) resolveTimeline(ids startupIDs, claims *auth.Claims) (*timeline, error) {
	if ids.hasTenant && ids.hasTimeline {
		key := proto.TimelineKey{TenantID: ids.tenant, TimelineID: ids.timeline}
		// Refused before the lookup: another tenant's timeline that
		// exists and one that does not get the same answer.
		if err := allows(claims, s.auth != nil, key); err != nil {
			return nil, err
		}
		return s.timelineByKey(key)
	}
	all, err := s.db.Timelines()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", acceptor.ErrStorage, err)
	}
	var match []proto.TimelineKey
	for _, k := range all {
		if s.auth != nil && claims.CheckTenant(k.TenantID) != nil {
			continue
		}
		if (!ids.hasTenant || k.TenantID == ids.tenant) && (!ids.hasTimeline || k.TimelineID == ids.timeline) {
			match = append(match, k)
		}
	}
	switch len(match) {
	case 1:
		return s.timelineByKey(match[0])
	case 0:
		return nil, pgwire.Errorf(pgwire.UndefinedObject, "no timeline on this safekeeper matches the startup options")
	}
	names := make([]string, 0, len(match))
	for i, k := range match {
		if i == 8 {
			names = append(names, fmt.Sprintf("and %d more", len(match)-i))
			break
		}
		names = append(names, k.String())
	}
	e := pgwire.Errorf(pgwire.InvalidParameterValue, "this safekeeper holds %d timelines (%s): name one in the startup options",
		len(match), strings.Join(names, ", "))
	e.Hint = "Connect with options '-c tenant_id=HEX -c timeline_id=HEX'."
	return nil, e
}
