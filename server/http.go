package server

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/storage"
)

// The HTTP API (Config.ListenHTTP): Neon's safekeeper paths where one
// exists, JSON bodies with LSNs as "X/X", errors as {"error", "code"} with
// the status that fits. /metrics is Prometheus text via client_golang.

// Version is the build's version (cmd sets it from git describe).
var Version = "dev"

type httpAPI struct {
	s       *Server
	started time.Time
	srv     *http.Server
	ln      net.Listener
	reg     *prometheus.Registry
	// walStreams holds a token per GET .../wal answer under way
	// (httpwal.go): at most maxWALStreams at once.
	walStreams chan struct{}
}

// apiError is an error answer: the status and a machine-readable code.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
	case errors.Is(err, errShutdown):
		ae = &apiError{http.StatusServiceUnavailable, "shutting_down", "the safekeeper is shutting down"}
	default:
		ae = &apiError{status: http.StatusInternalServerError, code: "internal", msg: err.Error()}
	}
	writeJSON(w, ae.status, httpapi.ErrorBody{Code: ae.code, Error: pgwire.ClientText(ae.msg)})
}

func newHTTPAPI(s *Server, ln net.Listener) *httpAPI {
	a := &httpAPI{s: s, started: time.Now(), ln: ln, reg: prometheus.NewRegistry(), walStreams: make(chan struct{}, maxWALStreams)}
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&timelineCollector{s: s}, s.metrics.writeSeconds, s.metrics.flushSeconds, s.metrics.slowFsyncs, s.metrics.writeBytes, s.metrics.appends, s.metrics.received, s.metrics.refused)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.HandleFunc("GET /v1/status", a.status)
	// Access (authn.go): open, the path's tenant, or safekeeperdata. A
	// DELETE destroys acknowledged WAL: safekeeperdata only, not a
	// compute's tenant token.
	mux.HandleFunc("GET /v1/tenant/timeline", a.guard(accessAdmin, a.timelines))
	mux.HandleFunc("GET /v1/tenant/{tenant_id}/timeline/{timeline_id}", a.guard(accessTenant, a.timeline))
	mux.HandleFunc("DELETE /v1/tenant/{tenant_id}/timeline/{timeline_id}", a.guard(accessAdmin, a.deleteTimeline))
	mux.HandleFunc("DELETE /v1/tenant/{tenant_id}", a.guard(accessAdmin, a.deleteTenant))
	mux.HandleFunc("GET /v1/tenant/{tenant_id}/timeline/{timeline_id}/wal", a.guard(accessTenant, a.wal)) // httpwal.go
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	if s.cfg.EnablePprof {
		mux.HandleFunc("/debug/pprof/", a.guard(accessAdmin, pprof.Index))
		mux.HandleFunc("/debug/pprof/profile", a.guard(accessAdmin, pprof.Profile))
		mux.HandleFunc("/debug/pprof/trace", a.guard(accessAdmin, pprof.Trace))
	}
	// Everything no route above takes. A path a route takes with another
	// method is 405 with Allow, as RFC 9110 wants (this catch-all matches
	// every method, so the mux itself never answers 405).
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if allow := allowedMethods(mux, r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, &apiError{http.StatusMethodNotAllowed, "method_not_allowed",
				r.Method + " " + r.URL.Path + ": method not allowed; allowed: " + strings.Join(allow, ", ")})
			return
		}
		writeError(w, &apiError{http.StatusNotFound, "not_found", "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
	a.srv = &http.Server{Handler: mux, ReadHeaderTimeout: min(10*time.Second, s.cfg.HTTPReadTimeout),
		ReadTimeout: s.cfg.HTTPReadTimeout, IdleTimeout: s.cfg.HTTPIdleTimeout}
	return a
}

// allowedMethods are the methods with which a route of mux other than the
// catch-all "/" takes r's path, in a fixed order (the routes themselves are
// the one list: a new route is allowed here without more code).
func allowedMethods(mux *http.ServeMux, r *http.Request) []string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	return allow
}

func (a *httpAPI) readyz(w http.ResponseWriter, r *http.Request) {
	refusal := a.s.walRefusal()
	switch {
	case a.s.isStopping():
		writeError(w, &apiError{http.StatusServiceUnavailable, "shutting_down", "the safekeeper is shutting down"})
	case a.s.db.CheckWritable() != nil:
		writeError(w, &apiError{http.StatusServiceUnavailable, "storage", "storage is not writable: " + a.s.db.CheckWritable().Error()})
	case refusal != nil:
		writeError(w, &apiError{http.StatusServiceUnavailable, "disk_full", "the disk circuit breaker refuses new WAL: " + refusal.why})
	default:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	}
}

func (a *httpAPI) status(w http.ResponseWriter, r *http.Request) {
	keys, err := a.s.db.Timelines()
	if err != nil {
		writeError(w, err)
		return
	}
	st := httpapi.Status{ID: a.s.cfg.NodeID, Version: Version, UptimeSeconds: time.Since(a.started).Seconds(),
		DataDir: a.s.cfg.DataDir, ListenPG: a.s.Addr().String(), ListenHTTP: a.ln.Addr().String(), Timelines: len(keys),
		DiskUsageBytes: a.s.db.FileSize()}
	if r := a.s.walRefusal(); r != nil {
		st.WALRefused = &httpapi.WALRefused{Reason: r.reason, Detail: r.why, Since: r.since.UTC()}
	}
	var fs unix.Statfs_t
	if unix.Statfs(a.s.cfg.DataDir, &fs) == nil {
		st.DiskFreeBytes = fs.Bavail * uint64(fs.Bsize)
	}
	writeJSON(w, http.StatusOK, st)
}

func (a *httpAPI) timelines(w http.ResponseWriter, r *http.Request) {
	keys, err := a.s.db.Timelines()
	if err != nil {
		writeError(w, err)
		return
	}
	out := []httpapi.TimelineSummary{}
	for _, k := range keys {
		tl, err := a.s.timelineByKey(k)
		if err != nil {
			continue // deleted meanwhile
		}
		st, _ := tl.Status()
		out = append(out, httpapi.TimelineSummary{TenantID: k.TenantID.String(), TimelineID: k.TimelineID.String(), Term: st.VotedFor.Term,
			PgTimeline: st.PgTimeline, FlushLSN: st.FlushLSN, CommitLSN: st.CommitLSN, RemovedUpTo: max(st.RemovedUpTo, tl.store.RemovedUpTo())})
	}
	writeJSON(w, http.StatusOK, out)
}

// pathKey parses the path's tenant_id and timeline_id.
func pathKey(r *http.Request) (proto.TimelineKey, error) {
	tenant, err := proto.ParseID(r.PathValue("tenant_id"))
	if err != nil {
		return proto.TimelineKey{}, &apiError{http.StatusBadRequest, "bad_id", "tenant_id: " + err.Error()}
	}
	timeline, err := proto.ParseID(r.PathValue("timeline_id"))
	if err != nil {
		return proto.TimelineKey{}, &apiError{http.StatusBadRequest, "bad_id", "timeline_id: " + err.Error()}
	}
	return proto.TimelineKey{TenantID: tenant, TimelineID: timeline}, nil
}

// forceParam reads ?force=true|false.
func forceParam(r *http.Request) (bool, error) {
	v := r.URL.Query().Get("force")
	if v == "" {
		return false, nil
	}
	f, err := strconv.ParseBool(v)
	if err != nil {
		return false, &apiError{http.StatusBadRequest, "bad_request", "force: want true or false, got " + strconv.Quote(v)}
	}
	return f, nil
}

// deleteError maps a delete's failure to its answer.
func deleteError(err error) error {
	switch {
	case errors.Is(err, storage.ErrNoTimeline):
		return &apiError{http.StatusNotFound, "not_found", err.Error()}
	case errors.Is(err, ErrTimelineBusy):
		return &apiError{http.StatusConflict, "busy", err.Error()}
	case errors.Is(err, errShutdown):
		return &apiError{http.StatusServiceUnavailable, "shutting_down", "the safekeeper is shutting down"}
	}
	return err
}

func (a *httpAPI) deleteTimeline(w http.ResponseWriter, r *http.Request) {
	key, err := pathKey(r)
	if err != nil {
		writeError(w, err)
		return
	}
	force, err := forceParam(r)
	if err != nil {
		writeError(w, err)
		return
	}
	res, err := a.s.DeleteTimeline(key, force)
	if err != nil {
		writeError(w, deleteError(err))
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (a *httpAPI) deleteTenant(w http.ResponseWriter, r *http.Request) {
	tenant, err := proto.ParseID(r.PathValue("tenant_id"))
	if err != nil {
		writeError(w, &apiError{http.StatusBadRequest, "bad_id", "tenant_id: " + err.Error()})
		return
	}
	force, err := forceParam(r)
	if err != nil {
		writeError(w, err)
		return
	}
	res, err := a.s.DeleteTenant(tenant, force)
	if err != nil {
		writeError(w, deleteError(err))
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (a *httpAPI) timeline(w http.ResponseWriter, r *http.Request) {
	key, err := pathKey(r)
	if err != nil {
		writeError(w, err)
		return
	}
	tl, err := a.s.timelineByKey(key)
	var pe *pgwire.Error
	if errors.As(err, &pe) && pe.Code == pgwire.UndefinedObject {
		writeError(w, &apiError{http.StatusNotFound, "not_found", "timeline " + key.String() + " does not exist on this safekeeper"})
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, a.describe(tl))
}

func (a *httpAPI) describe(tl *timeline) httpapi.Timeline {
	st, _ := tl.Status()
	ret := tl.retention()
	out := httpapi.Timeline{
		TimelineState: httpapi.TimelineState{
			TenantID: st.TenantID.String(), TimelineID: st.TimelineID.String(), Term: st.VotedFor.Term, VotedFor: st.VotedFor.String(),
			LastLogTerm: st.LastLogTerm(), TimelineStartLSN: st.TimelineStartLSN, FlushLSN: st.FlushLSN, CommitLSN: st.CommitLSN,
			TruncateLSN: st.TruncateLSN, RemovedUpTo: max(st.RemovedUpTo, tl.store.RemovedUpTo()), TermHistory: []httpapi.TermSwitch{},
		},
		RetentionHorizon: ret.Horizon, RetentionReason: ret.Reason, PgVersion: st.PgVersion, PgTimeline: st.PgTimeline,
		SystemID: st.SystemID, WalSegSize: st.WalSegSize, Readers: []httpapi.Reader{}, Slots: []httpapi.Slot{},
	}
	out.WALStartLSN, out.WALBytes = storedWAL(st, out.RemovedUpTo)
	for _, e := range st.History {
		out.TermHistory = append(out.TermHistory, httpapi.TermSwitch{Term: e.Term, StartLSN: e.StartLSN})
	}
	if p := tl.pushStatus(); p.connected {
		out.Proposer = &httpapi.Proposer{Address: p.addr, Term: p.term, Since: p.since, WriteLSN: p.end, CommitLSN: p.commit, LastPushAge: time.Since(p.at).Seconds()}
	}
	r := tl.repl
	r.mu.Lock()
	out.RemoteConsistentLSN = r.remoteConsistent
	for rd := range r.readers {
		rd.mu.Lock()
		j := httpapi.Reader{Kind: rd.kind(), Address: rd.addr, ApplicationName: rd.appName, Slot: rd.slot, Since: rd.since,
			SentLSN: rd.position(), WriteLSN: rd.status.Write, FlushLSN: rd.status.Flush, ApplyLSN: rd.status.Apply,
			WriteLag: rd.lags.seconds(0), FlushLag: rd.lags.seconds(1), ReplayLag: rd.lags.seconds(2),
			LagBytes: rd.lagBytes(st.CommitLSN)}
		if !rd.lastReply.IsZero() {
			at := rd.lastReply
			j.LastReply = &at
		}
		rd.mu.Unlock()
		out.Readers = append(out.Readers, j)
	}
	for _, s := range r.slots {
		out.Slots = append(out.Slots, httpapi.Slot{Name: s.Name, Temporary: s.temporary, Active: s.active != 0, RestartLSN: s.RestartLSN})
	}
	r.mu.Unlock()
	sort.Slice(out.Readers, func(i, j int) bool { return out.Readers[i].Since.Before(out.Readers[j].Since) })
	sort.Slice(out.Slots, func(i, j int) bool { return out.Slots[i].Name < out.Slots[j].Name })
	return out
}

// storedWAL is the WAL a timeline holds on disk: from its first stored
// byte (removed_up_to, or the timeline's start when nothing was removed)
// to flush_lsn. The timeline detail's wal_start_lsn and wal_bytes and the
// gauge safekeeper_retained_wal_bytes are this.
func storedWAL(st acceptor.State, removedUpTo proto.LSN) (start proto.LSN, bytes uint64) {
	if st.TimelineStartLSN == 0 {
		return 0, 0 // no WAL yet
	}
	start = max(removedUpTo, st.TimelineStartLSN)
	if st.FlushLSN > start {
		bytes = uint64(st.FlushLSN - start)
	}
	return start, bytes
}

// serverMetrics are the server-wide instruments (bounded cardinality: no
// per-timeline histograms).
type serverMetrics struct {
	writeSeconds prometheus.Histogram // one group commit: WAL into the store's pages
	flushSeconds prometheus.Histogram // one group commit: written to the file and fsynced
	slowFsyncs   prometheus.Counter
	writeBytes   prometheus.Histogram // WAL bytes per SafeKeeperRequest
	appends      prometheus.Counter
	received     prometheus.Counter
	slowFsync    time.Duration // a commit longer than this is counted in slowFsyncs
	refused      *prometheus.CounterVec
}

// observeCommit is storage's OnCommit.
func (m *serverMetrics) observeCommit(c storage.CommitStats) {
	if c.Err != nil || c.WALBytes == 0 {
		return // a commit of control state only: no WAL written
	}
	m.writeSeconds.Observe(c.Apply.Seconds())
	m.flushSeconds.Observe(c.Write.Seconds())
	if c.Apply+c.Write > m.slowFsync {
		m.slowFsyncs.Inc()
	}
}

func newMetrics(slowFsync time.Duration) *serverMetrics {
	return &serverMetrics{
		slowFsync: slowFsync,
		refused:   newRefusedCounter(),
		writeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "safekeeper_write_wal_seconds",
			Help: "Time of one group commit spent putting WAL and state into the store's pages (in memory), before the disk writes.", Buckets: prometheus.ExponentialBuckets(0.00001, 2, 16)}),
		flushSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "safekeeper_flush_wal_seconds",
			Help: "Time of one group commit spent writing to the file and fsyncing (bbolt's write time: pages, fdatasync, meta page, fdatasync).", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		slowFsyncs: prometheus.NewCounter(prometheus.CounterOpts{Name: "safekeeper_slow_fsyncs_total",
			Help: "Group commits that took longer than --slow-fsync-threshold (each is logged)."}),
		writeBytes: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "safekeeper_write_wal_bytes",
			Help: "WAL bytes of one SafeKeeperRequest.", Buckets: prometheus.ExponentialBuckets(64, 4, 8)}),
		appends: prometheus.NewCounter(prometheus.CounterOpts{Name: "safekeeper_appends_total",
			Help: "SafeKeeperRequests with WAL received."}),
		received: prometheus.NewCounter(prometheus.CounterOpts{Name: "safekeeper_wal_received_bytes_total",
			Help: "WAL bytes received from proposers."}),
	}
}

// timelineCollector reports every running timeline's positions at scrape
// time, and the server-wide gauges.
type timelineCollector struct{ s *Server }

var (
	labels         = []string{"tenant_id", "timeline_id"}
	descFlush      = prometheus.NewDesc("safekeeper_flush_lsn", "flush_lsn of the timeline (a byte position).", labels, nil)
	descCommit     = prometheus.NewDesc("safekeeper_commit_lsn", "commit_lsn of the timeline.", labels, nil)
	descRemote     = prometheus.NewDesc("safekeeper_remote_consistent_lsn", "Highest remote_consistent_lsn a pageserver-style consumer reported.", labels, nil)
	descTerm       = prometheus.NewDesc("safekeeper_term", "The term this safekeeper voted for on the timeline.", labels, nil)
	descReaderLag  = prometheus.NewDesc("safekeeper_reader_lag_bytes", "commit_lsn minus the lowest position (the higher of write and flush) a reader reported; one that reported none yet counts from where its stream started. 0 without readers.", labels, nil)
	descActive     = prometheus.NewDesc("safekeeper_active_timelines", "Timelines open on this safekeeper.", nil, nil)
	descProposers  = prometheus.NewDesc("safekeeper_connected_proposers", "Timelines with a proposer connected and streaming.", nil, nil)
	descReaders    = prometheus.NewDesc("safekeeper_connected_readers", "Replication streams being served.", nil, nil)
	descDisk       = prometheus.NewDesc("safekeeper_disk_usage_bytes", "Size of the data directory's database file.", nil, nil)
	descDiskFree   = prometheus.NewDesc("safekeeper_disk_free_bytes", "Free space for unprivileged users on the data directory's file system.", nil, nil)
	descRemovedTo  = prometheus.NewDesc("safekeeper_removed_up_to_lsn", "removed_up_to of the timeline: WAL below it was removed by retention.", labels, nil)
	descRetained   = prometheus.NewDesc("safekeeper_retained_wal_bytes", "WAL the timeline holds on disk: flush_lsn minus removed_up_to (or the timeline's start), the timeline detail's wal_bytes.", labels, nil)
	descBreaker    = prometheus.NewDesc("safekeeper_disk_breaker_tripped", "1 while the disk circuit breaker refuses new WAL (53100).", nil, nil)
	descConns      = prometheus.NewDesc("safekeeper_connections", "Open client connections (limit: --max-connections).", nil, nil)
	descRemovedSeg = prometheus.NewDesc("safekeeper_removed_wal_segments_total", "WAL segments removed by retention since the server started.", nil, nil)
)

func (c *timelineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descFlush, descCommit, descRemote, descTerm, descReaderLag, descActive, descProposers, descReaders, descDisk, descDiskFree, descRemovedTo, descRetained, descRemovedSeg, descBreaker, descConns} {
		ch <- d
	}
}

func (c *timelineCollector) Collect(ch chan<- prometheus.Metric) {
	c.s.mu.Lock()
	tls := make([]*timeline, 0, len(c.s.timelines))
	for _, tl := range c.s.timelines {
		tls = append(tls, tl)
	}
	c.s.mu.Unlock()
	proposers, readers := 0, 0
	for _, tl := range tls {
		st, _ := tl.Status()
		l := []string{tl.key.TenantID.String(), tl.key.TimelineID.String()}
		ch <- prometheus.MustNewConstMetric(descFlush, prometheus.GaugeValue, float64(st.FlushLSN), l...)
		ch <- prometheus.MustNewConstMetric(descCommit, prometheus.GaugeValue, float64(st.CommitLSN), l...)
		ch <- prometheus.MustNewConstMetric(descTerm, prometheus.GaugeValue, float64(st.VotedFor.Term), l...)
		removed := max(st.RemovedUpTo, tl.store.RemovedUpTo())
		ch <- prometheus.MustNewConstMetric(descRemovedTo, prometheus.GaugeValue, float64(removed), l...)
		_, retained := storedWAL(st, removed)
		ch <- prometheus.MustNewConstMetric(descRetained, prometheus.GaugeValue, float64(retained), l...)
		tl.repl.mu.Lock()
		remote := tl.repl.remoteConsistent
		readers += len(tl.repl.readers)
		var lag uint64 // of the reader furthest behind
		for rd := range tl.repl.readers {
			rd.mu.Lock()
			lag = max(lag, rd.lagBytes(st.CommitLSN))
			rd.mu.Unlock()
		}
		tl.repl.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(descRemote, prometheus.GaugeValue, float64(remote), l...)
		ch <- prometheus.MustNewConstMetric(descReaderLag, prometheus.GaugeValue, float64(lag), l...)
		if tl.pushStatus().connected {
			proposers++
		}
	}
	ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(len(tls)))
	ch <- prometheus.MustNewConstMetric(descProposers, prometheus.GaugeValue, float64(proposers))
	ch <- prometheus.MustNewConstMetric(descReaders, prometheus.GaugeValue, float64(readers))
	ch <- prometheus.MustNewConstMetric(descDisk, prometheus.GaugeValue, float64(c.s.db.FileSize()))
	tripped := 0.0
	if c.s.disk.tripped.Load() {
		tripped = 1
	}
	ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, tripped)
	c.s.mu.Lock()
	conns := len(c.s.conns)
	c.s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descConns, prometheus.GaugeValue, float64(conns))
	var fs unix.Statfs_t
	if unix.Statfs(c.s.cfg.DataDir, &fs) == nil {
		ch <- prometheus.MustNewConstMetric(descDiskFree, prometheus.GaugeValue, float64(fs.Bavail*uint64(fs.Bsize)))
	}
	ch <- prometheus.MustNewConstMetric(descRemovedSeg, prometheus.CounterValue, float64(c.s.removedSegments.Load()))
}

// httpAddr is the HTTP listener's address, nil when it is off.
func (a *httpAPI) addr() net.Addr { return a.ln.Addr() }
