// Package archive is the WAL archive's benchmark (make bench-archive):
// what `safekeeper run --remote-storage` costs and delivers next to
// pgBackRest's archive-push and archive-get, the usual way to archive a
// PostgreSQL 15 primary's WAL, on the same machine, into the same S3
// server, in the same run.
//
// The store is one versitygw (test/s3test) serving TLS on 127.0.0.1 with a
// certificate from a CA the benchmark makes (test/tlstest): pgBackRest's S3
// repository needs TLS, and both clients verify the certificate (the
// safekeeper through AWS_CA_BUNDLE, pgBackRest through
// repo1-storage-ca-file; pgBackRest matches host names only, not IP
// addresses, so it is pointed at localhost). pgBackRest runs as the
// PostgreSQL user, async, process-max 4, compress-type zst (its default
// level, 3); the safekeeper with its defaults (--backup-parallel-jobs 4,
// zstd at klauspost/compress's default level, --partial-backup-interval
// 10s).
//
// Two phases, each round by round with the two sides alternating, so the
// noise of a shared machine falls on both:
//
//  1. The same segments (upload, restore, compression). One primary (16
//     MiB segments) streams through a proposer to one safekeeper, with
//     no archive, while pgbench (synchronous_commit off) writes
//     BENCH_SEGMENTS whole segments; the safekeeper is stopped and its
//     data directory kept as a template, and the same segment files are
//     copied from the primary's pg_wal into a directory laid out as a data
//     directory (pg_control, pg_wal, an archive_status/*.ready per
//     segment), as PostgreSQL leaves them for its archiver. Per round:
//     (a) a copy of the template, flushed to disk (as a data directory
//     is when its safekeeper restarts: the copy's dirty pages would
//     otherwise be written back by the first fsync, 0.35 s inside the
//     clock), is started with --remote-storage (a fresh prefix) and timed from its start until its backup_lsn (GET
//     /v1/tenant/T/timeline/L, every 10 ms) reaches the end of the last
//     segment: the WAL is committed on it before the clock starts, so this
//     is the archive's upload of committed WAL; (b) `pgbackrest
//     archive-push` is run for each segment in order, as the archiver
//     would (the first call starts the async process, which pushes every
//     .ready segment with 4 processes), timed until the last call
//     returns, into a fresh repository path (stanza-create before the
//     clock). Then both archives are restored segment by segment, as
//     restore_command does: `safekeeper wal fetch --remote-storage` and
//     `pgbackrest archive-get` (async with its prefetch, and without),
//     every segment's SHA-256 checked against the original. Stored bytes
//     are the sizes of the segments' objects in versitygw's directory.
//  2. Under pgbench (lag and TPS). The same primary streams through the
//     proposer to three safekeepers (synchronous_standby_names =
//     'proposer'), archive_mode on. Three configurations alternate round
//     by round: none (no archive: the safekeepers without
//     --remote-storage, archive_command 'true'), sk (the safekeepers with
//     --remote-storage), pgbackrest (archive_command = pgbackrest
//     archive-push %p, archive_timeout 60s), the order rotated by one
//     each cycle, after one unreported warm-up round of BENCH_WARMUP
//     seconds per configuration. Before each round the
//     safekeepers are restarted with the configuration's flags,
//     pgbench's cleanup and a CHECKPOINT run, pg_switch_wal() closes the
//     segment, and the harness waits until the configuration's archive has
//     everything (backup_lsn, or pg_stat_archiver). During the round it
//     samples every 100 ms the primary's pg_current_wal_flush_lsn() and
//     the archive's end (the highest backup_lsn of the three safekeepers;
//     the end of pg_stat_archiver.last_archived_wal), in every
//     configuration alike; the lag is their difference. After each sk
//     round every whole segment below the highest backup_lsn must be in
//     the store, or the run fails: a lag that is not real is no figure.
//     The servers' CPU time over the round (utime+stime+cutime+cstime of
//     the primary's process tree with its archiver and archive_command,
//     the proposer and the safekeepers), read once pgbench's backends are
//     reaped, is divided by the round's transactions: the archive's cost
//     in the figure the machine's noise moves least.
//
// Ratios are of the medians over rounds (sk/pgbackrest for rates, sk/none
// for TPS and CPU per transaction). The results, with the machine, the method and the command,
// replace the bench-archive section of docs/performance.md
// (BENCH_WRITE_DOC=0: not).
//
// Lifecycle: TestBenchArchive skips unless -bench.archive is given, so
// make test only compiles and vets it (the parsers' unit tests do run).
// Every process it starts is stopped and every directory removed by
// t.Cleanup, also on failure: the pgBackRest processes it or PostgreSQL
// started are found by their command line, which names the benchmark's
// own configuration file, and killed by process id.
//
// Why the boundary sits here: a benchmark is not a test of correctness
// and takes minutes; it reuses test/pgtest, test/harness, test/s3test and
// test/tlstest for the fiddly parts and owns only the measurement. The
// package holds tests only; this file exists for its documentation.
package archive
