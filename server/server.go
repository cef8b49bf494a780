package server

import (
	"container/list"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/server/backup"
	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/server/timeline"
	"github.com/safekeeper/safekeeper/storage"
	"github.com/safekeeper/safekeeper/storage/archive"
	"github.com/safekeeper/safekeeper/storage/remote"
)

// Config configures a Server.
type Config struct {
	// RemoteStorage is the WAL archive's store (--remote-storage); nil:
	// no archive. With one, an uploader (server/backup) carries every
	// timeline's committed WAL there and retention keeps what is not
	// there yet. ArchiveCodec is how objects are written (zstd, age
	// recipients) and read.
	RemoteStorage remote.Storage
	ArchiveCodec  *archive.Codec
	// BackupParallelJobs bounds the segments uploaded at once
	// (--backup-parallel-jobs); default 4. PartialBackupInterval is how
	// often the unfinished segment is uploaded while it changes
	// (--partial-backup-interval); default 10 s. BackupTakeover bounds
	// how long a safekeeper waits for another to upload before it does
	// (server/backup); default 3 s.
	BackupParallelJobs    int
	PartialBackupInterval time.Duration
	BackupTakeover        time.Duration
	// ArchiveRetention: WAL in the archive older than this is deleted
	// from it (--archive-retention); 0 keeps it all.
	ArchiveRetention time.Duration
	// NodeID is this safekeeper's node id (SafeKeeperInfo.safekeeper_id).
	// It is recorded in DataDir on first start; New refuses another.
	NodeID uint64
	// ListenPG is the host:port of the PostgreSQL-protocol listener.
	ListenPG string
	// ListenHTTP is the host:port of the HTTP API (server/httpapi); ""
	// serves none.
	ListenHTTP string
	// EnablePprof serves /debug/pprof/ on the HTTP API.
	EnablePprof bool
	// HTTPReadTimeout bounds reading one HTTP request, headers and body
	// (net/http's ReadTimeout; the headers alone get at most 10 s). It
	// does not bound the answer: net/http lifts the read deadline once the
	// request is read, so GET .../wal and pprof's profile stream on.
	// Default 30 s.
	HTTPReadTimeout time.Duration
	// HTTPIdleTimeout closes a keep-alive HTTP connection idle this long
	// between requests. Default 2 min. There is no write timeout: WAL
	// answers stream for as long as the client reads.
	HTTPIdleTimeout time.Duration
	// DataDir holds the bbolt file; created if missing.
	DataDir string
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// ServerVersion is the server_version ParameterStatus; default "15.18".
	ServerVersion string
	// UnsafeNoFsync turns fsync off. For tests and benchmarks only: a crash
	// loses acknowledged WAL.
	UnsafeNoFsync bool
	// WalSenderTimeout is PostgreSQL's wal_sender_timeout for replication
	// streams: a reader silent for half of it (or for 10 s, whichever is
	// shorter) gets a keepalive asking for a reply, and a reader silent for
	// all of it is disconnected. Default (zero) 60 s; negative disables the
	// timeout, like wal_sender_timeout = 0: silent readers stay connected and
	// idle streams still get a keepalive every 10 s.
	WalSenderTimeout time.Duration
	// WalKeepSize is how much WAL below commit_lsn is kept whatever else
	// retention says (PostgreSQL's wal_keep_size). Default 1 GiB; negative:
	// none.
	WalKeepSize int64
	// MaxPeerWALKeepSize: a peer safekeeper whose flush_lsn (truncate_lsn)
	// is further behind commit_lsn than this no longer holds WAL here.
	// Default 16 GiB.
	MaxPeerWALKeepSize int64
	// MaxSlotWALKeepSize: a replication slot whose restart_lsn is further
	// behind commit_lsn than this is invalidated (PostgreSQL's
	// max_slot_wal_keep_size). 0 or negative: no limit (the default).
	MaxSlotWALKeepSize int64
	// RetentionInterval is the least time between two WAL removal passes of
	// a timeline (see server/timeline's retention.go). Default 1 s.
	RetentionInterval time.Duration
	// RemovedTimelineGrace: a timeline whose configuration does not name
	// this safekeeper (it was moved away: README_PROTO.md, "Membership and
	// generations") is deleted here once it has been so this long. 0:
	// never (the default; the command line's is 1 h).
	RemovedTimelineGrace time.Duration
	// ShutdownGrace bounds how long Shutdown lets each replication stream
	// send its committed WAL and wait for the client to confirm it before
	// the stream is ended with CommandComplete "COPY 0". Default 2 s.
	ShutdownGrace time.Duration
	// MaxBufferedWAL bounds the bytes of proposers' messages (WAL, mostly)
	// read or about to be read and not yet committed, over all timelines: a
	// push connection's reader reserves a message's length before it reads
	// the body, and waits (TCP pushes back) while the bound is reached. It
	// bounds memory when many timelines ingest at once (each may queue 64
	// requests of 128 KiB). Default 32 MiB (one proposer's window of 256
	// requests of 128 KiB, nearly; more made 1,000 timelines ingesting at
	// once slower, not faster: a bigger heap); at least
	// proto.MaxWALPerRequest.
	MaxBufferedWAL int64
	// SlowFsyncThreshold: a group commit (its write transaction, fsyncs
	// included) taking longer is logged with its durations. Default 1 s.
	SlowFsyncThreshold time.Duration
	// TLSCertFile and TLSKeyFile (PEM) turn on TLS for the PostgreSQL port
	// and the HTTP API (tls.go); both or neither. Re-read on ReloadTLS and
	// when the files change.
	TLSCertFile, TLSKeyFile string
	// TLSRequired refuses a connection that did not upgrade to TLS, with
	// FATAL 28000 as pg_hba.conf's hostssl would. Needs TLSCertFile.
	TLSRequired bool
	// AuthPublicKeys (Ed25519 PEM files; several for rotation) turn on
	// token authentication (authn.go).
	AuthPublicKeys []string
	// AllowAuthWithoutTLS lets a client send its token over a plaintext
	// connection (for tests and trusted networks).
	AllowAuthWithoutTLS bool
	// MaxConnections bounds open client connections. A connection arriving
	// when all are open evicts the oldest one still in its startup; only
	// when every one has finished its startup does it get FATAL 53300
	// (limits.go, conns.go). Default 1000.
	MaxConnections int
	// AuthenticationTimeout bounds a connection's startup (PostgreSQL's
	// authentication_timeout). Default 60 s.
	AuthenticationTimeout time.Duration
	// MaxTimelines bounds the timelines stored; a greeting that would
	// create one more gets 53400. Default 10,000.
	MaxTimelines int
	// MaxSlots bounds the replication slots (temporary and persistent) of
	// a timeline; 53400 beyond. Default 10.
	MaxSlots int
	// MaxDiskUsage: when the database file's pages in use (its size less
	// the free pages inside it, which new WAL reuses) reach this, new WAL
	// is refused (53100). 0: no such limit (the file system's reserve
	// applies always).
	MaxDiskUsage int64
	// MaxTimelineDiskUsage: a timeline holding this much WAL refuses more
	// (53100). 0: no limit.
	MaxTimelineDiskUsage int64
	// MinFreeDisk is the file system's reserve: with less free (counting
	// the free pages inside the database file as free), new WAL is
	// refused (53100). 0 (auto): 2% of the file system, at most 1 GiB, but
	// at least twice MaxBufferedWAL (the WAL read before the breaker trips
	// is still written) unless that is more than a quarter of the file
	// system; negative: none (WAL is written until the disk is full, and
	// storage fails).
	MinFreeDisk int64
}

func (c *Config) withDefaults() error {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.ServerVersion == "" {
		c.ServerVersion = "15.18"
	}
	if c.WalSenderTimeout == 0 {
		c.WalSenderTimeout = 60 * time.Second
	}
	switch {
	case c.WalKeepSize == 0:
		c.WalKeepSize = 1 << 30
	case c.WalKeepSize < 0:
		c.WalKeepSize = 0
	}
	if c.MaxPeerWALKeepSize <= 0 {
		c.MaxPeerWALKeepSize = 16 << 30
	}
	if c.RetentionInterval <= 0 {
		c.RetentionInterval = time.Second
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 2 * time.Second
	}
	if c.SlowFsyncThreshold <= 0 {
		c.SlowFsyncThreshold = time.Second
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = 1000
	}
	if c.HTTPReadTimeout <= 0 {
		c.HTTPReadTimeout = 30 * time.Second
	}
	if c.HTTPIdleTimeout <= 0 {
		c.HTTPIdleTimeout = 2 * time.Minute
	}
	if c.AuthenticationTimeout <= 0 {
		c.AuthenticationTimeout = time.Minute
	}
	if c.MaxTimelines <= 0 {
		c.MaxTimelines = 10000
	}
	if c.MaxSlots <= 0 {
		c.MaxSlots = 10
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("server: TLS needs both a certificate and a key file")
	}
	if c.TLSRequired && c.TLSCertFile == "" {
		return errors.New("server: TLS required but no certificate given")
	}
	if c.MaxBufferedWAL == 0 {
		c.MaxBufferedWAL = 32 << 20
	}
	c.MaxBufferedWAL = max(c.MaxBufferedWAL, proto.MaxWALPerRequest)
	if c.DataDir == "" {
		return errors.New("server: no data directory")
	}
	if c.ListenPG == "" {
		return errors.New("server: no listen address")
	}
	return nil
}

// ErrCorrupt is wrapped by the error of New when the database file is
// damaged (storage.ErrCorrupt): a restart cannot fix it.
var ErrCorrupt = storage.ErrCorrupt

// ErrNodeIDMismatch is wrapped by the error of New when the data directory
// was recorded as another node's (see NodeIDMismatchError).
var ErrNodeIDMismatch = errors.New("server: data directory belongs to another node id")

// NodeIDMismatchError is the error of New when Config.NodeID differs from
// the node id recorded in the data directory on its first start. Serving
// it under another id would present one node's WAL and votes as another's.
// It wraps ErrNodeIDMismatch.
type NodeIDMismatchError struct {
	DataDir    string
	Recorded   uint64 // the id the data directory belongs to
	Configured uint64 // Config.NodeID
}

func (e *NodeIDMismatchError) Error() string {
	return fmt.Sprintf("server: data directory %s belongs to safekeeper node id %d, not %d: start it with id %d, or give node %d its own data directory",
		e.DataDir, e.Recorded, e.Configured, e.Recorded, e.Configured)
}

func (e *NodeIDMismatchError) Unwrap() error { return ErrNodeIDMismatch }

// Server is a safekeeper: it accepts PostgreSQL-protocol connections, runs
// the WAL push protocol for proposers and keeps each timeline's state in one
// owner (server/timeline), run by the push readers themselves.
type Server struct {
	cfg Config
	log *slog.Logger
	db  *storage.DB
	ln  net.Listener

	ctx      context.Context // owners run until it is cancelled
	cancel   context.CancelFunc
	stopping chan struct{}
	stopOnce sync.Once
	// stopCtx is done once Shutdown began: waits that must not hold it up
	// (a push reader waiting for WAL budget) use it.
	stopCtx    context.Context
	stopCancel context.CancelFunc

	connSeq atomic.Uint64 // numbers connections: the "PID" of slot errors
	// reg holds the timelines. Its WAL budget (Config.MaxBufferedWAL): a
	// push reader acquires a request's WAL bytes before queueing it, the
	// timeline's owner releases them once the group commit that took them
	// is done.
	reg *timeline.Registry
	mem reclaimer // memory.go
	// writeLimit is the latest write deadline of any connection (unix
	// nanoseconds), set by Shutdown; 0 before. See limitedConn.
	writeLimit atomic.Int64

	http        *httpapi.API // nil without Config.ListenHTTP
	certs       *certSource  // nil without Config.TLSCertFile
	auth        *authState   // nil without Config.AuthPublicKeys
	disk        diskState    // the disk circuit breaker (limits.go)
	refusing    atomic.Int32 // refusals under way: refuseTooMany and evicted connections (at most maxRefusing)
	evictions   atomic.Int64 // evictions since the last warning about them (conns.go)
	evictWarned atomic.Int64 // when that warning was last logged (unix nanoseconds)
	metrics     *httpapi.Metrics
	// uploader carries WAL to the archive (nil: no archive).
	uploader      *backup.Uploader
	backupMetrics *backup.Metrics

	// mu guards the connection table (conns.go); the timelines have the
	// registry's own lock.
	mu       sync.Mutex
	conns    map[net.Conn]*connEntry // every connection holding a slot (conns.go)
	starting list.List               // of *connEntry: those still in their startup, oldest first
	connWG   sync.WaitGroup

	hooks hooks // tests only
}

// New creates the data directory if it is missing, starts listening and
// opens the database in the directory. Serve accepts. The
// first New on a data directory records Config.NodeID in it (a directory
// from before that adopts the id it is given); a later New with another
// NodeID fails with a *NodeIDMismatchError (errors.Is ErrNodeIDMismatch).
func New(cfg Config) (*Server, error) { return newServer(cfg, hooks{}) }

// hooks are test hooks, in the style of storage's open(..., hooks): New
// sets none, tests call newServer with some.
type hooks struct {
	// beforeOpen, storage, onPublish, create, persistInterval and
	// deleteTimeline are the registry's (timeline.Hooks).
	beforeOpen      func(proto.TimelineKey)
	storage         func(*storage.Timeline) acceptor.Storage
	onPublish       func()
	create          func(acceptor.State) (*storage.Timeline, error)
	persistInterval time.Duration
	// httpWAL runs in a GET .../wal handler once it holds its slot.
	httpWAL func()
	// lazyOpen skips opening the stored timelines at start (openStored):
	// they open when a client asks for them, as before it.
	lazyOpen bool
	// statfs replaces unix.Statfs in the disk circuit breaker.
	statfs func(path string, fs *unix.Statfs_t) error
	// evictGrace replaces evictGraceMax (0: the default).
	evictGrace     time.Duration
	deleteTimeline func(tenant, timeline proto.ID) error
}

func newServer(cfg Config, h hooks) (*Server, error) {
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	var authn *authState
	if len(cfg.AuthPublicKeys) > 0 {
		var err error
		if authn, err = newAuthState(cfg.AuthPublicKeys); err != nil {
			return nil, err
		}
	}
	var certs *certSource
	if cfg.TLSCertFile != "" {
		var err error
		if certs, err = newCertSource(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.Logger); err != nil {
			return nil, err
		}
	}
	// The data directory (0700) is made durably before anything listens
	// (a failure here, permission denied or a read-only file system, is the
	// operator's to fix); it stays unclaimed until the database opens.
	if err := storage.MkdirAllDurable(cfg.DataDir, 0o700); err != nil {
		return nil, err
	}
	// Listen first: a server that cannot listen must leave the data
	// directory as it was, not claimed for its node id.
	ln, err := net.Listen("tcp", cfg.ListenPG)
	if err != nil {
		return nil, err
	}
	var httpLn net.Listener
	if cfg.ListenHTTP != "" {
		if httpLn, err = net.Listen("tcp", cfg.ListenHTTP); err != nil {
			ln.Close()
			return nil, fmt.Errorf("listen for the HTTP API: %w", err)
		}
	}
	closeListeners := func() {
		ln.Close()
		if httpLn != nil {
			httpLn.Close()
		}
	}
	metrics := httpapi.NewMetrics(cfg.SlowFsyncThreshold)
	// Opening a large database on a busy disk can take long (bbolt waits
	// for the file's lock, then rebuilds the freelist by reading every
	// page: NoFreelistSync): say so, and how long it took.
	dbPath := filepath.Join(cfg.DataDir, "safekeeper.db")
	cfg.Logger.Info("opening the database", "path", dbPath)
	opened := time.Now()
	db, err := storage.Open(dbPath, storage.Options{
		Logger: cfg.Logger, UnsafeNoFsync: cfg.UnsafeNoFsync, SlowCommit: cfg.SlowFsyncThreshold,
		OnCommit: metrics.ObserveCommit,
	})
	if err != nil {
		closeListeners()
		return nil, err
	}
	cfg.Logger.Info("database opened", "path", dbPath, "duration", time.Since(opened), "size_bytes", db.FileSize())
	recorded, err := db.ClaimNodeID(cfg.NodeID)
	if err == nil && recorded != cfg.NodeID {
		err = &NodeIDMismatchError{DataDir: cfg.DataDir, Recorded: recorded, Configured: cfg.NodeID}
	}
	if err != nil {
		closeListeners()
		db.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopCtx, stopCancel := context.WithCancel(ctx)
	s := &Server{
		stopCtx: stopCtx, stopCancel: stopCancel,
		cfg: cfg, log: cfg.Logger, db: db, ln: ln,
		ctx: ctx, cancel: cancel, stopping: make(chan struct{}),
		conns:   map[net.Conn]*connEntry{},
		metrics: metrics,
		hooks:   h,
		certs:   certs,
		auth:    authn,
	}
	tcfg := timeline.Config{
		NodeID: cfg.NodeID, Logger: cfg.Logger, MaxTimelines: cfg.MaxTimelines, MaxSlots: cfg.MaxSlots,
		WalKeepSize: cfg.WalKeepSize, MaxPeerWALKeepSize: cfg.MaxPeerWALKeepSize, MaxSlotWALKeepSize: cfg.MaxSlotWALKeepSize,
		RetentionInterval: cfg.RetentionInterval, MaxBufferedWAL: cfg.MaxBufferedWAL,
		Metrics: metrics.Timelines(), Recycle: recycle,
		Hooks: timeline.Hooks{BeforeOpen: h.beforeOpen, Storage: h.storage, OnPublish: h.onPublish, Create: h.create,
			PersistInterval: h.persistInterval, DeleteTimeline: h.deleteTimeline},
	}
	if cfg.RemoteStorage != nil {
		codec := cfg.ArchiveCodec
		if codec == nil {
			codec = &archive.Codec{Compress: true}
		}
		s.backupMetrics = backup.NewMetrics()
		s.uploader = backup.New(nil, backup.Config{
			Store: cfg.RemoteStorage, Codec: codec, NodeID: cfg.NodeID, Jobs: cfg.BackupParallelJobs,
			PartialInterval: cfg.PartialBackupInterval, Takeover: cfg.BackupTakeover, Retention: cfg.ArchiveRetention,
			Logger: cfg.Logger, Metrics: s.backupMetrics,
		})
		tcfg.Backup = s.uploader
	}
	s.reg = timeline.NewRegistry(db, tcfg)
	if s.uploader != nil {
		s.uploader.SetRegistry(s.reg)
	}
	if httpLn != nil {
		s.http = s.newHTTPAPI(httpLn)
	}
	s.checkDisk()
	return s, nil
}

// HTTPAddr is the HTTP API's address, nil when it is off.
func (s *Server) HTTPAddr() net.Addr {
	if s.http == nil {
		return nil
	}
	return s.http.Addr()
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
// Meanwhile it opens every stored timeline in the background (openStored),
// so their metrics are there before any client connects.
func (s *Server) Serve() error {
	// One line with the addresses bound (the ports the kernel chose when
	// --listen-pg or --listen-http asked for port 0): tests and operators
	// read them here. With a certificate the HTTP API speaks HTTPS (tls).
	where := []any{"pg", s.ln.Addr().String()}
	if s.http != nil {
		where = append(where, "http", s.http.Addr().String())
	}
	s.log.Info("safekeeper listening", append(where, "node_id", s.cfg.NodeID, "data_dir", s.cfg.DataDir,
		"tls", s.certs != nil, "tls_required", s.cfg.TLSRequired)...)
	go s.mem.run(s.ctx, s)
	if s.uploader != nil {
		s.uploader.Start()
	}
	if !s.hooks.lazyOpen {
		s.reg.OpenStored() // nothing once Shutdown began
	}
	go s.watchDisk()
	if s.cfg.RemovedTimelineGrace > 0 {
		go s.sweepRemoved()
	}
	if s.certs != nil {
		go s.certs.watch(s.ctx)
	}
	if s.http != nil {
		var tlsConfig *tls.Config
		if s.certs != nil {
			tlsConfig = s.certs.config()
		}
		go s.http.Serve(tlsConfig)
	}
	var backoff time.Duration // while accept fails for lack of descriptors
	failures := 0
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
			if !acceptRetryable(err) {
				return err
			}
			// Out of file descriptors (or kernel memory): the connections
			// already open go on, and accept is retried after a pause, as
			// net/http's Server does, rather than the port being closed.
			if failures == 0 {
				s.log.Warn("accept failed; retrying with backoff (raise the open files limit, ulimit -n, or lower --max-connections)", "err", err)
			}
			failures++
			backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.ctx.Done():
				t.Stop()
			}
			continue
		}
		if failures > 0 {
			s.log.Info("accept works again", "failed_accepts", failures)
			failures, backoff = 0, 0
		}
		lc := &limitedConn{Conn: nc, limit: &s.writeLimit}
		s.mu.Lock()
		if s.isStopping() {
			s.mu.Unlock()
			lc.Close()
			continue
		}
		e, victim, ok := s.admitLocked(lc)
		if !ok {
			// Added under s.mu, as for an admitted one: Shutdown waits on
			// connWG only after it set stopping under s.mu.
			s.connWG.Add(1)
			s.mu.Unlock()
			s.metrics.Refused("too_many_clients")
			if s.refusing.Add(1) > maxRefusing {
				s.refusing.Add(-1)
				s.connWG.Done()
				lc.Close()
				continue
			}
			go func() {
				defer s.connWG.Done()
				defer s.refusing.Add(-1)
				s.refuseTooMany(lc)
			}()
			continue
		}
		s.connWG.Add(1)
		s.mu.Unlock()
		if victim != nil {
			s.evict(victim)
		}
		go func() {
			defer s.connWG.Done()
			defer s.release(e)
			s.serveConn(e)
		}()
	}
}

// The pause between accepts that failed for want of a descriptor: 5 ms,
// doubling to 1 s (net/http's Server.Serve).
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// acceptRetryable reports whether an accept error is a shortage that
// passes (EMFILE, ENFILE, ENOBUFS, ENOMEM) rather than a closed listener.
func acceptRetryable(err error) bool {
	for _, e := range []error{unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Shutdown stops accepting, ends every stream after making what it sent
// durable and answering it, waits for the timeline opens under way, stops
// the timeline owners and closes the data directory.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(func() {
		// Streams get ShutdownGrace to end as WalSndDone does, and a second
		// more for their last writes: a client that stopped reading cannot
		// hold a write, and so Shutdown, for the whole write timeout.
		limit := time.Now().Add(s.cfg.ShutdownGrace + shutdownWriteSlack)
		s.writeLimit.Store(limit.UnixNano())
		s.reg.Stop() // no timeline is opened, created or deleted from now on
		s.mu.Lock()
		close(s.stopping)
		s.stopCancel()
		s.ln.Close()
		for nc := range s.conns {
			nc.SetReadDeadline(time.Now()) // readers stop; owners and writers finish
			nc.SetWriteDeadline(limit)     // a write in progress ends by then
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
	if s.http != nil {
		s.http.Shutdown(ctx)
	}
	// Uploads under way are cancelled: what they did not finish stays
	// above backup_lsn, for the next start.
	if s.uploader != nil {
		s.uploader.Close()
	}
	// An open under way (from the HTTP API, whose handlers are not waited
	// for, or a connection cut short by ctx) still uses the database and
	// may start an owner: Close waits for it, then stops the owners.
	s.reg.Close()
	s.cancel()
	return s.db.Close()
}

// shutdownWriteSlack is how long after ShutdownGrace the last writes of a
// shutdown may take (a stream's final CommandComplete, a proposer's last
// responses and 57P01) before the write deadline closes the connection.
const shutdownWriteSlack = time.Second

// serveConn runs one client connection: startup, then simple queries
// (replication.go: the command set depends on the "replication" startup
// parameter; START_WAL_PUSH, IDENTIFY_SYSTEM and TIMELINE_STATUS work on
// every connection).
func (s *Server) serveConn(e *connEntry) {
	nc := e.nc
	log := s.log.With("peer", nc.RemoteAddr().String())
	opts := pgwire.AcceptOptions{StartupTimeout: s.cfg.AuthenticationTimeout, WriteTimeout: s.cfg.WalSenderTimeout}
	if s.certs != nil {
		opts.TLSConfig = s.certs.config()
	}
	pc, err := pgwire.Accept(nc, opts)
	if err != nil {
		var ne net.Error
		if e.evicted.Load() {
			log.Debug("evicted connection ended in its startup", "err", err)
			return
		}
		if errors.As(err, &ne) && ne.Timeout() {
			s.metrics.Refused("startup_timeout")
			log.Info("connection closed: startup not finished within the authentication timeout", "timeout", s.cfg.AuthenticationTimeout)
			return
		}
		log.Debug("connection startup failed", "err", err)
		return
	}
	if e.evicted.Load() {
		s.refuseEvicted(pc)
		return
	}
	params := pc.Params()
	if s.cfg.TLSRequired && !pc.TLS() {
		// PostgreSQL's refusal when only hostssl lines match.
		db := params["database"]
		if db == "" {
			db = params["user"]
		}
		e := pgwire.Errorf(pgwire.InvalidAuthorizationSpecification, "no pg_hba.conf entry for host %q, user %q, database %q, no encryption",
			hostOf(nc.RemoteAddr().String()), params["user"], db)
		if r, _ := pgwire.ParseReplication(params["replication"]); r == pgwire.ReplicationPhysical {
			e = pgwire.Errorf(pgwire.InvalidAuthorizationSpecification, "no pg_hba.conf entry for replication connection from host %q, user %q, no encryption",
				hostOf(nc.RemoteAddr().String()), params["user"])
		}
		log.Info("connection refused: TLS is required", "user", params["user"])
		pc.SendError(fatalError(e))
		pc.Flush()
		return
	}
	if s.auth != nil && !pc.TLS() && !s.cfg.AllowAuthWithoutTLS {
		// A token must not cross the network in the clear.
		log.Info("connection refused: authentication needs TLS", "user", params["user"])
		pc.SendError(fatalError(pgwire.Errorf(pgwire.InvalidAuthorizationSpecification,
			"no pg_hba.conf entry for host %q, user %q, no encryption", hostOf(nc.RemoteAddr().String()), params["user"])))
		pc.Flush()
		return
	}
	claims, err := s.authenticate(pc, params["user"])
	if err != nil {
		var pe *pgwire.Error
		switch {
		case errors.As(err, &pe) && pe.Code == pgwire.InvalidPassword:
			log.Info("connection refused: authentication failed", "user", params["user"], "err", err)
		case errors.As(err, &pe):
			// The password message broke the protocol (another message
			// type, or longer than PostgreSQL takes): PostgreSQL's FATAL.
			log.Info("connection refused: protocol violation during authentication", "user", params["user"], "err", err)
		default:
			log.Debug("connection ended during authentication", "err", err)
			return
		}
		pc.SendError(fatalError(pe))
		pc.Flush()
		return
	}
	log = log.With("application_name", params["application_name"])
	ids, err := parseStartupIDs(params["options"])
	var mode pgwire.Replication
	if err == nil {
		mode, err = pgwire.ParseReplication(params["replication"])
	}
	if err == nil && mode == pgwire.ReplicationLogical {
		err = pgwire.Errorf(pgwire.FeatureNotSupported, "logical replication connections are not supported by a safekeeper")
	}
	if err != nil {
		// The connection ends: FATAL, as PostgreSQL refuses a startup packet.
		log.Info("connection refused at startup", "err", err)
		pc.SendError(fatalError(err))
		pc.Flush()
		return
	}
	if !s.trust(e) { // evicted during the password exchange
		s.refuseEvicted(pc)
		return
	}
	if err := pc.Ready(pgwire.WalsenderParams(s.cfg.ServerVersion, params), nil); err != nil {
		return
	}
	rc := &replConn{srv: s, pc: pc, ids: ids, log: log, id: s.connSeq.Add(1), physical: mode == pgwire.ReplicationPhysical, claims: claims}
	defer rc.close()
	for {
		q, err := pc.ReadQuery()
		if err != nil {
			var pe *pgwire.Error
			switch {
			case s.isStopping():
				pc.SendError(fatalError(errShutdown))
				pc.Flush()
				return
			case rc.tl != nil && rc.tl.Deleted():
				pc.SendError(fatalError(errTimelineDeleted))
				pc.Flush()
				return
			case errors.As(err, &pe) && pe.Severity != pgwire.SeverityFatal:
				// A malformed Query, read whole: PostgreSQL answers ERROR
				// and the connection goes on.
				log.Info("malformed message from client", "err", err)
				pc.SendError(pe)
				if pc.SendReadyForQuery() != nil {
					return
				}
				continue
			case errors.As(err, &pe):
				log.Info("closing connection: client protocol violation", "err", err)
				pc.SendError(pe)
				pc.Flush()
			case !errors.Is(err, io.EOF):
				log.Debug("connection read failed", "err", err)
			}
			return
		}
		if !rc.handle(q) {
			return
		}
		if err := pc.Flush(); err != nil {
			return
		}
	}
}

func parseStartupIDs(options string) (startupIDs, error) {
	var ids startupIDs
	if options == "" {
		return ids, nil
	}
	opts, err := pgwire.ParseOptions(options) // an *pgwire.Error (22023) naming the options
	if err != nil {
		return ids, err
	}
	if v, ok := opts["tenant_id"]; ok {
		if ids.tenant, err = proto.ParseID(v); err != nil {
			return ids, errBadID("tenant_id", v)
		}
		ids.hasTenant = true
	}
	if v, ok := opts["timeline_id"]; ok {
		if ids.timeline, err = proto.ParseID(v); err != nil {
			return ids, errBadID("timeline_id", v)
		}
		ids.hasTimeline = true
	}
	for name := range opts {
		if err := checkSettingName(name); err != nil {
			return ids, err
		}
	}
	return ids, nil
}

// checkSettingName accepts, besides tenant_id and timeline_id, what
// PostgreSQL 15 accepts in startup options: its own settings and dotted
// custom names (both ignored here). Any other name is refused with 22023,
// naming it — a misspelt "-c tenantid=..." must not be silently ignored and
// the client served another timeline.
func checkSettingName(name string) error {
	lower := strings.ToLower(name)
	if lower == "tenant_id" || lower == "timeline_id" || strings.Contains(name, ".") || postgresSettings[lower] {
		return nil
	}
	e := pgwire.Errorf(pgwire.InvalidParameterValue, "unrecognized configuration parameter %q in startup options", name)
	e.Hint = "A safekeeper takes -c tenant_id=<32 hex digits> -c timeline_id=<32 hex digits>; PostgreSQL's own settings and dotted names are accepted and ignored."
	return e
}

// startupIDs are the tenant and timeline ids a client named in its startup
// options (-c tenant_id=… -c timeline_id=…); zero when not given.
type startupIDs struct {
	tenant, timeline       proto.ID
	hasTenant, hasTimeline bool
}

// hostOf is the host part of a host:port address.
func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}
