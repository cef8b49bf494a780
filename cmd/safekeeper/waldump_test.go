package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/server"
	"github.com/safekeeper/safekeeper/storage"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

func runDump(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(append([]string{"safekeeper", "wal", "dump", "--tenant-id", exportTenant.String(), "--timeline-id", exportTimeline.String()}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

// dumpWAL is generated WAL with heap-like records carrying block
// references, a record over several pages, a switch; and what is known of
// each record.
type dumpWAL struct {
	start proto.LSN
	data  []byte
	recs  []xlogtest.WaldumpRecord // Start, Prev, Rmgr, RecLen, TotLen
	ends  []proto.LSN
}

func makeDumpWAL(t *testing.T, start proto.LSN) *dumpWAL {
	t.Helper()
	g := xlogtest.NewGenerator(start, exportSegSize, 1, 1)
	w := &dumpWAL{start: start}
	prev := proto.InvalidLSN
	add := func(rmgr string, recLen, totLen int, st, end proto.LSN) {
		w.recs = append(w.recs, xlogtest.WaldumpRecord{Start: st, Prev: prev, Rmgr: rmgr, RecLen: recLen, TotLen: totLen})
		w.ends = append(w.ends, end)
		prev = st
	}
	rel := xlog.RelFileNode{Spc: 1663, DB: 5, Rel: 16384}
	for i := 0; i < 40; i++ {
		body := xlogtest.EncodeBody(xlogtest.Body{Blocks: []xlogtest.Block{{ID: 0, Rel: rel, Block: uint32(i), Data: []byte("tuple")}},
			Main: []byte{1, 2, 3}})
		st, end := g.Raw(10, 0x00, uint32(700+i), body) // Heap INSERT
		add("Heap", xlog.SizeOfXLogRecord+len(body), xlog.SizeOfXLogRecord+len(body), st, end)
	}
	img := bytes.Repeat([]byte{9}, xlog.BlockSize)
	body := xlogtest.EncodeBody(xlogtest.Body{Blocks: []xlogtest.Block{{ID: 0, Fork: 1, Rel: rel, Block: 7, Image: img, ImageInfo: xlog.BkpImageApply}}})
	st, end := g.Raw(0, 0xB0, 0, body) // XLOG FPI
	add("XLOG", xlog.SizeOfXLogRecord+len(body)-len(img), xlog.SizeOfXLogRecord+len(body), st, end)
	st, end = g.Record(5 * xlog.PageSize)
	add("XLOG", xlog.SizeOfXLogRecord+5+5*xlog.PageSize, xlog.SizeOfXLogRecord+5+5*xlog.PageSize, st, end)
	st, end = g.Switch()
	add("XLOG", xlog.SizeOfXLogRecord, xlog.SizeOfXLogRecord, st, end)
	for i := 0; i < 5; i++ {
		st, end = g.Record(100)
		add("XLOG", xlog.SizeOfXLogRecord+2+100, xlog.SizeOfXLogRecord+2+100, st, end)
	}
	w.data = g.Take()
	return w
}

// TestWALDumpFromDataDir: wal dump of a data directory prints every record
// with its LSN, prev link, rmgr, rec/tot lengths and block references
// (fork and FPW), across pages and a segment switch; --start inside a
// record begins at the next one, --end leaves out records ending after it;
// --json and --stats count the same records and bytes.
func TestWALDumpFromDataDir(t *testing.T) {
	w := makeDumpWAL(t, 0x1000000)
	dir := storeTimeline(t, w.start, w.data)
	code, stdout, stderr := runDump(t, "--data-dir", dir)
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got, err := xlogtest.ParseWaldump([]byte(stdout))
	if err != nil || len(got) != len(w.recs) {
		t.Fatalf("%d records (%v), want %d:\n%s", len(got), err, len(w.recs), stdout)
	}
	for i, r := range got {
		want := w.recs[i]
		want.Desc = r.Desc
		if r != want {
			t.Errorf("record %d: %+v, want %+v", i, r, want)
		}
	}
	// pg_waldump's lines: LSNs %X/%08X, the description (an INSERT's
	// xl_heap_insert is offnum 513, flags 0x03 in main data 1 2 3).
	lines := strings.Split(stdout, "\n")
	for i, want := range map[int]string{
		0:  "rmgr: Heap        len (rec/tot):     54/    54, tx:        700, lsn: 0/01000028, prev 0/00000000, desc: INSERT off 513 flags 0x03, blkref #0: rel 1663/5/16384 blk 0",
		40: "rmgr: XLOG        len (rec/tot):     49/  8241, tx:          0, lsn: 0/010008E8, prev 0/010008B0, desc: FPI , blkref #0: rel 1663/5/16384 fork fsm blk 7 FPW",
		42: "rmgr: XLOG        len (rec/tot):     24/    24, tx:          0, lsn: 0/0100C9D0, prev 0/01002938, desc: SWITCH ",
		43: "rmgr: XLOG        len (rec/tot):    126/   126, tx:          0, lsn: 0/01100028, prev 0/0100C9D0, desc: NOOP ",
	} {
		if lines[i] != want {
			t.Errorf("line %d\n%q, want\n%q", i, lines[i], want)
		}
	}

	// --start inside record 10, --end one byte short of record 44's last
	// byte (its end less 2 bytes of MAXALIGN padding: 126 bytes long).
	from, to := w.recs[10].Start+1, w.ends[44]-3
	_, stdout, stderr = runDump(t, "--data-dir", dir, "--start", from.String(), "--end", to.String())
	got, _ = xlogtest.ParseWaldump([]byte(stdout))
	if len(got) != 33 || got[0].Start != w.recs[11].Start || got[len(got)-1].Start != w.recs[43].Start {
		t.Fatalf("--start %s --end %s: %d records (%s); want records 11..43", from, to, len(got), stderr)
	}

	// --json: one object per record.
	_, stdout, _ = runDump(t, "--data-dir", dir, "--json")
	var recs []dumpRecordJSON
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var r dumpRecordJSON
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		recs = append(recs, r)
	}
	if len(recs) != len(w.recs) || recs[40].FPILen != xlog.BlockSize || len(recs[40].Blocks) != 1 || !recs[40].Blocks[0].FPW ||
		recs[40].Blocks[0].Fork != "fsm" || recs[0].XID != 700 || recs[0].Type != "INSERT" || recs[0].Desc != "INSERT off 513 flags 0x03" ||
		recs[0].Blocks[0].Rel != "1663/5/16384" || recs[0].LSN != w.recs[0].Start {
		t.Fatalf("--json: %d records, FPI record %+v", len(recs), recs[40])
	}

	// --stats and --stats --json.
	_, stdout, _ = runDump(t, "--data-dir", dir, "--stats")
	var heapRec, xlogRec, xlogFPI uint64
	for _, r := range w.recs {
		if r.Rmgr == "Heap" {
			heapRec += uint64(r.RecLen)
		} else {
			xlogRec += uint64(r.RecLen)
			xlogFPI += uint64(r.TotLen - r.RecLen)
		}
	}
	for _, want := range []string{
		// 40 of 48 records; 40×54 bytes of 43852 (the XLOG records: FPI
		// 49+8192, 40989, switch 24, 5×126); of 52044 combined.
		"Heap                                          40 ( 83.33)                 2160 (  4.93)                    0 (  0.00)                 2160 (  4.15)",
		"Btree                                          0 (  0.00)                    0 (  0.00)                    0 (  0.00)                    0 (  0.00)",
		"Total                                         48                         43852 [84.26%]                 8192 [15.74%]                52044 [100%]",
	} {
		if !strings.Contains(stdout, want+"\n") {
			t.Errorf("--stats lacks\n%s\n%s", want, stdout)
		}
	}
	_, stdout, _ = runDump(t, "--data-dir", dir, "--stats", "--json")
	var st statsJSON
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatal(err)
	}
	if st.Total.Count != 48 || st.Rmgrs[10].Rmgr != "Heap" || st.Rmgrs[10].RecordSize != heapRec || st.Rmgrs[0].RecordSize != xlogRec ||
		st.Rmgrs[0].FPISize != xlogFPI || st.Start != w.recs[0].Start || st.End != w.ends[len(w.ends)-1] {
		t.Fatalf("--stats --json %+v (heap %d, xlog %d+%d)", st, heapRec, xlogRec, xlogFPI)
	}
}

// TestWALDumpTimelineStartingMidPage: a timeline whose first byte is in
// mid-page (its start is a record boundary there) is dumped from it.
func TestWALDumpTimelineStartingMidPage(t *testing.T) {
	g := xlogtest.NewGenerator(0x1000000, exportSegSize, 1, 1)
	g.Record(100)
	g.Take()
	start := g.Pos()
	g.SetPrev(0x1000028)
	first, _ := g.Record(50)
	g.Record(20000)
	dir := storeTimeline(t, start, g.Take())
	code, stdout, stderr := runDump(t, "--data-dir", dir)
	got, _ := xlogtest.ParseWaldump([]byte(stdout))
	if code != 0 || len(got) != 2 || got[0].Start != first {
		t.Fatalf("exit %d, %d records: %s%s", code, len(got), stdout, stderr)
	}
}

// TestWALDumpCRCFailure: a flipped byte in a stored record ends the dump
// with exit 1 and one line naming the record's LSN as a CRC failure, after
// the records before it.
func TestWALDumpCRCFailure(t *testing.T) {
	w := makeDumpWAL(t, 0x1000000)
	victim := w.recs[41] // spans pages: flip a byte on its third page
	bad := bytes.Clone(w.data)
	bad[victim.Start-w.start+2*xlog.PageSize] ^= 0x40
	code, stdout, stderr := runDump(t, "--data-dir", storeTimeline(t, w.start, bad))
	got, _ := xlogtest.ParseWaldump([]byte(stdout))
	if code != 1 || len(got) != 41 || !strings.Contains(stderr, "CRC") || !strings.Contains(stderr, "record at "+victim.Start.String()+":") ||
		strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Fatalf("exit %d, %d records, stderr %q; want exit 1 after 41 records, one line naming a CRC failure at %s", code, len(got), stderr, victim.Start)
	}
}

// TestWALDumpUsage: exactly one source; LSNs, ids and the range checked;
// exit 2 for the command line, 1 for an unknown timeline or a data
// directory a server holds (at once, naming --http), one line each.
func TestWALDumpUsage(t *testing.T) {
	w := makeDumpWAL(t, 0x1000000)
	dir := storeTimeline(t, w.start, w.data)
	flush := w.start + proto.LSN(len(w.data))
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "exactly one of --data-dir"},
		{[]string{"--data-dir", dir, "--http", "127.0.0.1:1"}, exitUsage, "exactly one of --data-dir"},
		{[]string{"--data-dir", dir, "--start", "12"}, exitUsage, "--start"},
		{[]string{"--data-dir", dir, "--end", "0/x"}, exitUsage, "--end"},
		{[]string{"--data-dir", dir, "--start", "0/500000"}, exitUsage, "holds WAL only from 0/1000000"},
		{[]string{"--data-dir", dir, "--end", (flush + 1).String()}, exitUsage, "beyond the timeline's flush_lsn"},
		{[]string{"--data-dir", dir, "--start", "0/1100000", "--end", "0/1100000"}, exitUsage, "empty range"},
		{[]string{"--data-dir", filepath.Join(dir, "nope")}, 1, "no such file"},
	} {
		code, _, stderr := runDump(t, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("wal dump %q: exit %d, %q; want exit %d, one line with %q", c.args, code, stderr, c.code, c.want)
		}
	}
	// A timeline with no WAL past its start: nothing printed, exit 0.
	if code, stdout, stderr := runDump(t, "--data-dir", storeTimeline(t, 0x1000000, nil)); code != 0 || stdout != "" || !strings.Contains(stderr, "no WAL") {
		t.Errorf("empty timeline: exit %d, %q, %q", code, stdout, stderr)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"safekeeper", "wal", "dump", "--data-dir", dir, "--tenant-id", "xyz", "--timeline-id", exportTimeline.String()}, &out, &errb); code != exitUsage {
		t.Errorf("bad tenant id: exit %d: %s", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"safekeeper", "wal", "dump", "--data-dir", dir, "--tenant-id", exportTenant.String(), "--timeline-id", proto.ID{7}.String()}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "not found") {
		t.Errorf("unknown timeline: exit %d: %s", code, errb.String())
	}

	// A data directory a server holds: refused at once.
	db, err := storage.Open(filepath.Join(dir, "safekeeper.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	t0 := time.Now()
	code, _, stderr := runDump(t, "--data-dir", dir)
	if code != 1 || !strings.Contains(stderr, "--http") || time.Since(t0) > 5*time.Second {
		t.Fatalf("locked data dir: exit %d after %v: %q", code, time.Since(t0), stderr)
	}
}

// TestWALDumpCommandLineBeatsEnvironment: --data-dir on the command line
// wins over SAFEKEEPER_HTTP in the environment, --http over
// SAFEKEEPER_DATA_DIR; both from the environment (or both on the command
// line) is still the usage error.
func TestWALDumpCommandLineBeatsEnvironment(t *testing.T) {
	w := makeDumpWAL(t, 0x1000000)
	dir := storeTimeline(t, w.start, w.data)
	gone := harness.RefusedAddr(t) // nobody listens there

	t.Setenv("SAFEKEEPER_HTTP", gone)
	code, stdout, stderr := runDump(t, "--data-dir", dir)
	if code != 0 || !strings.Contains(stdout, "desc: SWITCH") {
		t.Errorf("--data-dir with SAFEKEEPER_HTTP set: exit %d: %q", code, stderr)
	}
	t.Setenv("SAFEKEEPER_DATA_DIR", dir)
	if code, _, stderr := runDump(t); code != exitUsage || !strings.Contains(stderr, "exactly one of --data-dir") {
		t.Errorf("SAFEKEEPER_DATA_DIR and SAFEKEEPER_HTTP: exit %d: %q", code, stderr)
	}
	os.Unsetenv("SAFEKEEPER_HTTP")
	code, _, stderr = runDump(t, "--http", gone)
	if code != 1 || !strings.Contains(stderr, "cannot reach the safekeeper's HTTP API at "+gone) {
		t.Errorf("--http with SAFEKEEPER_DATA_DIR set: exit %d: %q; want it to read --http", code, stderr)
	}
	if code, _, stderr := runDump(t, "--http", gone, "--data-dir", dir); code != exitUsage || !strings.Contains(stderr, "exactly one of --data-dir") {
		t.Errorf("--http and --data-dir: exit %d: %q", code, stderr)
	}
}

// TestProgressLine: the text of the progress line, and that nothing is
// written to a writer that is no terminal.
func TestProgressLine(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, 64<<20)
	now := p.start
	p.now = func() time.Time { return now }
	now = now.Add(2 * time.Second)
	p.set(16 << 20)
	p.finish()
	if buf.Len() != 0 {
		t.Fatalf("progress written to a non-terminal: %q", buf.String())
	}
	if got, want := p.line(now), "16.0 MiB / 64.0 MiB (25%), 8.0 MiB/s, ETA 6s"; got != want {
		t.Fatalf("line %q, want %q", got, want)
	}
	p.w = &buf // as on a terminal
	now = now.Add(time.Second)
	p.set(24 << 20)
	p.finish()
	if got := buf.String(); !strings.Contains(got, "\r\033[K24.0 MiB / 64.0 MiB (37%), 8.0 MiB/s, ETA 5s") || !strings.HasSuffix(got, "\r\033[K") {
		t.Fatalf("terminal output %q", got)
	}
}

// TestWALDumpAgreesWithPgWaldumpOnGeneratedWAL: PostgreSQL 15's pg_waldump
// on the same WAL written as segment files prints the same output, byte
// for byte: the record lines (LSNs %X/%08X, descriptions, block references
// with fork and FPW), from a --start inside a record too (its "first
// record is after" line), and --stats.
func TestWALDumpAgreesWithPgWaldumpOnGeneratedWAL(t *testing.T) {
	w := makeDumpWAL(t, 0x1000000)
	segs := t.TempDir()
	if err := xlogtest.WriteSegments(segs, 1, exportSegSize, w.start, w.data); err != nil {
		t.Fatal(err)
	}
	end := w.ends[len(w.ends)-1]
	pgWaldump := filepath.Join(pgtest.MustBinDir(t), "pg_waldump")
	waldump := func(extra ...string) string {
		t.Helper()
		out, err := exec.Command(pgWaldump, append([]string{"-p", segs, "-s", w.start.String(), "-e", end.String()}, extra...)...).Output()
		if err != nil {
			t.Fatalf("pg_waldump: %v", err)
		}
		return string(out)
	}
	dir := storeTimeline(t, w.start, w.data)
	_, ours, _ := runDump(t, "--data-dir", dir)
	if recs, _ := xlogtest.ParseWaldump([]byte(ours)); len(recs) != len(w.recs) {
		t.Fatalf("wal dump printed %d records, %d written", len(recs), len(w.recs))
	}
	if d := xlogtest.FirstDiff("wal dump", ours, "pg_waldump", waldump()); d != "" {
		t.Error(d)
	}
	// From inside a record: pg_waldump's "first record is after" line,
	// then the same records.
	mid := w.recs[41].Start + 100
	_, ours, _ = runDump(t, "--data-dir", dir, "--start", mid.String())
	theirs, err := exec.Command(pgWaldump, "-p", segs, "-s", mid.String(), "-e", end.String()).Output()
	if err != nil {
		t.Fatalf("pg_waldump -s %s: %v", mid, err)
	}
	if !strings.HasPrefix(ours, "first record is after "+mid.String()+", at ") {
		t.Errorf("--start %s: %q", mid, ours[:min(len(ours), 200)])
	}
	if d := xlogtest.FirstDiff("wal dump", ours, "pg_waldump", string(theirs)); d != "" {
		t.Errorf("--start %s: %s", mid, d)
	}
	_, ours, _ = runDump(t, "--data-dir", dir, "--start", mid.String(), "--stats")
	theirs, err = exec.Command(pgWaldump, "-p", segs, "-s", mid.String(), "-e", end.String(), "--stats").Output()
	if err != nil || ours != string(theirs) {
		t.Errorf("--start %s --stats (pg_waldump: %v):\n%s\npg_waldump:\n%s", mid, err, ours, theirs)
	}
	if _, ours, _ := runDump(t, "--data-dir", dir, "--stats"); ours != waldump("--stats") {
		t.Errorf("--stats differ:\n%s\npg_waldump:\n%s", ours, waldump("--stats"))
	}
}

// TestWALDumpMalformedRecord: a record whose main data is too short for
// its type, and one of a resource manager whose descriptions are not
// decoded, print markers in place of the description; the dump goes on to
// the next record and exits 0.
func TestWALDumpMalformedRecord(t *testing.T) {
	g := xlogtest.NewGenerator(0x1000000, exportSegSize, 1, 1)
	rel := xlog.RelFileNode{Spc: 1663, DB: 5, Rel: 16384}
	g.Raw(10, 0x20, 700, xlogtest.EncodeBody(xlogtest.Body{Blocks: []xlogtest.Block{{ID: 0, Rel: rel, Block: 3}}, Main: []byte{1, 2, 3}})) // Heap UPDATE, 3 bytes
	g.Raw(13, 0x20, 701, xlogtest.EncodeBody(xlogtest.Body{Main: make([]byte, 20)}))                                                       // Gin INSERT
	g.Record(10)
	code, stdout, stderr := runDump(t, "--data-dir", storeTimeline(t, 0x1000000, g.Take()))
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if code != 0 || len(lines) != 3 ||
		!strings.HasSuffix(lines[0], "desc: UPDATE <malformed: main data is 3 bytes, xl_heap_update needs 14>, blkref #0: rel 1663/5/16384 blk 3") ||
		!strings.HasSuffix(lines[1], "desc: INSERT <not decoded>") || !strings.HasSuffix(lines[2], "desc: NOOP ") {
		t.Fatalf("exit %d, stderr %q:\n%s", code, stderr, stdout)
	}
}

// TestProgressAboveOutput: output written through above erases the
// progress line first (stdout and stderr on one terminal).
func TestProgressAboveOutput(t *testing.T) {
	var term, out bytes.Buffer
	p := newProgress(&term, 100)
	p.w = &term // as on a terminal
	p.set(50)
	fmt.Fprint(p.above(&out), "record\n")
	if !strings.HasSuffix(term.String(), "\r\033[K") || out.String() != "record\n" {
		t.Fatalf("terminal %q, output %q", term.String(), out.String())
	}
	if w := newProgress(&term, 1).above(&out); w != io.Writer(&out) {
		t.Fatal("above wraps the output of a progress that is off")
	}
}

// TestWALExportProgress: ExportWithProgress reports bytes done, growing to
// the total exported.
func TestWALExportProgress(t *testing.T) {
	dataDir := storeTimeline(t, 0x1000000, bytes.Repeat([]byte{7}, 5*exportSegSize/2))
	var calls []int64
	var total int64
	err := storage.ExportWithProgress(filepath.Join(dataDir, "safekeeper.db"), proto.TimelineKey{TenantID: exportTenant, TimelineID: exportTimeline},
		t.TempDir(), nil, io.Discard, func(done, tot int64) {
			calls = append(calls, done)
			total = tot
		})
	if err != nil {
		t.Fatal(err)
	}
	if total != 5*exportSegSize/2 || len(calls) < 3 || calls[len(calls)-1] != total {
		t.Fatalf("progress %v of %d", calls, total)
	}
	for i := 1; i < len(calls); i++ {
		if calls[i] <= calls[i-1] {
			t.Fatalf("progress went back: %v", calls)
		}
	}
}

// TestWALDumpOverHTTP: --http reads the same records from a running
// server (GET .../wal) as --data-dir read from its data directory before
// it started; while it runs, --data-dir is refused at once naming --http;
// an unknown timeline over --http is one line and exit 1, an unreachable
// API too.
func TestWALDumpOverHTTP(t *testing.T) {
	w := makeDumpWAL(t, 0x1000000)
	dir := storeTimeline(t, w.start, w.data)
	code, offline, stderr := runDump(t, "--data-dir", dir)
	if code != 0 {
		t.Fatalf("--data-dir: exit %d: %s", code, stderr)
	}
	srv, err := server.New(server.Config{NodeID: 5, ListenPG: "127.0.0.1:0", ListenHTTP: "127.0.0.1:0", DataDir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-served
	})
	httpAddr := srv.HTTPAddr().String()
	code, online, stderr := runDump(t, "--http", httpAddr)
	if code != 0 || online != offline || !strings.Contains(online, "desc: SWITCH") {
		t.Fatalf("--http: exit %d, %d bytes (--data-dir: %d): %s", code, len(online), len(offline), stderr)
	}
	code, stats, _ := runDump(t, "--http", httpAddr, "--stats", "--start", w.recs[41].Start.String())
	if code != 0 || !strings.Contains(stats, "\nTotal                                          7 ") {
		t.Fatalf("--http --stats from record 41: exit %d\n%s", code, stats)
	}
	t0 := time.Now()
	code, _, stderr = runDump(t, "--data-dir", dir)
	if code != 1 || !strings.Contains(stderr, "--http") || time.Since(t0) > 5*time.Second {
		t.Fatalf("--data-dir of a running server: exit %d after %v: %q", code, time.Since(t0), stderr)
	}
	var out, errb bytes.Buffer
	code = run([]string{"safekeeper", "wal", "dump", "--http", httpAddr, "--tenant-id", exportTenant.String(), "--timeline-id", proto.ID{7}.String()}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "does not exist") || strings.Count(strings.TrimSpace(errb.String()), "\n") != 0 {
		t.Fatalf("unknown timeline over --http: exit %d: %q", code, errb.String())
	}
	gone := harness.RefusedAddr(t) // nobody listens there
	if code, _, stderr := runDump(t, "--http", gone); code != 1 || !strings.Contains(stderr, "cannot reach") {
		t.Fatalf("unreachable --http: exit %d: %q", code, stderr)
	}
}
