package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/httpapi"
)

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%s: Content-Type %q", url, resp.Header.Get("Content-Type"))
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v\n%s", url, err, b)
		}
	}
	return resp.StatusCode
}

// TestHTTPAPI: the HTTP API on a running timeline with a proposer, a reader
// and a slot: health, status, the timeline list and detail (LSNs as X/X,
// the proposer and the reader with their positions), JSON errors with
// their status (400 bad id, 404 unknown timeline or path), and /metrics,
// parsed as Prometheus text, whose LSN gauges equal TIMELINE_STATUS.
func TestHTTPAPI(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	base := "http://" + s.HTTPAddr().String()
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(50, 3000, 0)
	committed := p.pos
	p.push(5, 100, committed) // flush_lsn above commit_lsn: the two gauges differ
	c := replConnect(t, addr, false, "")
	if _, err := exec(t, c, `CREATE_REPLICATION_SLOT "s1" PHYSICAL (RESERVE_WAL)`); err != nil {
		t.Fatal(err)
	}
	st := newStream(t, addr)
	st.start("START_REPLICATION SLOT s1 " + tStart.String())
	st.readWAL(tStart, committed)
	st.waitReply(committed, committed)

	var ok map[string]string
	if code := getJSON(t, base+"/healthz", &ok); code != 200 || ok["status"] != "ok" {
		t.Fatalf("/healthz %d %v", code, ok)
	}
	if code := getJSON(t, base+"/readyz", &ok); code != 200 {
		t.Fatalf("/readyz %d %v", code, ok)
	}
	var status httpapi.Status
	if code := getJSON(t, base+"/v1/status", &status); code != 200 || status.ID != 1 || status.Timelines != 1 || status.ListenPG != addr ||
		status.DiskUsageBytes <= 0 || status.DiskFreeBytes == 0 {
		t.Fatalf("/v1/status %d %+v", code, status)
	}
	var list []map[string]any
	if code := getJSON(t, base+"/v1/tenant/timeline", &list); code != 200 || len(list) != 1 || list[0]["flush_lsn"] != p.pos.String() {
		t.Fatalf("/v1/tenant/timeline %d %v", code, list)
	}
	var tl httpapi.Timeline
	url := fmt.Sprintf("%s/v1/tenant/%s/timeline/%s", base, tTenant, tTimeline)
	if code := getJSON(t, url, &tl); code != 200 {
		t.Fatalf("%s: %d", url, code)
	}
	stRow := oneRow(t, must(exec(t, c, "TIMELINE_STATUS")), nil, "tenant_id", "timeline_id", "term", "voted_for", "last_log_term",
		"flush_lsn", "commit_lsn", "truncate_lsn", "timeline_start_lsn", "removed_up_to", "pg_timeline", "system_id", "wal_seg_size", "readers", "slots", "pg_version",
		"proposer_addr", "last_push_term", "last_push_age_ms", "retention_horizon", "retention_reason", "backup_lsn")
	if stRow[5] == stRow[6] {
		t.Fatalf("flush_lsn and commit_lsn are equal (%s): the test cannot tell them apart", stRow[5])
	}
	if tl.FlushLSN.String() != stRow[5] || tl.CommitLSN.String() != stRow[6] || tl.Term != 1 || len(tl.TermHistory) != 1 ||
		tl.TimelineStartLSN != tStart || fmt.Sprint(tl.SystemID) != stRow[11] {
		t.Fatalf("timeline detail %+v, TIMELINE_STATUS %q", tl, stRow)
	}
	if tl.Proposer == nil || tl.Proposer.Address != p.c.NetConn().LocalAddr().String() || tl.Proposer.Term != 1 {
		t.Fatalf("proposer %+v", tl.Proposer)
	}
	if len(tl.Readers) != 1 || tl.Readers[0].Slot != "s1" || tl.Readers[0].SentLSN != committed || tl.Readers[0].FlushLSN != committed || tl.Readers[0].LagBytes != 0 {
		t.Fatalf("readers %+v", tl.Readers)
	}
	if len(tl.Slots) != 1 || tl.Slots[0].Name != "s1" || !tl.Slots[0].Active {
		t.Fatalf("slots %+v", tl.Slots)
	}
	var e map[string]string
	if code := getJSON(t, fmt.Sprintf("%s/v1/tenant/xyz/timeline/%s", base, tTimeline), &e); code != 400 || e["code"] != "bad_id" || e["error"] == "" {
		t.Fatalf("bad tenant id: %d %v", code, e)
	}
	if code := getJSON(t, fmt.Sprintf("%s/v1/tenant/%s/timeline/%s", base, tTenant, proto.ID{9}), &e); code != 404 || e["code"] != "not_found" {
		t.Fatalf("unknown timeline: %d %v", code, e)
	}
	if code := getJSON(t, base+"/v2/nothing", &e); code != 404 {
		t.Fatalf("unknown path: %d %v", code, e)
	}
	if code := getJSON(t, base+"/debug/pprof/", &e); code != 404 {
		t.Fatalf("/debug/pprof/ without --enable-pprof: %d %v", code, e)
	}

	// /metrics: Prometheus text, the LSN gauges equal TIMELINE_STATUS.
	fams := scrape(t, base)
	gauge := func(name string) float64 {
		t.Helper()
		f := fams[name]
		if f == nil || len(f.Metric) != 1 {
			t.Fatalf("metric %s: %v", name, f)
		}
		m := f.Metric[0]
		if m.Gauge != nil {
			return m.Gauge.GetValue()
		}
		return m.Counter.GetValue()
	}
	if got := proto.LSN(gauge("safekeeper_flush_lsn")); got.String() != stRow[5] {
		t.Errorf("safekeeper_flush_lsn %s, TIMELINE_STATUS %s", got, stRow[5])
	}
	if got := proto.LSN(gauge("safekeeper_commit_lsn")); got.String() != stRow[6] {
		t.Errorf("safekeeper_commit_lsn %s, TIMELINE_STATUS %s", got, stRow[6])
	}
	for _, l := range fams["safekeeper_flush_lsn"].Metric[0].Label {
		if want := map[string]string{"tenant_id": tTenant.String(), "timeline_id": tTimeline.String()}[l.GetName()]; want != l.GetValue() {
			t.Errorf("label %s=%s", l.GetName(), l.GetValue())
		}
	}
	if gauge("safekeeper_term") != 1 || gauge("safekeeper_active_timelines") != 1 || gauge("safekeeper_connected_proposers") != 1 ||
		gauge("safekeeper_connected_readers") != 1 || gauge("safekeeper_appends_total") == 0 || gauge("safekeeper_disk_usage_bytes") <= 0 {
		t.Errorf("gauges: term %v timelines %v proposers %v readers %v appends %v",
			gauge("safekeeper_term"), gauge("safekeeper_active_timelines"), gauge("safekeeper_connected_proposers"),
			gauge("safekeeper_connected_readers"), gauge("safekeeper_appends_total"))
	}
	for _, name := range []string{"safekeeper_flush_wal_seconds", "safekeeper_write_wal_seconds", "safekeeper_write_wal_bytes"} {
		if h := fams[name]; h == nil || h.Metric[0].Histogram.GetSampleCount() == 0 {
			t.Errorf("%s: %v", name, h)
		}
	}
	if gauge("safekeeper_disk_free_bytes") <= 0 || gauge("safekeeper_removed_up_to_lsn") != 0 {
		t.Errorf("disk free %v, removed_up_to %v", gauge("safekeeper_disk_free_bytes"), gauge("safekeeper_removed_up_to_lsn"))
	}
	if f := fams["safekeeper_slow_fsyncs_total"]; f == nil || f.Metric[0].Counter.GetValue() != 0 {
		t.Errorf("safekeeper_slow_fsyncs_total with the default 1s threshold: %v", f)
	}
	if fams["go_goroutines"] == nil || fams["process_resident_memory_bytes"] == nil {
		t.Error("no Go runtime or process metrics")
	}
}

// TestHTTPMethodNotAllowed: a path a route takes with another method is
// 405 with an Allow header listing the route's methods (and the JSON error);
// an unknown path stays 404, without Allow.
func TestHTTPMethodNotAllowed(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	base := "http://" + s.HTTPAddr().String()
	tl := fmt.Sprintf("/v1/tenant/%s/timeline/%s", tTenant, tTimeline)
	for _, c := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodPost, "/v1/status", 405, "GET, HEAD"},
		{http.MethodDelete, "/healthz", 405, "GET, HEAD"},
		{http.MethodPut, tl, 405, "GET, HEAD, DELETE"},
		{http.MethodPost, "/v1/tenant/" + tTenant.String(), 405, "DELETE"},
		{http.MethodPost, tl + "/wal", 405, "GET, HEAD"},
		{http.MethodPost, "/v2/nothing", 404, ""},
	} {
		req, err := http.NewRequest(c.method, base+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e map[string]string
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		want := map[int]string{405: "method_not_allowed", 404: "not_found"}[c.status]
		if resp.StatusCode != c.status || resp.Header.Get("Allow") != c.allow || err != nil || e["code"] != want {
			t.Errorf("%s %s: %d, Allow %q, body %v (%v); want %d, Allow %q, code %s", c.method, c.path, resp.StatusCode,
				resp.Header.Get("Allow"), e, err, c.status, c.allow, want)
		}
	}
}

// TestHTTPErrorsWithoutPackageNames: the API's JSON errors carry no Go
// package names (storage's "no such timeline", proto's id errors), while
// the log keeps them.
func TestHTTPErrorsWithoutPackageNames(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	base := "http://" + s.HTTPAddr().String()
	for _, c := range []struct{ method, path string }{
		{http.MethodDelete, fmt.Sprintf("/v1/tenant/%s/timeline/%s", tTenant, proto.ID{9})},
		{http.MethodDelete, fmt.Sprintf("/v1/tenant/%s", proto.ID{9})},
		{http.MethodGet, fmt.Sprintf("/v1/tenant/xyz/timeline/%s", tTimeline)},
	} {
		req, _ := http.NewRequest(c.method, base+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e map[string]string
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if err != nil || e["error"] == "" {
			t.Fatalf("%s %s: %v %v", c.method, c.path, e, err)
		}
		for _, p := range []string{"storage: ", "proto: ", "server: ", "acceptor: "} {
			if strings.Contains(e["error"], p) {
				t.Errorf("%s %s: error %q names a Go package", c.method, c.path, e["error"])
			}
		}
	}
}

// TestSlowFsyncLogged: with --slow-fsync-threshold below every commit's
// time, each WAL commit is logged as a slow fsync with its durations and
// counted in safekeeper_slow_fsyncs_total.
func TestSlowFsyncLogged(t *testing.T) {
	var logs syncBuffer
	s := startTestServer(t, t.TempDir(), func(c *Config) {
		c.ListenHTTP = "127.0.0.1:0"
		c.SlowFsyncThreshold = time.Nanosecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	p.push(10, 1000, 0)
	fams := scrapeMetrics(t, s)
	n := fams["safekeeper_slow_fsyncs_total"].Metric[0].Counter.GetValue()
	if n == 0 {
		t.Fatal("safekeeper_slow_fsyncs_total is 0 with a 1ns threshold")
	}
	var slow int
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `msg="slow fsync"`) && strings.Contains(line, "duration=") && strings.Contains(line, "write_and_fsync=") {
			slow++
		}
	}
	if slow < int(n) {
		t.Fatalf("%d slow fsyncs counted, %d logged with their durations:\n%s", int(n), slow, logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// scrapeMetrics reads s's /metrics.
func scrapeMetrics(t *testing.T, s *Server) map[string]*dto.MetricFamily {
	t.Helper()
	return scrape(t, "http://"+s.HTTPAddr().String())
}

// scrape reads and parses the /metrics of the HTTP API at base.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// timelineGauge is the value of the per-timeline gauge name for tTenant,
// tTimeline.
func timelineGauge(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s", name)
	}
	for _, m := range f.Metric {
		l := map[string]string{}
		for _, p := range m.Label {
			l[p.GetName()] = p.GetValue()
		}
		if l["tenant_id"] == tTenant.String() && l["timeline_id"] == tTimeline.String() {
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("%s has no series for %s/%s: %v", name, tTenant, tTimeline, f)
	return 0
}

// TestRetainedWALGaugeMatchesTimelineDetail: WAL held by a slot whose
// client is gone shows in safekeeper_retained_wal_bytes, equal to the
// timeline detail's wal_bytes: flush_lsn minus removed_up_to once
// retention removed WAL below the slot (not the timeline's start), and the
// detail names the slot as the retention reason (what the
// SafekeeperWALRetained alert tells the operator to look at).
func TestRetainedWALGaugeMatchesTimelineDetail(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(150, 9000, 0) // ~1.3 segments; truncate_lsn 0: nothing removed yet
	c := replConnect(t, addr, false, "")
	if _, err := exec(t, c, `CREATE_REPLICATION_SLOT "gone" PHYSICAL (RESERVE_WAL)`); err != nil {
		t.Fatal(err)
	}
	c.Close(context.Background()) // its client is gone: the slot holds WAL from tStart+tSeg on
	p.truncate = true             // every peer has it all: only the slot holds WAL
	p.push(300, 9000, 0)
	waitFor(t, "removal up to the slot's segment", func() bool {
		p.heartbeat()
		return statusOf(t, s).RemovedUpTo == tStart+tSeg
	})

	var tl httpapi.Timeline
	url := fmt.Sprintf("http://%s/v1/tenant/%s/timeline/%s", s.HTTPAddr(), tTenant, tTimeline)
	if code := getJSON(t, url, &tl); code != 200 {
		t.Fatalf("%s: %d", url, code)
	}
	if tl.RemovedUpTo != tStart+tSeg || tl.WALStartLSN != tl.RemovedUpTo || tl.WALBytes != uint64(tl.FlushLSN-tl.RemovedUpTo) ||
		tl.RetentionReason != `replication slot "gone"` {
		t.Fatalf("timeline detail: removed_up_to %s wal_start_lsn %s wal_bytes %d flush_lsn %s retention_reason %q; want the slot to hold WAL from %s",
			tl.RemovedUpTo, tl.WALStartLSN, tl.WALBytes, tl.FlushLSN, tl.RetentionReason, tStart+tSeg)
	}
	fams := scrapeMetrics(t, s)
	if got := timelineGauge(t, fams, "safekeeper_retained_wal_bytes"); uint64(got) != tl.WALBytes || got == 0 {
		t.Fatalf("safekeeper_retained_wal_bytes %v, the timeline detail's wal_bytes %d", got, tl.WALBytes)
	}
	if got := lsn(timelineGauge(t, fams, "safekeeper_flush_lsn")); got != tl.FlushLSN {
		t.Fatalf("flush_lsn moved between the detail (%s) and the scrape (%s): the comparison is void", tl.FlushLSN, got)
	}
}

// TestHTTPIdleConnectionClosed: a keep-alive connection left idle after
// an answer is closed by the server after Config.HTTPIdleTimeout.
func TestHTTPIdleConnectionClosed(t *testing.T) {
	const idle = 200 * time.Millisecond
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.ListenHTTP, c.HTTPIdleTimeout = "127.0.0.1:0", idle })
	nc, err := net.Dial("tcp", s.HTTPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := io.WriteString(nc, "GET /healthz HTTP/1.1\r\nHost: sk\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("answer %d, close %v: want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	answered := time.Now()
	nc.SetReadDeadline(time.Now().Add(tTimeout))
	if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("idle connection: read %d bytes, %v; want EOF", n, err)
	}
	if waited := time.Since(answered); waited < idle*3/4 || waited > tTimeout/2 {
		t.Fatalf("idle connection closed after %v, want about %v", waited, idle)
	}
}
