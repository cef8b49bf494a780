package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/proto"
)

// The HTTP API (docs/operations.md, "Controller"). Errors are
// {"error": "...", "code": "..."} with a status:
//
//	400 bad_request        an id that is not 32 hex digits, a body that is not {"replicas": N}
//	409 no_room            fewer live safekeepers with room than the replicas
//	409 bad_config         the timeline's key holds something that is not a configuration
//	503 not_leader         this controller does not lead ("leader": the leader's address, or "")
//	503 fenced             it led, but the leadership was lost before the write: nothing was written
//	503 etcd_unavailable   etcd did not answer (the message names its endpoints)

// PlaceRequest is the optional body of a placement.
type PlaceRequest struct {
	Replicas int `json:"replicas"`
}

// PlaceAnswer is a placement's answer: the timeline's configuration.
type PlaceAnswer struct {
	Tenant     string   `json:"tenant_id"` // 32 hex digits
	Timeline   string   `json:"timeline_id"`
	Generation uint64   `json:"generation"`
	Members    []uint64 `json:"members"`
	NewMembers []uint64 `json:"new_members,omitempty"`
	// Placed is true when this request created the configuration, false
	// when the timeline had one already.
	Placed bool `json:"placed"`
	// Zones is how many distinct zones the members span.
	Zones int `json:"zones"`
	// Spread explains a placement over fewer zones than replicas.
	Spread string `json:"spread,omitempty"`
}

// ErrorBody is every error's answer.
type ErrorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
	// Leader is the leader's address on not_leader and fenced ("" when
	// no controller leads).
	Leader *string `json:"leader,omitempty"`
}

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

func (c *Controller) handler() http.Handler {
	prom := prometheus.NewRegistry()
	prom.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		c.m.isLeader, c.m.terms, c.m.placements, c.m.placeErrors, c.m.moveSteps, c.m.moves, c.m.moving, &viewCollector{c: c})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "leader": c.IsLeader()})
	})
	mux.HandleFunc("GET /v1/cluster", func(w http.ResponseWriter, r *http.Request) {
		s, err := c.cfg.Client.Status(r.Context())
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: err.Error(), Code: "etcd_unavailable"})
			return
		}
		writeJSON(w, http.StatusOK, s)
	})
	mux.HandleFunc("POST /v1/tenant/{tenant_id}/timeline/{timeline_id}", c.place)
	mux.Handle("GET /metrics", promhttp.HandlerFor(prom, promhttp.HandlerOpts{}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if allow := allowed(mux, r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeJSON(w, http.StatusMethodNotAllowed, ErrorBody{Code: "method_not_allowed",
				Error: r.Method + " " + r.URL.Path + ": method not allowed; allowed: " + strings.Join(allow, ", ")})
			return
		}
		writeJSON(w, http.StatusNotFound, ErrorBody{Code: "not_found", Error: "no such endpoint: " + r.Method + " " + r.URL.Path +
			" (the controller serves POST /v1/tenant/{tenant_id}/timeline/{timeline_id}, GET /v1/cluster, /metrics, /healthz)"})
	})
	return mux
}

// allowed is the methods another route of mux takes r's path with.
func allowed(mux *http.ServeMux, r *http.Request) []string {
	var out []string
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); pattern != "" && pattern != "/" {
			out = append(out, m)
		}
	}
	return out
}

// place is POST /v1/tenant/{tenant_id}/timeline/{timeline_id}.
func (c *Controller) place(w http.ResponseWriter, r *http.Request) {
	tenant, timeline, err := placeIDs(r)
	if err != nil {
		c.m.placeErrors.WithLabelValues("bad_request").Inc()
		writeJSON(w, http.StatusBadRequest, ErrorBody{Error: err.Error(), Code: "bad_request"})
		return
	}
	var p fleet.Placement
	var badRequest error
	// The term is taken when the request comes in; the body is read, the
	// fleet read and the configuration written under it, each write
	// fenced by it, however long that takes.
	err = c.Lead(r.Context(), func(ctx context.Context, t Term) error {
		c.log.Debug("placing as the leader", "tenant_id", tenant, "timeline_id", timeline, "election_rev", t.Rev)
		replicas, err := c.placeBody(r)
		if err != nil {
			badRequest = err
			return nil
		}
		p, err = c.cfg.Client.Place(ctx, tenant, timeline, replicas, t.Fence())
		return err
	})
	if badRequest != nil {
		c.m.placeErrors.WithLabelValues("bad_request").Inc()
		writeJSON(w, http.StatusBadRequest, ErrorBody{Error: badRequest.Error(), Code: "bad_request"})
		return
	}
	if err != nil {
		ae := c.placeError(r.Context(), err)
		c.m.placeErrors.WithLabelValues(ae.code).Inc()
		body := ErrorBody{Error: ae.msg, Code: ae.code}
		if ae.code == "not_leader" || ae.code == "fenced" {
			leader, _ := c.cfg.Client.Leader(r.Context())
			if leader == c.cfg.Advertise && !c.IsLeader() {
				leader = "" // our own key, not yet expired
			}
			body.Leader = &leader
		}
		writeJSON(w, ae.status, body)
		return
	}
	ans := PlaceAnswer{Tenant: tenant.String(), Timeline: timeline.String(), Generation: p.Config.Generation, Members: p.Config.Members,
		NewMembers: p.Config.NewMembers, Placed: p.Created, Zones: p.Zones, Spread: p.Spread}
	if !p.Created {
		zones := map[string]bool{}
		for _, m := range p.Members {
			if m.Zone != "" {
				zones[m.Zone] = true
			}
		}
		ans.Zones = len(zones)
	}
	status := http.StatusOK
	if p.Created {
		status = http.StatusCreated
		c.m.placements.Inc()
		c.log.Info("placed a timeline", "tenant_id", tenant, "timeline_id", timeline, "members", fmt.Sprint(p.Config.Members), "zones", p.Zones)
	}
	writeJSON(w, status, ans)
}

func placeIDs(r *http.Request) (tenant, timeline proto.ID, err error) {
	if tenant, err = proto.ParseID(r.PathValue("tenant_id")); err != nil {
		return tenant, timeline, fmt.Errorf("tenant_id: %v", err)
	}
	if timeline, err = proto.ParseID(r.PathValue("timeline_id")); err != nil {
		return tenant, timeline, fmt.Errorf("timeline_id: %v", err)
	}
	return tenant, timeline, nil
}

// placeBody reads the optional {"replicas": N}.
func (c *Controller) placeBody(r *http.Request) (replicas int, err error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, 4097))
	if err != nil {
		return 0, fmt.Errorf("reading the body: %v", err)
	}
	if len(b) > 4096 {
		return 0, errors.New("body over 4 KiB: want {\"replicas\": N} or nothing")
	}
	replicas = c.cfg.Replicas
	if strings.TrimSpace(string(b)) != "" {
		var req PlaceRequest
		d := json.NewDecoder(strings.NewReader(string(b)))
		d.DisallowUnknownFields()
		if err := d.Decode(&req); err != nil {
			return 0, fmt.Errorf("body: want {\"replicas\": N}: %v", err)
		}
		if d.More() {
			return 0, errors.New("body: data after the JSON value")
		}
		if req.Replicas != 0 {
			replicas = req.Replicas
		}
		if replicas < 1 || replicas > MaxReplicas {
			return 0, fmt.Errorf("replicas %d: want 1 to %d", replicas, MaxReplicas)
		}
	}
	return replicas, nil
}

func (c *Controller) placeError(ctx context.Context, err error) *apiError {
	switch {
	case errors.Is(err, fleet.ErrFenced):
		return &apiError{http.StatusServiceUnavailable, "fenced",
			"this controller is not the leader any more (its election key is gone or newer): the write was refused by the fence and nothing was written; send placements to the leader"}
	case errors.Is(err, ErrNotLeader):
		return &apiError{http.StatusServiceUnavailable, "not_leader", "this controller is not the leader; send placements to the leader"}
	case errors.Is(err, fleet.ErrUnavailable):
		return &apiError{http.StatusServiceUnavailable, "etcd_unavailable", err.Error()}
	case errors.Is(err, fleet.ErrNoRoom):
		return &apiError{http.StatusConflict, "no_room", err.Error()}
	case errors.Is(err, fleet.ErrBadConfig):
		return &apiError{http.StatusConflict, "bad_config", err.Error() + "; nothing was placed: fix or delete the key"}
	case ctx.Err() != nil:
		return &apiError{http.StatusServiceUnavailable, "cancelled", "the request ended before the placement: " + err.Error()}
	}
	return &apiError{http.StatusInternalServerError, "internal", err.Error()}
}
