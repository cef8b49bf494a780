package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/storage"
)

// TestInspect: `inspect` reads a stopped data directory (its timeline's
// state, WAL range and slots; as a table or --json) without changing a
// byte of it, names the running server's commands at once when one holds
// the directory, and refuses a directory that is not one.
func TestInspect(t *testing.T) {
	start := proto.LSN(3 * exportSegSize)
	dir := storeTimeline(t, start, bytes.Repeat([]byte{7}, 2*exportSegSize+100))
	db, err := storage.Open(filepath.Join(dir, "safekeeper.db"), storage.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ClaimNodeID(4); err != nil {
		t.Fatal(err)
	}
	tl, _, err := db.OpenTimeline(exportTenant, exportTimeline)
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.CreateSlot(storage.Slot{Name: "standby_1", RestartLSN: start + 10, RestartTLI: 1}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	before, err := os.ReadFile(filepath.Join(dir, "safekeeper.db"))
	if err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(append([]string{"safekeeper"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, stderr := cli("inspect", "--data-dir", dir)
	end := start + 2*exportSegSize + 100
	for _, want := range []string{"node id", "4", "timeline " + exportTenant.String() + "/" + exportTimeline.String(),
		"flush lsn", end.String(), "1@" + start.String(), start.String() + ".." + end.String() + ", 2097252 bytes", "slot standby_1", (start + 10).String()} {
		if !strings.Contains(out, want) {
			t.Fatalf("inspect: exit %d, no %q in\n%s%s", code, want, out, stderr)
		}
	}
	code, out, _ = cli("inspect", "--data-dir", dir, "--json")
	var j httpapi.Inspection
	if code != 0 || json.Unmarshal([]byte(out), &j) != nil || j.NodeID == nil || *j.NodeID != 4 || len(j.Timelines) != 1 ||
		j.Timelines[0].FlushLSN != end || j.Timelines[0].WALBytes != 2*exportSegSize+100 || len(j.Timelines[0].Slots) != 1 {
		t.Fatalf("inspect --json: exit %d %s", code, out)
	}
	if !strings.Contains(out, `"flush_lsn":"`+end.String()+`"`) {
		t.Fatalf("inspect --json prints LSNs as X/X: %s", out)
	}
	if code, _, stderr := cli("inspect", "--data-dir", dir, "--timeline-id", proto.ID{9}.String()); code != 1 || !strings.Contains(stderr, "no timeline") {
		t.Fatalf("inspect of another timeline: exit %d %q", code, stderr)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "safekeeper.db"))
	if !bytes.Equal(before, after) {
		t.Fatal("inspect changed the database file")
	}

	// Held by a server: refused at once, naming what to use instead.
	held, err := storage.Open(filepath.Join(dir, "safekeeper.db"), storage.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	code, _, stderr = cli("inspect", "--data-dir", dir)
	held.Close()
	if code != 1 || !strings.Contains(stderr, "held by a running safekeeper") || !strings.Contains(stderr, "safekeeper timeline show") {
		t.Fatalf("inspect of a held directory: exit %d %q", code, stderr)
	}
	if el := time.Since(began); el > 5*time.Second {
		t.Fatalf("inspect of a held directory took %v", el)
	}
	if code, _, stderr := cli("inspect", "--data-dir", t.TempDir()); code != 1 || !strings.Contains(stderr, "a safekeeper's data directory") {
		t.Fatalf("inspect of an empty directory: exit %d %q", code, stderr)
	}
	if code, _, _ := cli("inspect"); code != exitUsage {
		t.Fatalf("inspect without --data-dir: exit %d", code)
	}
}
