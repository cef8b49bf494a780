package pgtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Signal names the file a copy made by BaseBackup finds in its data
// directory, which decides the recovery it starts in (PostgreSQL's
// standby.signal and recovery.signal).
type Signal string

const (
	// StandbySignal makes the copy a standby: it replays WAL streamed
	// from primary_conninfo (or fetched by restore_command) until it is
	// promoted. A hot standby: it answers read-only queries meanwhile.
	StandbySignal Signal = "standby.signal"
	// RecoverySignal makes it run archive recovery: it replays what
	// restore_command fetches, up to the end of it, and then promotes
	// itself onto a new PostgreSQL timeline.
	RecoverySignal Signal = "recovery.signal"
)

// BackupOptions configures BaseBackup. The zero value is a copy that
// starts as a primary of its own after crash recovery.
type BackupOptions struct {
	// Signal is the recovery the copy starts in; "" for none.
	Signal Signal
	// PrimaryConninfo is the copy's primary_conninfo, a libpq connection
	// string (BaseBackup quotes it for postgresql.conf): where a standby
	// streams WAL from, the source's TCPConnString or a safekeeper.
	PrimaryConninfo string
	// Slot, when set, is pg_basebackup -C -S Slot: a physical replication
	// slot created on the source with the backup, and the copy's
	// primary_slot_name.
	Slot string
	// NoWAL is pg_basebackup -X none: the copy holds no WAL of its own,
	// so recovery has only what restore_command fetches. The default is
	// -X stream, the WAL written during the backup.
	NoWAL bool
	// Conf holds extra postgresql.conf lines, after ours (so they win).
	Conf []string
}

// BaseBackup makes a new cluster from a base backup of c (pg_basebackup -c
// fast over c's socket), configured but not started: Start starts it. It
// has a private directory like Start's, listens on its own Unix socket
// there and on no TCP address (whatever c listens on), keeps c's other
// settings (the backup copies them), waits for no synchronous standby
// (synchronous_standby_names is emptied: one that is promoted sets its
// own), and takes o's. The same cleanup as Start's stops it and removes
// the directory. For the test goroutine only.
func (c *Cluster) BaseBackup(t testing.TB, o BackupOptions) *Cluster {
	t.Helper()
	cp := newCluster(t, c.Bin, c.WALSegSize)
	wal := "stream"
	if o.NoWAL {
		wal = "none"
	}
	args := []string{"-h", c.SocketDir, "-p", strconv.Itoa(c.Port), "-U", "postgres", "-D", cp.DataDir, "-X", wal, "-c", "fast"}
	if o.Slot != "" {
		args = append(args, "-C", "-S", o.Slot)
	}
	if out, err := cp.run(backupTimeout, "pg_basebackup", args...); err != nil {
		t.Fatalf("pgtest: pg_basebackup: %v\n%s", err, out)
	}
	lines := []string{
		"listen_addresses = ''",
		"port = " + strconv.Itoa(cp.Port),
		"unix_socket_directories = " + confString(cp.SocketDir),
		"synchronous_standby_names = ''",
		"primary_conninfo = " + confString(o.PrimaryConninfo),
		"primary_slot_name = " + confString(o.Slot),
	}
	if o.Signal == StandbySignal {
		lines = append(lines, "hot_standby = on")
	}
	lines = append(lines, o.Conf...)
	// The backup's pgtest.conf is c's, included last by postgresql.conf:
	// what is appended to it overrides c's settings.
	if err := appendFile(filepath.Join(cp.DataDir, "pgtest.conf"), "\n"+strings.Join(lines, "\n")+"\n"); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if o.Signal != "" {
		if err := cp.writeOwned(filepath.Join(cp.DataDir, string(o.Signal)), nil, 0o600); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	return cp
}

// StartStandby makes a hot standby of c and starts it: BaseBackup with
// StandbySignal (unless o names another Signal), then Start. It streams
// from o.PrimaryConninfo; it returns once the standby accepts connections.
func (c *Cluster) StartStandby(t testing.TB, o BackupOptions) *Cluster {
	t.Helper()
	if o.Signal == "" {
		o.Signal = StandbySignal
	}
	s := c.BaseBackup(t, o)
	s.Start(t)
	return s
}

// Start starts the server of a cluster that is not running — a copy made
// by BaseBackup, or one stopped by Stop, Kill or Shutdown — and returns
// once it accepts connections (pg_ctl start -w; a standby, once it has
// replayed to a consistent state). Cleanup stops it. For the test
// goroutine only.
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	c.stopOnce = sync.Once{}
	if out, err := c.pgctlStart(); err != nil {
		c.logTail(t)
		t.Fatalf("pgtest: pg_ctl start: %v\n%s", err, out)
	}
}

// Shutdown stops the server cleanly (pg_ctl stop -m fast): it returns when
// the shutdown checkpoint, a standby's restartpoint, is done. Start starts
// it again.
func (c *Cluster) Shutdown(t testing.TB) {
	t.Helper()
	if out, err := c.run(pgctlTimeout, "pg_ctl", "-D", c.DataDir, "-m", "fast", "-w", "stop"); err != nil {
		t.Fatalf("pgtest: pg_ctl stop -m fast: %v\n%s", err, out)
	}
}

// Promote promotes a standby (pg_ctl promote -w): it returns once the
// server has left recovery and accepts writes, on a new PostgreSQL
// timeline.
func (c *Cluster) Promote(t testing.TB) {
	t.Helper()
	if out, err := c.run(pgctlTimeout, "pg_ctl", "-D", c.DataDir, "-w", "-t", strconv.Itoa(int(pgctlTimeout/time.Second)-10), "promote"); err != nil {
		t.Fatalf("pgtest: pg_ctl promote: %v\n%s", err, out)
	}
}

// WaitReplay waits until the server (a standby) has replayed WAL up to lsn
// (pg_last_wal_replay_lsn(), an LSN as X/X), failing the test after
// timeout. It polls with a growing delay; it does not sleep a fixed time.
func (c *Cluster) WaitReplay(t testing.TB, lsn string, timeout time.Duration) {
	t.Helper()
	sql := "select pg_last_wal_replay_lsn() >= '" + lsn + "'::pg_lsn"
	waitFor(t, timeout, "replay to reach "+lsn, func() bool {
		out, err := c.Query(context.Background(), sql)
		return err == nil && out == "t"
	})
}

// waitFor polls cond with a growing delay (5 ms up to 200 ms) until it is
// true, failing the test after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	delay := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(delay)
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// confString quotes s as a postgresql.conf string value.
func confString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + "'"
}

// appendFile appends s to the file at path.
func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("append to %s: %w", path, err)
	}
	return nil
}
