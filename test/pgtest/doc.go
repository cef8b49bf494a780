// Package pgtest starts a throwaway PostgreSQL 15 server for tests.
//
// It owns one thing: the lifecycle of a scratch cluster (initdb into a
// private temporary directory, a postgresql.conf listening only on a Unix
// socket inside that directory, pg_ctl start -w, and a t.Cleanup that stops
// it with pg_ctl stop -m immediate and removes the directory, even when the
// test fails). It also finds the PostgreSQL 15
// binaries (pg_waldump, psql, ...) for tests that only need a tool.
//
// A cluster's copies are clusters too (BaseBackup, StartStandby):
// pg_basebackup into a private directory of their own, the source's
// settings with their own socket and no TCP address, a primary_conninfo to
// stream from (the source, or a safekeeper: test/harness's StartStandby
// builds that one), a slot, a standby.signal or recovery.signal; then
// Start, Shutdown, Promote and WaitReplay, and the same Query, Kill,
// Restart and cleanup as the cluster they were copied from.
//
// The boundary sits here so that the WAL decoder's oracle tests, the
// proposer's tests and the end-to-end harness share one careful
// implementation of the fiddly parts: PostgreSQL refuses to run as root (when
// the test runs as root every PostgreSQL program is run through
// "runuser -u postgres --" and the directory is chowned to postgres),
// servers must not compete for ports, and nothing may sleep to wait (pg_ctl
// -w does the waiting). PostgreSQL cannot bind port 0 and report the port
// it got, so a test's server listens on no TCP port at all: clients reach
// it over the socket in its own directory (ConnString, psql -h SocketDir),
// and the port number (Port, the same for every cluster) only names the
// socket file. It imports nothing from this module.
//
// Lifecycle: Start → Exec/Query/ConnString … → (Stop, or automatic at
// cleanup); a copy: BaseBackup → Start (or StartStandby) → … → the same
// cleanup. On a failed test the tail of each server log is logged.
//
// Binaries are looked up in $PG_BINDIR, then `pg_config --bindir` (only when
// it reports PostgreSQL 15), then /usr/lib/postgresql/15/bin.
package pgtest
