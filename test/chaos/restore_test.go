package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// TestRestoreFromSafekeepersLosesNothing: a base backup without WAL
// (pg_basebackup -X none), transfers under load, then kill -9 of the
// primary and the proposer together (a lost host: commit_lsn on the
// safekeepers may lag what the primary acknowledged). The backup is
// restored into a new data directory whose only WAL source is
// `restore_command = 'safekeeper wal fetch ... %f %p'`, and promoted at the
// end of recovery: every acknowledged transfer is there, the total balance
// is 0, the last segment came zero-padded, and the server is on a new
// PostgreSQL timeline.
func TestRestoreFromSafekeepersLosesNothing(t *testing.T) {
	skipShort(t)
	rng := newRand(t)
	c := startCluster(t, options{})
	b := newBank(t, c.pg)

	restore := pgtest.Dir(t, "restore-")
	data := filepath.Join(restore, "data")
	c.pg.Run(t, "pg_basebackup", "-h", c.pg.SocketDir, "-p", strconv.Itoa(c.pg.Port), "-U", "postgres", "-D", data, "-X", "none", "-c", "fast")
	backupEnd := c.flushLSN()

	b.start(6, rng)
	// Several segments past the backup (1 MiB each), so recovery fetches
	// whole segments and then the unfinished last one.
	harness.WaitFor(t, 180*time.Second, "3 segments of WAL after the base backup", func() bool {
		c.checkProposerAlive()
		return c.flushLSN() >= backupEnd+3<<20
	})
	c.waitAcked(b, 300, "before the host is lost")
	c.prop.Kill()
	c.pg.Kill(t)
	b.halt(30 * time.Second)
	acked, hi := b.snapshot()
	sts, oks := c.statuses()
	var commit proto.LSN
	for i, st := range sts {
		if oks[i] {
			commit = max(commit, st.CommitLSN)
		}
	}
	t.Logf("host lost: %d acknowledged transfers, the last one's commit record above %s; highest commit_lsn on the safekeepers %s (%s)",
		len(acked), hi, commit, map[bool]string{true: "lagging: wal fetch must settle the end", false: "covering them"}[commit <= hi])

	// The restore: wal fetch is the only WAL source. PostgreSQL runs it as
	// its own user, so it gets a copy of the binary it can execute.
	bin := filepath.Join(restore, "safekeeper")
	copyExecutable(t, harness.Binary(t), bin)
	var addrs []string
	for _, sk := range c.sks {
		addrs = append(addrs, sk.Addr)
	}
	port := pgtest.Port // the primary's settings came with the backup: a socket only, here in restore
	logFile := filepath.Join(restore, "fetch.log")
	conf := fmt.Sprintf(`
unix_socket_directories = '%s'
synchronous_standby_names = ''
restore_command = '%s --log-level debug wal fetch --safekeepers %s --tenant-id %s --timeline-id %s %%f %%p 2>>%s'
`, restore, bin, strings.Join(addrs, ","), tenantID, timelineID, logFile)
	appendFile(t, filepath.Join(data, "postgresql.conf"), conf)
	// -X none leaves pg_wal empty: recovery can only read what it fetches.
	if ents, _ := os.ReadDir(filepath.Join(data, "pg_wal")); len(ents) > 1 { // archive_status/
		t.Fatalf("the base backup brought WAL of its own: %d entries in pg_wal", len(ents))
	}
	sig := filepath.Join(data, "recovery.signal")
	if err := os.WriteFile(sig, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.ChownToPostgres(sig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"server.log", "fetch.log"} {
				b, _ := os.ReadFile(filepath.Join(restore, f))
				t.Logf("%s tail:\n%s", f, harness.Tail(string(b), 40))
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c.pg.Cmd(ctx, "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop").Run()
	})
	c.pg.Run(t, "pg_ctl", "-D", data, "-l", filepath.Join(restore, "server.log"), "-w", "-t", "180", "start")
	query := func(sql string) string {
		return strings.TrimSpace(c.pg.Run(t, "psql", "-XAtq", "-h", restore, "-p", strconv.Itoa(port), "-U", "postgres", "-d", "postgres", "-c", sql))
	}
	harness.WaitFor(t, 120*time.Second, "the restored server to finish recovery and promote", func() bool {
		out, err := c.pg.Cmd(context.Background(), "psql", "-XAtq", "-h", restore, "-p", strconv.Itoa(port), "-U", "postgres",
			"-d", "postgres", "-c", "select pg_is_in_recovery()").Output()
		return err == nil && strings.TrimSpace(string(out)) == "f"
	})
	b.check(t, "restored from the safekeepers", query, acked)
	if tli := query("select timeline_id from pg_control_checkpoint()"); tli == "1" {
		t.Errorf("the restored server is still on timeline 1: it did not promote at the end of recovery")
	}

	// What wal fetch did: whole segments, then the last one zero-padded
	// (recovery finds the end of WAL in its zeros).
	fl, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	log := string(fl)
	fetched := regexp.MustCompile(`msg=fetched .*?file=([0-9A-F]{24}) .* zero_padded=(\w+) synced=(\w+)`).FindAllStringSubmatch(log, -1)
	var padded []string
	synced := false
	for _, m := range fetched {
		if m[2] == "true" {
			padded = append(padded, m[1])
		}
		synced = synced || m[3] == "true"
	}
	if len(fetched) < 3 || len(padded) == 0 {
		t.Fatalf("wal fetch fetched %d segments, %d of them zero-padded; want whole segments and the last one padded:\n%s", len(fetched), len(padded), harness.Tail(log, 30))
	}
	t.Logf("restored: %d segments fetched, the last (%s) zero-padded; sync run by wal fetch: %v", len(fetched), padded[len(padded)-1], synced)
}

func copyExecutable(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}
