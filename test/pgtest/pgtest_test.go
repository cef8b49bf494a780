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
