package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
)

// TestSlowTimelineOpenDoesNotStopOthers: opening a timeline may fsync.
// While one timeline's open hangs (a slow disk), the server still accepts
// connections and serves every other timeline — readers and a proposer's
// greeting alike — and a second client of the slow timeline waits for the
// same open instead of starting another; both are served once it ends.
func TestSlowTimelineOpenDoesNotStopOthers(t *testing.T) {
	dir := t.TempDir()
	fast := proto.ID{0xbb, 2}
	s := startTestServer(t, dir, nil)
	for _, tl := range []proto.ID{tTimeline, fast} {
		p := newTestPush(t, s.Addr().String(), tl, 1, hist1(tStart), tStart)
		p.push(2, 300, 0)
		p.c.Close()
	}
	shutdown(t, s)

	slow := proto.TimelineKey{TenantID: tTenant, TimelineID: tTimeline}
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	defer release() // a failing test must not leave the open hanging
	var opens atomic.Int32
	entered := make(chan struct{}, 4)
	// lazyOpen: the opens here are the clients', not the opens at start.
	s = startHookedServer(t, dir, nil, hooks{lazyOpen: true, beforeOpen: func(k proto.TimelineKey) {
		if k == slow {
			opens.Add(1)
			entered <- struct{}{}
			<-gate
		}
	}})
	addr := s.Addr().String()
	host, port, _ := strings.Cut(addr, ":")
	slowOpts := fmt.Sprintf("options='-c tenant_id=%s -c timeline_id=%s'", tTenant, tTimeline)
	results := make(chan error, 2)
	for range 2 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), tTimeout)
			defer cancel()
			c, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=tester sslmode=disable replication=true %s", host, port, slowOpts))
			if err != nil {
				results <- err
				return
			}
			defer c.Close(context.Background())
			_, err = c.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll()
			results <- err
		}()
	}
	select {
	case <-entered:
	case <-time.After(tTimeout):
		t.Fatal("the slow timeline's open never started")
	}

	// With the slow open in progress: a new connection, a reader and a
	// proposer of the other timeline are served, each within a short bound.
	quick, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgconn.Connect(quick, fmt.Sprintf("host=%s port=%s user=tester sslmode=disable replication=true options='-c tenant_id=%s -c timeline_id=%s'",
		host, port, tTenant, fast))
	if err != nil {
		t.Fatalf("connecting while another timeline opens: %v", err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(quick, "TIMELINE_STATUS").ReadAll(); err != nil {
		t.Fatalf("TIMELINE_STATUS of another timeline while one opens: %v", err)
	}
	q, err := proposer.Dial(quick, proposer.DialConfig{AllowTimelineCreation: true, Addr: addr, TenantID: tTenant, TimelineID: fast})
	if err != nil {
		t.Fatalf("START_WAL_PUSH while another timeline opens: %v", err)
	}
	defer q.Close()
	if err := q.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
		TimelineID: fast, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xdd}}); err != nil {
		t.Fatal(err)
	}
	if m, err := q.Recv(quick); err != nil {
		t.Fatalf("greeting another timeline while one opens: %v", err)
	} else if _, ok := m.(*proto.SafeKeeperInfo); !ok {
		t.Fatalf("greeting answered with %T", m)
	}

	select {
	case err := <-results:
		t.Fatalf("a reader of the slow timeline finished before its open did: %v", err)
	default:
	}
	release()
	for range 2 {
		if err := <-results; err != nil {
			t.Fatalf("reader of the slow timeline: %v", err)
		}
	}
	if n := opens.Load(); n != 1 {
		t.Fatalf("the slow timeline was opened %d times, want once (single-flight)", n)
	}
}

// TestShutdownWaitsForTimelineOpens: an open under way (here from the HTTP
// API, whose handlers Shutdown does not wait for) holds Shutdown until it
// ends: the data directory stays open under it, the open succeeds and its
// owner is stopped with the others. Opens asked for after shutdown began
// are refused.
func TestShutdownWaitsForTimelineOpens(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, dir, nil)
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	p.push(2, 300, 0)
	p.c.Close()
	shutdown(t, s)

	key := proto.TimelineKey{TenantID: tTenant, TimelineID: tTimeline}
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	defer release()
	entered := make(chan struct{}, 1)
	// lazyOpen: the open is the HTTP API's (openstored_test.go has the
	// opens at start).
	s = startHookedServer(t, dir, func(c *Config) { c.ListenHTTP = "127.0.0.1:0" }, hooks{lazyOpen: true, beforeOpen: func(k proto.TimelineKey) {
		if k == key {
			entered <- struct{}{}
			<-gate
		}
	}})
	go http.Get(fmt.Sprintf("http://%s/v1/tenant/%s/timeline/%s", s.HTTPAddr(), tTenant, tTimeline)) //nolint:errcheck // its answer is lost to the shutdown
	select {
	case <-entered:
	case <-time.After(tTimeout):
		t.Fatal("the open never started")
	}

	stopped := shutdownInBackground(t, s)
	if _, err := s.timelineByKey(proto.TimelineKey{TenantID: tTenant, TimelineID: proto.ID{0xbb, 9}}); err != errShutdown {
		t.Fatalf("an open asked for after shutdown began: %v, want errShutdown", err)
	}
	// Shutdown without the wait returns once the HTTP server's grace (1 s)
	// is over; give it twice that.
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned (%v) while a timeline open was under way", err)
	case <-time.After(2 * time.Second):
	}
	release()
	if err := <-stopped; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	tl := running(s, key)
	if tl == nil {
		t.Fatal("the open under way at shutdown failed")
	}
	select {
	case <-tl.Done():
	default:
		t.Fatal("Shutdown returned with the opened timeline's owner running")
	}
}

// shutdownInBackground starts s's Shutdown (bounded by tTimeout) and
// returns once it has begun; its result comes on the channel.
func shutdownInBackground(t *testing.T, s *Server) <-chan error {
	t.Helper()
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), tTimeout)
		defer cancel()
		stopped <- s.Shutdown(ctx)
	}()
	waitFor(t, "shutdown to begin", s.isStopping)
	return stopped
}

// TestGreetingCreatesTimelineOnlyWhenAllowed: a greeting creates a
// timeline the safekeeper does not hold only if its START_WAL_PUSH allows
// it. With (allow_timeline_creation false) it is FATAL 42704 naming the
// timeline, and nothing is stored: a mistyped id must not start a timeline.
// Allowed, and with no option at all (the WAL push protocol's rule 1 as
// version 1 states it), the greeting creates it. Once stored, a greeting
// not allowed to create finds it.
func TestGreetingCreatesTimelineOnlyWhenAllowed(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	info := func(tl proto.ID) *proto.ServerInfo {
		return &proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
			TimelineID: tl, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xcc, 1}, WalEnd: tStart}
	}
	greet := func(tl proto.ID, allow bool) (*proto.SafeKeeperInfo, error) {
		ctx := testCtx(t)
		c, err := proposer.Dial(ctx, proposer.DialConfig{AllowTimelineCreation: allow, Addr: addr, TenantID: tTenant, TimelineID: tl})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		if err := c.Send(info(tl)); err != nil {
			return nil, err
		}
		m, err := c.Recv(ctx)
		if err != nil {
			return nil, err
		}
		return m.(*proto.SafeKeeperInfo), nil
	}
	stored := func() []proto.TimelineKey {
		keys, err := s.db.Timelines()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}

	typo := proto.ID{0xbb, 0xee}
	_, err := greet(typo, false)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42704" || pe.Severity != "FATAL" ||
		!strings.Contains(pe.Message, proto.TimelineKey{TenantID: tTenant, TimelineID: typo}.String()) || !strings.Contains(pe.Detail, "allow_timeline_creation") {
		t.Fatalf("greeting a timeline not stored, creation not allowed: %v (%+v); want FATAL 42704 naming it", err, pe)
	}
	if keys := stored(); len(keys) != 0 {
		t.Fatalf("the refused greeting stored %v", keys)
	}

	if _, err := greet(tTimeline, true); err != nil {
		t.Fatalf("greeting allowed to create: %v", err)
	}
	if _, err := greet(tTimeline, false); err != nil {
		t.Fatalf("greeting a stored timeline, creation not allowed: %v", err)
	}

	// No option: version 1's START_WAL_PUSH creates.
	c := rawConnect(t, addr)
	c.write(rawQuery("START_WAL_PUSH\x00"))
	if _, ok := c.recv().(*pgproto3.CopyBothResponse); !ok {
		t.Fatal("START_WAL_PUSH without options: no CopyBothResponse")
	}
	third := proto.ID{0xbb, 0xef}
	payload := info(third).Encode(nil)
	b, _ := (&pgproto3.CopyData{Data: payload}).Encode(nil)
	c.write(b)
	if m, ok := c.recv().(*pgproto3.CopyData); !ok || len(m.Data) == 0 || m.Data[0] != 'I' {
		t.Fatalf("greeting after START_WAL_PUSH without options: got %+v, want SafeKeeperInfo", m)
	}
	want := map[proto.TimelineKey]bool{{TenantID: tTenant, TimelineID: tTimeline}: true, {TenantID: tTenant, TimelineID: third}: true}
	keys := stored()
	for _, k := range keys {
		delete(want, k)
	}
	if len(keys) != 2 || len(want) != 0 {
		t.Fatalf("stored timelines %v; want %s and %s", keys, tTimeline, third)
	}
}
