package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

const exportSegSize = 1 << 20

var (
	exportTenant   = proto.ID{0xe1}
	exportTimeline = proto.ID{0xe2}
)

// storeTimeline writes a data directory holding one timeline whose WAL is
// wal from start, committed up to its end, and returns the directory.
func storeTimeline(t *testing.T, start proto.LSN, wal []byte) string {
	t.Helper()
	dir := t.TempDir()
	db, err := storage.Open(filepath.Join(dir, "safekeeper.db"), storage.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st := acceptor.State{TenantID: exportTenant, TimelineID: exportTimeline, SystemID: 1, PgVersion: 150000,
		WalSegSize: exportSegSize, PgTimeline: 1}
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.WriteWAL(start, wal); err != nil {
		t.Fatal(err)
	}
	end := start + proto.LSN(len(wal))
	st.VotedFor = proto.Ballot{Term: 1}
	st.History = proto.TermHistory{{Term: 1, StartLSN: start}}
	st.TimelineStartLSN, st.FlushLSN, st.CommitLSN = start, end, end
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	return dir
}

func runExport(t *testing.T, dataDir, outDir string, extra ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	args := append([]string{"safekeeper", "wal", "export", "--data-dir", dataDir, "--tenant-id", exportTenant.String(),
		"--timeline-id", exportTimeline.String(), "--output", outDir}, extra...)
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestWALExportUptoOutsideTheTimeline: --upto 0/0 is a value, not "unset";
// an --upto at or below the timeline's start (or inside a first segment the
// timeline does not hold from its first byte) has nothing to export and is
// refused clearly instead of reporting an empty export.
func TestWALExportUptoOutsideTheTimeline(t *testing.T) {
	aligned := storeTimeline(t, 0x1000000, bytes.Repeat([]byte{7}, 3*exportSegSize/2))
	midSegment := storeTimeline(t, 0x1000100, bytes.Repeat([]byte{7}, 3*exportSegSize/2))
	for _, tc := range []struct {
		dataDir, upto string
		code          int
		want          string
	}{
		{aligned, "0/0", exitUsage, "not above the timeline's start 0/1000000"},
		{aligned, "0/500000", exitUsage, "not above the timeline's start 0/1000000"},
		{aligned, "0/1000000", exitUsage, "not above the timeline's start 0/1000000"},
		{midSegment, "0/1000200", 1, "whole segments only from 0/1100000"},
	} {
		out := t.TempDir()
		code, stdout, stderr := runExport(t, tc.dataDir, out, "--upto", tc.upto)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("--upto %s: exit %d, stderr %q; want exit %d and %q (stdout %q)", tc.upto, code, stderr, tc.code, tc.want, stdout)
		}
		if files, _ := os.ReadDir(out); len(files) != 0 {
			t.Errorf("--upto %s: wrote %d files", tc.upto, len(files))
		}
	}
}

// TestWALExportWritesTheLastSegmentUnderItsName: the unfinished last
// segment is written as NAME, zero-padded, since a restore_command is only
// asked for NAME (a NAME.partial would be skipped and its commits lost); a
// NAME.partial left in the directory is removed, a stale NAME replaced.
func TestWALExportWritesTheLastSegmentUnderItsName(t *testing.T) {
	start := proto.LSN(0x1000000)
	wal := bytes.Repeat([]byte{7}, 3*exportSegSize/2)
	dataDir := storeTimeline(t, start, wal)
	seg1 := proto.SegmentFileName(1, start, exportSegSize)
	seg2 := proto.SegmentFileName(1, start+exportSegSize, exportSegSize)
	out := t.TempDir()
	stale := bytes.Repeat([]byte{0xee}, exportSegSize)
	for _, name := range []string{seg1 + ".partial", seg2, seg2 + ".partial"} {
		if err := os.WriteFile(filepath.Join(out, name), stale, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Up to commit_lsn: segment 1 complete, segment 2 unfinished.
	code, stdout, stderr := runExport(t, dataDir, out)
	if code != 0 {
		t.Fatalf("export: exit %d: %s", code, stderr)
	}
	wantFiles(t, out, seg1, seg2)
	for _, name := range []string{seg1 + ".partial", seg2 + ".partial"} {
		if !strings.Contains(stdout, "removed "+name) {
			t.Errorf("the removal of %s is not reported:\n%s", name, stdout)
		}
	}
	if !strings.Contains(stdout, "wrote "+seg2+": unfinished") {
		t.Errorf("the unfinished segment is not reported:\n%s", stdout)
	}
	b, err := os.ReadFile(filepath.Join(out, seg2))
	want := append(append([]byte(nil), wal[exportSegSize:]...), make([]byte, exportSegSize/2)...)
	if err != nil || !bytes.Equal(b, want) {
		t.Fatalf("%s is not the timeline's last WAL, zero-padded to a whole segment: %v", seg2, err)
	}

	// Up to the middle of segment 1: it is rewritten unfinished.
	code, _, stderr = runExport(t, dataDir, out, "--upto", (start + exportSegSize/2).String())
	if code != 0 {
		t.Fatalf("export --upto: exit %d: %s", code, stderr)
	}
	b, err = os.ReadFile(filepath.Join(out, seg1))
	want = append(append([]byte(nil), wal[:exportSegSize/2]...), make([]byte, exportSegSize/2)...)
	if err != nil || !bytes.Equal(b, want) {
		t.Fatalf("%s after --upto is not the WAL up to there, zero-padded: %v", seg1, err)
	}
}

func wantFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if strings.Join(got, " ") != strings.Join(names, " ") {
		t.Fatalf("%s holds %q, want %q", dir, got, names)
	}
}

// TestWALExportWritesHistoryFiles: after a promotion (the timeline is on
// PostgreSQL timeline 2 or 3) the export holds the history file of that
// timeline, byte for byte the one stored (the promoted primary's), and of
// each ancestor but timeline 1, byte for byte as PostgreSQL wrote it; the
// segments are named by the timeline they belong to. Without them `cp %f
// %p` recovery ends at the end of timeline 1 and promotes there, without
// the WAL written after the promotion.
func TestWALExportWritesHistoryFiles(t *testing.T) {
	start := proto.LSN(0x1000000)
	wal := bytes.Repeat([]byte{7}, 3*exportSegSize)
	// As PostgreSQL 15 writes them: timeline 3's is timeline 2's, a
	// newline, and one more line.
	hist2 := "1\t0/1100100\tno recovery target specified\n"
	hist3 := hist2 + "\n2\t0/1200100\tno recovery target specified\n"
	seg := func(tli uint32, n int) string {
		return proto.SegmentFileName(tli, start+proto.LSN(n*exportSegSize), exportSegSize)
	}
	for _, tc := range []struct {
		tli     uint32
		history string
		files   map[string]string // history files and their content
		names   []string          // every file, in name order
	}{
		{2, hist2, map[string]string{"00000002.history": hist2},
			[]string{seg(1, 0), "00000002.history", seg(2, 1), seg(2, 2)}},
		{3, hist3, map[string]string{"00000002.history": hist2, "00000003.history": hist3},
			[]string{seg(1, 0), "00000002.history", seg(2, 1), "00000003.history", seg(3, 2)}},
	} {
		dataDir := storeSwitchedTimeline(t, start, wal, tc.tli, []byte(tc.history))
		out := t.TempDir()
		code, stdout, stderr := runExport(t, dataDir, out)
		if code != 0 {
			t.Fatalf("timeline %d: export: exit %d: %s", tc.tli, code, stderr)
		}
		wantFiles(t, out, tc.names...)
		for name, want := range tc.files {
			b, err := os.ReadFile(filepath.Join(out, name))
			if err != nil || string(b) != want {
				t.Errorf("timeline %d: %s = %q, %v; want %q", tc.tli, name, b, err, want)
			}
			if !strings.Contains(stdout, "wrote "+name) {
				t.Errorf("timeline %d: writing %s is not reported:\n%s", tc.tli, name, stdout)
			}
		}
	}
	// A stored history that does not parse fails the export, rather than
	// naming the ancestors' segments by the current timeline.
	dataDir := storeSwitchedTimeline(t, start, wal, 2, []byte("not a history file\n"))
	if code, _, stderr := runExport(t, dataDir, t.TempDir()); code != 1 || !strings.Contains(stderr, "does not parse") {
		t.Fatalf("export with a damaged history: exit %d: %s", code, stderr)
	}
}

// storeSwitchedTimeline is storeTimeline for a timeline a promoted primary
// switched to PostgreSQL timeline tli, with its history file.
func storeSwitchedTimeline(t *testing.T, start proto.LSN, wal []byte, tli uint32, history []byte) string {
	t.Helper()
	dataDir := storeTimeline(t, start, wal)
	db, err := storage.Open(filepath.Join(dataDir, "safekeeper.db"), storage.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tl, st, err := db.OpenTimeline(exportTenant, exportTimeline)
	if err != nil {
		t.Fatal(err)
	}
	st.PgTimeline, st.PgHistory = tli, history
	if err := tl.Commit(st); err != nil {
		t.Fatal(err)
	}
	return dataDir
}
