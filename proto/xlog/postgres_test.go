package xlog_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// TestRealPostgresWAL decodes WAL written by a real PostgreSQL 15 and checks
// the decoder's record ends against pg_waldump's. The workload makes tiny
// records, records larger than a page and than a segment, TOAST rows,
// full-page writes after a CHECKPOINT and two XLOG_SWITCHes; decoding starts
// at a segment start inside a record, so its tail must be skipped.
func TestRealPostgresWAL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL 15")
	}
	c := pgtest.Start(t, pgtest.Options{WALSegSizeMB: 1})
	seg := c.WALSegSize
	lsn := func(sql string) proto.LSN {
		t.Helper()
		out := c.Exec(t, sql)
		l, err := proto.ParseLSN(out[strings.LastIndex(out, "\n")+1:])
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return l
	}
	// Keep every segment from now on, whatever checkpoints do.
	c.Exec(t, "SELECT pg_create_physical_replication_slot('keep', true)")
	c.Exec(t, `CREATE TABLE small(id int PRIMARY KEY, v text);
		CREATE TABLE big(id int, v text);
		ALTER TABLE big ALTER v SET STORAGE EXTERNAL;`)
	// A record longer than a segment; decoding starts at the last segment
	// start inside it.
	bigEnd := lsn("SELECT pg_logical_emit_message(false, 'sk', repeat('s', 1500000))")
	from := (bigEnd - 1).SegmentStart(seg)

	var sql strings.Builder
	for _, n := range []int{10, 100, 1000, 8000, 8150, 8192, 9000, 16384, 50000, 200000, 1 << 20, 3 << 20} {
		fmt.Fprintf(&sql, "SELECT pg_logical_emit_message(false, 'sk', repeat('a', %d));\n", n)
	}
	// Index records of every access method, for the Reader's record type
	// names (rm_identify) below.
	sql.WriteString(`CREATE TABLE idx(id int, a int[], p point, r int4range);
		CREATE INDEX ON idx USING gin(a);
		CREATE INDEX ON idx USING gist(p);
		CREATE INDEX ON idx USING spgist(p);
		CREATE INDEX ON idx USING brin(id) WITH (pages_per_range = 1);
		CREATE INDEX ON idx USING hash(id);
		CREATE SEQUENCE seq;
		INSERT INTO idx SELECT g, ARRAY[g, g+1], point(g, g), int4range(g, g+10) FROM generate_series(1, 300) g;
		SELECT count(nextval('seq')) FROM generate_series(1, 100);
		DELETE FROM idx WHERE id % 3 = 0;
		VACUUM idx;
	`)
	sql.WriteString(`INSERT INTO small SELECT g, 'v' || g FROM generate_series(1, 3000) g;
		INSERT INTO big SELECT g, repeat(md5(g::text), 5000) FROM generate_series(1, 4) g;
		SELECT pg_switch_wal();
		SELECT pg_logical_emit_message(false, 'sk', repeat('b', 77));
		CHECKPOINT;
		UPDATE small SET v = v || 'x';
		SELECT pg_logical_emit_message(false, 'sk', repeat('c', 123456));
	`)
	for i := 0; i < 40; i++ {
		fmt.Fprintf(&sql, "SELECT pg_logical_emit_message(false, 'sk', repeat('d', %d));\n", 8000+i*7)
	}
	c.Exec(t, sql.String())
	swEnd := lsn("SELECT pg_switch_wal()")
	to := (swEnd - 1).SegmentStart(seg) + proto.LSN(seg)

	var data []byte
	for l := from; l < to; l += proto.LSN(seg) {
		b, err := os.ReadFile(filepath.Join(c.WALDir(), proto.SegmentFileName(1, l, seg)))
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, b...)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	recs, stderr, err := xlogtest.RunWaldump(ctx, c.PgBin("pg_waldump"), c.WALDir(), from, to)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("WAL %s..%s: %d records; pg_waldump stderr: %s", from, to, len(recs), strings.TrimSpace(stderr))
	last := recs[len(recs)-1]
	if !last.IsSwitch() {
		t.Fatalf("pg_waldump's last record before %s is %+v, want the XLOG_SWITCH", to, last)
	}
	ends := append(xlogtest.EndsFromStarts(recs, seg), to)

	// The workload must have produced what this test claims to cover.
	var overPage, overSeg, switches, fpw int
	for i, r := range recs {
		if r.TotLen > xlog.PageSize {
			overPage++
		}
		if r.Start.SegmentStart(seg) != (ends[i]-1).SegmentStart(seg) && !r.IsSwitch() {
			overSeg++
		}
		if r.IsSwitch() {
			switches++
		}
		if strings.Contains(r.Desc, "FPW") {
			fpw++
		}
	}
	if recs[0].Start <= from+xlog.SizeOfXLogLongPHD || overPage < 10 || overSeg < 2 || switches < 2 || fpw < 5 {
		t.Fatalf("workload too weak: first record %s (from %s), %d records > page, %d crossing segments, %d switches, %d FPWs",
			recs[0].Start, from, overPage, overSeg, switches, fpw)
	}

	// PostgreSQL zero-fills the pages after a switch, page headers
	// included (CopyXLogRecordToWAL), which is why the decoder does not
	// look for page headers there.
	for i, r := range recs {
		if !r.IsSwitch() {
			continue
		}
		for p := (r.Start/xlog.PageSize + 1) * xlog.PageSize; p < ends[i]; p += xlog.PageSize {
			if h := data[p-from : p-from+xlog.SizeOfXLogShortPHD]; string(h) != string(make([]byte, len(h))) {
				t.Fatalf("page %s after the switch at %s has a non-zero header % x", p, r.Start, h)
			}
		}
	}

	for _, seed := range seeds() {
		for _, maxChunk := range []int{100, 8192, 300000} {
			d := xlog.NewDecoder(from, seg)
			feedChecked(t, seed, d, data, ends, from, maxChunk)
			if d.RecordEnd() != to {
				t.Fatalf("final RecordEnd %s, want %s", d.RecordEnd(), to)
			}
		}
	}
	// The Reader returns pg_waldump's records: starts, prev links, lengths
	// (rec = xl_tot_len less the images), rmgr and record type names; and
	// the description and block references pg_waldump prints after
	// "desc: ", whole for the resource managers described (times in the
	// local zone, which pg_waldump, run by this process, shares), the
	// record type's name and the block references for the others.
	r := xlog.NewReader(from, seg)
	r.Feed(data)
	types, pairs := map[string]bool{}, map[string]bool{}
	described := 0
	for i, w := range recs {
		rec, ok, err := r.Next()
		if err != nil || !ok {
			t.Fatalf("Reader: record %d (%s): %v, %v", i, w.Start, ok, err)
		}
		name, _, _ := strings.Cut(w.Desc, " ")
		if rec.LSN != w.Start || rec.Prev != w.Prev || int(rec.TotLen) != w.TotLen || int(rec.TotLen)-rec.FPILen() != w.RecLen ||
			xlog.RmgrName(rec.RmID) != w.Rmgr || xlog.RecordType(rec) != name || rec.End != ends[i] {
			t.Fatalf("Reader: record %d: %s %s prev %s len %d/%d %s ends %s; pg_waldump: %+v (ends %s)", i, xlog.RmgrName(rec.RmID), rec.LSN, rec.Prev,
				int(rec.TotLen)-rec.FPILen(), rec.TotLen, xlog.RecordType(rec), rec.End, w, ends[i])
		}
		if xlog.Described(rec.RmID) {
			if got := xlog.Describe(rec, zoned(time.Local)) + xlog.BlockRefs(rec); got != w.Desc {
				t.Fatalf("record %d at %s: desc\n%s\npg_waldump:\n%s", i, rec.LSN, got, w.Desc)
			}
			described++
		} else if !strings.HasPrefix(w.Desc, xlog.RecordType(rec)+" ") || !strings.HasSuffix(w.Desc, xlog.BlockRefs(rec)) {
			t.Fatalf("record %d at %s: type %q, block references %q; pg_waldump: %q", i, rec.LSN, xlog.RecordType(rec), xlog.BlockRefs(rec), w.Desc)
		}
		types[w.Rmgr] = true
		pairs[w.Rmgr+"/"+name] = true
	}
	for _, rm := range []string{"XLOG", "Transaction", "Storage", "Standby", "Heap", "Heap2", "Btree", "Hash", "Gin", "Gist", "SPGist", "BRIN", "Sequence", "LogicalMessage"} {
		if !types[rm] {
			t.Errorf("no %s record in the workload's WAL: its record type names are not checked", rm)
		}
	}
	t.Logf("Reader: %d records as pg_waldump's (%d with the same whole description), %d rmgr/record type pairs", len(recs), described, len(pairs))

	// Starting at a record end in mid-stream works too.
	for _, k := range []int{0, len(ends) / 3, len(ends) / 2, len(ends) - 2} {
		st := ends[k]
		d := xlog.NewDecoder(st, seg)
		feedChecked(t, int64(k), d, data[st-from:], ends[k+1:], st, 5000)
	}
}
