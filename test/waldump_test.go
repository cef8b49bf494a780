package test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

var (
	dumpTenant   = proto.ID{0xd0, 1}
	dumpTimeline = proto.ID{0xd0, 2}
)

// skTimeline reads a safekeeper's GET /v1/tenant/{t}/timeline/{tl}.
func skTimeline(t *testing.T, sk *harness.Safekeeper) (start, flush, commit proto.LSN) {
	t.Helper()
	return skTimelineOf(t, sk, dumpTenant, dumpTimeline)
}

// skTimelineOf is skTimeline for another timeline.
func skTimelineOf(t *testing.T, sk *harness.Safekeeper, tenant, timeline proto.ID) (start, flush, commit proto.LSN) {
	t.Helper()
	resp, err := http.Get("http://" + sk.HTTPAddr + "/v1/tenant/" + tenant.String() + "/timeline/" + timeline.String())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tl struct {
		TimelineStartLSN proto.LSN `json:"timeline_start_lsn"`
		FlushLSN         proto.LSN `json:"flush_lsn"`
		CommitLSN        proto.LSN `json:"commit_lsn"`
	}
	if resp.StatusCode != http.StatusOK {
		return 0, 0, 0
	}
	if err := json.NewDecoder(resp.Body).Decode(&tl); err != nil {
		t.Fatal(err)
	}
	return tl.TimelineStartLSN, tl.FlushLSN, tl.CommitLSN
}

// pgWaldump runs PostgreSQL's pg_waldump on the primary's pg_wal.
func pgWaldump(t *testing.T, pg *pgtest.Cluster, start, end proto.LSN, extra ...string) string {
	t.Helper()
	args := append([]string{"-p", pg.WALDir(), "-t", "1", "-s", start.String(), "-e", end.String()}, extra...)
	cmd := exec.CommandContext(harness.Context(t, 2*time.Minute), pg.PgBin("pg_waldump"), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("pg_waldump %q: %v\n%s", args, err, errb.String())
	}
	return out.String()
}

// sameDump checks that ours is pg_waldump's output byte for byte and, on
// a mismatch, fails with the first differing lines. It returns the records
// compared; the range must hold records with block references, and with
// images if wantFPW.
func sameDump(t *testing.T, what, ours, theirs string, wantFPW bool) []xlogtest.WaldumpRecord {
	t.Helper()
	if d := xlogtest.FirstDiff("wal dump", ours, "pg_waldump", theirs); d != "" {
		t.Fatalf("%s: wal dump's output is not pg_waldump's: %s", what, d)
	}
	recs, err := xlogtest.ParseWaldump([]byte(ours))
	if err != nil {
		t.Fatal(err)
	}
	blk, fpw := 0, 0
	for _, r := range recs {
		if refs := strings.Join(r.Blkrefs(), "; "); refs != "" {
			blk++
			if strings.Contains(refs, "FPW") {
				fpw++
			}
		}
	}
	if len(recs) == 0 || blk == 0 || (wantFPW && fpw == 0) {
		t.Fatalf("%s: %d records, %d with block references, %d with images: the range does not test them", what, len(recs), blk, fpw)
	}
	return recs
}

var statsRow = regexp.MustCompile(`(?m)^(\S+)\s+\d+ \(.*$`)

// statsRows returns the per-rmgr rows and the Total row of a --stats table.
func statsRows(out string) []string {
	var rows []string
	for _, l := range strings.Split(out, "\n") {
		if statsRow.MatchString(l) || strings.HasPrefix(l, "Total ") {
			rows = append(rows, l)
		}
	}
	return rows
}

// TestWALDumpMatchesPgWaldump is the acceptance check of `wal dump`: a real
// PostgreSQL 15 primary under pgbench (and a checkpoint, VACUUM, index
// splits and page deletions, subtransactions, prepared and aborted
// transactions, a database created and dropped, a WAL switch) streams
// through the proposer into three safekeepers until more than one whole
// 16 MiB segment past the timeline's start is committed; then `wal dump`
// over the range, read from a running safekeeper (--http) and from a
// stopped one's data directory, prints byte for byte what pg_waldump prints
// on the primary's pg_wal (every line: LSNs as %X/%08X, lengths, record
// types, whole descriptions, block references), also from a --start that is
// no record boundary; --stats equals pg_waldump --stats byte for byte; a
// running safekeeper's data directory is refused at once, naming --http;
// and one flipped byte in a stored record is reported as a CRC failure at
// that record's LSN, exit 1.
func TestWALDumpMatchesPgWaldump(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL 15 and pgbench")
	}
	began := time.Now()
	elapsed := func() time.Duration { return time.Since(began).Round(100 * time.Millisecond) }
	pg := pgtest.Start(t, pgtest.Options{Conf: []string{"wal_keep_size = '1GB'", "max_prepared_transactions = 2"}})
	sks := harness.StartSafekeepers(t, 3)
	prop := harness.StartProposer(t, harness.ProposerOptions{Upstream: pg.ConnString(), Safekeepers: harness.Addrs(sks),
		Tenant: dumpTenant.String(), Timeline: dumpTimeline.String(), Create: true, Slot: "proposer", ApplicationName: "proposer"})
	var tlStart proto.LSN
	harness.WaitFor(t, 60*time.Second, "the timeline on safekeeper 1", func() bool {
		prop.CheckRunning()
		tlStart, _, _ = skTimeline(t, sks[0])
		return tlStart != 0
	})
	segSize := pg.WALSegSize
	// At least one whole segment past the one the timeline starts in.
	target := tlStart.SegmentStart(segSize) + 2*proto.LSN(segSize) + 1<<20
	pgbench := func(args ...string) {
		pg.Run(t, "pgbench", append(append([]string{"-h", pg.SocketDir, "-p", strconv.Itoa(pg.Port), "-U", "postgres"}, args...), "postgres")...)
	}
	pgbench("-i", "-s", "2", "-q")
	// Besides pgbench's own records, the record types of a checkpoint,
	// VACUUM (pruning, freezing, a truncated heap, deleted index pages),
	// index page splits, subtransactions (more than 64: ASSIGNMENT),
	// prepared transactions, an abort, a dropped table, a database
	// created and dropped, a sequence, a logical message, a restore point
	// and a WAL switch: a few seconds.
	pg.Exec(t, `CHECKPOINT;
		CREATE TABLE split(id int PRIMARY KEY, pad text);
		INSERT INTO split SELECT g, repeat('x', 40) FROM generate_series(1, 20000) g;
		DO $$ BEGIN FOR i IN 1..70 LOOP BEGIN INSERT INTO split VALUES (100000 + i, 'sub'); EXCEPTION WHEN OTHERS THEN NULL; END; END LOOP; END $$;
		BEGIN; INSERT INTO split VALUES (200001, 'prepared'); PREPARE TRANSACTION 'sk_commit';
		COMMIT PREPARED 'sk_commit';
		BEGIN; CREATE TABLE gone(x int); SAVEPOINT s; INSERT INTO gone VALUES (1); PREPARE TRANSACTION 'sk_abort';
		ROLLBACK PREPARED 'sk_abort';
		BEGIN; INSERT INTO split VALUES (200002, 'aborted'); ROLLBACK;
		CREATE TABLE dropped(x int); DROP TABLE dropped;
		DELETE FROM split WHERE id BETWEEN 1000 AND 19000;
		CREATE TABLE emptied(x int); INSERT INTO emptied SELECT generate_series(1, 1000); DELETE FROM emptied;
		VACUUM split, emptied, pgbench_branches;
		VACUUM FREEZE pgbench_tellers;
		CREATE SEQUENCE seq; SELECT nextval('seq');
		SELECT pg_logical_emit_message(false, 'sk', 'wal dump');
		SELECT pg_create_restore_point('sk');
		SELECT pg_switch_wal();`)
	pg.Exec(t, "CREATE DATABASE copied STRATEGY FILE_COPY")
	pg.Exec(t, "DROP DATABASE copied")
	lsnNow := func() proto.LSN {
		l, err := proto.ParseLSN(pg.Exec(t, "SELECT pg_current_wal_flush_lsn()"))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	workloadEnd := lsnNow()
	runs := 0
	for ; runs < 1 || lsnNow() < target; runs++ {
		if runs == 30 {
			t.Fatalf("30 pgbench runs wrote WAL only up to %s, want %s", lsnNow(), target)
		}
		pgbench("-n", "-c", "4", "-j", "2", "-t", "500")
	}
	primaryEnd := lsnNow()
	t.Logf("[%v] pgbench -i and the other statements up to %s, %d pgbench runs up to %s", elapsed(), workloadEnd, runs, primaryEnd)
	var end proto.LSN
	harness.WaitFor(t, 60*time.Second, "safekeepers to commit the pgbench WAL", func() bool {
		_, flush, commit := skTimeline(t, sks[0])
		end = flush
		return flush >= primaryEnd && commit >= primaryEnd
	})
	// Whole segments in [tlStart, end): from the first segment start at or
	// after tlStart to the last one at or below end.
	whole := (end.SegmentStart(segSize) - (tlStart + proto.LSN(segSize) - 1).SegmentStart(segSize)) / proto.LSN(segSize)
	if whole < 1 {
		t.Fatalf("timeline %s..%s covers no whole segment", tlStart, end)
	}
	t.Logf("[%v] timeline %s..%s: %.1f MiB, %d whole 16 MiB segments", elapsed(), tlStart, end, float64(end-tlStart)/(1<<20), whole)

	ids := []string{"--tenant-id", dumpTenant.String(), "--timeline-id", dumpTimeline.String()}
	dump := func(args ...string) (int, string, string) {
		return harness.Run(t, append(append([]string{"wal", "dump"}, ids...), args...)...)
	}
	theirs := pgWaldump(t, pg, tlStart, end)

	// From the running safekeeper 1, over HTTP.
	code, ours, stderr := dump("--http", sks[0].HTTPAddr, "--start", tlStart.String(), "--end", end.String())
	if code != 0 {
		t.Fatalf("wal dump --http: exit %d: %s", code, stderr)
	}
	recs := sameDump(t, "--http", ours, theirs, true)
	t.Logf("[%v] --http: %d records, %d bytes, equal to pg_waldump's", elapsed(), len(recs), len(ours))
	// The range holds what the workload was for, so that their
	// descriptions are compared.
	types := map[string]int{}
	for _, r := range recs {
		name, _, _ := strings.Cut(r.Desc, " ")
		types[r.Rmgr+" "+name]++
		if r.Rmgr == "Transaction" && strings.Contains(r.Desc, "; subxacts:") {
			types["Transaction with subxacts"]++
		}
		if r.Rmgr == "Transaction" && strings.Contains(r.Desc, "; rels:") && strings.Contains(r.Desc, "dropped stats:") {
			types["Transaction with rels"]++
		}
	}
	var missing []string
	for _, want := range []string{"XLOG CHECKPOINT_ONLINE", "XLOG FPI", "XLOG SWITCH", "XLOG RESTORE_POINT",
		"Transaction COMMIT", "Transaction ABORT", "Transaction ASSIGNMENT", "Transaction PREPARE", "Transaction COMMIT_PREPARED",
		"Transaction ABORT_PREPARED", "Transaction with subxacts", "Transaction with rels",
		"Storage CREATE", "Storage TRUNCATE", "Database CREATE_FILE_COPY", "Database DROP",
		"Standby RUNNING_XACTS", "Standby LOCK", "Standby INVALIDATIONS",
		"Heap INSERT", "Heap INSERT+INIT", "Heap HOT_UPDATE", "Heap UPDATE", "Heap DELETE", "Heap LOCK", "Heap INPLACE",
		"Heap2 PRUNE", "Heap2 VACUUM", "Heap2 VISIBLE", "Heap2 FREEZE_PAGE", "Heap2 MULTI_INSERT+INIT",
		"Btree INSERT_LEAF", "Btree INSERT_UPPER", "Btree SPLIT_R", "Btree VACUUM", "Btree MARK_PAGE_HALFDEAD", "Btree UNLINK_PAGE",
		"Sequence LOG", "LogicalMessage MESSAGE"} {
		if types[want] == 0 {
			missing = append(missing, want)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("the WAL compared has no %s record: the workload does not test them (%d record types: %v)", strings.Join(missing, ", "), len(types), types)
	}

	// The data directory of a running safekeeper: refused at once.
	t0 := time.Now()
	code, _, stderr = dump("--data-dir", sks[1].DataDir)
	if code != 1 || !strings.Contains(stderr, "--http") || strings.Count(strings.TrimSpace(stderr), "\n") > 0 || time.Since(t0) > 10*time.Second {
		t.Fatalf("wal dump --data-dir of a running safekeeper: exit %d after %v: %q; want exit 1 at once, one line naming --http", code, time.Since(t0), stderr)
	}

	// From safekeeper 1's data directory, stopped; the default range is
	// the timeline's first record to its flush_lsn.
	if err := prop.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := sks[0].Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	code, ours, stderr = dump("--data-dir", sks[0].DataDir, "--end", end.String())
	if code != 0 {
		t.Fatalf("wal dump --data-dir: exit %d: %s", code, stderr)
	}
	n := len(sameDump(t, "--data-dir", ours, theirs, true))
	t.Logf("[%v] --data-dir: %d records equal to pg_waldump's over %s..%s (%d segments), %d record types", elapsed(), n, tlStart, end,
		(end-1).SegmentNo(segSize)-tlStart.SegmentNo(segSize)+1, len(types))

	// A --start inside a record, in mid-segment: both print "first record
	// is after" and begin at the first record at or after it.
	mid := recs[len(recs)/2].Start + 3
	code, ours, stderr = dump("--data-dir", sks[0].DataDir, "--start", mid.String(), "--end", end.String())
	if code != 0 {
		t.Fatalf("wal dump --start %s: exit %d: %s", mid, code, stderr)
	}
	n = len(sameDump(t, "--start "+mid.String(), ours, pgWaldump(t, pg, mid, end), false))
	t.Logf("[%v] --start %s: %d records equal", elapsed(), mid, n)

	// --stats: byte for byte what pg_waldump --stats prints (its header
	// line prints LSNs as X/X too).
	code, ours, stderr = dump("--data-dir", sks[0].DataDir, "--start", tlStart.String(), "--end", end.String(), "--stats")
	if code != 0 {
		t.Fatalf("wal dump --stats: exit %d: %s", code, stderr)
	}
	theirStats := pgWaldump(t, pg, tlStart, end, "--stats")
	if rows := statsRows(theirStats); len(rows) < 20 || ours != theirStats {
		t.Fatalf("--stats differ:\nwal dump:\n%s\npg_waldump:\n%s", ours, theirStats)
	}
	rows := statsRows(ours)
	t.Logf("[%v] --stats: equal to pg_waldump's (%d rows), %s", elapsed(), len(rows), strings.Join(strings.Fields(rows[len(rows)-1]), " "))

	// One flipped byte inside a stored record: a CRC failure at its LSN.
	var victim xlogtest.WaldumpRecord
	for _, r := range recs[len(recs)/3:] {
		if off := uint64(r.Start) % xlog.PageSize; r.TotLen > 64 && off+64 < xlog.PageSize {
			victim = r
			break
		}
	}
	flipStoredByte(t, filepath.Join(sks[0].DataDir, "safekeeper.db"), victim.Start+40)
	code, _, stderr = dump("--data-dir", sks[0].DataDir, "--end", end.String())
	if code != 1 || !strings.Contains(stderr, "CRC") || !strings.Contains(stderr, victim.Start.String()) {
		t.Fatalf("wal dump after flipping a byte of the record at %s: exit %d: %q; want exit 1 naming a CRC failure at it", victim.Start, code, stderr)
	}
	t.Logf("[%v] flipped byte at %s: %s", elapsed(), victim.Start+40, strings.TrimSpace(stderr))
}

// flipStoredByte inverts the WAL byte at lsn in a stopped safekeeper's
// bbolt file (storage/doc.go: timelines/<tenant‖timeline>/wal/<extent>/<chunk>,
// keys the big-endian LSN of their first byte).
func flipStoredByte(t *testing.T, path string, lsn proto.LSN) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	key := append(append([]byte{}, dumpTenant[:]...), dumpTimeline[:]...)
	lk := binary.BigEndian.AppendUint64(nil, uint64(lsn))
	err = db.Update(func(tx *bolt.Tx) error {
		wal := tx.Bucket([]byte("timelines")).Bucket(key).Bucket([]byte("wal"))
		c := wal.Cursor()
		ek, _ := c.Seek(lk)
		if ek == nil || !bytes.Equal(ek, lk) {
			ek, _ = c.Prev()
		}
		ext := wal.Bucket(ek)
		cc := ext.Cursor()
		ck, v := cc.Seek(lk)
		if ck == nil || !bytes.Equal(ck, lk) {
			ck, v = cc.Prev()
		}
		start := proto.LSN(binary.BigEndian.Uint64(ck))
		if lsn < start || lsn >= start+proto.LSN(len(v)) {
			return fmt.Errorf("no stored chunk holds %s (nearest at %s, %d bytes)", lsn, start, len(v))
		}
		chunk := bytes.Clone(v)
		chunk[lsn-start] ^= 0xff
		return ext.Put(bytes.Clone(ck), chunk)
	})
	if err != nil {
		t.Fatal(err)
	}
}
