package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/etcdtest"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// TestRestoreFromSafekeepersLosesNothing: a base backup without WAL
// (pg_basebackup -X none), transfers under load, then kill -9 of the
// primary and the proposer together (a lost host: commit_lsn on the
// safekeepers may lag what the primary acknowledged). The backup is
// restored into a new data directory whose only WAL source is
// `restore_command = 'safekeeper wal fetch ... %f %p'` (finding the
// safekeepers through etcd, as in a fleet), and promoted at the
// end of recovery: every acknowledged transfer is there, the total balance
// is 0, the last segment came zero-padded, and the server is on a new
// PostgreSQL timeline.
func TestRestoreFromSafekeepersLosesNothing(t *testing.T) {
	skipShort(t)
	rng := newRand(t)
	etcd := etcdtest.Start(t).Endpoints()
	c := startCluster(t, options{skArgs: fleetArgs(etcd)})
	c.adoptInto(etcd) // wal fetch finds the safekeepers through etcd
	b := newBank(t, c.pg)

	// The restore: wal fetch will be the only WAL source. PostgreSQL runs
	// it as its own user, so it gets a copy of the binary it can execute,
	// here, where it logs too.
	restore := pgtest.Dir(t, "restore-")
	bin := filepath.Join(restore, "safekeeper")
	copyExecutable(t, harness.Binary(t), bin)
	logFile := filepath.Join(restore, "fetch.log")
	restored := c.pg.BaseBackup(t, pgtest.BackupOptions{Signal: pgtest.RecoverySignal, NoWAL: true, Conf: []string{
		fmt.Sprintf("restore_command = '%s --log-level debug wal fetch --etcd-endpoints %s --tenant-id %s --timeline-id %s %%f %%p 2>>%s'",
			bin, strings.Join(etcd, ","), tenantID, timelineID, logFile)}})
	backupEnd := c.flushLSN()
	// -X none leaves pg_wal empty: recovery can only read what it fetches.
	if ents, _ := os.ReadDir(filepath.Join(restored.DataDir, "pg_wal")); len(ents) > 1 { // archive_status/
		t.Fatalf("the base backup brought WAL of its own: %d entries in pg_wal", len(ents))
	}

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

	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fetch.log tail:\n%s", harness.TailFile(logFile, 40))
		}
	})
	restored.Start(t)
	query := func(sql string) string { return restored.Exec(t, sql) }
	harness.WaitFor(t, 120*time.Second, "the restored server to finish recovery and promote", func() bool {
		out, err := restored.Query(context.Background(), "select pg_is_in_recovery()")
		return err == nil && out == "f"
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
