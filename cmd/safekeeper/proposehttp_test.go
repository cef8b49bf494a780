package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
)

// series finds the sample of family name whose labels include want.
func series(t *testing.T, mf map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	t.Helper()
	f := mf[name]
	if f == nil {
		t.Fatalf("no %s in the scrape", name)
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue(), true
		default:
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestProposerHTTPServesTheSnapshot: /metrics turns a proposer.Status
// into the documented series — the state one-hot, the term and LSNs as
// numbers, the lag in bytes and seconds, per link its state (one-hot),
// flush_lsn and counters, labelled by the timeline, the configured address
// and the safekeeper_id once known — and /readyz answers 200 while the
// proposer streams, 503 with the state as code and its reason otherwise.
func TestProposerHTTPServesTheSnapshot(t *testing.T) {
	tenant, timeline := proto.ID{0xaa}, proto.ID{0xbb}
	st := proposer.Status{
		State: proposer.StateStreaming, Term: 7, Quorum: 2,
		CommitLSN: 0x1000100, TruncateLSN: 0x1000000, FlushLSN: 0x1000100, WriteLSN: 0x1000200, PrimaryFlushLSN: 0x1000300,
		LagBytes: 0x200, Lag: 1500 * time.Millisecond,
		Safekeepers: []proposer.LinkStatus{
			{Addr: "sk1:5454", ID: 1, State: proposer.LinkStreaming, FlushLSN: 0x1000100, Responses: 40, Reconnects: 2,
				Refusals: map[string]uint64{"53100": 3, proposer.RefusedVote: 1}},
			{Addr: "sk2:5454", ID: 2, State: proposer.LinkStreaming, FlushLSN: 0x1000200, Responses: 41},
			{Addr: "sk3:5454", State: proposer.LinkDown, LastError: "dial: connect: connection refused"},
		},
	}
	srv := httptest.NewServer(proposerHandler(func() proposer.Status { return st }, tenant, timeline))
	defer srv.Close()
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	code, body := get("/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	tl := map[string]string{"tenant_id": tenant.String(), "timeline_id": timeline.String()}
	with := func(kv ...string) map[string]string {
		m := map[string]string{"tenant_id": tenant.String(), "timeline_id": timeline.String()}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for name, want := range map[string]float64{
		"safekeeper_proposer_term": 7, "safekeeper_proposer_quorum": 2,
		"safekeeper_proposer_commit_lsn": 0x1000100, "safekeeper_proposer_truncate_lsn": 0x1000000,
		"safekeeper_proposer_flush_lsn": 0x1000100, "safekeeper_proposer_write_lsn": 0x1000200,
		"safekeeper_proposer_primary_flush_lsn": 0x1000300, "safekeeper_proposer_lag_bytes": 0x200,
		"safekeeper_proposer_lag_seconds": 1.5,
	} {
		if got, ok := series(t, mf, name, tl); !ok || got != want {
			t.Errorf("%s = %v (found %v), want %v", name, got, ok, want)
		}
	}
	for _, s := range proposer.States {
		want := 0.0
		if s == proposer.StateStreaming {
			want = 1
		}
		if got, ok := series(t, mf, "safekeeper_proposer_state", with("state", string(s))); !ok || got != want {
			t.Errorf("safekeeper_proposer_state{state=%q} = %v (found %v), want %v", s, got, ok, want)
		}
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"safekeeper_proposer_link_state", with("safekeeper", "sk1:5454", "safekeeper_id", "1", "state", "streaming"), 1},
		{"safekeeper_proposer_link_state", with("safekeeper", "sk1:5454", "safekeeper_id", "1", "state", "down"), 0},
		{"safekeeper_proposer_link_state", with("safekeeper", "sk3:5454", "safekeeper_id", "", "state", "down"), 1},
		{"safekeeper_proposer_link_state", with("safekeeper", "sk3:5454", "state", "streaming"), 0},
		{"safekeeper_proposer_link_flush_lsn", with("safekeeper", "sk2:5454", "safekeeper_id", "2"), 0x1000200},
		{"safekeeper_proposer_link_responses_total", with("safekeeper", "sk2:5454"), 41},
		{"safekeeper_proposer_link_reconnects_total", with("safekeeper", "sk1:5454"), 2},
		{"safekeeper_proposer_link_refusals_total", with("safekeeper", "sk1:5454", "reason", "53100"), 3},
		{"safekeeper_proposer_link_refusals_total", with("safekeeper", "sk1:5454", "reason", "vote_refused"), 1},
		{"safekeeper_proposer_link_refusals_total", with("safekeeper", "sk1:5454", "reason", "28P01"), 0}, // shown before it happens
		{"safekeeper_proposer_link_refusals_total", with("safekeeper", "sk3:5454", "reason", "53100"), 0},
	} {
		if got, ok := series(t, mf, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if n := len(mf["safekeeper_proposer_link_state"].Metric); n != 3*len(proposer.LinkStates) {
		t.Errorf("%d link_state series, want one per link and state (%d)", n, 3*len(proposer.LinkStates))
	}
	if mf["go_goroutines"] == nil || mf["process_start_time_seconds"] == nil {
		t.Error("no Go runtime or process metrics")
	}

	if code, body := get("/readyz"); code != http.StatusOK || !strings.Contains(string(body), `"ready"`) {
		t.Errorf("/readyz while streaming: %d %s", code, body)
	}
	if code, body := get("/healthz"); code != http.StatusOK || !strings.Contains(string(body), `"ok"`) {
		t.Errorf("/healthz: %d %s", code, body)
	}
	for _, s := range []proposer.State{proposer.StateNoQuorum, proposer.StateNoPrimary, proposer.StateWaitingLease} {
		st.State, st.Reason = s, "because of "+string(s)
		code, body := get("/readyz")
		var e struct{ Error, Code string }
		if err := json.Unmarshal(body, &e); err != nil || code != http.StatusServiceUnavailable || e.Code != string(s) || e.Error != st.Reason {
			t.Errorf("/readyz in %s: %d %s; want 503 with code %s and the reason", s, code, body, s)
		}
	}
	if code, body := get("/v1/status"); code != http.StatusNotFound || !strings.Contains(string(body), `"not_found"`) {
		t.Errorf("an unknown path: %d %s", code, body)
	}
	resp, err := http.Post(srv.URL+"/readyz", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") == "" {
		t.Errorf("POST /readyz: %d, Allow %q; want 405 with Allow", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

// TestProposeListenHTTPChecked: a --listen-http that is not host:port is
// a usage error (exit 2); a port that is taken fails (exit 1) naming the
// HTTP API, before the primary or a safekeeper is contacted.
func TestProposeListenHTTPChecked(t *testing.T) {
	base := []string{"safekeeper", "propose", "--upstream", "host=127.0.0.1 port=1", "--safekeepers", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
		"--tenant-id", strings.Repeat("a", 32), "--timeline-id", strings.Repeat("b", 32)}
	var out, errb bytes.Buffer
	if code := run(append(base, "--listen-http", "localhost:notaport"), &out, &errb); code != exitUsage || !strings.Contains(errb.String(), "--listen-http") {
		t.Errorf("--listen-http localhost:notaport: exit %d, stderr %q; want %d naming the flag", code, errb.String(), exitUsage)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	errb.Reset()
	if code := run(append(base, "--listen-http", taken.Addr().String()), &out, &errb); code != 1 || !strings.Contains(errb.String(), "listen for the HTTP API") {
		t.Errorf("--listen-http on a port in use: exit %d, stderr %q; want 1 naming the HTTP API", code, errb.String())
	}
}
