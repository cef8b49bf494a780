// Command safekeeper makes PostgreSQL's write-ahead log durable on a quorum
// of safekeepers and serves it back. See README.md.
//
// It owns the command line and the process around the packages that do the
// work; it holds no protocol logic of its own:
//
//	safekeeper run          a safekeeper server (package server; run.go)
//	safekeeper propose      the walproposer: a primary's WAL to a quorum (package proposer)
//	safekeeper sync         elect and bring a quorum to the end of WAL, print it (proposer.Sync)
//	safekeeper status       a running server's status, timeline list|show|delete its timelines
//	                        (server/httpapi's Client and models)
//	safekeeper inspect      what a stopped server's data dir holds (timeline.Inspect)
//	safekeeper timeline pull a timeline copied from a peer into a stopped server (timeline.Pull)
//	safekeeper wal export   a stopped server's WAL as pg_wal segment files (timeline.Export)
//	safekeeper wal dump     a timeline's WAL records as pg_waldump prints them (proto/xlog.Reader),
//	                        from a stopped server's data dir (timeline.OpenWAL) or a running one's
//	                        HTTP API
//	safekeeper archive      ls|verify|prune a timeline's WAL archive in --remote-storage
//	                        (storage/archive: Scan, Verify, Prune; archive.go)
//	safekeeper controller   the fleet's controller: placement over HTTP, one leader by etcd election
//	                        (package fleet/controller)
//	safekeeper cluster status the fleet as etcd holds it (fleet.Client.Status)
//	safekeeper token        Ed25519 key pairs (keygen) and the JWTs they sign (issue) (package server/auth)
//	safekeeper help         the commands, or one command's help
//
// # Flags to configuration
//
// Each command reads its flags (urfave/cli/v2) into the Config of the
// package it runs (server.Config, proposer.Config, proposer.SyncConfig) and
// checks every value before anything starts: ids of 32 hex digits, host:port
// lists without duplicates, a replication slot name PostgreSQL accepts
// (proto.CheckSlotName), PostgreSQL 15 version numbers, segment sizes,
// positive durations. A bad value is a usage error found before any file
// is opened or socket dialled (the one found later: run on a data directory
// that belongs to another --id). The global --log-format (text, json) and
// --log-level pick one slog.Logger on stderr, handed to the package; nothing
// logs through a global logger.
//
// # Lifecycle
//
// run: serverConfig (every flag checked), server.New (creates the data
// directory, listens, opens the bbolt file, claims or checks the node id),
// then Serve until SIGTERM or SIGINT (serve). The signal starts Shutdown:
// stop
// accepting, make what was received durable, answer it, end every stream,
// bounded by 30 s; then exit 0. propose and sync run until their work ends
// or SIGTERM/SIGINT cancels their context (sync also ends at --timeout);
// propose --listen-http serves the proposer's Stats (Prometheus /metrics,
// /healthz, /readyz: proposehttp.go) meanwhile.
// SIGHUP makes run re-read its TLS certificate and auth public keys; it is
// logged and ignored by propose and sync (and by run without them): its
// default action would kill the process without a clean shutdown when
// logrotate signals it or its terminal closes. wal export
// and wal dump --data-dir open the bbolt file read-only and fail (exit 1)
// at once when a running server holds its lock; on a terminal they show
// progress on stderr (progress.go).
//
// # Exit codes
//
//	0  success; run and propose after SIGTERM/SIGINT and a clean stop
//	1  any other error (also sync without a quorum in --timeout)
//	2  usage: a bad or missing flag or argument, an unknown command, a bad
//	   value (urfave/cli's own parse errors too), run on a data directory
//	   that belongs to another --id
//	3  deposed: propose or sync met a higher term on a safekeeper; another
//	   proposer owns the timeline
//	4  refused for good (exitPermanent): a restart cannot fix it, an operator
//	   must act: run on a data directory it cannot use (permission denied,
//	   not a directory, a read-only file system, a damaged database); propose
//	   or sync on a timeline no safekeeper holds; propose or sync refused by
//	   the safekeepers for good (another system id,
//	   segment size or major version; a primary of an older PostgreSQL
//	   timeline, which a standby was promoted from; a forked timeline
//	   history). The systemd units do not restart after 2 or 4
//	   (RestartPreventExitStatus)
//
// Every error is one line on stderr, "safekeeper: ..."; report picks the
// code from the error's type (usageError, permanentError, cli.ExitCoder).
//
// Why the boundary sits here: flags, signals, exit codes and the process's
// stdout and stderr are the only things a command line adds, so they stay
// here and nothing imports this package; server, proposer and the timeline
// host take a Config and a context, and are tested and embedded without a
// process. What reads or writes a data directory, or calls the HTTP API, is
// a package's API: this package imports neither storage nor acceptor (a
// test checks).
package main
