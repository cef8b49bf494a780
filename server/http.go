package server

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
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
	"github.com/safekeeper/safekeeper/server/timeline"
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
	case errors.Is(err, timeline.ErrStopped):
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
		tl, err := a.s.reg.Open(k)
		if err != nil {
			continue // deleted meanwhile
		}
		st, _ := tl.Status()
		out = append(out, httpapi.TimelineSummary{TenantID: k.TenantID.String(), TimelineID: k.TimelineID.String(), Term: st.VotedFor.Term,
			PgTimeline: st.PgTimeline, FlushLSN: st.FlushLSN, CommitLSN: st.CommitLSN, RemovedUpTo: max(st.RemovedUpTo, tl.RemovedUpTo())})
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
	case errors.Is(err, timeline.ErrNotFound):
		return &apiError{http.StatusNotFound, "not_found", err.Error()}
	case errors.Is(err, timeline.ErrBusy):
		return &apiError{http.StatusConflict, "busy", err.Error()}
	case errors.Is(err, timeline.ErrStopped):
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
	res, err := a.s.reg.Delete(key, force)
	if err != nil {
		writeError(w, deleteError(err))
		return
	}
	writeJSON(w, http.StatusOK, httpapi.DeleteResult(res))
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
	res, err := a.s.reg.DeleteTenant(tenant, force)
	if err != nil {
		writeError(w, deleteError(err))
		return
	}
	out := map[string]httpapi.DeleteResult{}
	for id, r := range res {
		out[id] = httpapi.DeleteResult(r)
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *httpAPI) timeline(w http.ResponseWriter, r *http.Request) {
	key, err := pathKey(r)
	if err != nil {
		writeError(w, err)
		return
	}
	tl, err := a.s.reg.Open(key)
	if errors.Is(err, timeline.ErrNotFound) {
		writeError(w, &apiError{http.StatusNotFound, "not_found", "timeline " + key.String() + " does not exist on this safekeeper"})
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, a.describe(tl))
}

func (a *httpAPI) describe(tl *timeline.Timeline) httpapi.Timeline {
	st, _ := tl.Status()
	horizon, reason := tl.Retention()
	out := httpapi.Timeline{
		TimelineState: httpapi.TimelineState{
			TenantID: st.TenantID.String(), TimelineID: st.TimelineID.String(), Term: st.VotedFor.Term, VotedFor: st.VotedFor.String(),
			LastLogTerm: st.LastLogTerm(), TimelineStartLSN: st.TimelineStartLSN, FlushLSN: st.FlushLSN, CommitLSN: st.CommitLSN,
			TruncateLSN: st.TruncateLSN, RemovedUpTo: max(st.RemovedUpTo, tl.RemovedUpTo()), TermHistory: []httpapi.TermSwitch{},
		},
		RetentionHorizon: horizon, RetentionReason: reason, PgVersion: st.PgVersion, PgTimeline: st.PgTimeline,
		SystemID: st.SystemID, WalSegSize: st.WalSegSize, Readers: []httpapi.Reader{}, Slots: []httpapi.Slot{},
	}
	out.WALStartLSN, out.WALBytes = storedWAL(st, out.RemovedUpTo)
	for _, e := range st.History {
		out.TermHistory = append(out.TermHistory, httpapi.TermSwitch{Term: e.Term, StartLSN: e.StartLSN})
	}
	if p := tl.Proposer(); p.Connected {
		out.Proposer = &httpapi.Proposer{Address: p.Addr, Term: p.Term, Since: p.Since, WriteLSN: p.End, CommitLSN: p.Commit, LastPushAge: time.Since(p.At).Seconds()}
	}
	repl := tl.Replication(st.CommitLSN)
	out.RemoteConsistentLSN = repl.RemoteConsistentLSN
	for _, rd := range repl.Readers {
		j := httpapi.Reader{Kind: rd.Kind, Address: rd.Addr, ApplicationName: rd.AppName, Slot: rd.Slot, Since: rd.Since,
			SentLSN: rd.Sent, WriteLSN: rd.Write, FlushLSN: rd.Flush, ApplyLSN: rd.Apply,
			WriteLag: rd.WriteLag, FlushLag: rd.FlushLag, ReplayLag: rd.ReplayLag, LagBytes: rd.LagBytes}
		if !rd.LastReply.IsZero() {
			at := rd.LastReply
			j.LastReply = &at
		}
		out.Readers = append(out.Readers, j)
	}
	for _, s := range repl.Slots {
		out.Slots = append(out.Slots, httpapi.Slot{Name: s.Name, Temporary: s.Temporary, Active: s.Active, RestartLSN: s.RestartLSN})
	}
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

// httpAddr is the HTTP listener's address, nil when it is off.
func (a *httpAPI) addr() net.Addr { return a.ln.Addr() }
