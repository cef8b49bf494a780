package test

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage/archive"
	"github.com/safekeeper/safekeeper/storage/remote"
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

	restored, logFile := archiveRestoreCopy(t, c.PG, srv, storeURL)

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
	restoreFromTheArchiveAlone(t, c.Safekeepers, restored, acked, "acknowledged rows")

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

// readThroughMB is the WAL a standby falls behind by in
// TestStandbyCatchesUpThroughReadThrough (SAFEKEEPER_READTHROUGH_MB
// raises it: 3072 for the 3 GB run docs/performance.md reports).
func readThroughMB() int {
	if v, err := strconv.Atoi(os.Getenv("SAFEKEEPER_READTHROUGH_MB")); err == nil && v > 0 {
		return v
	}
	return 48
}

// TestStandbyCatchesUpThroughReadThrough: a hot standby made from a base
// backup taken before the load starts streaming from a safekeeper only
// after that safekeeper removed the WAL it needs (--wal-keep-size 0: it
// went once it was in the archive, a file:// store here). The safekeeper
// serves it from the archive, in order, as if it were local, and the
// standby catches up to the primary.
func TestStandbyCatchesUpThroughReadThrough(t *testing.T) {
	store := "file://" + filepath.Join(t.TempDir(), "archive")
	mb := readThroughMB()
	// The primary keeps its WAL, for the byte comparisons below.
	c := harness.StartCluster(t, harness.ClusterOptions{Tenant: archiveTenant, Timeline: archiveTimeline,
		PG: pgtest.Options{WALSegSizeMB: 1, Conf: []string{fmt.Sprintf("wal_keep_size = '%dMB'", mb+256)}},
		SafekeeperArgs: []string{"--remote-storage", store, "--partial-backup-interval", "300ms", "--wal-keep-size", "0",
			"--retention-interval", "100ms"}})
	c.PG.Exec(t, "CREATE TABLE ledger (id int PRIMARY KEY, note text)")
	sk := c.Safekeepers[0]
	standby := c.PG.BaseBackup(t, pgtest.BackupOptions{Signal: pgtest.StandbySignal, NoWAL: true,
		PrimaryConninfo: sk.ConnString(archiveTenant, archiveTimeline) + " application_name=readthrough"})
	start, err := proto.ParseLSN(c.PG.Exec(t, "SELECT pg_current_wal_flush_lsn()"))
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for cur := start; cur < start+proto.LSN(mb)<<20; {
		c.PG.Exec(t, fmt.Sprintf("INSERT INTO ledger SELECT g, repeat(md5(g::text), 40) FROM generate_series(%d, %d) g", rows+1, rows+2000))
		rows += 2000
		if cur, err = proto.ParseLSN(c.PG.Exec(t, "SELECT pg_current_wal_flush_lsn()")); err != nil {
			t.Fatal(err)
		}
	}
	end, _ := proto.ParseLSN(c.PG.Exec(t, "SELECT pg_current_wal_flush_lsn()"))
	// Nearly all of it is removed here once archived (all but the
	// segments at the end).
	harness.WaitFor(t, 120*time.Second, "the safekeeper to remove the WAL the standby needs", func() bool {
		return sk.TimelineStatusLSN(t, archiveTenant, archiveTimeline, "removed_up_to") >= end.SegmentStart(1<<20)-1<<20
	})
	removed := sk.TimelineStatusLSN(t, archiveTenant, archiveTimeline, "removed_up_to")
	t.Logf("%d MiB of WAL from %s to %s; the safekeeper removed up to %s", mb, start, end, removed)

	t0 := time.Now()
	standby.Start(t)
	harness.WaitFor(t, 300*time.Second, "the standby to replay up to the primary's end", func() bool {
		out, err := standby.Query(context.Background(), "SELECT pg_last_wal_replay_lsn() >= '"+end.String()+"'::pg_lsn")
		return err == nil && out == "t"
	})
	if got := standby.Exec(t, "SELECT count(*) FROM ledger"); got != strconv.Itoa(rows) {
		t.Fatalf("standby has %s rows, the primary committed %d", got, rows)
	}
	t.Logf("the standby caught up %d MiB through read-through in %v", mb, time.Since(t0).Round(time.Millisecond))
	if !strings.Contains(string(mustRead(t, sk.LogPath)), "serving WAL removed here from the archive") {
		t.Fatalf("the safekeeper did not serve the start from the archive")
	}

	// A client reading the removed WAL gets the primary's bytes; once the
	// archived object is damaged (a byte flipped in the store), 58P01 and
	// nothing of it.
	seg := start.SegmentStart(1 << 20)
	rc := archiveReplConn(t, sk)
	if got := streamWAL(t, rc, seg, seg+1<<20); !bytes.Equal(got, mustRead(t, filepath.Join(c.PG.WALDir(), proto.SegmentFileName(1, seg, 1<<20)))) {
		t.Fatalf("read-through of %s differs from the primary's segment", seg)
	}
	rc.Close(context.Background())

	// wal fetch with the safekeepers and the archive: the safekeepers no
	// longer hold the segment, the archive serves it; without the
	// archive, that is a failure (126), not the end of WAL.
	second := proto.SegmentFileName(1, seg+1<<20, 1<<20)
	addrs := strings.Join(harness.Addrs(c.Safekeepers), ",")
	if r := archiveFetch(t, store, second, "--safekeepers", addrs); r.code != 0 || !bytes.Equal(r.data, mustRead(t, filepath.Join(c.PG.WALDir(), second))) ||
		!strings.Contains(r.stderr, "trying the archive") {
		t.Fatalf("wal fetch --safekeepers --remote-storage of a segment the safekeepers removed: exit %d, %d bytes\n%s", r.code, len(r.data), r.stderr)
	}
	out := filepath.Join(t.TempDir(), "RECOVERYXLOG")
	if code, _, stderr := harness.Run(t, "wal", "fetch", "--safekeepers", addrs, "--tenant-id", archiveTenant, "--timeline-id", archiveTimeline, second, out); code != 126 {
		t.Fatalf("wal fetch --safekeepers alone of a removed segment: exit %d, want 126\n%s", code, stderr)
	}

	obj := filepath.Join(strings.TrimPrefix(store, "file://"), archiveTenant, archiveTimeline, "wal", proto.SegmentFileName(1, seg, 1<<20))
	b := mustRead(t, obj)
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(obj, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := startReplicationError(t, archiveReplConn(t, sk), seg); code != "58P01" {
		t.Fatalf("START_REPLICATION from a corrupt archived segment: %q, want 58P01", code)
	}
	if r := archiveFetch(t, store, proto.SegmentFileName(1, seg, 1<<20)); r.code != 126 || r.data != nil || !strings.Contains(r.stderr, "corrupt") {
		t.Fatalf("wal fetch of a corrupt object: exit %d, %d bytes written; want 126 naming it corrupt\n%s", r.code, len(r.data), r.stderr)
	}
}

// archiveReplConn is a replication connection to sk for the archive tests'
// timeline.
func archiveReplConn(t *testing.T, sk *harness.Safekeeper) *pgconn.PgConn {
	t.Helper()
	c, err := pgconn.Connect(harness.Context(t, 10*time.Second), sk.ConnString(archiveTenant, archiveTimeline)+" sslmode=disable replication=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// startReplicationError runs START_REPLICATION from on rc and returns the
// SQLSTATE of the error that ends it ("" if WAL came instead).
func startReplicationError(t *testing.T, rc *pgconn.PgConn, from proto.LSN) string {
	t.Helper()
	ctx := harness.Context(t, 20*time.Second)
	rc.Frontend().Send(&pgproto3.Query{String: fmt.Sprintf("START_REPLICATION %s TIMELINE 1", from)})
	if err := rc.Frontend().Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := rc.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			return m.Code
		case *pgproto3.CopyData:
			if m.Data[0] == pglogrepl.XLogDataByteID {
				return ""
			}
		}
	}
}

// checkArchivedSegments fetches every whole segment in [from, to) from the
// archive (wal fetch --remote-storage) and compares it with the primary's
// pg_wal file: nothing skipped, nothing different.
func checkArchivedSegments(t *testing.T, storeURL string, pg *pgtest.Cluster, from, to proto.LSN, extra ...string) int {
	t.Helper()
	n := 0
	for seg := from.SegmentStart(pg.WALSegSize); seg+proto.LSN(pg.WALSegSize) <= to; seg += proto.LSN(pg.WALSegSize) {
		name := proto.SegmentFileName(1, seg, pg.WALSegSize)
		r := archiveFetch(t, storeURL, name, extra...)
		if r.code != 0 {
			t.Fatalf("segment %s is not in the archive: exit %d\n%s", name, r.code, r.stderr)
		}
		if !bytes.Equal(r.data, mustRead(t, filepath.Join(pg.WALDir(), name))) {
			t.Fatalf("segment %s in the archive differs from the primary's", name)
		}
		n++
	}
	return n
}

// startArchiveCluster starts the cluster of the archive tests: 1 MiB
// segments, the primary configured with pgConf, every safekeeper archiving
// to a file:// store with args besides, and the ledger table. It returns
// the store's directory and URL.
func startArchiveCluster(t *testing.T, pgConf []string, args ...string) (c *harness.Cluster, storeDir, store string) {
	t.Helper()
	storeDir = filepath.Join(t.TempDir(), "archive")
	store = "file://" + storeDir
	c = harness.StartCluster(t, harness.ClusterOptions{Tenant: archiveTenant, Timeline: archiveTimeline,
		PG:             pgtest.Options{WALSegSizeMB: 1, Conf: pgConf},
		SafekeeperArgs: append([]string{"--remote-storage", store}, args...)})
	c.PG.Exec(t, "CREATE TABLE ledger (id int PRIMARY KEY, note text)")
	return c, storeDir, store
}

// insertRows inserts n batches of 500 rows into ledger from id next+1,
// each an acknowledged commit, and returns the next id.
func insertRows(t *testing.T, pg *pgtest.Cluster, next, n int) int {
	t.Helper()
	for range n {
		pg.Exec(t, fmt.Sprintf("INSERT INTO ledger SELECT g, repeat(md5(g::text), 40) FROM generate_series(%d, %d) g", next+1, next+500))
		next += 500
	}
	return next
}

func flushLSN(t *testing.T, pg *pgtest.Cluster) proto.LSN {
	t.Helper()
	l, err := proto.ParseLSN(pg.Exec(t, "SELECT pg_current_wal_flush_lsn()"))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestArchiveRidesOutAStoreOutage: the S3 store answers 503, then 500,
// then refuses the credentials, then drops connections, then is slow,
// while the primary commits. Commits go on throughout; backup_lsn stays
// where the store stopped, the WAL above it stays on the safekeepers'
// disks (--wal-keep-size 0 would remove it otherwise), the errors are
// counted and logged at most once a minute; once the store is back the
// backlog drains and every segment is in the archive, byte for byte.
func TestArchiveRidesOutAStoreOutage(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	proxy := s3test.StartFaultProxy(t, srv)
	storeURL := proxy.URL(srv, "outage")
	c := harness.StartCluster(t, harness.ClusterOptions{Tenant: archiveTenant, Timeline: archiveTimeline,
		PG: pgtest.Options{WALSegSizeMB: 1, Conf: []string{"wal_keep_size = '1GB'"}},
		SafekeeperArgs: []string{"--remote-storage", storeURL, "--partial-backup-interval", "300ms", "--wal-keep-size", "0",
			"--retention-interval", "100ms"}})
	c.PG.Exec(t, "CREATE TABLE ledger (id int PRIMARY KEY, note text)")
	start := c.Safekeepers[0].TimelineStatusLSN(t, archiveTenant, archiveTimeline, "timeline_start_lsn")
	next := insertRows(t, c.PG, 0, 3)
	before := flushLSN(t, c.PG)
	harness.WaitFor(t, 60*time.Second, "the archive to reach the load before the outage", func() bool {
		return backupLSN(t, c.Safekeepers) >= before
	})

	for _, f := range []s3test.Fault{s3test.Unavailable, s3test.ServerError, s3test.Forbidden, s3test.Drop} {
		proxy.Set(f)
		seen := proxy.Seen(f)
		stuck := backupLSN(t, c.Safekeepers)
		next = insertRows(t, c.PG, next, 3) // commits go on
		harness.WaitFor(t, 30*time.Second, fmt.Sprintf("uploads to meet fault %d", f), func() bool { return proxy.Seen(f) > seen })
		if b := backupLSN(t, c.Safekeepers); b != stuck {
			t.Fatalf("fault %d: backup_lsn moved from %s to %s while the store failed every request", f, stuck, b)
		}
		for _, sk := range c.Safekeepers {
			if r := sk.TimelineStatusLSN(t, archiveTenant, archiveTimeline, "removed_up_to"); r > stuck {
				t.Fatalf("fault %d: safekeeper %d removed WAL up to %s, above backup_lsn %s: WAL not in the archive is gone", f, sk.ID, r, stuck)
			}
		}
	}
	outageEnd := flushLSN(t, c.PG)
	errs, lag := 0.0, 0.0
	for _, sk := range c.Safekeepers {
		errs += scrapeSum(t, sk, "safekeeper_backup_errors_total")
		lag = max(lag, scrapeMetric(t, sk, "safekeeper_backup_lag_bytes", ""))
		if n := strings.Count(string(mustRead(t, sk.LogPath)), "archive upload failed"); n > 1 {
			t.Errorf("safekeeper %d logged %d upload failures within a minute; want at most one", sk.ID, n)
		}
	}
	if errs == 0 || lag == 0 {
		t.Errorf("during the outage: %v upload errors counted, backup lag %v bytes; want both above 0", errs, lag)
	}
	t.Logf("outage: %d rows committed, WAL up to %s, backup_lsn held at %s; %v errors counted, lag %v bytes", next, outageEnd, backupLSN(t, c.Safekeepers), errs, lag)

	// A slow store still drains; then the store is back.
	proxy.SetDelay(300 * time.Millisecond)
	proxy.Set(s3test.Slow)
	next = insertRows(t, c.PG, next, 2)
	end := flushLSN(t, c.PG)
	harness.WaitFor(t, 120*time.Second, "a slow store to take the backlog", func() bool { return backupLSN(t, c.Safekeepers) >= outageEnd })
	proxy.Set(s3test.Pass)
	harness.WaitFor(t, 60*time.Second, "the archive to catch up", func() bool { return backupLSN(t, c.Safekeepers) >= end })
	n := checkArchivedSegments(t, proxy.URL(srv, "outage"), c.PG, start, end)
	if code, out, stderr := harness.Run(t, "archive", "verify", "--remote-storage", proxy.URL(srv, "outage"), "--tenant-id", archiveTenant, "--timeline-id", archiveTimeline); code != 0 {
		t.Fatalf("archive verify after the outage: exit %d\n%s%s", code, out, stderr)
	}
	t.Logf("after the outage: %d rows; %d segments in the archive, each the primary's byte for byte", next, n)
}

// scrapeSum is the sum of every series of one metric of sk.
func scrapeSum(t *testing.T, sk *harness.Safekeeper, name string) float64 {
	t.Helper()
	sum := 0.0
	for _, m := range scrapeFamilies(t, sk)[name].GetMetric() {
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return sum
}

// TestArchiveResumesAfterEverySafekeeperIsKilled: kill -9 of all three
// safekeepers while they upload, with a temporary file of a killed upload
// left in the store: each comes back with the backup_lsn it had made
// durable (never lower), the uploads resume from there, and once the
// primary has committed more, every segment is in the archive byte for
// byte and the leftover is not taken for an object.
func TestArchiveResumesAfterEverySafekeeperIsKilled(t *testing.T) {
	c, storeDir, store := startArchiveCluster(t, []string{"wal_keep_size = '1GB'"}, "--partial-backup-interval", "200ms")
	start := c.Safekeepers[0].TimelineStatusLSN(t, archiveTenant, archiveTimeline, "timeline_start_lsn")
	next := insertRows(t, c.PG, 0, 6)
	harness.WaitFor(t, 30*time.Second, "the first segments in the archive", func() bool {
		return backupLSN(t, c.Safekeepers) > start+2<<20
	})
	next = insertRows(t, c.PG, next, 4) // uploads under way as the kill comes
	var before []proto.LSN
	for _, sk := range c.Safekeepers {
		before = append(before, sk.TimelineStatusLSN(t, archiveTenant, archiveTimeline, "backup_lsn"))
	}
	for _, sk := range c.Safekeepers {
		sk.Kill()
	}
	// What a killed upload to a directory can leave: a hidden temporary
	// file next to where the object was to be.
	walDir := filepath.Join(storeDir, archiveTenant, archiveTimeline, "wal")
	leftover := filepath.Join(walDir, "."+proto.SegmentFileName(1, start+40<<20, 1<<20)+".tmp-0123456789abcdef")
	if err := os.WriteFile(leftover, []byte("half an upload"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, sk := range c.Safekeepers {
		sk.Start()
		if got := sk.TimelineStatusLSN(t, archiveTenant, archiveTimeline, "backup_lsn"); got < before[i] {
			t.Fatalf("safekeeper %d came back with backup_lsn %s, below the %s it reported before the kill", sk.ID, got, before[i])
		}
	}
	next = insertRows(t, c.PG, next, 4) // acknowledged once the proposer has its quorum back
	end := flushLSN(t, c.PG)
	harness.WaitFor(t, 60*time.Second, "the archive to catch up after the restarts", func() bool {
		return backupLSN(t, c.Safekeepers) >= end
	})
	n := checkArchivedSegments(t, store, c.PG, start, end)
	if r := archiveFetch(t, store, proto.SegmentFileName(1, start+40<<20, 1<<20)); r.code != 1 {
		t.Fatalf("the leftover temporary file was served as a segment: exit %d", r.code)
	}
	if code, out, stderr := harness.Run(t, "archive", "verify", "--remote-storage", store, "--tenant-id", archiveTenant, "--timeline-id", archiveTimeline); code != 0 {
		t.Fatalf("archive verify after the kills: exit %d\n%s%s", code, out, stderr)
	}
	t.Logf("%d rows; backup_lsn before the kill %v; %d segments in the archive after the restarts, each the primary's", next, before, n)
}

// archiveRestoreCopy makes a copy of pg from a base backup without WAL
// (not started) whose only WAL source is restore_command = `safekeeper wal
// fetch --remote-storage storeURL`: PostgreSQL runs it as its own user,
// with a copy of the binary and the credentials in a file it can read. It
// returns the copy and the file wal fetch logs to.
func archiveRestoreCopy(t *testing.T, pg *pgtest.Cluster, srv *s3test.Server, storeURL string, conf ...string) (*pgtest.Cluster, string) {
	t.Helper()
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
	restored := pg.BaseBackup(t, pgtest.BackupOptions{Signal: pgtest.RecoverySignal, NoWAL: true, Conf: append([]string{
		fmt.Sprintf("restore_command = '%s --log-level debug wal fetch --remote-storage ''%s'' --remote-storage-credentials-file %s --tenant-id %s --timeline-id %s %%f %%p 2>>%s'",
			bin, storeURL, creds, archiveTenant, archiveTimeline, logFile)}, conf...)})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fetch.log tail:\n%s", harness.TailFile(logFile, 30))
		}
	})
	return restored, logFile
}

// TestArchiveRestoreThroughATimelineSwitch: the primary is lost, a hot
// standby fed by a safekeeper is promoted (PostgreSQL timeline 2) and
// protected by a new proposer on the same safekeepers, which archive on:
// the history file and timeline 2's segments go to the archive. A base
// backup taken on timeline 1, before all of it, restored from the archive
// alone (every safekeeper's data gone) follows the switch and has every
// row either primary acknowledged.
func TestArchiveRestoreThroughATimelineSwitch(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	storeURL := srv.URL("failover")
	c := harness.StartCluster(t, harness.ClusterOptions{Tenant: archiveTenant, Timeline: archiveTimeline,
		PG:             pgtest.Options{WALSegSizeMB: 1},
		SafekeeperArgs: []string{"--remote-storage", storeURL, "--partial-backup-interval", "300ms"}})
	c.PG.Exec(t, "CREATE TABLE ledger (id int PRIMARY KEY, note text)")
	restored, _ := archiveRestoreCopy(t, c.PG, srv, storeURL)
	standby := c.PG.StartStandby(t, pgtest.BackupOptions{PrimaryConninfo: c.Safekeepers[0].ConnString(archiveTenant, archiveTimeline) + " application_name=next"})
	next := insertRows(t, c.PG, 0, 6)

	// The primary's host is lost; sync settles the end; the standby
	// replays to it and is promoted.
	c.Proposer.Kill()
	c.PG.Kill(t)
	code, out, stderr := harness.Run(t, "sync", "--safekeepers", strings.Join(harness.Addrs(c.Safekeepers), ","),
		"--tenant-id", archiveTenant, "--timeline-id", archiveTimeline, "--timeout", "60s")
	if code != 0 {
		t.Fatalf("sync: exit %d: %s", code, stderr)
	}
	standby.WaitReplay(t, strings.TrimSpace(out), 60*time.Second)
	standby.Promote(t)
	standby.Exec(t, "ALTER SYSTEM SET synchronous_standby_names = 'proposer'")
	standby.Exec(t, "SELECT pg_reload_conf()")
	prop := harness.StartProposer(t, harness.ProposerOptions{Name: "proposer2", Upstream: standby.ConnString(),
		Safekeepers: harness.Addrs(c.Safekeepers), Tenant: archiveTenant, Timeline: archiveTimeline,
		Slot: "proposer", ApplicationName: "proposer", Debug: true})
	harness.WaitSyncStandby(t, standby, prop, "proposer", 90*time.Second)
	next = insertRows(t, standby, next, 6)
	end := flushLSN(t, standby)
	harness.WaitFor(t, 60*time.Second, "the archive to reach the new primary's last commit", func() bool {
		return backupLSN(t, c.Safekeepers) >= end
	})

	// Only the archive is left.
	prop.Kill()
	standby.Stop(t)
	restoreFromTheArchiveAlone(t, c.Safekeepers, restored, next, "rows acknowledged by both primaries")
	if tli := restored.Exec(t, "SELECT timeline_id FROM pg_control_checkpoint()"); tli != "3" {
		t.Errorf("the restored server is on PostgreSQL timeline %s, want 3 (it followed timeline 2 and promoted)", tli)
	}
	t.Logf("restored %d rows across the timeline switch from the archive alone", next)
}

// TestRunChecksTheArchiveAtStart: `safekeeper run --remote-storage` with a
// bucket that does not exist, or credentials the store refuses, exits 2
// naming the problem before it serves anything; a store that cannot be
// reached (down for now) is no reason not to start: it warns, serves, and
// archives once the store is back.
func TestRunChecksTheArchiveAtStart(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	dir := t.TempDir()
	wrongBucket := strings.Replace(srv.URL("p"), "s3://"+srv.Bucket+"/", "s3://no-such-bucket/", 1)
	code, _, stderr := harness.Run(t, "run", "--id", "1", "--data-dir", filepath.Join(dir, "a"), "--listen-pg", "127.0.0.1:0", "--listen-http", "", "--remote-storage", wrongBucket)
	if code != 2 || !strings.Contains(stderr, `bucket "no-such-bucket" does not exist`) {
		t.Errorf("run with a missing bucket: exit %d, want 2 naming the bucket\n%s", code, stderr)
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
	code, _, stderr = harness.Run(t, "run", "--id", "1", "--data-dir", filepath.Join(dir, "b"), "--listen-pg", "127.0.0.1:0", "--listen-http", "", "--remote-storage", srv.URL("p"))
	if code != 2 || !strings.Contains(stderr, "credentials refused") {
		t.Errorf("run with a wrong secret: exit %d, want 2 naming the credentials\n%s", code, stderr)
	}
	srv.SetEnv(t)
	down := strings.Replace(srv.URL("p"), url.QueryEscape(srv.Endpoint), url.QueryEscape("http://"+harness.RefusedAddr(t)), 1)
	sk := harness.StartSafekeeper(t, 1, "--remote-storage", down)
	if !strings.Contains(string(mustRead(t, sk.LogPath)), "the archive's store cannot be reached; starting anyway") {
		t.Errorf("a safekeeper whose store is down started without saying so")
	}
}

// TestArchiveUploaderIsReplaced: the safekeeper that uploads a timeline's
// segments is killed; the two left (a quorum: commits go on) take its
// work over within seconds, and no segment is skipped.
func TestArchiveUploaderIsReplaced(t *testing.T) {
	store := "file://" + filepath.Join(t.TempDir(), "archive")
	c := harness.StartCluster(t, harness.ClusterOptions{Tenant: archiveTenant, Timeline: archiveTimeline,
		PG:             pgtest.Options{WALSegSizeMB: 1, Conf: []string{"wal_keep_size = '1GB'"}},
		SafekeeperArgs: []string{"--remote-storage", store, "--partial-backup-interval", "300ms"}})
	c.PG.Exec(t, "CREATE TABLE ledger (id int PRIMARY KEY, note text)")
	start := c.Safekeepers[0].TimelineStatusLSN(t, archiveTenant, archiveTimeline, "timeline_start_lsn")
	next := insertRows(t, c.PG, 0, 6)
	mid := flushLSN(t, c.PG)
	harness.WaitFor(t, 30*time.Second, "the archive to reach the first load", func() bool { return backupLSN(t, c.Safekeepers) >= mid })
	uploader, most := 0, -1.0
	for i, sk := range c.Safekeepers {
		if n := scrapeMetric(t, sk, "safekeeper_backed_up_segments_total", ""); n > most {
			uploader, most = i, n
		}
	}
	c.Safekeepers[uploader].Kill()
	rest := append(append([]*harness.Safekeeper{}, c.Safekeepers[:uploader]...), c.Safekeepers[uploader+1:]...)
	next = insertRows(t, c.PG, next, 6)
	end := flushLSN(t, c.PG)
	t0 := time.Now()
	harness.WaitFor(t, 30*time.Second, "the other safekeepers to archive what the killed uploader left", func() bool {
		return backupLSN(t, rest) >= end
	})
	took := time.Since(t0)
	if took > 10*time.Second {
		t.Errorf("the archive caught up %v after the last commit; want within seconds", took)
	}
	n := checkArchivedSegments(t, store, c.PG, start, end)
	t.Logf("safekeeper %d uploaded %v segments and was killed; the others archived the rest (%d rows, %d segments in all) %v after the last commit",
		c.Safekeepers[uploader].ID, most, next, n, took.Round(time.Millisecond))
}

// TestArchiveRacingUploadersAreHarmless: with no turn to wait for (every
// safekeeper's delay near zero) all three upload each segment at once:
// each segment is stored once, the others find it there with the same
// content, no error is counted, and the archive is the primary's WAL.
func TestArchiveRacingUploadersAreHarmless(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	storeURL := srv.URL("race")
	c := harness.StartCluster(t, harness.ClusterOptions{Tenant: archiveTenant, Timeline: archiveTimeline,
		PG:             pgtest.Options{WALSegSizeMB: 1, Conf: []string{"wal_keep_size = '1GB'"}},
		SafekeeperArgs: []string{"--remote-storage", storeURL, "--partial-backup-interval", "100ms", "--backup-takeover", "1ms"}})
	c.PG.Exec(t, "CREATE TABLE ledger (id int PRIMARY KEY, note text)")
	start := c.Safekeepers[0].TimelineStatusLSN(t, archiveTenant, archiveTimeline, "timeline_start_lsn")
	next := insertRows(t, c.PG, 0, 10)
	end := flushLSN(t, c.PG)
	waitEveryBackupLSN(t, c.Safekeepers, end, 60*time.Second, "every safekeeper's backup_lsn to reach the end")
	uploads, errs := 0.0, 0.0
	for _, sk := range c.Safekeepers {
		uploads += scrapeMetric(t, sk, "safekeeper_backed_up_segments_total", "")
		errs += scrapeSum(t, sk, "safekeeper_backup_errors_total")
	}
	if errs != 0 {
		t.Errorf("racing uploaders counted %v errors; want none", errs)
	}
	n := checkArchivedSegments(t, storeURL, c.PG, start, end)
	t.Logf("%d rows, %d segments: %v uploads by three racing safekeepers, no error", next, n, uploads)
}

// TestArchiveStoresEachSegmentOnceInSteadyState: once one safekeeper
// uploads a timeline's segments, the other two wait their turn for each
// new segment and find it stored, however long the primary takes between
// segments: every segment completed after that is sent to the store once,
// counted at the store's door. (A wait carried over from the segments
// another stored had the two others store most segments again, each
// compressed and sent in full before the store refused it.)
func TestArchiveStoresEachSegmentOnceInSteadyState(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	proxy := s3test.StartFaultProxy(t, srv)
	c := harness.StartCluster(t, harness.ClusterOptions{Tenant: archiveTenant, Timeline: archiveTimeline,
		PG:             pgtest.Options{WALSegSizeMB: 1, Conf: []string{"wal_keep_size = '1GB'"}},
		SafekeeperArgs: []string{"--remote-storage", proxy.URL(srv, "once"), "--partial-backup-interval", "1s"}})
	c.PG.Exec(t, "CREATE TABLE ledger (id int PRIMARY KEY, note text)")
	// The first segments: every safekeeper finds the archive idle (no
	// partial stored lately) and may store them.
	next := insertRows(t, c.PG, 0, 4)
	waitEveryBackupLSN(t, c.Safekeepers, flushLSN(t, c.PG), 60*time.Second, "the archive to reach the first segments")
	segmentPuts := func() map[string]int {
		out := map[string]int{}
		for path, n := range proxy.Puts("") {
			if strings.Contains(path, "/wal/") && len(path[strings.LastIndexByte(path, '/')+1:]) == 24 {
				out[path] = n
			}
		}
		return out
	}
	before := segmentPuts()
	// Segments completed one at a time, further apart than any
	// safekeeper's wait for its turn (at most 3 s), the partial kept
	// fresh by a commit after each.
	for range 3 {
		next = insertRows(t, c.PG, next, 1)
		c.PG.Exec(t, "SELECT pg_switch_wal()")
		next = insertRows(t, c.PG, next, 1)
		waitEveryBackupLSN(t, c.Safekeepers, flushLSN(t, c.PG).SegmentStart(1<<20), 60*time.Second, "the archive to reach the new segment")
		time.Sleep(3500 * time.Millisecond) // the primary's pause: the scenario, not a wait for a condition
	}
	// A stall of the WAL longer than a partial interval and a turn, then
	// several segments completed by one commit: the partial and the last
	// segment are old, but the others saw the active uploader lately, and
	// wait their turn as before instead of taking the archive for idle.
	time.Sleep(5 * time.Second) // the primary's pause: the scenario
	c.PG.Exec(t, fmt.Sprintf("INSERT INTO ledger SELECT g, repeat(md5(g::text), 40) FROM generate_series(%d, %d) g", next+1, next+2500))
	next += 2500
	waitEveryBackupLSN(t, c.Safekeepers, flushLSN(t, c.PG).SegmentStart(1<<20), 60*time.Second, "the archive to reach the segments of one big commit")
	after := segmentPuts()
	stored := 0
	for path, n := range after {
		if _, old := before[path]; old {
			continue
		}
		stored++
		if n != 1 {
			t.Errorf("%s was sent to the store %d times; want once", path, n)
		}
	}
	if stored < 5 {
		t.Fatalf("%d new segments stored; want at least 5", stored)
	}
	t.Logf("%d segments stored once each after the first %d", stored, len(before))
}

// TestWALFetchFromTheArchive: `wal fetch --remote-storage` alone, against
// an archive laid out by storage/archive: whole segments byte for byte,
// the newest partial's segment zero-padded, a history file; exit 1 past
// the archive's end and for a history file it lacks; exit 126 for a
// segment missing below the end (a gap: ending recovery there would lose
// the WAL after it) and for a bad name.
func TestWALFetchFromTheArchive(t *testing.T) {
	root := filepath.Join(t.TempDir(), "archive")
	storeURL := "file://" + root
	store, err := remote.Open(storeURL, remote.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var key proto.TimelineKey
	key.TenantID, _ = proto.ParseID(archiveTenant)
	key.TimelineID, _ = proto.ParseID(archiveTimeline)
	ar := archive.Open(store, &archive.Codec{Compress: true}, key)
	const seg = 1 << 20
	ctx := context.Background()
	content := func(n int) []byte { return bytes.Repeat([]byte{byte(n), 0xd1, 0x10}, seg/3+1)[:seg] }
	name := func(n int) string { return proto.SegmentFileName(1, proto.LSN(n*seg), seg) }
	for _, n := range []int{1, 2, 4} { // 3 is missing: a gap
		if _, _, err := ar.Put(ctx, ar.SegmentName(name(n)), archive.Header{Kind: archive.KindSegment, SystemID: 9, PgTimeline: 1, SegSize: seg, Start: proto.LSN(n * seg)}, content(n)); err != nil {
			t.Fatal(err)
		}
	}
	for _, end := range []int{1000, 5000} { // an older partial and the newest
		if _, _, err := ar.Put(ctx, ar.PartialName(name(5), proto.LSN(5*seg+end)), archive.Header{Kind: archive.KindPartial, SystemID: 9, PgTimeline: 1, SegSize: seg, Start: 5 * seg}, content(5)[:end]); err != nil {
			t.Fatal(err)
		}
	}
	hist := []byte("1\t0/5001388\tno recovery target specified\n")
	if _, _, err := ar.Put(ctx, ar.HistoryName(2), archive.Header{Kind: archive.KindHistory, SystemID: 9, PgTimeline: 2}, hist); err != nil {
		t.Fatal(err)
	}
	if r := archiveFetch(t, storeURL, name(2)); r.code != 0 || !bytes.Equal(r.data, content(2)) || r.padded {
		t.Errorf("whole segment: exit %d, %d bytes, padded %v\n%s", r.code, len(r.data), r.padded, r.stderr)
	}
	padded := make([]byte, seg)
	copy(padded, content(5)[:5000])
	if r := archiveFetch(t, storeURL, name(5)); r.code != 0 || !bytes.Equal(r.data, padded) || !r.padded {
		t.Errorf("the newest partial's segment: exit %d, %d bytes, padded %v; want its 5000 bytes zero-padded\n%s", r.code, len(r.data), r.padded, r.stderr)
	}
	if r := archiveFetch(t, storeURL, "00000002.history"); r.code != 0 || !bytes.Equal(r.data, hist) {
		t.Errorf("history file: exit %d, %q\n%s", r.code, r.data, r.stderr)
	}
	for _, f := range []string{name(6), "00000003.history", proto.SegmentFileName(2, 6*seg, seg)} {
		if r := archiveFetch(t, storeURL, f); r.code != 1 || r.data != nil {
			t.Errorf("%s (past the end): exit %d, %d bytes; want 1 and nothing\n%s", f, r.code, len(r.data), r.stderr)
		}
	}
	if r := archiveFetch(t, storeURL, name(3)); r.code != 126 || r.data != nil || !strings.Contains(r.stderr, "gap in the archive") {
		t.Errorf("a missing segment below the end: exit %d; want 126 naming the gap\n%s", r.code, r.stderr)
	}
	if r := archiveFetch(t, storeURL, "pg_hba.conf"); r.code != 126 {
		t.Errorf("a bad name: exit %d, want 126", r.code)
	}
	// Without the partials, the whole segment after the gap still makes
	// it one.
	parts, err := ar.Partials(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if err := store.Delete(ctx, p.Name); err != nil {
			t.Fatal(err)
		}
	}
	if r := archiveFetch(t, storeURL, name(3)); r.code != 126 || !strings.Contains(r.stderr, "gap in the archive") {
		t.Errorf("a missing segment below a whole one: exit %d; want 126 naming the gap\n%s", r.code, r.stderr)
	}
	if r := archiveFetch(t, storeURL, name(5)); r.code != 1 {
		t.Errorf("past the last whole segment, no partial: exit %d, want 1\n%s", r.code, r.stderr)
	}
}

// TestArchiveEncryptedToAgeRecipients: safekeepers given
// --archive-recipient store objects a reader without the identity cannot
// use (wal fetch exits 126 naming it), and with --archive-identity-file
// wal fetch restores the primary's segments byte for byte.
func TestArchiveEncryptedToAgeRecipients(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	idFile := filepath.Join(t.TempDir(), "archive.key")
	if err := os.WriteFile(idFile, []byte(id.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, storeDir, store := startArchiveCluster(t, []string{"wal_keep_size = '1GB'"}, "--partial-backup-interval", "300ms", "--archive-recipient", id.Recipient().String(), "--archive-compression", "none")
	start := c.Safekeepers[0].TimelineStatusLSN(t, archiveTenant, archiveTimeline, "timeline_start_lsn")
	insertRows(t, c.PG, 0, 6)
	end := flushLSN(t, c.PG)
	harness.WaitFor(t, 60*time.Second, "the archive to reach the end", func() bool { return backupLSN(t, c.Safekeepers) >= end })
	first := proto.SegmentFileName(1, start.SegmentStart(1<<20), 1<<20)
	stored := mustRead(t, filepath.Join(storeDir, archiveTenant, archiveTimeline, "wal", first))
	if plain := mustRead(t, filepath.Join(c.PG.WALDir(), first)); bytes.Contains(stored, plain[:4096]) {
		t.Fatalf("the archived object holds the WAL in the clear")
	}
	if r := archiveFetch(t, store, first); r.code != 126 || !strings.Contains(r.stderr, "encrypted and no identity") {
		t.Fatalf("wal fetch without the identity: exit %d, want 126 naming the missing identity\n%s", r.code, r.stderr)
	}
	n := checkArchivedSegments(t, store, c.PG, start, end, "--archive-identity-file", idFile)
	t.Logf("%d encrypted segments restored byte for byte with the identity", n)
}

// TestArchiveRetentionPrunesOldWAL: with --archive-retention the
// uploaders delete the WAL stored longer ago than that, oldest first: the
// first segments go, the newest partial and the WAL since stay, and what
// is left verifies (no gap: an archive that starts later).
func TestArchiveRetentionPrunesOldWAL(t *testing.T) {
	c, storeDir, store := startArchiveCluster(t, nil, "--partial-backup-interval", "300ms", "--archive-retention", "2s")
	start := c.Safekeepers[0].TimelineStatusLSN(t, archiveTenant, archiveTimeline, "timeline_start_lsn")
	first := filepath.Join(storeDir, archiveTenant, archiveTimeline, "wal", proto.SegmentFileName(1, start.SegmentStart(1<<20), 1<<20))
	next := insertRows(t, c.PG, 0, 4)
	harness.WaitFor(t, 30*time.Second, "the first segment in the archive", func() bool {
		_, err := os.Stat(first)
		return err == nil
	})
	// More WAL, a while later: the first segments are past the retention.
	harness.WaitFor(t, 60*time.Second, "the archive retention to delete the first segment", func() bool {
		next = insertRows(t, c.PG, next, 1)
		_, err := os.Stat(first)
		return os.IsNotExist(err)
	})
	end := flushLSN(t, c.PG)
	harness.WaitFor(t, 30*time.Second, "the archive to reach the end", func() bool { return backupLSN(t, c.Safekeepers) >= end })
	code, out, stderr := harness.Run(t, "archive", "verify", "--remote-storage", store, "--tenant-id", archiveTenant, "--timeline-id", archiveTimeline)
	if code != 0 {
		t.Fatalf("archive verify after retention: exit %d\n%s%s", code, out, stderr)
	}
	if !strings.Contains(string(mustRead(t, c.Safekeepers[0].LogPath))+string(mustRead(t, c.Safekeepers[1].LogPath))+string(mustRead(t, c.Safekeepers[2].LogPath)), "archive retention deleted old WAL") {
		t.Errorf("no safekeeper logged its archive retention")
	}
	t.Logf("%d rows; after retention: %s", next, strings.TrimSpace(out))
}

// TestPrunedWALIsNotStoredAgain: a safekeeper that was down while the
// others archived, and while the archive was pruned, comes back with an
// old backup_lsn and the pruned WAL on its disk: it does not store that
// WAL again (the prune's mark says where the archive starts now), and
// the archive verifies.
func TestPrunedWALIsNotStoredAgain(t *testing.T) {
	c, storeDir, store := startArchiveCluster(t, nil, "--partial-backup-interval", "300ms")
	next := insertRows(t, c.PG, 0, 3)
	a := flushLSN(t, c.PG)
	waitEveryBackupLSN(t, c.Safekeepers, a, 30*time.Second, "every safekeeper's backup_lsn to reach the first load")
	late := c.Safekeepers[2]
	if err := late.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	next = insertRows(t, c.PG, next, 8)
	b := flushLSN(t, c.PG)
	harness.WaitFor(t, 30*time.Second, "the archive to reach the second load", func() bool { return backupLSN(t, c.Safekeepers[:2]) >= b })
	cut := (a + (b-a)/2).SegmentStart(1 << 20)
	code, out, stderr := harness.Run(t, "archive", "prune", "--remote-storage", store, "--tenant-id", archiveTenant, "--timeline-id", archiveTimeline, "--before", cut.String())
	if code != 0 {
		t.Fatalf("archive prune: exit %d\n%s%s", code, out, stderr)
	}
	pruned := filepath.Join(storeDir, archiveTenant, archiveTimeline, "wal", proto.SegmentFileName(1, cut-1<<20, 1<<20))
	late.Start()
	next = insertRows(t, c.PG, next, 2)
	end := flushLSN(t, c.PG)
	harness.WaitFor(t, 60*time.Second, "the returning safekeeper's backup_lsn to reach the end", func() bool {
		return late.TimelineStatusLSN(t, archiveTenant, archiveTimeline, "backup_lsn") >= end
	})
	if _, err := os.Stat(pruned); !os.IsNotExist(err) {
		t.Fatalf("the pruned segment %s is back in the archive (%v)", filepath.Base(pruned), err)
	}
	if code, out, stderr := harness.Run(t, "archive", "verify", "--remote-storage", store, "--tenant-id", archiveTenant, "--timeline-id", archiveTimeline); code != 0 {
		t.Fatalf("archive verify: exit %d\n%s%s", code, out, stderr)
	}
	t.Logf("%d rows; pruned below %s while safekeeper %d was down; it came back and stored nothing below it", next, cut, late.ID)
}

// TestDeleteKeepsTheArchiveUnlessAsked: deleting a timeline from a
// safekeeper leaves its archive, the backup of last resort; `timeline
// delete --archive` (DELETE ?archive=true) deletes it too; a safekeeper
// without an archive refuses --archive before it deletes anything.
func TestDeleteKeepsTheArchiveUnlessAsked(t *testing.T) {
	c, storeDir, _ := startArchiveCluster(t, nil, "--partial-backup-interval", "300ms")
	insertRows(t, c.PG, 0, 3)
	end := flushLSN(t, c.PG)
	harness.WaitFor(t, 30*time.Second, "the archive to reach the load", func() bool { return backupLSN(t, c.Safekeepers) >= end })
	c.Proposer.Kill()
	objects := func() int {
		n := 0
		filepath.WalkDir(filepath.Join(storeDir, archiveTenant), func(_ string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				n++
			}
			return nil
		})
		return n
	}
	before := objects()
	del := func(sk *harness.Safekeeper, extra ...string) (int, string) {
		code, out, stderr := harness.Run(t, append([]string{"timeline", "delete", "--http", sk.HTTPAddr, "--tenant-id", archiveTenant, "--timeline-id", archiveTimeline, "--force"}, extra...)...)
		return code, out + stderr
	}
	if code, out := del(c.Safekeepers[0]); code != 0 || objects() != before {
		t.Fatalf("timeline delete without --archive: exit %d, %d archive objects left of %d\n%s", code, objects(), before, out)
	}
	plain := harness.StartSafekeeper(t, 9)
	if code, out := del(plain, "--archive"); code == 0 || !strings.Contains(out, "no archive") {
		t.Fatalf("--archive on a safekeeper without an archive: exit %d\n%s", code, out)
	}
	code, out := del(c.Safekeepers[1], "--archive")
	if code != 0 || objects() != 0 || !strings.Contains(out, fmt.Sprintf("deleted its archive: %d objects", before)) {
		t.Fatalf("timeline delete --archive: exit %d, %d archive objects left of %d\n%s", code, objects(), before, out)
	}
	t.Logf("the archive's %d objects stayed after a delete, and went with --archive", before)
}

// TestBackupLSNNeverPassesAMissingSegment: backup_lsn says the WAL below
// it is in the archive, so it may never pass a whole segment the store
// does not hold, however the uploader's checks and turns interleave. One
// safekeeper archives, through a slow store (each request 40 ms, longer
// than its turn delay of 1 ms), while the primary commits; at every look,
// every whole segment below backup_lsn is in the store.
func TestBackupLSNNeverPassesAMissingSegment(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	proxy := s3test.StartFaultProxy(t, srv)
	proxy.SetDelay(40 * time.Millisecond)
	proxy.Set(s3test.Slow)
	storeURL := proxy.URL(srv, "slow")
	c := harness.StartCluster(t, harness.ClusterOptions{Tenant: archiveTenant, Timeline: archiveTimeline, PG: pgtest.Options{WALSegSizeMB: 1}})
	sk := c.Safekeepers[0]
	if err := sk.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	sk.Args = append(sk.Args, "--remote-storage", storeURL, "--partial-backup-interval", "100ms", "--backup-takeover", "1ms")
	sk.Start()
	c.PG.Exec(t, "CREATE TABLE ledger (id int PRIMARY KEY, note text)")
	start := sk.TimelineStatusLSN(t, archiveTenant, archiveTimeline, "timeline_start_lsn").SegmentStart(1 << 20)
	walDir := filepath.Join(srv.Root, srv.Bucket, "slow", archiveTenant, archiveTimeline, "wal")
	check := func() proto.LSN {
		b := sk.TimelineStatusLSN(t, archiveTenant, archiveTimeline, "backup_lsn")
		for seg := start; seg+1<<20 <= b; seg += 1 << 20 {
			if _, err := os.Stat(filepath.Join(walDir, proto.SegmentFileName(1, seg, 1<<20))); err != nil {
				t.Fatalf("backup_lsn %s, but segment %s is not in the store: %v", b, proto.SegmentFileName(1, seg, 1<<20), err)
			}
		}
		return b
	}
	next := 0
	for range 12 {
		next = insertRows(t, c.PG, next, 1)
		check()
	}
	end := flushLSN(t, c.PG)
	harness.WaitFor(t, 60*time.Second, "the archive to reach the end", func() bool { return check() >= end })
	t.Logf("%d rows; backup_lsn reached %s through a slow store, never past a missing segment", next, end)
}

// restoreFromTheArchiveAlone kills the safekeepers and removes their data
// (the primaries are stopped already), starts restored (a copy whose only
// WAL source is the archive), waits for it to finish recovery and promote,
// and checks that its ledger holds rows 1 to rows.
func restoreFromTheArchiveAlone(t *testing.T, sks []*harness.Safekeeper, restored *pgtest.Cluster, rows int, what string) {
	t.Helper()
	for _, sk := range sks {
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
	if got := restored.Exec(t, "SELECT count(*) || ' ' || coalesce(max(id), 0) FROM ledger"); got != fmt.Sprintf("%d %d", rows, rows) {
		t.Fatalf("restored ledger: count and max id %q, want %d %s", got, rows, what)
	}
}

// waitEveryBackupLSN waits until every one of sks reports a backup_lsn at
// or above lsn.
func waitEveryBackupLSN(t *testing.T, sks []*harness.Safekeeper, lsn proto.LSN, timeout time.Duration, what string) {
	t.Helper()
	var seen []string
	deadline := time.Now().Add(timeout)
	for {
		seen = seen[:0]
		behind := false
		for _, sk := range sks {
			b := sk.TimelineStatusLSN(t, archiveTenant, archiveTimeline, "backup_lsn")
			seen = append(seen, fmt.Sprintf("safekeeper %d at %s", sk.ID, b))
			behind = behind || b < lsn
		}
		if !behind {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (%s); backup_lsn: %s", timeout, what, lsn, strings.Join(seen, ", "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
