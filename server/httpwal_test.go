package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/httpapi"
)

// TestHTTPWAL: GET .../wal serves the timeline's WAL bytes as pushed, by
// default from its start to flush_lsn, an end above flush_lsn cut to it,
// the range in X-Wal-Start/X-Wal-End and Content-Length; JSON errors: 400
// for a bad LSN, a bad id or start above end, 404 for an unknown timeline
// or WAL the safekeeper does not hold.
func TestHTTPWAL(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	base := fmt.Sprintf("http://%s/v1/tenant/%s/timeline/%s/wal", s.HTTPAddr(), tTenant, tTimeline)
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	wal, _ := p.push(400, 3000, 0) // more than one read chunk (1 MiB)
	flush := p.pos
	if len(wal) <= 1<<20 {
		t.Fatalf("%d bytes of WAL: one chunk", len(wal))
	}
	get := func(query string) (*http.Response, []byte) {
		t.Helper()
		resp, err := http.Get(base + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	mid := tStart + 12345
	for _, c := range []struct {
		query      string
		start, end proto.LSN
	}{
		{"", tStart, flush},
		{"?start=" + mid.String(), mid, flush},
		{"?start=" + mid.String() + "&end=" + (mid + 100).String(), mid, mid + 100},
		{"?end=" + (flush + 1<<20).String(), tStart, flush},
		{"?start=" + flush.String(), flush, flush},
	} {
		resp, b := get(c.query)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/octet-stream" ||
			resp.Header.Get(httpapi.WALStartHeader) != c.start.String() || resp.Header.Get(httpapi.WALEndHeader) != c.end.String() ||
			resp.ContentLength != int64(c.end-c.start) || !bytes.Equal(b, wal[c.start-tStart:c.end-tStart]) {
			t.Errorf("GET wal%s: %d %v, %d bytes; want %s..%s as pushed", c.query, resp.StatusCode, resp.Header, len(b), c.start, c.end)
		}
	}
	var e map[string]string
	for _, c := range []struct {
		url  string
		code int
		want string
	}{
		{base + "?start=zz", 400, "bad_lsn"},
		{base + "?end=1/2/3", 400, "bad_lsn"},
		{base + "?start=" + (flush + 8).String(), 400, "bad_range"},
		{base + "?start=" + (tStart - 8).String(), 404, "wal_removed"},
		{fmt.Sprintf("http://%s/v1/tenant/%s/timeline/%s/wal", s.HTTPAddr(), tTenant, proto.ID{9}), 404, "not_found"},
		{fmt.Sprintf("http://%s/v1/tenant/xyz/timeline/%s/wal", s.HTTPAddr(), tTimeline), 400, "bad_id"},
	} {
		if code := getJSON(t, c.url, &e); code != c.code || e["code"] != c.want || e["error"] == "" {
			t.Errorf("GET %s: %d %v; want %d %s", c.url, code, e, c.code, c.want)
		}
	}
}

// TestHTTPWALStreamsAreBounded: at most httpapi.MaxWALStreams GET .../wal answers
// run at once; one more is refused with 429 and the API's JSON error
// (counted in safekeeper_refused_total), without being served; once the
// answers under way end, a new one is served again.
func TestHTTPWALStreamsAreBounded(t *testing.T) {
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	defer release()
	entered := make(chan struct{}, httpapi.MaxWALStreams+1)
	var held atomic.Bool
	held.Store(true)
	s := startHookedServer(t, t.TempDir(), func(c *Config) { c.ListenHTTP = "127.0.0.1:0" }, hooks{httpWAL: func() {
		if held.Load() {
			entered <- struct{}{}
			<-gate
		}
	}})
	url := fmt.Sprintf("http://%s/v1/tenant/%s/timeline/%s/wal", s.HTTPAddr(), tTenant, tTimeline)
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	wal, _ := p.push(20, 1000, 0)

	type result struct {
		code int
		body []byte
		err  error
	}
	get := func(ch chan<- result) {
		resp, err := http.Get(url)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- result{resp.StatusCode, b, err}
	}
	results := make(chan result, httpapi.MaxWALStreams)
	for range httpapi.MaxWALStreams {
		go get(results)
	}
	for i := range httpapi.MaxWALStreams {
		select {
		case <-entered:
		case <-time.After(tTimeout):
			t.Fatalf("%d of %d WAL answers under way", i, httpapi.MaxWALStreams)
		}
	}

	one := make(chan result, 1)
	go get(one)
	select {
	case <-entered:
		t.Fatalf("answer %d was served while %d were under way", httpapi.MaxWALStreams+1, httpapi.MaxWALStreams)
	case r := <-one:
		var e map[string]string
		if r.err != nil || r.code != http.StatusTooManyRequests || json.Unmarshal(r.body, &e) != nil || e["code"] != "too_many_requests" || e["error"] == "" {
			t.Fatalf("answer %d: %d %s %v, want 429 too_many_requests", httpapi.MaxWALStreams+1, r.code, r.body, r.err)
		}
	case <-time.After(tTimeout):
		t.Fatal("no answer")
	}
	if got := refused(s, "http_wal_streams"); got != 1 {
		t.Errorf("safekeeper_refused_total{reason=\"http_wal_streams\"} = %v, want 1", got)
	}

	held.Store(false)
	release()
	for range httpapi.MaxWALStreams {
		if r := <-results; r.err != nil || r.code != 200 || !bytes.Equal(r.body, wal) {
			t.Fatalf("an answer under way: %d, %d bytes, %v; want 200 and the WAL", r.code, len(r.body), r.err)
		}
	}
	go get(one)
	if r := <-one; r.err != nil || r.code != 200 || !bytes.Equal(r.body, wal) {
		t.Fatalf("after the others ended: %d, %d bytes, %v; want 200 and the WAL", r.code, len(r.body), r.err)
	}
}
