package server

import (
	"errors"
	"fmt"
	"strings"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/storage"
)

// supportedPgMajor is the PostgreSQL major version whose WAL format
// (page magic 0xD110, record layout) proto/xlog decodes.
const supportedPgMajor = 15

// timelineFor returns the running timeline named by m, opening it from disk
// or creating it (atomically, rule 1) if it is new.
func (s *Server) timelineFor(m *proto.ServerInfo) (*timeline, error) {
	return s.openTimeline(proto.TimelineKey{TenantID: m.TenantID, TimelineID: m.TimelineID}, m)
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
func (s *Server) openTimeline(key proto.TimelineKey, create *proto.ServerInfo) (*timeline, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.timelines[key]; ok {
		return t, nil
	}
	if s.isStopping() {
		return nil, errShutdown
	}
	store, st, err := s.db.OpenTimeline(key.TenantID, key.TimelineID)
	if errors.Is(err, storage.ErrNoTimeline) {
		if create == nil {
			return nil, pgwire.Errorf(pgwire.UndefinedObject, "timeline %s does not exist on this safekeeper", key)
		}
		if major := create.PgVersion / 10000; major != supportedPgMajor {
			return nil, fmt.Errorf("%w: PostgreSQL major version %d: this safekeeper decodes PostgreSQL %d WAL only",
				acceptor.ErrIncompatible, major, supportedPgMajor)
		}
		st = acceptor.NewState(create)
		store, err = s.db.CreateTimeline(st)
		if err == nil {
			s.log.Info("created timeline", "timeline", key.String(), "system_id", create.SystemID,
				"pg_version", create.PgVersion, "wal_seg_size", create.WalSegSize)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", acceptor.ErrStorage, err)
	}
	return s.startTimeline(key, st, store)
}

// newAcceptor is acceptor.New; tests replace it to fail like a full disk.
var newAcceptor = acceptor.New

// startTimeline starts the owner of a timeline. s.mu is held.
func (s *Server) startTimeline(key proto.TimelineKey, st acceptor.State, store *storage.Timeline) (*timeline, error) {
	// acceptor.New writes (it durably cuts WAL above flush_lsn). When it
	// cannot — a full disk after a restart — the timeline still opens,
	// read-only: its durable state and committed WAL are served, and the
	// next proposer greeting tries again (as after a storage failure).
	state := st
	acc, broken := newAcceptor(acceptor.Config{NodeID: s.cfg.NodeID}, st, store)
	switch {
	case broken == nil:
		state = acc.State()
	case errors.Is(broken, acceptor.ErrStorage):
		s.log.Error("timeline opened read-only: storage cannot write; a proposer's next greeting retries",
			"timeline", key.String(), "flush_lsn", st.FlushLSN, "commit_lsn", st.CommitLSN, "err", broken)
	default:
		return nil, broken
	}
	repl, err := newReplState(store, st.PgTimeline)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", acceptor.ErrStorage, err)
	}
	t := &timeline{
		key: key, log: s.log.With("timeline", key.String()), in: make(chan event, eventQueue),
		state: state, changed: make(chan struct{}), store: store, repl: repl, stopped: make(chan struct{}),
	}
	s.timelines[key] = t
	s.ownerWG.Add(2)
	go func() {
		defer s.ownerWG.Done()
		t.run(s.ctx, acc, broken, func() (*acceptor.Acceptor, error) {
			_, st, err := s.db.OpenTimeline(key.TenantID, key.TimelineID)
			if err != nil {
				return nil, err
			}
			return newAcceptor(acceptor.Config{NodeID: s.cfg.NodeID}, st, store)
		})
	}()
	go func() {
		defer s.ownerWG.Done()
		s.runRetention(s.ctx, t)
		repl.saveAll()
	}()
	return t, nil
}

// resolveTimeline picks the timeline a reader means: the one its startup
// options name, else the only one stored (matching the tenant if only
// tenant_id was given). Otherwise the error names the choices.
func (s *Server) resolveTimeline(ids startupIDs) (*timeline, error) {
	if ids.hasTenant && ids.hasTimeline {
		return s.timelineByKey(proto.TimelineKey{TenantID: ids.tenant, TimelineID: ids.timeline})
	}
	all, err := s.db.Timelines()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", acceptor.ErrStorage, err)
	}
	var match []proto.TimelineKey
	for _, k := range all {
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
