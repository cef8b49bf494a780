package s3test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// Fault is what a FaultProxy does to the requests it gets.
type Fault int

const (
	Pass          Fault = iota // forward them
	Unavailable                // answer 503 SlowDown, as S3 does under load
	ServerError                // answer 500 InternalError
	Forbidden                  // answer 403 InvalidAccessKeyId: credentials refused
	Drop                       // close the connection without an answer
	Slow                       // forward each after a delay (FaultProxy.Delay)
	LosePutAnswer              // forward a PUT, then close the connection without its answer
	CorruptPut                 // forward a PUT with one byte of its body flipped
)

// FaultProxy is an HTTP proxy in front of a Server that fails requests on
// command: a store that goes down, answers errors or refuses the
// credentials, and comes back. It listens on 127.0.0.1 at a port it binds
// itself.
type FaultProxy struct {
	*httptest.Server
	mu    sync.Mutex
	fault Fault
	delay time.Duration
	seen  map[Fault]int
	puts  map[string]int // PUTs per object key, whatever the fault
}

// StartFaultProxy starts a proxy to s and registers its cleanup.
func StartFaultProxy(t testing.TB, s *Server) *FaultProxy {
	t.Helper()
	target, _ := url.Parse(s.Endpoint)
	rp := httputil.NewSingleHostReverseProxy(target)
	p := &FaultProxy{seen: map[Fault]int{}, puts: map[string]int{}, delay: time.Second}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		f, d := p.fault, p.delay
		p.seen[f]++
		if r.Method == http.MethodPut {
			p.puts[r.URL.Path]++
		}
		p.mu.Unlock()
		fail := func(status int, code string) {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(status)
			w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>` + code + `</Code><Message>injected by the test</Message></Error>`))
		}
		// hangUp closes the connection without an answer.
		hangUp := func() {
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
			fail(http.StatusBadGateway, "InternalError")
		}
		switch f {
		case Unavailable:
			fail(http.StatusServiceUnavailable, "SlowDown")
		case ServerError:
			fail(http.StatusInternalServerError, "InternalError")
		case Forbidden:
			fail(http.StatusForbidden, "InvalidAccessKeyId")
		case Drop:
			hangUp()
		case LosePutAnswer:
			if r.Method != http.MethodPut {
				rp.ServeHTTP(w, r)
				return
			}
			rp.ServeHTTP(httptest.NewRecorder(), r) // the store acts on it
			hangUp()
		case CorruptPut:
			if r.Method == http.MethodPut && r.ContentLength > 0 {
				body, err := io.ReadAll(r.Body)
				if err != nil {
					return
				}
				body[len(body)/2] ^= 0x01
				r.Body = io.NopCloser(bytes.NewReader(body))
			}
			rp.ServeHTTP(w, r)
		case Slow:
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
			rp.ServeHTTP(w, r)
		default:
			rp.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(p.Close)
	return p
}

// Set makes the proxy do f from now on.
func (p *FaultProxy) Set(f Fault) {
	p.mu.Lock()
	p.fault = f
	p.mu.Unlock()
}

// SetDelay is the delay of Slow.
func (p *FaultProxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Seen is how many requests met f.
func (p *FaultProxy) Seen(f Fault) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[f]
}

// Puts is how many PUT requests the proxy got for each path
// (/BUCKET/KEY) ending in suffix.
func (p *FaultProxy) Puts(suffix string) map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for path, n := range p.puts {
		if strings.HasSuffix(path, suffix) {
			out[path] = n
		}
	}
	return out
}

// URL is s.URL(prefix) through the proxy.
func (p *FaultProxy) URL(s *Server, prefix string) string {
	return strings.Replace(s.URL(prefix), url.QueryEscape(s.Endpoint), url.QueryEscape(p.Server.URL), 1)
}
