package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// startProposer starts `safekeeper propose --create` for timeline tl of
// tenant(1) on pg and sks, with slot and application_name proposer and
// extra flags.
func startProposer(t *testing.T, pg *pgtest.Cluster, sks []*harness.Safekeeper, tl proto.ID, extra ...string) *harness.Process {
	t.Helper()
	return harness.StartProposer(t, harness.ProposerOptions{Upstream: pg.ConnString(), Safekeepers: harness.Addrs(sks),
		Tenant: tenant(1).String(), Timeline: tl.String(), Create: true, Slot: "proposer", ApplicationName: "proposer", Args: extra})
}

// httpListenLine is the line a process logs once its HTTP API listens,
// with the address it got (a test passes port 0).
var httpListenLine = regexp.MustCompile(`msg="HTTP API listening" .*?\baddr=(\S+)`)

// listeningHTTP waits for p's "HTTP API listening" line and returns the
// address in it.
func listeningHTTP(t *testing.T, p *harness.Process) string {
	t.Helper()
	var addr string
	harness.WaitFor(t, 15*time.Second, "the HTTP API to listen", func() bool {
		p.CheckRunning()
		m := httpListenLine.FindStringSubmatch(p.Log())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	return addr
}

// sample is the value of family name's series whose labels include
// labels, and whether there is one.
func sample(mf map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
next:
	for _, m := range mf[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		if c := m.GetCounter(); c != nil {
			return c.GetValue(), true
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

// readyz is the proposer's /readyz: the status and the JSON code.
func readyz(t *testing.T, addr string) (int, string) {
	code, e := readyzBody(t, addr)
	return code, e.Code
}

// readyzBody is the proposer's /readyz: the status and the JSON answer.
func readyzBody(t *testing.T, addr string) (int, struct{ Error, Code string }) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct{ Error, Code string }
	json.Unmarshal(b, &e)
	return resp.StatusCode, e
}

// skTimelineTerm is a safekeeper's term, flush_lsn and commit_lsn of
// tenant(1)'s timeline tl, from its HTTP API.
func skTimelineTerm(t *testing.T, sk *harness.Safekeeper, tl proto.ID) (term uint64, flush, commit proto.LSN) {
	t.Helper()
	resp, err := http.Get("http://" + sk.HTTPAddr + "/v1/tenant/" + tenant(1).String() + "/timeline/" + tl.String())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Term      uint64    `json:"term"`
		FlushLSN  proto.LSN `json:"flush_lsn"`
		CommitLSN proto.LSN `json:"commit_lsn"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&v) != nil {
		return 0, 0, 0
	}
	return v.Term, v.FlushLSN, v.CommitLSN
}

// TestProposerMetricsAndReadiness: `propose --listen-http` with a real
// PostgreSQL 15 primary and three safekeepers. Idle, its scrape shows
// the positions the others report: commit_lsn and the term each safekeeper
// has, each link's flush_lsn the flush_lsn of that safekeeper, the flush
// and write it reported as the primary's pg_stat_replication shows them,
// the primary's end of WAL as pg_current_wal_flush_lsn(), no lag; every link
// streaming with its safekeeper_id; /readyz 200. One safekeeper killed:
// its link down, /readyz still 200 (2 of 3), commits go on. A second one
// killed: /readyz 503 no_quorum; a commit then waits, and the lag behind
// the primary grows, in bytes and in time, until the safekeeper is back.
func TestProposerMetricsAndReadiness(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Options{WALSegSizeMB: 1})
	sks := harness.StartSafekeepers(t, 3)
	tl := proto.ID{0xbb, 0x0e}
	prop := startProposer(t, pg, sks, tl, "--listen-http", "127.0.0.1:0")
	addr := listeningHTTP(t, prop)
	tlLabels := map[string]string{"tenant_id": tenant(1).String(), "timeline_id": tl.String()}
	with := func(kv ...string) map[string]string {
		m := map[string]string{"tenant_id": tenant(1).String(), "timeline_id": tl.String()}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	gauge := func(mf map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
		t.Helper()
		v, ok := sample(mf, name, labels)
		if !ok {
			t.Fatalf("no %s%v in the proposer's scrape", name, labels)
		}
		return v
	}
	lsn := func(sql string) proto.LSN {
		t.Helper()
		l, err := proto.ParseLSN(pg.Exec(t, sql))
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return l
	}

	harness.WaitFor(t, 60*time.Second, "the proposer to be the synchronous standby", func() bool {
		if exited, code := prop.Exited(); exited {
			t.Fatalf("proposer exited %d", code)
		}
		out, err := pg.Query(t.Context(), "select state from pg_stat_replication where application_name = 'proposer'")
		return err == nil && out == "streaming"
	})
	pg.Exec(t, "alter system set synchronous_standby_names = 'proposer'; select pg_reload_conf();")
	pg.Exec(t, "set statement_timeout = '30s'; create table pm(x int); insert into pm select generate_series(1, 10000)")

	// Idle: the scrape agrees with the safekeepers and the primary.
	var last string
	harness.WaitFor(t, 30*time.Second, "the scrape to agree with the safekeepers and pg_stat_replication", func() bool {
		row, err := pg.Query(t.Context(), "select write_lsn || ' ' || flush_lsn || ' ' || pg_current_wal_flush_lsn() from pg_stat_replication where application_name = 'proposer'")
		if err != nil {
			return false
		}
		mf := scrape(t, addr)
		got := fmt.Sprintf("%s %s %s", proto.LSN(gauge(mf, "safekeeper_proposer_write_lsn", tlLabels)),
			proto.LSN(gauge(mf, "safekeeper_proposer_flush_lsn", tlLabels)), proto.LSN(gauge(mf, "safekeeper_proposer_primary_flush_lsn", tlLabels)))
		last = fmt.Sprintf("pg_stat_replication write, flush and the primary's end %q, scraped %q", row, got)
		if row != got {
			return false
		}
		primary := last
		term, commit := gauge(mf, "safekeeper_proposer_term", tlLabels), proto.LSN(gauge(mf, "safekeeper_proposer_commit_lsn", tlLabels))
		for _, sk := range sks {
			skTerm, skFlush, skCommit := skTimelineTerm(t, sk, tl)
			id := strconv.FormatUint(sk.ID, 10)
			linkFlush := proto.LSN(gauge(mf, "safekeeper_proposer_link_flush_lsn", with("safekeeper", sk.Addr, "safekeeper_id", id)))
			streaming := gauge(mf, "safekeeper_proposer_link_state", with("safekeeper", sk.Addr, "safekeeper_id", id, "state", "streaming"))
			last = fmt.Sprintf("%s; safekeeper %d: term %d, flush_lsn %s, commit_lsn %s; scraped term %v, link flush_lsn %s, commit_lsn %s, streaming %v",
				primary, sk.ID, skTerm, skFlush, skCommit, term, linkFlush, commit, streaming)
			if float64(skTerm) != term || skFlush != linkFlush || skCommit != commit || streaming != 1 {
				return false
			}
		}
		return gauge(mf, "safekeeper_proposer_lag_bytes", tlLabels) == 0 && gauge(mf, "safekeeper_proposer_lag_seconds", tlLabels) == 0 &&
			gauge(mf, "safekeeper_proposer_state", with("state", "streaming")) == 1
	})
	t.Logf("agreed: %s", last)
	if code, _ := readyz(t, addr); code != http.StatusOK {
		t.Fatalf("/readyz while streaming to all three: %d", code)
	}

	// One safekeeper down: its link is down, the quorum streams on.
	sks[2].Kill()
	harness.WaitFor(t, 15*time.Second, "the killed safekeeper's link to show down", func() bool {
		mf := scrape(t, addr)
		down, _ := sample(mf, "safekeeper_proposer_link_state", with("safekeeper", sks[2].Addr, "state", "down"))
		return down == 1
	})
	if code, reason := readyz(t, addr); code != http.StatusOK {
		t.Fatalf("/readyz with 2 of 3 safekeepers: %d %s, want 200", code, reason)
	}
	before := lsn("select pg_current_wal_flush_lsn()")
	pg.Exec(t, "set statement_timeout = '30s'; insert into pm values (1)")
	if f := proto.LSN(gauge(scrape(t, addr), "safekeeper_proposer_flush_lsn", tlLabels)); f <= before {
		t.Fatalf("a commit with 2 of 3 safekeepers returned, but the reported flush is %s, not above %s", f, before)
	}

	// A second one down: no quorum. A commit waits; the lag grows.
	sks[1].Kill()
	harness.WaitFor(t, 15*time.Second, "/readyz to say no_quorum", func() bool {
		code, reason := readyz(t, addr)
		return code == http.StatusServiceUnavailable && reason == "no_quorum"
	})
	if v := gauge(scrape(t, addr), "safekeeper_proposer_state", with("state", "no_quorum")); v != 1 {
		t.Fatalf("safekeeper_proposer_state{state=no_quorum} = %v while /readyz says no_quorum", v)
	}
	if _, e := readyzBody(t, addr); !strings.Contains(e.Error, "1 of 3 safekeepers streaming, a quorum is 2") ||
		!strings.Contains(e.Error, sks[1].Addr) || !strings.Contains(e.Error, sks[2].Addr) {
		t.Fatalf("/readyz without a quorum: %q; want the count and both safekeepers named", e.Error)
	} else {
		t.Logf("/readyz: 503 %+v", e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	committed := make(chan error, 1)
	go func() {
		_, err := pg.Query(ctx, "insert into pm select generate_series(1, 1000)")
		committed <- err
	}()
	defer func() {
		cancel()
		<-committed
	}()
	var lag1, lag1Bytes float64
	harness.WaitFor(t, 15*time.Second, "the waiting commit's WAL to lag", func() bool {
		mf := scrape(t, addr)
		lag1, lag1Bytes = gauge(mf, "safekeeper_proposer_lag_seconds", tlLabels), gauge(mf, "safekeeper_proposer_lag_bytes", tlLabels)
		return lag1 > 0 && lag1Bytes > 0
	})
	harness.WaitFor(t, 15*time.Second, "the lag to grow while the quorum is lost", func() bool {
		mf := scrape(t, addr)
		lag, bytes := gauge(mf, "safekeeper_proposer_lag_seconds", tlLabels), gauge(mf, "safekeeper_proposer_lag_bytes", tlLabels)
		return lag >= lag1+1 && bytes >= lag1Bytes
	})
	select {
	case err := <-committed:
		t.Fatalf("a commit returned without a quorum of safekeepers: %v", err)
	default:
	}

	// One back: the commit returns, the lag is gone, /readyz is 200.
	sks[1].Start()
	select {
	case err := <-committed:
		committed <- err // for the deferred wait
		if err != nil {
			t.Fatalf("the waiting commit, once a quorum is back: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting commit did not return within 30 s of the quorum's return")
	}
	harness.WaitFor(t, 15*time.Second, "the lag to be gone and /readyz 200", func() bool {
		mf := scrape(t, addr)
		code, _ := readyz(t, addr)
		return code == http.StatusOK && gauge(mf, "safekeeper_proposer_lag_bytes", tlLabels) == 0 && gauge(mf, "safekeeper_proposer_lag_seconds", tlLabels) == 0
	})
	mf := scrape(t, addr)
	if n := gauge(mf, "safekeeper_proposer_link_reconnects_total", with("safekeeper", sks[1].Addr)); n < 1 {
		t.Errorf("safekeeper 2 was killed and came back, but its link counts %v reconnects", n)
	}
	if n := gauge(mf, "safekeeper_proposer_link_responses_total", with("safekeeper", sks[0].Addr)); n < 1 {
		t.Errorf("safekeeper 1 streamed throughout, but its link counts %v responses", n)
	}
}
