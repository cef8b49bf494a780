package main

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/server"
	"github.com/safekeeper/safekeeper/server/auth"
)

// `safekeeper run`: the flags become a server.Config (serverConfig, every
// value checked before anything is created or listened on), SIGHUP
// reloads what can be reloaded (reloader), and serve runs the server until
// SIGTERM or SIGINT.

func runCommand() *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "run a safekeeper server",
		Description: "Listens for PostgreSQL-protocol connections: proposers push WAL with START_WAL_PUSH,\n" +
			"replication clients read it back. SIGTERM or SIGINT: stop accepting, make received WAL\n" +
			"durable, answer and close every stream, exit 0. SIGHUP re-reads --tls-cert/--tls-key and\n" +
			"--auth-public-key (logged and ignored when there are none).\n" +
			"Exit codes: 0 after SIGTERM/SIGINT, 2 usage error (also a data directory of another --id),\n" +
			"4 a data directory it cannot use for good (permission denied, not a directory, a read-only\n" +
			"file system, a damaged database: a restart cannot fix it), 1 any other error.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "id", "data-dir") },
		Flags:        runFlags(),
		Action:       runServer,
	}
}

func runFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.Uint64Flag{Name: "id", Usage: "this safekeeper's node id: positive, unique among the safekeepers of a timeline (reported to proposers, which refuse to count one id twice) (required)"},
		&cli.StringFlag{Name: "listen-pg", Value: "127.0.0.1:5454", Usage: "host:port of the PostgreSQL-protocol listener"},
		&cli.StringFlag{Name: "data-dir", Usage: "directory of the safekeeper's bbolt database (created if missing) (required)"},
		&cli.BoolFlag{Name: "unsafe-no-fsync", Hidden: true, Usage: "TESTS AND BENCHMARKS ONLY: never fsync; a crash loses acknowledged WAL"},
		&cli.DurationFlag{Name: "wal-sender-timeout", Value: 60 * time.Second, Usage: "disconnect a replication client silent this long; it is asked for a reply after half of it (at most 10s); 0 disables, like PostgreSQL's wal_sender_timeout = 0"},
		&cli.DurationFlag{Name: "retention-interval", Value: time.Second, Usage: "least time between two WAL removal passes of a timeline"},
		&cli.DurationFlag{Name: "removed-timeline-grace", Value: time.Hour, Usage: "delete a timeline this safekeeper was moved off (its configuration no longer names it) after this long; 0: never"},
		&cli.StringFlag{Name: "tls-cert", Usage: "PEM certificate (chain) for TLS on the PostgreSQL port and HTTPS on the HTTP API; re-read on SIGHUP and when the file changes"},
		&cli.StringFlag{Name: "tls-key", Usage: "PEM private key of --tls-cert"},
		&cli.BoolFlag{Name: "tls-required", Usage: "refuse connections that do not use TLS (FATAL 28000, as pg_hba.conf hostssl)"},
		&cli.StringSliceFlag{Name: "auth-public-key", Usage: "Ed25519 public key file (PEM) that signs tokens; turns authentication on; repeat for key rotation; re-read on SIGHUP"},
		&cli.IntFlag{Name: "max-connections", Value: 1000, Usage: "most client connections at once; a new one evicts the oldest connection still in its startup, and only when all have finished theirs gets FATAL 53300 sorry, too many clients already"},
		&cli.DurationFlag{Name: "authentication-timeout", Value: time.Minute, Usage: "close a connection that has not finished its startup in this time, as PostgreSQL's authentication_timeout"},
		&cli.IntFlag{Name: "max-timelines", Value: 10000, Usage: "most timelines on this safekeeper; a greeting that would create one more gets 53400"},
		&cli.IntFlag{Name: "max-slots", Value: 10, Usage: "most replication slots (temporary and persistent) per timeline; more get 53400"},
		&cli.StringFlag{Name: "max-disk-usage", Value: "0", Usage: "refuse new WAL (53100) once the database file holds this much in use (e.g. 100GB; its free pages, left by retention or a delete, do not count; 0: no limit); new WAL is also refused while the file system, with those free pages, has less free than --min-free-disk"},
		&cli.StringFlag{Name: "min-free-disk", Value: "auto", Usage: "refuse new WAL (53100) while the data directory's file system has less free space than this (auto: 2% of it, at most 1GB, but at least 64MB, twice the WAL buffered in memory, or a quarter of a smaller file system; 0: never, WAL is written until the disk is full)"},
		&cli.StringFlag{Name: "max-timeline-disk-usage", Value: "0", Usage: "refuse new WAL (53100) for a timeline holding this much WAL (0: no limit)"},
		&cli.BoolFlag{Name: "allow-auth-without-tls", Usage: "accept tokens (passwords) over plaintext connections; only on a trusted network"},
		&cli.DurationFlag{Name: "slow-fsync-threshold", Value: time.Second, Usage: "log a group commit (write and fsync of WAL and state) that takes longer than this, with its durations; counted in safekeeper_slow_fsyncs_total"},
		&cli.StringFlag{Name: "listen-http", Value: "127.0.0.1:7676", Usage: "host:port of the HTTP API (status, timelines, /metrics, /healthz, /readyz); '' disables it"},
		&cli.BoolFlag{Name: "enable-pprof", Usage: "serve Go's /debug/pprof/ on the HTTP API"},
		&cli.StringFlag{Name: "wal-keep-size", Value: "1GB", Usage: "WAL kept below commit_lsn whatever else retention says, as PostgreSQL's wal_keep_size (e.g. 1GB, 512MB; 0: none)"},
		&cli.StringFlag{Name: "max-slot-wal-keep-size", Value: "-1", Usage: "invalidate a replication slot whose restart_lsn is further behind commit_lsn than this, as PostgreSQL's max_slot_wal_keep_size (-1: never)"},
		&cli.StringFlag{Name: "max-peer-wal-keep-size", Value: "16GB", Usage: "stop keeping WAL for a peer safekeeper further behind commit_lsn than this (it then recovers with safekeeper timeline pull)"},
	}, append(archiveWriteFlags(), runFleetFlags()...)...)
}

// runServer is run's action. SIGTERM and SIGINT are taken from the first
// step on: a supervisor may stop run while it starts (opening a large
// database takes a while), and that must be a clean stop, not the default
// action's kill.
func runServer(c *cli.Context) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	cfg, err := serverConfig(c)
	if err != nil {
		return err
	}
	log := cfg.Logger
	// SIGHUP re-reads the TLS certificate and the auth keys once the
	// server exists; one that comes while it is starting (after the
	// listen line a test or an operator waits for, before the server is
	// known) is applied once it is up rather than dropped.
	hup := &reloader{log: log}
	defer onSIGHUP(log, hup.signaled)()
	if cfg.UnsafeNoFsync {
		log.Warn("UNSAFE: fsync is off; a crash loses acknowledged WAL")
	}
	srv, err := server.New(cfg)
	if errors.Is(err, server.ErrNodeIDMismatch) {
		return usageError{err} // the data dir belongs to another --id
	}
	if err != nil {
		return dataDirError(cfg.DataDir, err)
	}
	stopReg, err := register(c, srv, cfg, log)
	if err != nil {
		srv.Shutdown(context.Background())
		return err
	}
	defer stopReg()
	hup.started(srv)
	return serve(srv, sig, log)
}

// serverConfig is run's flags as a server.Config, every value checked: a
// bad one is a usage error, found before the data directory is created or
// a port listened on.
func serverConfig(c *cli.Context) (server.Config, error) {
	if c.NArg() > 0 {
		return server.Config{}, usagef("run takes no arguments, got %q", c.Args().Slice())
	}
	if c.Uint64("id") == 0 {
		return server.Config{}, usagef("--id must be a positive node id, unique among the safekeepers of a timeline")
	}
	if err := checkListenAddr(c.String("listen-pg")); err != nil {
		return server.Config{}, usagef("--listen-pg %q: %w", c.String("listen-pg"), err)
	}
	if err := checkDataDir(c); err != nil {
		return server.Config{}, err
	}
	if err := checkFleetFlags(c); err != nil {
		return server.Config{}, err
	}
	if h := c.String("listen-http"); h != "" {
		if err := checkListenAddr(h); err != nil {
			return server.Config{}, usagef("--listen-http %q: %w", h, err)
		}
	}
	walSenderTimeout := c.Duration("wal-sender-timeout")
	switch {
	case walSenderTimeout < 0:
		return server.Config{}, usagef("--wal-sender-timeout %v: want a duration ≥ 0 (0 disables the timeout)", walSenderTimeout)
	case walSenderTimeout == 0:
		walSenderTimeout = -1 // server.Config: negative disables
	}
	if c.Duration("retention-interval") <= 0 {
		return server.Config{}, usagef("--retention-interval %v: want a positive duration", c.Duration("retention-interval"))
	}
	if c.Duration("removed-timeline-grace") < 0 {
		return server.Config{}, usagef("--removed-timeline-grace %v: want a duration ≥ 0 (0: never)", c.Duration("removed-timeline-grace"))
	}
	if c.Duration("slow-fsync-threshold") <= 0 {
		return server.Config{}, usagef("--slow-fsync-threshold %v: want a positive duration", c.Duration("slow-fsync-threshold"))
	}
	walKeep, err := parsePGSize(c.String("wal-keep-size"), false)
	if err != nil {
		return server.Config{}, usagef("--wal-keep-size: %w", err)
	}
	slotKeep, err := parsePGSize(c.String("max-slot-wal-keep-size"), true)
	if err != nil {
		return server.Config{}, usagef("--max-slot-wal-keep-size: %w", err)
	}
	peerKeep, err := parsePGSize(c.String("max-peer-wal-keep-size"), false)
	if err != nil || peerKeep == 0 {
		return server.Config{}, usagef("--max-peer-wal-keep-size %q: want a positive size like 16GB", c.String("max-peer-wal-keep-size"))
	}
	if walKeep == 0 {
		walKeep = -1 // server.Config: negative keeps none
	}
	maxDisk, err := parsePGSize(c.String("max-disk-usage"), false)
	if err != nil {
		return server.Config{}, usagef("--max-disk-usage: %w", err)
	}
	maxTLDisk, err := parsePGSize(c.String("max-timeline-disk-usage"), false)
	if err != nil {
		return server.Config{}, usagef("--max-timeline-disk-usage: %w", err)
	}
	var minFree int64 // server.Config: 0 is auto
	if v := c.String("min-free-disk"); v != "auto" {
		if minFree, err = parsePGSize(v, false); err != nil {
			return server.Config{}, usagef("--min-free-disk: %w (or auto)", err)
		}
		if minFree == 0 {
			minFree = -1 // none
		}
	}
	for _, f := range []string{"max-connections", "max-timelines", "max-slots"} {
		if c.Int(f) <= 0 {
			return server.Config{}, usagef("--%s %d: want a positive number", f, c.Int(f))
		}
	}
	if c.Duration("authentication-timeout") <= 0 {
		return server.Config{}, usagef("--authentication-timeout %v: want a positive duration", c.Duration("authentication-timeout"))
	}
	if err := checkSecurity(c); err != nil {
		return server.Config{}, err
	}
	if c.Int("backup-parallel-jobs") <= 0 {
		return server.Config{}, usagef("--backup-parallel-jobs %d: want a positive number", c.Int("backup-parallel-jobs"))
	}
	if c.Duration("partial-backup-interval") <= 0 || c.Duration("backup-takeover") <= 0 {
		return server.Config{}, usagef("--partial-backup-interval %v: want a positive duration", c.Duration("partial-backup-interval"))
	}
	log, err := logger(c)
	if err != nil {
		return server.Config{}, err
	}
	var retention time.Duration
	if v := c.String("archive-retention"); v != "0" && v != "" {
		if retention, err = parseAge(v); err != nil || retention <= 0 {
			return server.Config{}, usagef("--archive-retention %q: want an age such as 7d, 36h or 90m (0: keep all)", v)
		}
	}
	store, codec, err := openArchive(c, log.Warn)
	if err != nil {
		return server.Config{}, err
	}
	return server.Config{
		RemoteStorage: store, ArchiveCodec: codec, BackupParallelJobs: c.Int("backup-parallel-jobs"),
		PartialBackupInterval: c.Duration("partial-backup-interval"), BackupTakeover: c.Duration("backup-takeover"), ArchiveRetention: retention,
		NodeID: c.Uint64("id"), ListenPG: c.String("listen-pg"), DataDir: c.String("data-dir"),
		Logger: log, UnsafeNoFsync: c.Bool("unsafe-no-fsync"),
		WalSenderTimeout: walSenderTimeout, RetentionInterval: c.Duration("retention-interval"), RemovedTimelineGrace: c.Duration("removed-timeline-grace"),
		WalKeepSize: walKeep, MaxSlotWALKeepSize: slotKeep, MaxPeerWALKeepSize: peerKeep,
		ListenHTTP: c.String("listen-http"), EnablePprof: c.Bool("enable-pprof"),
		SlowFsyncThreshold: c.Duration("slow-fsync-threshold"),
		TLSCertFile:        c.String("tls-cert"), TLSKeyFile: c.String("tls-key"), TLSRequired: c.Bool("tls-required"),
		AuthPublicKeys: c.StringSlice("auth-public-key"), AllowAuthWithoutTLS: c.Bool("allow-auth-without-tls"),
		MaxConnections: c.Int("max-connections"), AuthenticationTimeout: c.Duration("authentication-timeout"),
		MaxTimelines: c.Int("max-timelines"), MaxSlots: c.Int("max-slots"), MaxDiskUsage: maxDisk, MaxTimelineDiskUsage: maxTLDisk,
		MinFreeDisk: minFree,
	}, nil
}

// checkSecurity checks the TLS and authentication flags and loads their
// files as the server will: --tls-cert with --tls-key, every
// --auth-public-key (a file that is missing, unreadable or holds no
// usable key is a usage error naming the flag and the file), then the
// rules between them. An empty value is no file: SAFEKEEPER_TLS_CERT= in
// a unit file's environment must not pass for a certificate (and so let
// --auth-public-key or --tls-required by without one).
func checkSecurity(c *cli.Context) error {
	tlsCert, tlsKey := c.String("tls-cert"), c.String("tls-key")
	if tlsCert != "" && tlsKey != "" {
		for _, f := range []struct{ flag, path string }{{"tls-cert", tlsCert}, {"tls-key", tlsKey}} {
			if _, err := os.ReadFile(f.path); err != nil {
				return usagef("--%s: %w", f.flag, err)
			}
		}
		if _, err := tls.LoadX509KeyPair(tlsCert, tlsKey); err != nil {
			return usagef("--tls-cert %s, --tls-key %s: %w", tlsCert, tlsKey, err)
		}
	}
	if keys := c.StringSlice("auth-public-key"); len(keys) > 0 {
		if _, err := auth.LoadVerifier(keys...); err != nil {
			return usagef("--auth-public-key: %w", err)
		}
	}
	if c.Bool("tls-required") && tlsCert == "" {
		return usagef("--tls-required needs --tls-cert and --tls-key")
	}
	if (tlsCert == "") != (tlsKey == "") {
		return usagef("--tls-cert and --tls-key go together")
	}
	if len(c.StringSlice("auth-public-key")) > 0 && tlsCert == "" && !c.Bool("allow-auth-without-tls") {
		return usagef("--auth-public-key without --tls-cert would have clients send their tokens in plaintext: give --tls-cert and --tls-key, or --allow-auth-without-tls on a trusted network")
	}
	return nil
}

// serve runs srv until SIGTERM or SIGINT (one that came while it started
// stops it before it serves), then shuts it down, bounded by 30 s.
func serve(srv *server.Server, sig <-chan os.Signal, log *slog.Logger) error {
	select {
	case s := <-sig: // while it started: stop before serving
		log.Info("shutting down before serving", "signal", s.String())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			return err
		}
		log.Info("stopped")
		return nil
	default:
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	select {
	case s := <-sig:
		log.Info("shutting down", "signal", s.String())
	case err := <-served:
		srv.Shutdown(context.Background())
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		return err
	}
	<-served
	log.Info("stopped")
	return nil
}

// reloader is what SIGHUP does to run: Server.Reload once the server is
// up; a SIGHUP before that is remembered and applied then.
type reloader struct {
	log     *slog.Logger
	mu      sync.Mutex
	srv     *server.Server // nil until started
	pending bool
}

func (r *reloader) signaled() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.srv == nil {
		r.pending = true
		return
	}
	r.reload()
}

func (r *reloader) started(srv *server.Server) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.srv = srv
	if r.pending {
		r.reload()
	}
}

// reload re-reads the TLS certificate and auth keys (Server.Reload logs
// the outcome). r.mu is held.
func (r *reloader) reload() {
	if !r.srv.Reloadable() {
		r.log.Info("SIGHUP ignored: nothing to reload (no --tls-cert, no --auth-public-key)")
		return
	}
	r.srv.Reload()
}
