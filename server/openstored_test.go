package server

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

// storeTimelines stores n timelines (timeline ids 0xbb,0x10+i) in dir,
// each under its own term with its own amount of WAL and a commit_lsn
// below its flush_lsn, and returns their durable states as read back from
// disk after the server stopped.
func storeTimelines(t *testing.T, dir string, n int) map[proto.TimelineKey]acceptor.State {
	t.Helper()
	s := startTestServer(t, dir, nil)
	for i := range n {
		term := uint64(i + 1)
		p := newTestPush(t, s.Addr().String(), proto.ID{0xbb, byte(0x10 + i)}, term, proto.TermHistory{{Term: term, StartLSN: tStart}}, tStart)
		p.push(2+i, 300, 0)
		p.push(1, 200, p.pos) // commit_lsn stays below flush_lsn
		p.c.Close()
	}
	shutdown(t, s)
	db, err := storage.Open(filepath.Join(dir, "safekeeper.db"), storage.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	keys, err := db.Timelines()
	if err != nil {
		t.Fatal(err)
	}
	want := map[proto.TimelineKey]acceptor.State{}
	for _, k := range keys {
		_, st, err := db.OpenTimeline(k.TenantID, k.TimelineID)
		if err != nil {
			t.Fatal(err)
		}
		if st.FlushLSN <= st.CommitLSN || st.CommitLSN == 0 {
			t.Fatalf("timeline %s stored flush_lsn %s commit_lsn %s: the test needs commit_lsn in (0, flush_lsn)", k, st.FlushLSN, st.CommitLSN)
		}
		want[k] = st
	}
	if len(want) != n {
		t.Fatalf("%d timelines stored, want %d", len(want), n)
	}
	return want
}

// timelineGauges scrapes /metrics and returns, per timeline, its
// safekeeper_flush_lsn, safekeeper_commit_lsn and safekeeper_term.
func timelineGauges(t *testing.T, base string) map[proto.TimelineKey][3]float64 {
	t.Helper()
	fams := scrape(t, base)
	out := map[proto.TimelineKey][3]float64{}
	for i, name := range []string{"safekeeper_flush_lsn", "safekeeper_commit_lsn", "safekeeper_term"} {
		f := fams[name]
		if f == nil {
			continue
		}
		for _, m := range f.Metric {
			var k proto.TimelineKey
			for _, l := range m.Label {
				id, err := proto.ParseID(l.GetValue())
				if err != nil {
					t.Fatalf("%s label %s=%q: %v", name, l.GetName(), l.GetValue(), err)
				}
				switch l.GetName() {
				case "tenant_id":
					k.TenantID = id
				case "timeline_id":
					k.TimelineID = id
				}
			}
			v := out[k]
			v[i] = m.Gauge.GetValue()
			out[k] = v
		}
	}
	return out
}

// TestMetricsCoverStoredTimelinesAfterRestart: after a restart every
// stored timeline is opened in the background, so /metrics carries each
// one's flush_lsn, commit_lsn and term as stored (and the server reports
// them open) before any client has asked for one. Before, a timeline had
// no series until a proposer or reader opened it.
func TestMetricsCoverStoredTimelinesAfterRestart(t *testing.T) {
	dir := t.TempDir()
	want := storeTimelines(t, dir, 3)

	s := startTestServer(t, dir, func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	base := "http://" + s.HTTPAddr().String()
	// No client connects and nothing but /metrics is asked for (the
	// timeline list would open the timelines itself).
	var got map[proto.TimelineKey][3]float64
	waitFor(t, "every stored timeline's series in /metrics", func() bool {
		got = timelineGauges(t, base)
		return len(got) >= len(want)
	})
	if len(got) != len(want) {
		t.Fatalf("/metrics has series of %d timelines, %d are stored: %v", len(got), len(want), got)
	}
	for k, st := range want {
		g, ok := got[k]
		if !ok {
			t.Fatalf("no series of stored timeline %s", k)
		}
		if proto.LSN(g[0]) != st.FlushLSN || proto.LSN(g[1]) != st.CommitLSN || uint64(g[2]) != st.VotedFor.Term {
			t.Errorf("timeline %s: flush_lsn %s commit_lsn %s term %v in /metrics; stored %s %s %d",
				k, proto.LSN(g[0]), proto.LSN(g[1]), g[2], st.FlushLSN, st.CommitLSN, st.VotedFor.Term)
		}
	}
	s.mu.Lock()
	conns := len(s.conns)
	s.mu.Unlock()
	if conns != 0 {
		t.Fatalf("%d client connections: the series must come without any", conns)
	}
}

// TestOpenAtStartSurvivesABrokenTimeline: a stored timeline that cannot be
// opened (its control record damaged) is logged with its ids and does not
// stop the others from opening or the server from serving; the one line
// at the end counts both.
func TestOpenAtStartSurvivesABrokenTimeline(t *testing.T) {
	dir := t.TempDir()
	// More timelines than the registry opens at once, the broken one
	// among the first: a failure must not end the opens of the rest.
	want := storeTimelines(t, dir, 8)
	broken := proto.TimelineKey{TenantID: tTenant, TimelineID: proto.ID{0xbb, 0x11}}
	bdb, err := bolt.Open(filepath.Join(dir, "safekeeper.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error {
		name := append(append([]byte{}, broken.TenantID[:]...), broken.TimelineID[:]...)
		tb := tx.Bucket([]byte("timelines")).Bucket(name)
		v := append([]byte{}, tb.Get([]byte("control"))...)
		v[len(v)/2] ^= 0xff // the CRC no longer matches
		return tb.Put([]byte("control"), v)
	})
	if cerr := bdb.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	delete(want, broken)

	var logs syncBuffer
	s := startTestServer(t, dir, func(c *Config) {
		c.ListenHTTP = "127.0.0.1:0"
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	waitFor(t, "the line that ends the opens at start", func() bool { return strings.Contains(logs.String(), `"opened the stored timelines"`) })
	var done, failed map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		switch m["msg"] {
		case "opened the stored timelines":
			done = m
		case "could not open timeline at start; a client's open retries it":
			failed = m
		}
	}
	if done["timelines"] != float64(len(want)) || done["failed"] != float64(1) || done["duration"] == nil {
		t.Errorf("the closing line: %v, want %d timelines opened, 1 failed, and the time taken", done, len(want))
	}
	if failed == nil || failed["level"] != "ERROR" || failed["timeline_id"] != broken.TimelineID.String() || failed["tenant_id"] != broken.TenantID.String() {
		t.Errorf("the broken timeline's line: %v", failed)
	}
	got := timelineGauges(t, "http://"+s.HTTPAddr().String())
	if len(got) != len(want) {
		t.Fatalf("series of %d timelines, want the %d that open: %v", len(got), len(want), got)
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			t.Errorf("no series of timeline %s", k)
		}
	}
	// The server serves: a reader of an open timeline is answered.
	c := replConnect(t, s.Addr().String(), false, fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, proto.ID{0xbb, 0x10}))
	if _, err := c.Exec(testCtx(t), "TIMELINE_STATUS").ReadAll(); err != nil {
		t.Fatalf("TIMELINE_STATUS after a failed open at start: %v", err)
	}
}

// TestOpenAtStartSkipsADeletedTimeline: a timeline deleted after the opens
// at start listed the stored ones (here: removed from storage just before
// its open reads it) is skipped quietly, counted as deleted in the closing
// line, not logged as a failure; the others open.
func TestOpenAtStartSkipsADeletedTimeline(t *testing.T) {
	dir := t.TempDir()
	want := storeTimelines(t, dir, 3)
	gone := proto.TimelineKey{TenantID: tTenant, TimelineID: proto.ID{0xbb, 0x11}}
	delete(want, gone)
	var logs syncBuffer
	var s *Server
	ready := make(chan struct{})
	s = startHookedServer(t, dir, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}, hooks{beforeOpen: func(k proto.TimelineKey) {
		<-ready // s is set
		if k == gone {
			if err := s.db.DeleteTimeline(k.TenantID, k.TimelineID); err != nil {
				t.Errorf("deleting %s: %v", k, err)
			}
		}
	}})
	close(ready)
	waitFor(t, "the line that ends the opens at start", func() bool { return strings.Contains(logs.String(), `"opened the stored timelines"`) })
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		if m["level"] == "ERROR" || m["level"] == "WARN" {
			t.Errorf("a deleted timeline logged as a failure: %v", m)
		}
		if m["msg"] == "opened the stored timelines" && (m["timelines"] != float64(len(want)) || m["deleted"] != float64(1) || m["failed"] != float64(0)) {
			t.Errorf("the closing line: %v, want %d opened, 1 deleted, 0 failed", m, len(want))
		}
	}
	if open := s.reg.Running(); len(open) != len(want) || running(s, gone) != nil {
		t.Errorf("%d timelines open (the deleted one: %v), want the %d still stored", len(open), running(s, gone) != nil, len(want))
	}
}
