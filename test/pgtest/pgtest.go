package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// DefaultBinDir is where Debian/Ubuntu install the PostgreSQL 15 programs.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// Timeouts for the PostgreSQL programs we run. pg_ctl gets its own -t too.
const (
	initdbTimeout = 120 * time.Second
	pgctlTimeout  = 90 * time.Second
	psqlTimeout   = 60 * time.Second
	// startTimeout bounds pg_ctl start: a copy's recovery (BaseBackup)
	// may fetch WAL through restore_command before it is consistent.
	startTimeout = 190 * time.Second
	// backupTimeout bounds pg_basebackup (a benchmark copies gigabytes).
	backupTimeout = 10 * time.Minute
)

// Port is the port number of every cluster Start makes without
// Options.TCP. It names the server's Unix socket (SocketDir/.s.PGSQL.5432),
// not a TCP port: such servers listen on no TCP address (listen_addresses
// is empty), and each has a socket directory of its own, so they never
// compete for a port. A standby or a restored copy made from such a cluster's data
// directory inherits both settings and needs only a socket directory of
// its own.
const Port = 5432

// tcpAttempts bounds how often Start tries another TCP port (Options.TCP)
// when the server reports the one it was given in use.
const tcpAttempts = 10

// Options configures Start. The zero value is a replica-level cluster with
// 16 MiB WAL segments.
type Options struct {
	// WALLevel is wal_level: "replica" (default when empty), "logical" or
	// "minimal".
	WALLevel string
	// WALSegSizeMB is initdb's --wal-segsize in MiB (a power of two,
	// 1..1024); 0 keeps PostgreSQL's default of 16.
	WALSegSizeMB int
	// Conf holds extra postgresql.conf lines, appended after ours (so they
	// win), e.g. "wal_keep_size = '1GB'".
	Conf []string
	// TCP makes the server listen on 127.0.0.1 as well, at Cluster.Port,
	// for what must use TCP (a benchmark's replication links, which a
	// socket would flatter). PostgreSQL cannot bind port 0, so Start
	// gives it a random port outside the kernel's ephemeral range (where
	// other tests' port-0 listeners and outgoing connections take theirs)
	// and, if the server says it could not bind it, another, up to 10
	// times. Without TCP no port is picked at all.
	TCP bool
}

// Cluster is a running throwaway PostgreSQL 15 server.
type Cluster struct {
	// Dir is the private temporary directory holding everything below; it
	// is removed at cleanup.
	Dir string
	// DataDir is the cluster's data directory (PGDATA), Dir/data.
	DataDir string
	// SocketDir is unix_socket_directories, Dir itself: the host of every
	// connection (libpq host=SocketDir, psql -h SocketDir).
	SocketDir string
	// LogFile is the server log, Dir/server.log.
	LogFile string
	// Port names the server's socket in SocketDir: the package's Port, or
	// with Options.TCP also the TCP port it listens on at 127.0.0.1.
	Port int
	// Bin is the directory of the PostgreSQL 15 programs.
	Bin string
	// WALSegSize is the WAL segment size in bytes.
	WALSegSize uint64

	asPostgres bool
	stopOnce   sync.Once
}

// BinDir returns the directory of the PostgreSQL 15 programs, or an error
// naming where it looked. See the package comment for the search order.
func BinDir() (string, error) {
	var tried []string
	ok := func(dir string) bool {
		tried = append(tried, dir)
		st, err := os.Stat(filepath.Join(dir, "initdb"))
		return err == nil && !st.IsDir()
	}
	if dir := os.Getenv("PG_BINDIR"); dir != "" && ok(dir) {
		return dir, nil
	}
	if out, err := exec.Command("pg_config", "--version", "--bindir").Output(); err == nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) == 2 && strings.HasPrefix(lines[0], "PostgreSQL 15") && ok(strings.TrimSpace(lines[1])) {
			return strings.TrimSpace(lines[1]), nil
		}
	}
	if ok(DefaultBinDir) {
		return DefaultBinDir, nil
	}
	return "", fmt.Errorf("pgtest: PostgreSQL 15 programs not found (no initdb in %s); install postgresql-15 or set PG_BINDIR", strings.Join(tried, ", "))
}

// MustBinDir is BinDir for tests: it fails t (t.Fatal, never Skip) when the
// programs are missing.
func MustBinDir(t testing.TB) string {
	t.Helper()
	dir, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// Start creates, configures and starts a new cluster and registers a
// t.Cleanup that stops it (immediate mode) and removes its directory. Any
// failure fails t with the tail of the server log. Start is not for use from
// goroutines other than the test's.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	bin := MustBinDir(t)
	if opts.WALLevel == "" {
		opts.WALLevel = "replica"
	}
	segMB := opts.WALSegSizeMB
	if segMB == 0 {
		segMB = 16
	}
	if segMB < 1 || segMB > 1024 || segMB&(segMB-1) != 0 {
		t.Fatalf("pgtest: WALSegSizeMB %d is not a power of two in 1..1024", segMB)
	}

	c := newCluster(t, bin, uint64(segMB)<<20)

	args := []string{"-D", c.DataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8",
		"--locale=C", "--no-sync", "--wal-segsize=" + strconv.Itoa(segMB)}
	if out, err := c.run(initdbTimeout, "initdb", args...); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}

	for attempt := 1; ; attempt++ {
		if opts.TCP {
			c.Port = pickPort()
		}
		if err := c.writeConf(opts); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		logFrom := fileSize(c.LogFile)
		out, err := c.pgctlStart()
		if err == nil {
			return c
		}
		// PostgreSQL's words when it could bind none of listen_addresses.
		if opts.TCP && attempt < tcpAttempts && strings.Contains(readFrom(c.LogFile, logFrom), "could not create any TCP/IP sockets") {
			t.Logf("pgtest: port %d is in use; trying another", c.Port)
			continue
		}
		c.logTail(t)
		t.Fatalf("pgtest: pg_ctl start: %v\n%s", err, out)
	}
}

// newCluster makes the private directory of a new cluster (its data
// directory not yet made) and registers the cleanup that stops the server
// and removes the directory, logging the server log's tail first if the
// test failed.
func newCluster(t testing.TB, bin string, walSegSize uint64) *Cluster {
	t.Helper()
	// Our own MkdirTemp rather than t.TempDir: t.TempDir's parent is 0700
	// and owned by root, which the postgres user could not traverse.
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	c := &Cluster{
		Dir:        dir,
		DataDir:    filepath.Join(dir, "data"),
		SocketDir:  dir,
		LogFile:    filepath.Join(dir, "server.log"),
		Port:       Port,
		Bin:        bin,
		WALSegSize: walSegSize,
		asPostgres: os.Geteuid() == 0,
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.logTail(t)
		}
		c.stop(t)
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("pgtest: remove %s: %v", dir, err)
		}
	})
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if c.asPostgres {
		if err := chownToPostgres(dir); err != nil {
			t.Fatalf("pgtest: running as root and %v", err)
		}
	}
	return c
}

// pgctlStart runs pg_ctl start -w: it returns once the server accepts
// connections (a standby: once it has reached a consistent state).
func (c *Cluster) pgctlStart() ([]byte, error) {
	return c.run(startTimeout, "pg_ctl", "-D", c.DataDir, "-l", c.LogFile,
		"-w", "-t", strconv.Itoa(int(startTimeout/time.Second)-10), "start")
}

// pickPort chooses the TCP port of a start with Options.TCP (a variable
// so that a test can hand it a port in use).
var pickPort = randomPort

// randomPort returns a random port from 1024..65535 outside the kernel's
// ephemeral range (net.ipv4.ip_local_port_range), so that neither a port-0
// listener nor an outgoing connection can hold it.
func randomPort() int {
	lo, hi := 32768, 60999 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			l, err1 := strconv.Atoi(f[0])
			h, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && l <= h {
				lo, hi = l, h
			}
		}
	}
	type span struct{ first, last int }
	var spans []span
	if lo > 1024 {
		spans = append(spans, span{1024, lo - 1})
	}
	if hi < 65535 {
		spans = append(spans, span{hi + 1, 65535})
	}
	if spans == nil { // every port is ephemeral: the retries must do
		spans = []span{{1024, 65535}}
	}
	n := 0
	for _, s := range spans {
		n += s.last - s.first + 1
	}
	k := rand.IntN(n)
	for _, s := range spans {
		if k <= s.last-s.first {
			return s.first + k
		}
		k -= s.last - s.first + 1
	}
	panic("pgtest: randomPort: k out of range")
}

// fileSize is the size of path, 0 if it does not exist.
func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// readFrom returns path's contents from offset on.
func readFrom(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}

// writeConf writes our settings to an include file, pgtest.conf, and makes
// postgresql.conf include it.
func (c *Cluster) writeConf(opts Options) error {
	listen := "''" // the Unix socket only: no TCP port to pick
	if opts.TCP {
		listen = "'127.0.0.1'"
	}
	lines := []string{
		"listen_addresses = " + listen,
		"port = " + strconv.Itoa(c.Port),
		"unix_socket_directories = '" + c.SocketDir + "'",
		"wal_level = " + opts.WALLevel,
		"max_wal_senders = 10",
		"max_replication_slots = 10",
		"fsync = on",
		"logging_collector = off",
		"log_min_messages = warning",
	}
	lines = append(lines, opts.Conf...)
	if err := c.writeOwned(filepath.Join(c.DataDir, "pgtest.conf"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	main := filepath.Join(c.DataDir, "postgresql.conf")
	b, err := os.ReadFile(main)
	if err != nil {
		return err
	}
	const incLine = "include = 'pgtest.conf'\n"
	if !bytes.Contains(b, []byte(incLine)) {
		return appendFile(main, "\n"+incLine)
	}
	return nil
}

// writeOwned writes a file the server reads, owned by the user it runs as.
func (c *Cluster) writeOwned(path string, data []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, data, mode); err != nil {
		return err
	}
	if c.asPostgres {
		return chownToPostgres(path)
	}
	return nil
}

// ConnString returns a libpq keyword/value connection string for the
// postgres superuser over the server's Unix socket (add replication=true
// and the like as needed).
func (c *Cluster) ConnString() string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", c.SocketDir, c.Port)
}

// TCPConnString is ConnString over TCP, for a cluster started with
// Options.TCP.
func (c *Cluster) TCPConnString() string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", c.Port)
}

// PgBin returns the path of the PostgreSQL 15 program name, e.g.
// PgBin("pg_waldump").
func (c *Cluster) PgBin(name string) string { return filepath.Join(c.Bin, name) }

// WALDir returns the cluster's pg_wal directory.
func (c *Cluster) WALDir() string { return filepath.Join(c.DataDir, "pg_wal") }

// Query runs sql (one or more statements, each in its own transaction, so
// CHECKPOINT works) with psql -XAtq over the unix socket and returns the
// trimmed output. It is safe to call from any goroutine.
func (c *Cluster) Query(ctx context.Context, sql string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, psqlTimeout)
	defer cancel()
	cmd := c.command(ctx, "psql", "-XAtq", "-v", "ON_ERROR_STOP=1",
		"-h", c.SocketDir, "-p", strconv.Itoa(c.Port), "-U", "postgres", "-d", "postgres", "-f", "-")
	cmd.Stdin = strings.NewReader(sql)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("pgtest: psql: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// Exec is Query for the test goroutine: it fails t on error.
func (c *Cluster) Exec(t testing.TB, sql string) string {
	t.Helper()
	out, err := c.Query(context.Background(), sql)
	if err != nil {
		t.Fatalf("%v\nSQL: %s", err, sql)
	}
	return out
}

// Stop stops the server now (pg_ctl stop -m immediate: no shutdown
// checkpoint, like a crash). It is idempotent; cleanup calls it too.
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	c.stop(t)
}

func (c *Cluster) stop(t testing.TB) {
	c.stopOnce.Do(func() {
		if _, err := os.Stat(filepath.Join(c.DataDir, "postmaster.pid")); err != nil {
			return // never started, or already down
		}
		if out, err := c.run(pgctlTimeout, "pg_ctl", "-D", c.DataDir, "-m", "immediate", "-w", "stop"); err != nil {
			t.Errorf("pgtest: pg_ctl stop: %v\n%s", err, out)
		}
	})
}

// logTail logs the last lines of the server log.
func (c *Cluster) logTail(t testing.TB) {
	b, err := os.ReadFile(c.LogFile)
	if err != nil {
		t.Logf("pgtest: server log: %v", err)
		return
	}
	const keep = 4000
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	t.Logf("pgtest: tail of %s:\n%s", c.LogFile, b)
}

// run runs a PostgreSQL program with a timeout and returns its combined
// output.
func (c *Cluster) run(timeout time.Duration, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := c.command(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s timed out after %v: %w", name, timeout, err)
	}
	return out.Bytes(), err
}

// command builds an exec.Cmd for a PostgreSQL program, through runuser when
// we are root. WaitDelay bounds how long a killed program's pipes may linger.
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	path := c.PgBin(name)
	var cmd *exec.Cmd
	if c.asPostgres {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = "/" // absolute paths everywhere; the postgres user may not read our cwd
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// chownToPostgres hands path (recursively) to the postgres user.
func chownToPostgres(path string) error {
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("no postgres user: %w", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	return filepath.Walk(path, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}
