package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestStartExecAndCleanup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	var c *Cluster
	t.Run("cluster", func(t *testing.T) {
		c = Start(t, Options{WALLevel: "logical", WALSegSizeMB: 1, Conf: []string{"work_mem = '7MB'"}})

		v, err := strconv.Atoi(c.Exec(t, "SHOW server_version_num"))
		if err != nil || v/10000 != 15 {
			t.Fatalf("server_version_num = %d (%v), want 15xxxx", v, err)
		}
		if got := c.Exec(t, "SHOW wal_level"); got != "logical" {
			t.Errorf("wal_level = %q, want logical", got)
		}
		if got := c.Exec(t, "SHOW wal_segment_size"); got != "1MB" {
			t.Errorf("wal_segment_size = %q, want 1MB", got)
		}
		if got := c.Exec(t, "SHOW work_mem"); got != "7MB" {
			t.Errorf("extra Conf line not applied: work_mem = %q", got)
		}
		if got := c.Exec(t, "SHOW max_wal_senders; SHOW max_replication_slots; SHOW fsync"); got != "10\n10\non" {
			t.Errorf("settings = %q", got)
		}
		// Several statements, each in its own transaction: CHECKPOINT
		// would fail inside a transaction block.
		if got := c.Exec(t, "CREATE TABLE x(i int); CHECKPOINT; INSERT INTO x VALUES (1),(2); SELECT sum(i) FROM x"); got != "3" {
			t.Errorf("multi-statement output = %q, want 3", got)
		}
		// ConnString reaches the server over its Unix socket (a socket
		// connection has no server address), and it listens on no TCP
		// address at all.
		out, err := c.command(context.Background(), "psql", "-XAtq", "-d", c.ConnString(), "-c", "SELECT inet_server_addr() IS NULL, current_setting('listen_addresses')").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "t|" {
			t.Errorf("psql %q: %q, %v; want a socket connection and listen_addresses ''", c.ConnString(), out, err)
		}
		if _, err := c.Query(context.Background(), "SELECT * FROM no_such_table"); err == nil {
			t.Error("Query of a missing table did not fail")
		}
		if _, err := os.Stat(filepath.Join(c.WALDir(), "000000010000000000000001")); err != nil && c.Exec(t, "SELECT count(*) > 0 FROM pg_ls_waldir()") != "t" {
			t.Errorf("WALDir %s has no segments", c.WALDir())
		}
		if _, err := os.Stat(c.PgBin("pg_waldump")); err != nil {
			t.Errorf("PgBin: %v", err)
		}
	})
	if c == nil {
		t.Fatal("subtest did not start a cluster")
	}
	// The subtest's cleanup must have stopped the server and removed its
	// directory.
	if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
		t.Errorf("cluster dir %s still exists after cleanup (err=%v)", c.Dir, err)
	}
	out, err := c.command(context.Background(), "pg_isready", "-h", c.SocketDir, "-p", strconv.Itoa(c.Port)).CombinedOutput()
	if err == nil {
		t.Errorf("server still accepting connections after cleanup: %s", out)
	}
}

func TestBinDir(t *testing.T) {
	t.Setenv("PG_BINDIR", "/nonexistent")
	dir, err := BinDir()
	if err != nil {
		t.Fatal(err) // the host must have PostgreSQL 15; never skip
	}
	if _, err := os.Stat(filepath.Join(dir, "pg_waldump")); err != nil {
		t.Errorf("BinDir %s has no pg_waldump: %v", dir, err)
	}
}

// TestKillRestart: Kill ends the postmaster and its children with SIGKILL
// (no shutdown checkpoint: the next start runs crash recovery) and a
// committed row survives Restart.
func TestKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	c := Start(t, Options{})
	c.Exec(t, "CREATE TABLE k(i int); INSERT INTO k VALUES (42)")
	pid, err := c.Pid()
	if err != nil {
		t.Fatal(err)
	}
	kids := children(pid)
	if len(kids) == 0 {
		t.Fatalf("postmaster %d has no children", pid)
	}
	c.Kill(t)
	for _, p := range append(kids, pid) {
		if alive(p) {
			t.Fatalf("process %d alive after Kill", p)
		}
	}
	if _, err := c.Query(context.Background(), "SELECT 1"); err == nil {
		t.Fatal("server answers after Kill")
	}
	c.Stop(t) // a no-op after Kill
	c.Restart(t)
	if got := c.Exec(t, "SELECT i FROM k"); got != "42" {
		t.Fatalf("after restart: %q", got)
	}
	if p2, err := c.Pid(); err != nil || p2 == pid {
		t.Fatalf("pid after restart %d (%v), before %d", p2, err, pid)
	}
	b, _ := os.ReadFile(c.LogFile)
	if !strings.Contains(string(b), "not properly shut down; automatic recovery in progress") {
		t.Fatalf("no crash recovery after Kill:\n%s", b)
	}
	c.Restart(t) // running: stops, then starts
	if got := c.Exec(t, "SELECT i FROM k"); got != "42" {
		t.Fatalf("after second restart: %q", got)
	}
}

// TestTCP: with Options.TCP the server also listens on 127.0.0.1 at Port,
// outside the ephemeral range; a port in use (held here) makes Start try
// another, and TCPConnString reaches the server over TCP.
func TestTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldPort := held.Addr().(*net.TCPAddr).Port
	picks := 0
	pickPort = func() int {
		picks++
		if picks == 1 {
			return heldPort // in use: the server cannot bind it
		}
		return randomPort()
	}
	t.Cleanup(func() { pickPort = randomPort })

	c := Start(t, Options{TCP: true})
	if picks != 2 || c.Port == heldPort {
		t.Fatalf("%d ports picked, started on %d (held: %d); want a second pick", picks, c.Port, heldPort)
	}
	out, err := c.command(context.Background(), "psql", "-XAtq", "-d", c.TCPConnString(), "-c", "SELECT inet_server_addr(), inet_server_port()").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "127.0.0.1|"+strconv.Itoa(c.Port) {
		t.Fatalf("psql %q: %q, %v", c.TCPConnString(), out, err)
	}
	if got := c.Exec(t, "SELECT inet_server_addr() IS NULL"); got != "t" {
		t.Fatalf("Exec is not over the socket: %q", got)
	}
}

func TestRandomPortOutsideEphemeralRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skip(err)
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		t.Fatal(err)
	}
	if lo <= 1024 && hi >= 65535 {
		t.Skipf("every port is ephemeral here (%d-%d)", lo, hi)
	}
	for range 1000 {
		if p := randomPort(); p < 1024 || p > 65535 || (p >= lo && p <= hi) {
			t.Fatalf("randomPort() = %d; ephemeral range %d-%d", p, lo, hi)
		}
	}
}

// TestBaseBackupCopies: StartStandby makes a hot standby in a directory of
// its own, on its own socket and no TCP address, streaming from its
// primary_conninfo (quoted for postgresql.conf: a value with a quote and a
// backslash arrives whole) through the slot it made; it replays, answers
// read-only queries, stops cleanly and starts again, and Promote makes it
// a primary on timeline 2. A RecoverySignal copy without WAL recovers
// from restore_command alone and promotes itself at the end of it. Each
// copy's directory is gone after its test.
func TestBaseBackupCopies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	pg := Start(t, Options{WALSegSizeMB: 1, TCP: true})
	pg.Exec(t, "CREATE TABLE b(i int); INSERT INTO b VALUES (1)")
	var dirs []string
	t.Run("standby", func(t *testing.T) {
		const app = `it's a \ standby`
		sb := pg.StartStandby(t, BackupOptions{
			PrimaryConninfo: pg.ConnString() + ` application_name='it\'s a \\ standby'`,
			Slot:            "copy_slot",
			Conf:            []string{"wal_receiver_status_interval = 1s"},
		})
		dirs = append(dirs, sb.Dir)
		if sb.Dir == pg.Dir || sb.SocketDir != sb.Dir || sb.Port != Port {
			t.Fatalf("the copy's directory %s, socket %s:%d; the primary's %s", sb.Dir, sb.SocketDir, sb.Port, pg.Dir)
		}
		if got := sb.Exec(t, "SELECT pg_is_in_recovery(), current_setting('listen_addresses'), current_setting('hot_standby'), current_setting('wal_receiver_status_interval')"); got != "t||on|1s" {
			t.Fatalf("the standby: %q, want in recovery, no TCP address, hot_standby on and the extra Conf line", got)
		}
		pg.Exec(t, "INSERT INTO b VALUES (2)")
		flush := pg.Exec(t, "SELECT pg_current_wal_flush_lsn()")
		sb.WaitReplay(t, flush, 60*time.Second)
		if got := sb.Exec(t, "SELECT sum(i) FROM b"); got != "3" {
			t.Fatalf("the standby after replay: sum %q, want 3", got)
		}
		if got := pg.Exec(t, "SELECT application_name || '|' || state FROM pg_stat_replication"); got != app+"|streaming" {
			t.Fatalf("pg_stat_replication on the primary: %q, want %q streaming", got, app)
		}
		if got := pg.Exec(t, "SELECT active FROM pg_replication_slots WHERE slot_name = 'copy_slot'"); got != "t" {
			t.Fatalf("the copy's slot on the primary: active %q", got)
		}
		sb.Shutdown(t)
		if _, err := sb.Query(context.Background(), "SELECT 1"); err == nil {
			t.Fatal("the standby answers after Shutdown")
		}
		sb.Start(t)
		sb.Promote(t)
		// The timeline of the WAL it writes (its end-of-recovery
		// checkpoint, which pg_control shows, may come later).
		if got := sb.Exec(t, "SELECT pg_is_in_recovery(); INSERT INTO b VALUES (4); SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"); got != "f\n00000002" {
			t.Fatalf("after Promote: %q, want out of recovery on timeline 2", got)
		}
	})
	t.Run("recovery from restore_command", func(t *testing.T) {
		pg.Exec(t, "SELECT pg_switch_wal()")
		cp := pg.BaseBackup(t, BackupOptions{Signal: RecoverySignal, NoWAL: true,
			Conf: []string{"restore_command = 'cp " + pg.WALDir() + "/%f %p'"}})
		dirs = append(dirs, cp.Dir)
		if ents, err := os.ReadDir(filepath.Join(cp.DataDir, "pg_wal")); err != nil || len(ents) > 1 { // archive_status/
			t.Fatalf("NoWAL: %d entries in the copy's pg_wal (%v)", len(ents), err)
		}
		pg.Exec(t, "INSERT INTO b VALUES (8); SELECT pg_switch_wal()")
		cp.Start(t)
		waitFor(t, 60*time.Second, "the recovered copy out of recovery with every row the primary switched out", func() bool {
			return cp.Exec(t, "SELECT pg_is_in_recovery()::text || ' ' || (SELECT sum(i) FROM b)") == "false 11"
		})
	})
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("copy directory %s still exists after its test (err=%v)", d, err)
		}
	}
	if len(dirs) != 2 {
		t.Fatalf("%d copies made, want 2", len(dirs))
	}
}
