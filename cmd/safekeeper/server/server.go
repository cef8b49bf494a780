package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/storage"
)

// Config configures a Server.
type Config struct {
	// NodeID is this safekeeper's node id (SafeKeeperInfo.safekeeper_id).
	NodeID uint64
	// ListenPG is the host:port of the PostgreSQL-protocol listener.
	ListenPG string
	// DataDir holds the bbolt file; created if missing.
	DataDir string
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// ServerVersion is the server_version ParameterStatus; default "15.18".
	ServerVersion string
	// UnsafeNoFsync turns fsync off. For tests and benchmarks only: a crash
	// loses acknowledged WAL.
	UnsafeNoFsync bool
}

func (c *Config) withDefaults() error {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.ServerVersion == "" {
		c.ServerVersion = "15.18"
	}
	if c.DataDir == "" {
		return errors.New("server: no data directory")
	}
	if c.ListenPG == "" {
		return errors.New("server: no listen address")
	}
	return nil
}

// Server is a safekeeper: it accepts PostgreSQL-protocol connections, runs
// the WAL push protocol for proposers and keeps each timeline's state in one
// owner goroutine.
type Server struct {
	cfg Config
	log *slog.Logger
	db  *storage.DB
	ln  net.Listener

	ctx      context.Context // owners run until it is cancelled
	cancel   context.CancelFunc
	stopping chan struct{}
	stopOnce sync.Once

	mu        sync.Mutex
	timelines map[TimelineKey]*timeline
	conns     map[net.Conn]struct{}
	connWG    sync.WaitGroup
	ownerWG   sync.WaitGroup
}

// New opens the data directory and starts listening. Serve accepts.
func New(cfg Config) (*Server, error) {
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	db, err := storage.Open(filepath.Join(cfg.DataDir, "safekeeper.db"), storage.Options{
		Logger: cfg.Logger, UnsafeNoFsync: cfg.UnsafeNoFsync,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.ListenPG)
	if err != nil {
		db.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		cfg: cfg, log: cfg.Logger, db: db, ln: ln,
		ctx: ctx, cancel: cancel, stopping: make(chan struct{}),
		timelines: map[TimelineKey]*timeline{}, conns: map[net.Conn]struct{}{},
	}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

func (s *Server) isStopping() bool {
	select {
	case <-s.stopping:
		return true
	default:
		return false
	}
}

// Serve accepts connections until Shutdown. It returns nil after Shutdown.
func (s *Server) Serve() error {
	s.log.Info("safekeeper listening", "addr", s.ln.Addr().String(), "node_id", s.cfg.NodeID, "data_dir", s.cfg.DataDir)
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.isStopping() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		s.mu.Lock()
		if s.isStopping() {
			s.mu.Unlock()
			nc.Close()
			continue
		}
		s.conns[nc] = struct{}{}
		s.connWG.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.connWG.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, nc)
				s.mu.Unlock()
				nc.Close()
			}()
			s.serveConn(nc)
		}()
	}
}

// Shutdown stops accepting, ends every stream after making what it sent
// durable and answering it, stops the timeline owners and closes the data
// directory.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		close(s.stopping)
		s.ln.Close()
		for nc := range s.conns {
			nc.SetReadDeadline(time.Now()) // readers stop; owners and writers finish
		}
		s.mu.Unlock()
	})
	done := make(chan struct{})
	go func() { s.connWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.mu.Lock()
		for nc := range s.conns {
			nc.Close()
		}
		s.mu.Unlock()
		<-done
	}
	s.cancel()
	s.ownerWG.Wait()
	return s.db.Close()
}

// serveConn runs one client connection: startup, then simple queries.
func (s *Server) serveConn(nc net.Conn) {
	log := s.log.With("remote", nc.RemoteAddr().String())
	pc, err := pgwire.Accept(nc, pgwire.AcceptOptions{StartupTimeout: 10 * time.Second})
	if err != nil {
		log.Debug("connection startup failed", "err", err)
		return
	}
	params := pc.Params()
	log = log.With("application_name", params["application_name"])
	ids, err := parseStartupIDs(params["options"])
	if err != nil {
		pc.SendError(err)
		pc.Flush()
		return
	}
	if err := pc.Ready(pgwire.WalsenderParams(s.cfg.ServerVersion, params), nil); err != nil {
		return
	}
	for {
		q, err := pc.ReadQuery()
		if err != nil {
			return
		}
		cmd := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(q), ";"))
		switch {
		case strings.EqualFold(cmd, "START_WAL_PUSH"):
			if !s.runPush(pc, ids, log) {
				return
			}
		default:
			pc.SendError(pgwire.Errorf(pgwire.SyntaxError, "syntax error: unknown command %q", firstWord(cmd)))
			pc.SendReadyForQuery()
		}
		if err := pc.Flush(); err != nil {
			return
		}
	}
}

func firstWord(s string) string {
	if i := strings.IndexAny(s, " \t\r\n"); i >= 0 {
		return s[:i]
	}
	return s
}

func parseStartupIDs(options string) (startupIDs, error) {
	var ids startupIDs
	if options == "" {
		return ids, nil
	}
	opts, err := pgwire.ParseOptions(options)
	if err != nil {
		return ids, pgwire.Errorf(pgwire.InvalidParameterValue, "invalid startup options: %v", err)
	}
	if v, ok := opts["tenant_id"]; ok {
		if ids.tenant, err = proto.ParseID(v); err != nil {
			return ids, pgwire.Errorf(pgwire.InvalidParameterValue, "invalid tenant_id in startup options: %v", err)
		}
		ids.hasTenant = true
	}
	if v, ok := opts["timeline_id"]; ok {
		if ids.timeline, err = proto.ParseID(v); err != nil {
			return ids, pgwire.Errorf(pgwire.InvalidParameterValue, "invalid timeline_id in startup options: %v", err)
		}
		ids.hasTimeline = true
	}
	return ids, nil
}

// timelineFor returns the running timeline named by m, opening it from disk
// or creating it (atomically, rule 1) if it is new.
func (s *Server) timelineFor(m *proto.ServerInfo) (*timeline, error) {
	key := TimelineKey{Tenant: m.TenantID, Timeline: m.TimelineID}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.timelines[key]; ok {
		return t, nil
	}
	if s.isStopping() {
		return nil, errShutdown
	}
	store, st, err := s.db.OpenTimeline(key.Tenant, key.Timeline)
	if errors.Is(err, storage.ErrNoTimeline) {
		st = acceptor.NewState(m)
		store, err = s.db.CreateTimeline(st)
		if err == nil {
			s.log.Info("created timeline", "timeline", key.String(), "system_id", m.SystemID,
				"pg_version", m.PgVersion, "wal_seg_size", m.WalSegSize)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", acceptor.ErrStorage, err)
	}
	return s.startTimeline(key, st, store)
}

// startTimeline starts the owner of a timeline. s.mu is held.
func (s *Server) startTimeline(key TimelineKey, st acceptor.State, store *storage.Timeline) (*timeline, error) {
	acc, err := acceptor.New(acceptor.Config{NodeID: s.cfg.NodeID}, st, store)
	if err != nil {
		return nil, err
	}
	t := &timeline{
		key: key, log: s.log.With("timeline", key.String()), in: make(chan event, eventQueue),
		state: acc.State(), changed: make(chan struct{}), store: store, stopped: make(chan struct{}),
	}
	s.timelines[key] = t
	s.ownerWG.Add(1)
	go func() {
		defer s.ownerWG.Done()
		t.run(s.ctx, acc)
	}()
	return t, nil
}

var errShutdown = pgwire.Errorf(pgwire.AdminShutdown, "terminating connection due to administrator command")

// wireError gives err its SQLSTATE.
func wireError(err error) error {
	var pe *pgwire.Error
	if errors.As(err, &pe) {
		return err
	}
	code := pgwire.InternalError
	switch {
	case errors.Is(err, acceptor.ErrProtocol):
		code = pgwire.ProtocolViolation
	case errors.Is(err, acceptor.ErrVoteRefused):
		code = pgwire.VoteRefused
	case errors.Is(err, acceptor.ErrStaleTerm):
		code = pgwire.StaleTerm
	case errors.Is(err, acceptor.ErrCommonPointMismatch):
		code = pgwire.CommonPointMismatch
	case errors.Is(err, acceptor.ErrTruncateCommitted):
		code = pgwire.TruncateCommitted
	case errors.Is(err, acceptor.ErrIncompatible):
		code = pgwire.IncompatibleTimeline
	case errors.Is(err, acceptor.ErrStorage):
		code = pgwire.StorageFailure
	}
	return pgwire.Errorf(code, "%s", err.Error())
}
