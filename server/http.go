package server

import (
	"context"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/auth"
	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/storage/archive"
)

// Version is the build's version (cmd sets it from git describe), as
// GET /v1/status reports it.
var Version = "dev"

// newHTTPAPI is the HTTP API (Config.ListenHTTP) on ln, reading the
// timelines through the registry and the rest of the process through
// httpHost.
func (s *Server) newHTTPAPI(ln net.Listener) *httpapi.API {
	var verifier func() *auth.Verifier
	if s.auth != nil {
		verifier = s.auth.v.Load
	}
	var extra []prometheus.Collector
	var deleteArchive func(context.Context, proto.TimelineKey) (int, error)
	if s.backupMetrics != nil {
		extra = s.backupMetrics.Collectors()
		codec := s.cfg.ArchiveCodec
		if codec == nil {
			codec = &archive.Codec{Compress: true}
		}
		deleteArchive = func(ctx context.Context, key proto.TimelineKey) (int, error) {
			n, _, err := archive.DeleteAll(ctx, archive.Open(s.cfg.RemoteStorage, codec, key))
			return n, err
		}
	}
	return httpapi.New(ln, httpapi.Config{
		NodeID: s.cfg.NodeID, DataDir: s.cfg.DataDir, Version: Version, Registry: s.reg, Host: httpHost{s}, Metrics: s.metrics,
		Logger: s.log, EnablePprof: s.cfg.EnablePprof, ReadTimeout: s.cfg.HTTPReadTimeout, IdleTimeout: s.cfg.HTTPIdleTimeout,
		Verifier: verifier, OnWAL: s.hooks.httpWAL, Archiving: s.uploader != nil, Collectors: extra,
		DeleteArchive: deleteArchive,
	})
}

// httpHost is the server as the HTTP API reads it (httpapi.Host).
type httpHost struct{ s *Server }

func (h httpHost) Stopping() bool       { return h.s.isStopping() }
func (h httpHost) PGAddr() net.Addr     { return h.s.Addr() }
func (h httpHost) CheckWritable() error { return h.s.db.CheckWritable() }
func (h httpHost) FileSize() int64      { return h.s.db.FileSize() }
func (h httpHost) WALRefused() *httpapi.WALRefused {
	r := h.s.walRefusal()
	if r == nil {
		return nil
	}
	return &httpapi.WALRefused{Reason: r.reason, Detail: r.why, Since: r.since}
}

func (h httpHost) Connections() int {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return len(h.s.conns)
}
