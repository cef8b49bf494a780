package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage/archive"
	"github.com/safekeeper/safekeeper/storage/archive/archivetest"
	"github.com/safekeeper/safekeeper/storage/remote"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/s3test"
)

// The command-line tests of `safekeeper archive ls|verify|prune`: archives
// of real generated WAL (storage/archive/archivetest) in a file:// store
// (or on a real S3 server), the binary run on them.

var (
	toolsTenant   = proto.ID{0xa7, 1}
	toolsTimeline = proto.ID{0xa7, 2}
)

const toolsSeg = 1 << 20

// toolsArchive is a fresh file:// store holding w's archive; it returns
// the archive, the store's root directory and the names put.
func toolsArchive(t *testing.T, w *archivetest.WAL) (*archive.Archive, string, []string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "store")
	store, err := remote.Open("file://"+root, remote.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ar := archive.Open(store, &archive.Codec{Compress: true}, proto.TimelineKey{TenantID: toolsTenant, TimelineID: toolsTimeline})
	return ar, root, w.Put(t, ar)
}

// archiveTool runs `safekeeper archive CMD` on the archive at storeURL.
func archiveTool(t *testing.T, storeURL, cmd string, extra ...string) (code int, stdout, stderr string) {
	t.Helper()
	args := append([]string{"archive", cmd, "--remote-storage", storeURL, "--tenant-id", toolsTenant.String(), "--timeline-id", toolsTimeline.String()}, extra...)
	return harness.Run(t, args...)
}

// lsOutput is the part of `archive ls --json` the tests read.
type lsOutput struct {
	Start, End proto.LSN
	Segments   int
	Partials   int
	Timelines  []struct {
		Timeline    uint32
		First, Last string
		Count       int
	}
	Histories []struct {
		File string
		Ends []struct {
			Timeline uint32
			End      proto.LSN
		}
	}
	NewestPartial *struct {
		Segment string
		End     proto.LSN
	} `json:"newest_partial"`
	WALBytes         int64   `json:"wal_bytes"`
	StoredBytes      int64   `json:"stored_bytes"`
	CompressionRatio float64 `json:"compression_ratio"`
	Gaps             []struct {
		First, Last string
		Count       int
	}
	Misnamed []string
}

func archiveLsJSON(t *testing.T, storeURL string) lsOutput {
	t.Helper()
	code, out, errOut := archiveTool(t, storeURL, "ls", "--json")
	if code != 0 {
		t.Fatalf("archive ls --json: exit %d\n%s", code, errOut)
	}
	var ls lsOutput
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatalf("archive ls --json: %v\n%s", err, out)
	}
	return ls
}

var verifiedRecords = regexp.MustCompile(`decoded (\d+) WAL records from (\S+) to (\S+):`)

// checkVerified checks `archive verify`'s report of a good archive: exit
// 0, OK, every record of w from its start to its end.
func checkVerified(t *testing.T, what string, code int, out, errOut string, w *archivetest.WAL) {
	t.Helper()
	m := verifiedRecords.FindStringSubmatch(out)
	if code != 0 || !strings.Contains(out, "OK: the WAL from") || m == nil {
		t.Fatalf("%s: exit %d\n%s%s", what, code, out, errOut)
	}
	if m[1] != strconv.Itoa(len(w.Records)) || m[2] != w.Records[0].String() || m[3] != w.End.String() {
		t.Errorf("%s: decoded %s records %s..%s, want %d from %s to %s", what, m[1], m[2], m[3], len(w.Records), w.Records[0], w.End)
	}
}

// TestArchiveToolsGoodArchive: ls of an archive as the uploader writes it
// lists the segments, the partial and the sizes, with no gap; verify
// decodes every record to the partial's end and exits 0; the same on a
// real S3 server.
func TestArchiveToolsGoodArchive(t *testing.T) {
	w := archivetest.Generate(archivetest.Options{Start: toolsSeg, End: 6*toolsSeg + 5000, Seed: 21})
	_, root, _ := toolsArchive(t, w)
	url := "file://" + root

	code, out, errOut := archiveTool(t, url, "ls")
	if code != 0 {
		t.Fatalf("archive ls: exit %d\n%s", code, errOut)
	}
	for _, want := range []string{
		"PostgreSQL timeline 1: 000000010000000000000001..000000010000000000000005, 5 segments (0/100000..0/600000)",
		"newest partial: 000000010000000000000006 up to " + w.End.String(),
		"gaps: none",
		"compression ratio",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("archive ls does not say %q:\n%s", want, out)
		}
	}
	var onDisk int64
	for _, f := range storeFiles(t, root) {
		fi, err := os.Stat(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		onDisk += fi.Size()
	}
	ls := archiveLsJSON(t, url)
	if ls.StoredBytes != onDisk {
		t.Errorf("archive ls --json: stored_bytes %d, the store's files hold %d", ls.StoredBytes, onDisk)
	}
	if ls.Segments != 5 || ls.Partials != 1 || ls.NewestPartial == nil || ls.NewestPartial.End != w.End || ls.Start != toolsSeg || ls.End != w.End ||
		len(ls.Gaps) != 0 || ls.WALBytes != int64(w.End-w.Start) || ls.StoredBytes >= ls.WALBytes || ls.CompressionRatio <= 1 {
		t.Errorf("archive ls --json: %+v", ls)
	}

	code, out, errOut = archiveTool(t, url, "verify")
	checkVerified(t, "archive verify", code, out, errOut, w)
	// --json: ok, and the LSNs as X/X.
	code, out, _ = archiveTool(t, url, "verify", "--json")
	if code != 0 || !strings.Contains(out, `"ok":true`) || !strings.Contains(out, `"records_end":"`+w.End.String()+`"`) {
		t.Errorf("archive verify --json: exit %d\n%s", code, out)
	}

	t.Run("s3", func(t *testing.T) {
		srv := s3test.Start(t)
		srv.SetEnv(t) // the binary inherits the credentials
		store, err := remote.Open(srv.URL("tools"), remote.Options{})
		if err != nil {
			t.Fatal(err)
		}
		w.Put(t, archive.Open(store, &archive.Codec{Compress: true}, proto.TimelineKey{TenantID: toolsTenant, TimelineID: toolsTimeline}))
		code, out, errOut := archiveTool(t, srv.URL("tools"), "verify")
		checkVerified(t, "archive verify on S3", code, out, errOut, w)
		if ls := archiveLsJSON(t, srv.URL("tools")); ls.Segments != 5 || len(ls.Gaps) != 0 {
			t.Errorf("archive ls on S3: %+v", ls)
		}
	})
}

// TestArchiveToolsGap: a segment missing between others is a gap: ls
// shows it (text and JSON), verify exits 1 naming it.
func TestArchiveToolsGap(t *testing.T) {
	w := archivetest.Generate(archivetest.Options{Start: toolsSeg, End: 6*toolsSeg + 5000, Seed: 22})
	_, root, names := toolsArchive(t, w)
	if err := os.Remove(filepath.Join(root, filepath.FromSlash(names[2]))); err != nil { // segment 3
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, filepath.FromSlash(names[3]))); err != nil { // and 4
		t.Fatal(err)
	}
	url := "file://" + root
	code, out, _ := archiveTool(t, url, "ls")
	if want := "gap: 000000010000000000000003..000000010000000000000004 (0/300000..0/500000), 2 segments missing"; code != 0 || !strings.Contains(out, want) {
		t.Errorf("archive ls: exit %d, want %q:\n%s", code, want, out)
	}
	if ls := archiveLsJSON(t, url); len(ls.Gaps) != 1 || ls.Gaps[0].First != "000000010000000000000003" || ls.Gaps[0].Count != 2 {
		t.Errorf("archive ls --json gaps: %+v", ls.Gaps)
	}
	code, out, errOut := archiveTool(t, url, "verify")
	if code != 1 || !strings.Contains(errOut, "gap") || !strings.Contains(errOut, "segment 000000010000000000000003") || !strings.Contains(out, "FAILED") {
		t.Errorf("archive verify with a gap: exit %d, want 1 naming segment 3\n%s%s", code, out, errOut)
	}
	// After the gap the archive is whole.
	code, out, errOut = archiveTool(t, url, "verify", "--from", "0/500000")
	if code != 0 {
		t.Errorf("archive verify --from 0/500000: exit %d\n%s%s", code, out, errOut)
	}
}

// TestArchiveToolsCorruptObject: a byte flipped in a stored object's file
// makes verify exit 1 naming the object.
func TestArchiveToolsCorruptObject(t *testing.T) {
	w := archivetest.Generate(archivetest.Options{Start: toolsSeg, End: 5*toolsSeg + 5000, Seed: 23})
	_, root, names := toolsArchive(t, w)
	for _, name := range []string{names[1], names[len(names)-1]} { // a segment, the partial
		path := filepath.Join(root, filepath.FromSlash(name))
		orig, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		bad := slices.Clone(orig)
		bad[len(bad)/2] ^= 0x20
		if err := os.WriteFile(path, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := archiveTool(t, "file://"+root, "verify")
		if code != 1 || !strings.Contains(errOut, name+": archive: corrupt object") {
			t.Errorf("a byte flipped in %s: exit %d, want 1 naming it\n%s%s", name, code, out, errOut)
		}
		if err := os.WriteFile(path, orig, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := archiveTool(t, "file://"+root, "verify")
	checkVerified(t, "archive verify, the bytes put back", code, out, errOut, w)
}

// TestArchiveToolsTimelineSwitch: after a promotion the segments continue
// under timeline 2's name from the segment holding the switch point, with
// 00000002.history: ls shows both timelines and the history and no gap,
// verify decodes across the switch; without the history file verify
// exits 1 naming it.
func TestArchiveToolsTimelineSwitch(t *testing.T) {
	w := archivetest.Generate(archivetest.Options{Start: toolsSeg, SwitchAt: 3*toolsSeg + 70_000, End: 6*toolsSeg + 100, Seed: 24})
	ar, root, _ := toolsArchive(t, w)
	url := "file://" + root
	code, out, errOut := archiveTool(t, url, "ls")
	for _, want := range []string{
		"PostgreSQL timeline 1: 000000010000000000000001..000000010000000000000002, 2 segments",
		"PostgreSQL timeline 2: 000000020000000000000003..000000020000000000000005, 3 segments",
		"history file 00000002.history: timeline 1 ended at " + w.Switch.String(),
		"newest partial: 000000020000000000000006",
		"gaps: none",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("archive ls: exit %d, want %q:\n%s%s", code, want, out, errOut)
		}
	}
	code, out, errOut = archiveTool(t, url, "verify")
	checkVerified(t, "archive verify across a timeline switch", code, out, errOut, w)

	if err := os.Remove(filepath.Join(root, filepath.FromSlash(ar.HistoryName(2)))); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = archiveTool(t, url, "verify")
	if code != 1 || !strings.Contains(errOut, "00000002.history is not in the archive") {
		t.Errorf("archive verify without the history file: exit %d\n%s%s", code, out, errOut)
	}
}

// storeFiles are the files of a file:// store, relative to its root.
func storeFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			rel, _ := filepath.Rel(root, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestArchiveToolsPrune: prune --before deletes the whole segments wholly
// below the LSN and prints them, --older-than those stored before the
// age (up to the first newer one), never the newest partial or the
// history file; --dry-run prints the same and deletes nothing; the rest
// still verifies.
func TestArchiveToolsPrune(t *testing.T) {
	w := archivetest.Generate(archivetest.Options{Start: toolsSeg, SwitchAt: 2*toolsSeg + 100, End: 7*toolsSeg + 5000, Seed: 25})

	t.Run("before", func(t *testing.T) {
		ar, root, names := toolsArchive(t, w)
		url := "file://" + root
		all := storeFiles(t, root)
		code, dry, errOut := archiveTool(t, url, "prune", "--before", "0/4FFFFF", "--dry-run")
		if code != 0 || !strings.Contains(dry, "nothing was deleted (--dry-run)") {
			t.Fatalf("prune --dry-run: exit %d\n%s%s", code, dry, errOut)
		}
		if got := storeFiles(t, root); !slices.Equal(got, all) {
			t.Fatalf("prune --dry-run deleted files:\nbefore %v\nafter  %v", all, got)
		}
		code, out, errOut := archiveTool(t, url, "prune", "--before", "0/4FFFFF")
		if code != 0 {
			t.Fatalf("prune --before: exit %d\n%s", code, errOut)
		}
		// Segments 1 to 3 end at or below 0/400000; segment 4 ends after
		// 0/4FFFFF and stays.
		deleted := regexp.MustCompile(`(?m)^deleted segment (\S+) `).FindAllStringSubmatch(out, -1)
		wouldDelete := regexp.MustCompile(`(?m)^would delete segment (\S+) `).FindAllStringSubmatch(dry, -1)
		want := []string{"000000010000000000000001", "000000020000000000000002", "000000020000000000000003"}
		if len(deleted) != 3 || len(wouldDelete) != 3 {
			t.Fatalf("prune printed %d deletions, the dry run %d; want 3:\n%s\n%s", len(deleted), len(wouldDelete), out, dry)
		}
		for i, f := range want {
			if deleted[i][1] != f || wouldDelete[i][1] != f {
				t.Errorf("deletion %d: %s (dry run %s), want %s", i, deleted[i][1], wouldDelete[i][1], f)
			}
		}
		left := storeFiles(t, root)
		for _, n := range names[3:] {
			if !slices.Contains(left, n) {
				t.Errorf("%s was deleted", n)
			}
		}
		for _, n := range names[:3] {
			if slices.Contains(left, n) {
				t.Errorf("%s was not deleted", n)
			}
		}
		// The prune's mark (where the archive starts now) is new.
		if !slices.Contains(left, ar.HistoryName(2)) || !slices.Contains(left, ar.PrunedName(4*toolsSeg)) || len(left) != len(all)-3+1 {
			t.Errorf("left after prune: %v", left)
		}
		code, out, errOut = archiveTool(t, url, "verify")
		if code != 0 || !strings.Contains(out, "OK: the WAL from 0/400000") {
			t.Errorf("verify after prune: exit %d\n%s%s", code, out, errOut)
		}
	})

	t.Run("older-than", func(t *testing.T) {
		ar, root, names := toolsArchive(t, w)
		url := "file://" + root
		old := time.Now().Add(-8 * 24 * time.Hour)
		// Segments 1, 2 and 4 and the newest partial are 8 days old, 3 and
		// the rest new: 1 and 2 go, 4 stays (behind 3), and the partial.
		for _, n := range []string{names[0], names[1], names[3], names[len(names)-1]} {
			if err := os.Chtimes(filepath.Join(root, filepath.FromSlash(n)), old, old); err != nil {
				t.Fatal(err)
			}
		}
		all := storeFiles(t, root)
		code, dry, _ := archiveTool(t, url, "prune", "--older-than", "7d", "--dry-run")
		if got := storeFiles(t, root); code != 0 || !slices.Equal(got, all) {
			t.Fatalf("prune --older-than 7d --dry-run: exit %d, files before %v, after %v\n%s", code, all, got, dry)
		}
		code, out, errOut := archiveTool(t, url, "prune", "--older-than", "7d", "--json")
		if code != 0 {
			t.Fatalf("prune --older-than 7d: exit %d\n%s", code, errOut)
		}
		var res struct {
			Deleted []struct{ Object string }
			Start   proto.LSN
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range res.Deleted {
			got = append(got, d.Object)
		}
		if !slices.Equal(got, names[:2]) || res.Start != 3*toolsSeg || !strings.Contains(dry, "would delete 2 objects") {
			t.Errorf("prune --older-than 7d deleted %v (the archive now from %s), want %v\ndry run:\n%s", got, res.Start, names[:2], dry)
		}
		if left := storeFiles(t, root); len(left) != len(all)-2+1 || !slices.Contains(left, ar.HistoryName(2)) || !slices.Contains(left, names[len(names)-1]) || !slices.Contains(left, ar.PrunedName(3*toolsSeg)) {
			t.Errorf("left: %v", left)
		}
	})
}

// TestArchiveToolsUsage: bad flags exit 2 with a message, before the
// store is touched.
func TestArchiveToolsUsage(t *testing.T) {
	url := "file://" + filepath.Join(t.TempDir(), "store")
	ids := []string{"--tenant-id", toolsTenant.String(), "--timeline-id", toolsTimeline.String()}
	for _, args := range [][]string{
		append([]string{"archive", "ls"}, ids...), // no --remote-storage
		{"archive", "verify", "--remote-storage", url},
		append([]string{"archive", "ls", "--remote-storage", "ftp://x/y"}, ids...),
		append([]string{"archive", "verify", "--remote-storage", url, "--from", "12"}, ids...),
		append([]string{"archive", "prune", "--remote-storage", url}, ids...),
		append([]string{"archive", "prune", "--remote-storage", url, "--before", "0/1000000", "--older-than", "1d"}, ids...),
		append([]string{"archive", "prune", "--remote-storage", url, "--older-than", "7 days"}, ids...),
		append([]string{"archive", "prune", "--remote-storage", url, "--before", "x"}, ids...),
		append([]string{"archive", "ls", "--remote-storage", url, "extra"}, ids...),
		{"archive", "nosuch"},
	} {
		code, _, errOut := harness.Run(t, args...)
		if code != 2 || !strings.HasPrefix(errOut, "safekeeper: ") {
			t.Errorf("%q: exit %d, want 2 with a message; stderr %q", args, code, errOut)
		}
	}
}
