package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

// GET /v1/tenant/{tenant_id}/timeline/{timeline_id}/wal?start=X/X&end=X/X:
// the timeline's raw WAL bytes [start, end) as application/octet-stream
// (what `safekeeper wal dump --http` reads). start defaults to the first
// byte held (timeline_start_lsn, or removed_up_to after retention), end to
// flush_lsn; an end above flush_lsn is cut to it. The range served is in
// the X-Wal-Start and X-Wal-End headers and Content-Length. Errors: 400
// bad_id / bad_lsn / bad_range, 404 not_found (no such timeline) or
// wal_removed (start below the WAL held), 429 too_many_requests (more than
// MaxWALStreams answers at once).

const (
	walReadChunk = 1 << 20
	// MaxWALStreams bounds the GET .../wal answers under way at once.
	// Each holds a read buffer of walReadChunk and may take long (a slow
	// client of a large range): without a bound, clients could make the
	// server hold any number of them.
	MaxWALStreams = 32
)

func (a *API) wal(w http.ResponseWriter, r *http.Request) {
	select {
	case a.walStreams <- struct{}{}:
		defer func() { <-a.walStreams }()
	default:
		a.cfg.Metrics.Refused("http_wal_streams")
		w.Header().Set("Retry-After", "1")
		writeError(w, &apiError{http.StatusTooManyRequests, "too_many_requests",
			fmt.Sprintf("%d WAL answers are under way, the most this safekeeper serves at once; retry later", MaxWALStreams)})
		return
	}
	if a.cfg.OnWAL != nil {
		a.cfg.OnWAL()
	}
	tl, key, ok := a.pathTimeline(w, r)
	if !ok {
		return
	}
	st := tl.State()
	first := max(st.TimelineStartLSN, st.RemovedUpTo, tl.RemovedUpTo())
	start, end := first, st.FlushLSN
	for _, p := range []struct {
		name string
		dst  *proto.LSN
	}{{"start", &start}, {"end", &end}} {
		if v := r.URL.Query().Get(p.name); v != "" {
			l, err := proto.ParseLSN(v)
			if err != nil {
				writeError(w, &apiError{http.StatusBadRequest, "bad_lsn", p.name + ": " + err.Error()})
				return
			}
			*p.dst = l
		}
	}
	end = min(end, st.FlushLSN)
	switch {
	case start < first:
		writeError(w, &apiError{http.StatusNotFound, "wal_removed",
			fmt.Sprintf("WAL at %s is not held: this safekeeper holds timeline %s from %s (timeline start %s, removed up to %s)",
				start, key, first, st.TimelineStartLSN, max(st.RemovedUpTo, tl.RemovedUpTo()))})
		return
	case start > end:
		writeError(w, &apiError{http.StatusBadRequest, "bad_range", fmt.Sprintf("start %s is above the end %s (flush_lsn %s)", start, end, st.FlushLSN)})
		return
	}
	// The first chunk is read before the answer starts, so that a range
	// retention removed meanwhile is still a 404.
	buf := make([]byte, min(uint64(end-start), walReadChunk))
	n, err := tl.ReadWAL(start, buf)
	if errors.Is(err, storage.ErrWALRemoved) {
		writeError(w, &apiError{http.StatusNotFound, "wal_removed", err.Error()})
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set(WALStartHeader, start.String())
	h.Set(WALEndHeader, end.String())
	h.Set("Content-Length", strconv.FormatUint(uint64(end-start), 10))
	w.WriteHeader(http.StatusOK)
	// Each ReadWAL is its own short read transaction, copied out: nothing
	// of bbolt is held across the writes to the client.
	for pos := start; ; {
		if n == 0 && pos < end {
			// The stored WAL ended early (or was removed under us): cut
			// the answer short, which the client sees against
			// Content-Length.
			a.log.Warn("GET wal: stored WAL ends below the range served", "timeline", key.String(), "pos", pos, "end", end, "err", err)
			panic(http.ErrAbortHandler)
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return // the client went away
		}
		pos += proto.LSN(n)
		if pos >= end {
			return
		}
		n, err = tl.ReadWAL(pos, buf[:min(uint64(end-pos), walReadChunk)])
		if err != nil {
			n = 0
		}
	}
}
