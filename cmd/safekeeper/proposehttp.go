package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
)

// The proposer's HTTP endpoint (propose --listen-http): Prometheus
// /metrics, /healthz and /readyz, each answered from a proposer.Stats
// snapshot taken for the request; docs/proposer.md, "Monitoring". Errors
// and 503s are {"error", "code"} as the safekeeper's HTTP API answers them
// (docs/http.md). The metrics are named as the safekeeper's (safekeeper_
// and the field's words) with safekeeper_proposer_ in front: one binary,
// one prefix to find them all by, and Neon's walproposer, which runs
// inside PostgreSQL, exports no metrics of its own to borrow names from.

// proposerHandler serves snap's snapshots for the timeline tenant/timeline.
func proposerHandler(snap func() proposer.Status, tenant, timeline proto.ID) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&proposerCollector{snap: snap, tl: []string{tenant.String(), timeline.String()}})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSONAnswer(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		st := snap()
		if st.State == proposer.StateStreaming {
			writeJSONAnswer(w, http.StatusOK, map[string]string{"status": "ready"})
			return
		}
		writeJSONAnswer(w, http.StatusServiceUnavailable, map[string]string{"error": st.Reason, "code": string(st.State)})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics", "/healthz", "/readyz":
			w.Header().Set("Allow", "GET, HEAD")
			writeJSONAnswer(w, http.StatusMethodNotAllowed, map[string]string{
				"error": r.Method + " " + r.URL.Path + ": method not allowed; allowed: GET, HEAD", "code": "method_not_allowed"})
		default:
			writeJSONAnswer(w, http.StatusNotFound, map[string]string{
				"error": "no such endpoint: " + r.Method + " " + r.URL.Path + " (the proposer serves /metrics, /healthz, /readyz)", "code": "not_found"})
		}
	})
	return mux
}

// serveProposerHTTP listens on addr and serves stats there (with the
// safekeeper HTTP API's timeouts) until stop, which closes the listener and
// waits up to 5 s for the requests under way. A port that cannot be
// listened on is an error (exit 1): the flag asked for it.
func serveProposerHTTP(log *slog.Logger, addr string, stats func() *proposer.Stats, tenant, timeline proto.ID) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for the HTTP API: %w", err)
	}
	srv := &http.Server{
		Handler:           proposerHandler(func() proposer.Status { return stats().Snapshot(time.Now()) }, tenant, timeline),
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	log.Info("HTTP API listening", "addr", ln.Addr().String())
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("HTTP API stopped", "err", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-served
	}, nil
}

func writeJSONAnswer(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// proposerCollector turns a snapshot into metrics at scrape time: every
// series carries the timeline's tenant_id and timeline_id (to join with
// the safekeepers' own), the link series the safekeeper's address as
// configured (safekeeper) and its safekeeper_id ("" until it greeted).
type proposerCollector struct {
	snap func() proposer.Status
	tl   []string // tenant_id, timeline_id
}

var (
	tlLabels   = []string{"tenant_id", "timeline_id"}
	linkLabels = []string{"tenant_id", "timeline_id", "safekeeper", "safekeeper_id"}

	descPropState = prometheus.NewDesc("safekeeper_proposer_state",
		"1 for the proposer's state, 0 for the others: streaming (elected, streaming to a quorum: /readyz 200), no_quorum, no_primary, waiting_lease (/readyz 503 with it as code).",
		append(tlLabels, "state"), nil)
	descPropTerm   = prometheus.NewDesc("safekeeper_proposer_term", "The term of the proposer's current (or last) campaign.", tlLabels, nil)
	descPropQuorum = prometheus.NewDesc("safekeeper_proposer_quorum", "Safekeepers a quorum needs: half of those configured, plus one.", tlLabels, nil)
	descPropCommit = prometheus.NewDesc("safekeeper_proposer_commit_lsn",
		"commit_lsn of the term: WAL below it is durable on a quorum; the safekeepers' commit_lsn follows it.", tlLabels, nil)
	descPropTruncate = prometheus.NewDesc("safekeeper_proposer_truncate_lsn",
		"truncate_lsn of the term: WAL every safekeeper has; the primary's slot is held there.", tlLabels, nil)
	descPropFlush = prometheus.NewDesc("safekeeper_proposer_flush_lsn",
		"The flush position last reported to the primary (its pg_stat_replication.flush_lsn for the proposer): WAL durable on a quorum, what synchronous commits wait for.", tlLabels, nil)
	descPropWrite = prometheus.NewDesc("safekeeper_proposer_write_lsn",
		"The write position last reported to the primary (its pg_stat_replication.write_lsn): the end of the WAL received from it.", tlLabels, nil)
	descPropPrimary = prometheus.NewDesc("safekeeper_proposer_primary_flush_lsn",
		"The primary's end of WAL, as it last told the proposer (IDENTIFY_SYSTEM, then the WAL end of each XLogData and keepalive); at least the end of the WAL received.", tlLabels, nil)
	descPropLagBytes = prometheus.NewDesc("safekeeper_proposer_lag_bytes",
		"safekeeper_proposer_primary_flush_lsn minus safekeeper_proposer_flush_lsn: WAL the primary has that no quorum is known to hold (0 until the first flush report).", tlLabels, nil)
	descPropLagSeconds = prometheus.NewDesc("safekeeper_proposer_lag_seconds",
		"How long the oldest WAL received from the primary and not yet reported flushed (on a quorum) has waited; 0 when none waits.", tlLabels, nil)

	descLinkState = prometheus.NewDesc("safekeeper_proposer_link_state",
		"1 for the state of the link to a safekeeper, 0 for the others: down, connecting, greeted, voting, streaming, parked (sits out the term), refused (refuses this primary for good).",
		append(linkLabels, "state"), nil)
	descLinkFlush = prometheus.NewDesc("safekeeper_proposer_link_flush_lsn",
		"The safekeeper's last known flush_lsn (its greeting, vote and SafeKeeperResponses).", linkLabels, nil)
	descLinkResponses = prometheus.NewDesc("safekeeper_proposer_link_responses_total",
		"SafeKeeperResponses (acknowledgments) received from the safekeeper.", linkLabels, nil)
	descLinkReconnects = prometheus.NewDesc("safekeeper_proposer_link_reconnects_total",
		"Connection attempts to the safekeeper after the first (its retries, and each new session's connection).", linkLabels, nil)
	descLinkRefusals = prometheus.NewDesc("safekeeper_proposer_link_refusals_total",
		"Connections the safekeeper ended with an ErrorResponse, by its SQLSTATE (53100 disk, 53300 too many clients, 28P01 token, 22023 another cluster's timeline, ...), and votes it refused (reason vote_refused).",
		append(linkLabels, "reason"), nil)
)

// refusalReasons are the refusals a safekeeper gives whose counters are
// shown from 0 before the first one: a series that first appears at 1 has
// no increase() in Prometheus, and an alert on it would miss a first
// refusal. Others (any SQLSTATE) appear when they happen.
var refusalReasons = []string{
	"53100", // disk full or over a limit: WAL refused
	"53300", // too many connections
	"53400", // a configured limit (timelines, slots)
	"28000", // refused: TLS required, or no token
	"28P01", // the token failed authentication
	"22023", // the timeline belongs to another cluster, major or segment size
	"57P01", // the safekeeper is shutting down
	proposer.RefusedVote,
}

func (c *proposerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPropState, descPropTerm, descPropQuorum, descPropCommit, descPropTruncate, descPropFlush,
		descPropWrite, descPropPrimary, descPropLagBytes, descPropLagSeconds,
		descLinkState, descLinkFlush, descLinkResponses, descLinkReconnects, descLinkRefusals} {
		ch <- d
	}
}

func (c *proposerCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.snap()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	one := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, s := range proposer.States {
		gauge(descPropState, one(st.State == s), append(c.tl, string(s))...)
	}
	gauge(descPropTerm, float64(st.Term), c.tl...)
	gauge(descPropQuorum, float64(st.Quorum), c.tl...)
	gauge(descPropCommit, float64(st.CommitLSN), c.tl...)
	gauge(descPropTruncate, float64(st.TruncateLSN), c.tl...)
	gauge(descPropFlush, float64(st.FlushLSN), c.tl...)
	gauge(descPropWrite, float64(st.WriteLSN), c.tl...)
	gauge(descPropPrimary, float64(st.PrimaryFlushLSN), c.tl...)
	gauge(descPropLagBytes, float64(st.LagBytes), c.tl...)
	gauge(descPropLagSeconds, st.Lag.Seconds(), c.tl...)
	for _, l := range st.Safekeepers {
		id := ""
		if l.ID != 0 {
			id = strconv.FormatUint(l.ID, 10)
		}
		ll := append(append([]string(nil), c.tl...), l.Addr, id)
		for _, s := range proposer.LinkStates {
			gauge(descLinkState, one(l.State == s), append(ll, string(s))...)
		}
		gauge(descLinkFlush, float64(l.FlushLSN), ll...)
		counter(descLinkResponses, l.Responses, ll...)
		counter(descLinkReconnects, l.Reconnects, ll...)
		for _, reason := range refusalReasons {
			if _, ok := l.Refusals[reason]; !ok {
				counter(descLinkRefusals, 0, append(ll, reason)...)
			}
		}
		for reason, n := range l.Refusals {
			counter(descLinkRefusals, n, append(ll, reason)...)
		}
	}
}
