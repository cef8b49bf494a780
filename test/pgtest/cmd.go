package pgtest

import (
	"context"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Cmd returns a command running program name — from the cluster's bin
// directory, or from PATH if it is not a PostgreSQL program — as the
// postgres user when we are root (PostgreSQL refuses root). Unlike the
// runuser wrapper Start uses, the program is the command's direct child, so
// signals sent to cmd.Process (SIGINT to pg_receivewal, say) reach it.
func (c *Cluster) Cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	path := c.PgBin(name)
	if _, err := os.Stat(path); err != nil {
		path = name
	}
	cmd := exec.CommandContext(ctx, path, args...)
	if os.Geteuid() == 0 {
		uid, gid := postgresIDs()
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	cmd.Dir = "/" // absolute paths everywhere; the postgres user may not read our cwd
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Run runs Cmd(name, args...) with a 2-minute limit and returns its combined
// output; a failure fails the test with that output.
func (c *Cluster) Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := c.Cmd(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %q: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// Dir makes a temporary directory (removed at the end of the test) that
// the user PostgreSQL programs run as owns, for base backups, pg_receivewal
// output and the like.
func Dir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ChownToPostgres(dir); err != nil && os.Geteuid() == 0 {
		t.Fatal(err)
	}
	return dir
}

// ChownToPostgres hands path (recursively) to the postgres user when we are
// root; otherwise it does nothing.
func ChownToPostgres(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	return chownToPostgres(path)
}

func postgresIDs() (int, int) {
	u, err := user.Lookup("postgres")
	if err != nil {
		panic("pgtest: running as root without a postgres user: " + err.Error())
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return uid, gid
}
