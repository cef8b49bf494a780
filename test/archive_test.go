package test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
	"github.com/safekeeper/safekeeper/test/s3test"
)

const (
	archiveTenant   = "a1c1e5000000000000000000000000a1"
	archiveTimeline = "a1c1e5000000000000000000000000b2"
)

// archiveFetch runs `safekeeper wal fetch --remote-storage URL` (and the
// extra flags) for name into a file of its own.
func archiveFetch(t *testing.T, storeURL, name string, extra ...string) fetchRun {
	t.Helper()
	out := filepath.Join(t.TempDir(), "RECOVERYXLOG")
	args := append([]string{"wal", "fetch", "--remote-storage", storeURL,
		"--tenant-id", archiveTenant, "--timeline-id", archiveTimeline, "--timeout", "60s"}, extra...)
	code, _, stderr := harness.Run(t, append(args, name, out)...)
	r := fetchRun{code: code, stderr: stderr}
	r.data, _ = os.ReadFile(out)
	r.padded = strings.Contains(stderr, "zero_padded=true")
	return r
}

// backupLSN is the highest backup_lsn any of the safekeepers reports.
func backupLSN(t *testing.T, sks []*harness.Safekeeper) proto.LSN {
	t.Helper()
	var hi proto.LSN
	for _, sk := range sks {
		l, err := proto.ParseLSN(sk.TimelineStatus(t, archiveTenant, archiveTimeline)["backup_lsn"])
		if err != nil {
			t.Fatal(err)
		}
		hi = max(hi, l)
	}
	return hi
}

// TestArchiveRestoreFromTheArchiveAlone: three safekeepers archive to a
// real S3 server (versitygw) while a primary commits; a base backup taken
// before the load is restored with restore_command = `safekeeper wal
// fetch --remote-storage ...` after every safekeeper's data is gone. Every
// transaction acknowledged before the archive reported it (backup_lsn, the
// newest partial included: not only the segments before the last
// pg_switch_wal) is there, and every whole segment fetched is byte for
// byte the primary's pg_wal file.
func TestArchiveRestoreFromTheArchiveAlone(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t) // the safekeepers' credentials (they inherit the environment)
	storeURL := srv.URL("pitr")
	c := harness.StartCluster(t, harness.ClusterOptions{Tenant: archiveTenant, Timeline: archiveTimeline,
		PG:             pgtest.Options{WALSegSizeMB: 1, Conf: []string{"wal_keep_size = '1GB'"}},
		SafekeeperArgs: []string{"--remote-storage", storeURL, "--partial-backup-interval", "300ms", "--wal-keep-size", "0"}})
	c.PG.Exec(t, "CREATE TABLE ledger (id int PRIMARY KEY, note text)")

	// The restore's side: PostgreSQL runs restore_command as its own user,
	// with a copy of the binary and the credentials in a file it can read.
	restoreDir := pgtest.Dir(t, "archive-restore-")
	bin := filepath.Join(restoreDir, "safekeeper")
	if err := os.WriteFile(bin, mustRead(t, harness.Binary(t)), 0o755); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(restoreDir, "credentials")
	if err := os.WriteFile(creds, []byte(fmt.Sprintf("[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n", srv.AccessKey, srv.SecretKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.ChownToPostgres(restoreDir); err != nil && os.Geteuid() == 0 {
		t.Fatal(err)
	}
	logFile := filepath.Join(restoreDir, "fetch.log")
	restored := c.PG.BaseBackup(t, pgtest.BackupOptions{Signal: pgtest.RecoverySignal, NoWAL: true, Conf: []string{
		fmt.Sprintf("restore_command = '%s --log-level debug wal fetch --remote-storage ''%s'' --remote-storage-credentials-file %s --tenant-id %s --timeline-id %s %%f %%p 2>>%s'",
			bin, storeURL, creds, archiveTenant, archiveTimeline, logFile)}})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fetch.log tail:\n%s", harness.TailFile(logFile, 30))
		}
	})

	// The load: every INSERT returns once the proposer's quorum has it
	// (the proposer is the synchronous standby): acknowledged. About 4
	// MiB of WAL, a segment switch, then more.
	acked := 0
	insert := func(n int) {
		for range n {
			c.PG.Exec(t, fmt.Sprintf("INSERT INTO ledger SELECT g, repeat(md5(g::text), 40) FROM generate_series(%d, %d) g", acked+1, acked+500))
			acked += 500
		}
	}
	insert(12)
	c.PG.Exec(t, "SELECT pg_switch_wal()")
	insert(3)
	last, err := proto.ParseLSN(c.PG.Exec(t, "SELECT pg_current_wal_flush_lsn()"))
	if err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 60*time.Second, "the archive to reach the last acknowledged commit", func() bool {
		return backupLSN(t, c.Safekeepers) >= last
	})
	t.Logf("%d rows acknowledged, the last below %s; backup_lsn %s", acked, last, backupLSN(t, c.Safekeepers))

	// The archive of real PostgreSQL WAL, read while the uploaders run:
	// archive verify decodes every record to the newest partial's end (a
	// record boundary: commit_lsn), and ls finds no gap.
	ids := []string{"--remote-storage", storeURL, "--tenant-id", archiveTenant, "--timeline-id", archiveTimeline}
	code, out, errOut := harness.Run(t, append([]string{"archive", "verify"}, ids...)...)
	if code != 0 || !strings.Contains(out, "OK: the WAL from") {
		t.Fatalf("archive verify of the real archive: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("archive verify:\n%s", out)
	code, out, errOut = harness.Run(t, append([]string{"archive", "ls", "--json"}, ids...)...)
	if code != 0 || !strings.Contains(out, `"gaps":[]`) || strings.Contains(out, `"newest_partial":null`) {
		t.Errorf("archive ls of the real archive: exit %d\n%s%s", code, out, errOut)
	}
	// One safekeeper uploads each segment (a few may race at a takeover);
	// the others find it there. The lag metrics are exported.
	uploads := 0.0
	for _, sk := range c.Safekeepers {
		uploads += scrapeMetric(t, sk, "safekeeper_backed_up_segments_total", "")
		if lag := scrapeMetric(t, sk, "safekeeper_backup_lag_bytes", ""); lag < 0 {
			t.Errorf("safekeeper %d: backup lag %v", sk.ID, lag)
		}
	}
	segments := float64(uint64(last)>>20 - uint64(c.Safekeepers[0].TimelineStatusLSN(t, archiveTenant, archiveTimeline, "timeline_start_lsn"))>>20)
	if uploads < segments-1 || uploads > segments+2 {
		t.Errorf("the safekeepers uploaded %v whole segments in all for about %v segments: want each once", uploads, segments)
	}
	t.Logf("%v segment uploads in all for about %v segments", uploads, segments)

	// Everything but the archive goes away.
	c.Proposer.Kill()
	c.PG.Stop(t)
	for _, sk := range c.Safekeepers {
		sk.Kill()
		if err := os.RemoveAll(sk.DataDir); err != nil {
			t.Fatal(err)
		}
	}
	restored.Start(t)
	harness.WaitFor(t, 120*time.Second, "the restored server to finish recovery and promote", func() bool {
		out, err := restored.Query(context.Background(), "SELECT pg_is_in_recovery()")
		return err == nil && out == "f"
	})
	if got := restored.Exec(t, "SELECT count(*) || ' ' || coalesce(max(id), 0) FROM ledger"); got != fmt.Sprintf("%d %d", acked, acked) {
		t.Fatalf("restored ledger: count and max id %q, want %d acknowledged rows", got, acked)
	}

	// What recovery fetched: whole segments, byte for byte the primary's,
	// and the newest partial's segment zero-padded at the end.
	log := string(mustRead(t, logFile))
	fetched := regexp.MustCompile(`msg=fetched .*?file=([0-9A-F]{24}) .*zero_padded=(\w+)`).FindAllStringSubmatch(log, -1)
	whole, padded := 0, 0
	for _, m := range fetched {
		if m[2] == "true" {
			padded++
			continue
		}
		r := archiveFetch(t, storeURL, m[1])
		if r.code != 0 {
			t.Fatalf("wal fetch %s from the archive: exit %d\n%s", m[1], r.code, r.stderr)
		}
		if want := mustRead(t, filepath.Join(c.PG.WALDir(), m[1])); !bytes.Equal(r.data, want) {
			t.Errorf("segment %s from the archive differs from the primary's pg_wal file", m[1])
		}
		whole++
	}
	if whole < 3 || padded == 0 {
		t.Fatalf("recovery fetched %d whole segments and %d zero-padded; want several whole and the last padded:\n%s", whole, padded, harness.Tail(log, 20))
	}
	t.Logf("restored %d rows from the archive alone: %d whole segments (byte-identical to pg_wal) and %d zero-padded partial", acked, whole, padded)
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
