package httpapi

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/safekeeper/safekeeper/server/auth"
	"github.com/safekeeper/safekeeper/server/timeline"
)

// Config configures an API. The server fills it (server.Config documents
// the settings).
type Config struct {
	NodeID  uint64
	DataDir string
	Version string // the build's (GET /v1/status)
	// Registry is where every timeline is read, opened and deleted.
	Registry *timeline.Registry
	// Host is the process around the timelines.
	Host Host
	// Metrics are the server-wide instruments /metrics serves besides the
	// timelines' gauges.
	Metrics *Metrics
	// Logger receives the API's logs; nil discards them.
	Logger *slog.Logger
	// EnablePprof serves /debug/pprof/.
	EnablePprof bool
	// ReadTimeout bounds reading a request (net/http's ReadTimeout; the
	// headers alone get at most 10 s), IdleTimeout a keep-alive
	// connection between requests.
	ReadTimeout, IdleTimeout time.Duration
	// Verifier is the current token verifier (it changes on a reload);
	// nil: authentication is off.
	Verifier func() *auth.Verifier
	// OnWAL is a test hook: it runs in a GET .../wal handler once it holds
	// its slot. Nil in production.
	OnWAL func()
	// Archiving: an archive is configured; the timelines' backup lag is
	// reported (the timeline view, safekeeper_backup_lag_*).
	Archiving bool
	// Collectors are more instruments /metrics serves (the uploader's).
	Collectors []prometheus.Collector
	// DeleteArchive deletes a timeline's whole archive (a DELETE with
	// ?archive=true); nil without an archive.
	DeleteArchive func(ctx context.Context, key proto.TimelineKey) (objects int, err error)
}

// Host is what the API reads of the process it serves, besides the
// timelines: server.Server provides it.
type Host interface {
	// Stopping reports whether the server's shutdown began.
	Stopping() bool
	// PGAddr is the address of the PostgreSQL-protocol listener.
	PGAddr() net.Addr
	// WALRefused is why the disk circuit breaker refuses new WAL, nil
	// while it takes it.
	WALRefused() *WALRefused
	// Connections is how many client connections are open.
	Connections() int
	// CheckWritable reports whether storage can write (nil: it can).
	CheckWritable() error
	// FileSize is the database file's size.
	FileSize() int64
}

// API is the HTTP API: Neon's safekeeper paths where one exists, JSON
// bodies (models.go) with LSNs as "X/X", errors as ErrorBody with the
// status that fits. /metrics is Prometheus text via client_golang.
type API struct {
	cfg     Config
	log     *slog.Logger
	reg     *timeline.Registry
	host    Host
	started time.Time
	srv     *http.Server
	ln      net.Listener
	prom    *prometheus.Registry
	// walStreams holds a token per GET .../wal answer under way (wal.go):
	// at most MaxWALStreams at once.
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
	writeJSON(w, ae.status, ErrorBody{Code: ae.code, Error: pgwire.ClientText(ae.msg)})
}

// New is the API that will serve on ln (Serve). Its uptime counts from
// now.
func New(ln net.Listener, cfg Config) *API {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	a := &API{cfg: cfg, log: cfg.Logger, reg: cfg.Registry, host: cfg.Host, started: time.Now(), ln: ln, prom: prometheus.NewRegistry(),
		walStreams: make(chan struct{}, MaxWALStreams)}
	m := cfg.Metrics
	a.prom.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&timelineCollector{a: a}, m.writeSeconds, m.flushSeconds, m.slowFsyncs, m.writeBytes, m.appends, m.received, m.refused)
	a.prom.MustRegister(cfg.Collectors...)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.HandleFunc("GET /v1/status", a.status)
	// Access (auth.go): open, the path's tenant, or safekeeperdata. A
	// DELETE destroys acknowledged WAL: safekeeperdata only, not a
	// compute's tenant token.
	mux.HandleFunc("GET /v1/tenant/timeline", a.guard(accessAdmin, a.timelines))
	mux.HandleFunc("GET /v1/tenant/{tenant_id}/timeline/{timeline_id}", a.guard(accessTenant, a.timeline))
	mux.HandleFunc("DELETE /v1/tenant/{tenant_id}/timeline/{timeline_id}", a.guard(accessAdmin, a.deleteTimeline))
	mux.HandleFunc("PUT /v1/tenant/{tenant_id}/timeline/{timeline_id}/membership", a.guard(accessAdmin, a.membership))
	mux.HandleFunc("POST /v1/tenant/{tenant_id}/timeline/{timeline_id}/term_bump", a.guard(accessAdmin, a.termBump))
	mux.HandleFunc("POST /v1/pull_timeline", a.guard(accessAdmin, a.pullTimeline))
	mux.HandleFunc("DELETE /v1/tenant/{tenant_id}", a.guard(accessAdmin, a.deleteTenant))
	mux.HandleFunc("GET /v1/tenant/{tenant_id}/timeline/{timeline_id}/wal", a.guard(accessTenant, a.wal)) // wal.go
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.prom, promhttp.HandlerOpts{}))
	if cfg.EnablePprof {
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
	a.srv = &http.Server{Handler: mux, ReadHeaderTimeout: min(10*time.Second, cfg.ReadTimeout),
		ReadTimeout: cfg.ReadTimeout, IdleTimeout: cfg.IdleTimeout}
	return a
}

// Addr is the address the API listens on.
func (a *API) Addr() net.Addr { return a.ln.Addr() }

// Serve serves until Shutdown, HTTPS when tlsConfig is not nil.
func (a *API) Serve(tlsConfig *tls.Config) error {
	if tlsConfig != nil {
		a.srv.TLSConfig = tlsConfig
		return a.srv.ServeTLS(a.ln, "", "")
	}
	return a.srv.Serve(a.ln)
}

// Shutdown stops accepting, lets the requests under way end for at most a
// second (a WAL answer may stream for long), then closes every connection.
func (a *API) Shutdown(ctx context.Context) {
	hctx, hcancel := context.WithTimeout(ctx, time.Second)
	a.srv.Shutdown(hctx)
	hcancel()
	a.srv.Close()
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

func (a *API) readyz(w http.ResponseWriter, r *http.Request) {
	refusal := a.host.WALRefused()
	switch {
	case a.host.Stopping():
		writeError(w, &apiError{http.StatusServiceUnavailable, "shutting_down", "the safekeeper is shutting down"})
	case a.host.CheckWritable() != nil:
		writeError(w, &apiError{http.StatusServiceUnavailable, "storage", "storage is not writable: " + a.host.CheckWritable().Error()})
	case refusal != nil:
		writeError(w, &apiError{http.StatusServiceUnavailable, "disk_full", "the disk circuit breaker refuses new WAL: " + refusal.Detail})
	default:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	}
}

func (a *API) status(w http.ResponseWriter, r *http.Request) {
	keys, err := a.reg.Keys()
	if err != nil {
		writeError(w, err)
		return
	}
	st := Status{ID: a.cfg.NodeID, Version: a.cfg.Version, UptimeSeconds: time.Since(a.started).Seconds(),
		DataDir: a.cfg.DataDir, ListenPG: a.host.PGAddr().String(), ListenHTTP: a.ln.Addr().String(), Timelines: len(keys),
		DiskUsageBytes: a.host.FileSize()}
	if r := a.host.WALRefused(); r != nil {
		st.WALRefused = &WALRefused{Reason: r.Reason, Detail: r.Detail, Since: r.Since.UTC()}
	}
	var fs unix.Statfs_t
	if unix.Statfs(a.cfg.DataDir, &fs) == nil {
		st.DiskFreeBytes = fs.Bavail * uint64(fs.Bsize)
	}
	writeJSON(w, http.StatusOK, st)
}

func (a *API) timelines(w http.ResponseWriter, r *http.Request) {
	keys, err := a.reg.Keys()
	if err != nil {
		writeError(w, err)
		return
	}
	out := []TimelineSummary{}
	for _, k := range keys {
		tl, err := a.reg.Open(k)
		if err != nil {
			continue // deleted meanwhile
		}
		st := tl.State()
		out = append(out, TimelineSummary{TenantID: k.TenantID.String(), TimelineID: k.TimelineID.String(), Term: st.VotedFor.Term,
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

func (a *API) deleteTimeline(w http.ResponseWriter, r *http.Request) {
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
	withArchive, err := a.archiveParam(r)
	if err != nil {
		writeError(w, err)
		return
	}
	res, err := a.reg.Delete(key, force)
	if err != nil {
		writeError(w, deleteError(err))
		return
	}
	out := DeleteResult{DirExisted: res.DirExisted, WasActive: res.WasActive}
	if withArchive {
		if out.ArchiveObjectsDeleted, err = a.deleteArchive(r.Context(), key); err != nil {
			writeError(w, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// archiveParam is ?archive=true|false: delete the archive too. Asked of a
// safekeeper without an archive, it is refused before anything is
// deleted.
func (a *API) archiveParam(r *http.Request) (bool, error) {
	v := r.URL.Query().Get("archive")
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, &apiError{http.StatusBadRequest, "bad_request", "archive: want true or false, got " + strconv.Quote(v)}
	}
	if b && a.cfg.DeleteArchive == nil {
		return false, &apiError{http.StatusBadRequest, "no_archive", "archive=true: this safekeeper has no archive (--remote-storage)"}
	}
	return b, nil
}

// deleteArchive deletes the archive of key after its local delete. A
// failure is a 502 saying so: the local timeline is gone, and the same
// DELETE with archive=true again deletes what is left of the archive.
func (a *API) deleteArchive(ctx context.Context, key proto.TimelineKey) (*int, error) {
	n, err := a.cfg.DeleteArchive(ctx, key)
	if err != nil {
		return nil, &apiError{http.StatusBadGateway, "archive", fmt.Sprintf("timeline %s deleted here, but deleting its archive failed after %d objects (send the DELETE with archive=true again): %v", key, n, err)}
	}
	a.log.Info("deleted the timeline's archive", "tenant_id", key.TenantID.String(), "timeline_id", key.TimelineID.String(), "objects", n)
	return &n, nil
}

func (a *API) deleteTenant(w http.ResponseWriter, r *http.Request) {
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
	withArchive, err := a.archiveParam(r)
	if err != nil {
		writeError(w, err)
		return
	}
	res, err := a.reg.DeleteTenant(tenant, force)
	if err != nil {
		writeError(w, deleteError(err))
		return
	}
	out := map[string]DeleteResult{}
	for id, d := range res {
		dr := DeleteResult{DirExisted: d.DirExisted, WasActive: d.WasActive}
		if withArchive {
			tl, err := proto.ParseID(id)
			if err != nil {
				writeError(w, err)
				return
			}
			if dr.ArchiveObjectsDeleted, err = a.deleteArchive(r.Context(), proto.TimelineKey{TenantID: tenant, TimelineID: tl}); err != nil {
				writeError(w, err)
				return
			}
		}
		out[id] = dr
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *API) timeline(w http.ResponseWriter, r *http.Request) {
	if tl, _, ok := a.pathTimeline(w, r); ok {
		writeJSON(w, http.StatusOK, a.describe(tl))
	}
}

// membership is PUT .../membership: the body a configuration (JSON:
// generation, members, new_members), which the timeline adopts if its
// generation is above the stored one (README_PROTO.md, rule 9). 200 with
// what it holds afterwards (MembershipSwitch) also when it kept its own
// (a lower generation); 409 for another configuration of the stored
// generation; 400 for a body that is no valid configuration.
func (a *API) membership(w http.ResponseWriter, r *http.Request) {
	tl, _, ok := a.pathTimeline(w, r)
	if !ok {
		return
	}
	var c proto.Configuration
	if err := decodeBody(w, r, "configuration", &c); err != nil {
		writeError(w, err)
		return
	}
	if err := c.Validate(); err != nil || c.Generation == 0 {
		msg := "generation 0 is no configuration"
		if err != nil {
			msg = err.Error()
		}
		writeError(w, &apiError{http.StatusBadRequest, "bad_request", "configuration: " + msg})
		return
	}
	before := tl.State().Configuration.Generation
	cur, st, err := tl.SetConfiguration(c)
	var ce *acceptor.ConfigurationError
	switch {
	case errors.As(err, &ce):
		writeError(w, &apiError{http.StatusConflict, "configuration_conflict", err.Error()})
		return
	case err != nil:
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, MembershipSwitch{Configuration: cur, Switched: cur.Generation > before, Term: st.VotedFor.Term,
		LastLogTerm: st.LastLogTerm(), FlushLSN: st.FlushLSN, CommitLSN: st.CommitLSN})
}

// decodeBody reads one JSON value of at most 64 KiB into v, refusing
// unknown fields and trailing data (a 400 for the caller to answer).
func decodeBody(w http.ResponseWriter, r *http.Request, what string, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &apiError{http.StatusBadRequest, "bad_request", what + ": " + err.Error()}
	}
	if dec.More() {
		return &apiError{http.StatusBadRequest, "bad_request", what + ": data after the JSON value"}
	}
	return nil
}

// termBump is POST .../term_bump: the body {"term": N}; voted_for is raised
// to N if it is below (README_PROTO.md, "Membership and generations").
func (a *API) termBump(w http.ResponseWriter, r *http.Request) {
	tl, _, ok := a.pathTimeline(w, r)
	if !ok {
		return
	}
	var req TermBumpRequest
	if err := decodeBody(w, r, "term_bump", &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Term == 0 || req.Term > proto.MaxTerm {
		writeError(w, &apiError{http.StatusBadRequest, "bad_request", fmt.Sprintf("term_bump: term %d: want 1 to %d", req.Term, uint64(proto.MaxTerm))})
		return
	}
	prev, cur, err := tl.TermBump(req.Term)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, TermBumpResponse{PreviousTerm: prev, CurrentTerm: cur})
}

// pullTimeline is POST /v1/pull_timeline: the body names a timeline and a
// peer's PostgreSQL-protocol address; the timeline is copied from it into
// this safekeeper (timeline.Registry.PullOnline). 200 with what was
// copied, or existed true for a timeline held already.
func (a *API) pullTimeline(w http.ResponseWriter, r *http.Request) {
	var req PullRequest
	if err := decodeBody(w, r, "pull_timeline", &req); err != nil {
		writeError(w, err)
		return
	}
	tenant, err1 := proto.ParseID(req.TenantID)
	tl, err2 := proto.ParseID(req.TimelineID)
	_, _, addrErr := net.SplitHostPort(req.From)
	if err := errors.Join(err1, err2); err != nil || addrErr != nil {
		msg := fmt.Sprintf("pull_timeline: from %q: want the peer's host:port", req.From)
		if err != nil {
			msg = "pull_timeline: " + err.Error()
		}
		writeError(w, &apiError{http.StatusBadRequest, "bad_request", msg})
		return
	}
	res, existed, err := a.reg.PullOnline(r.Context(), timeline.PullConfig{Key: proto.TimelineKey{TenantID: tenant, TimelineID: tl}, From: req.From})
	if errors.Is(err, timeline.ErrBusy) {
		writeError(w, &apiError{http.StatusConflict, "busy", err.Error()})
		return
	}
	if err != nil {
		writeError(w, &apiError{http.StatusBadGateway, "pull_failed", "pull_timeline from " + req.From + ": " + err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, PullResponse{Existed: existed, WALStartLSN: res.WALStart, FlushLSN: res.FlushLSN, Term: res.Term, CommitLSN: res.CommitLSN})
}

// pathTimeline opens the timeline the path names; when it cannot, it
// answers (400 for bad ids, 404 for a timeline not held) and ok is false.
func (a *API) pathTimeline(w http.ResponseWriter, r *http.Request) (tl *timeline.Timeline, key proto.TimelineKey, ok bool) {
	key, err := pathKey(r)
	if err != nil {
		writeError(w, err)
		return nil, key, false
	}
	tl, err = a.reg.Open(key)
	if errors.Is(err, timeline.ErrNotFound) {
		writeError(w, &apiError{http.StatusNotFound, "not_found", "timeline " + key.String() + " does not exist on this safekeeper"})
		return nil, key, false
	}
	if err != nil {
		writeError(w, err)
		return nil, key, false
	}
	return tl, key, true
}

func (a *API) describe(tl *timeline.Timeline) Timeline {
	st := tl.State()
	horizon, reason := tl.Retention()
	out := Timeline{
		TimelineState: TimelineState{
			TenantID: st.TenantID.String(), TimelineID: st.TimelineID.String(), Term: st.VotedFor.Term, VotedFor: st.VotedFor.String(),
			LastLogTerm: st.LastLogTerm(), TimelineStartLSN: st.TimelineStartLSN, FlushLSN: st.FlushLSN, CommitLSN: st.CommitLSN,
			TruncateLSN: st.TruncateLSN, RemovedUpTo: max(st.RemovedUpTo, tl.RemovedUpTo()), TermHistory: termHistory(st.History),
		},
		RetentionHorizon: horizon, RetentionReason: reason, PgVersion: st.PgVersion, PgTimeline: st.PgTimeline,
		SystemID: st.SystemID, WalSegSize: st.WalSegSize, Readers: []Reader{}, Slots: []Slot{},
	}
	out.WALStartLSN, out.WALBytes = storedWAL(st, out.RemovedUpTo)
	out.BackupLSN = tl.BackupLSN()
	if st.Configuration.Generation > 0 {
		c := st.Configuration.Clone()
		out.Configuration = &c
	}
	if a.cfg.Archiving {
		b, d := tl.BackupLag(st.CommitLSN)
		secs := d.Seconds()
		out.BackupLagBytes, out.BackupLagSeconds = &b, &secs
	}
	if p := tl.Proposer(); p.Connected {
		out.Proposer = &Proposer{Address: p.Addr, Term: p.Term, Since: p.Since, WriteLSN: p.End, CommitLSN: p.Commit, LastPushAge: time.Since(p.At).Seconds()}
	}
	repl := tl.Replication(st.CommitLSN)
	out.RemoteConsistentLSN = repl.RemoteConsistentLSN
	for _, rd := range repl.Readers {
		j := Reader{Kind: rd.Kind, Address: rd.Addr, ApplicationName: rd.AppName, Slot: rd.Slot, Since: rd.Since,
			SentLSN: rd.Sent, WriteLSN: rd.Write, FlushLSN: rd.Flush, ApplyLSN: rd.Apply,
			WriteLag: rd.WriteLag, FlushLag: rd.FlushLag, ReplayLag: rd.ReplayLag, LagBytes: rd.LagBytes}
		if !rd.LastReply.IsZero() {
			at := rd.LastReply
			j.LastReply = &at
		}
		out.Readers = append(out.Readers, j)
	}
	for _, s := range repl.Slots {
		out.Slots = append(out.Slots, Slot{Name: s.Name, Temporary: s.Temporary, Active: s.Active, RestartLSN: s.RestartLSN})
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
