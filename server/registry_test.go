package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

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
	s = startHookedServer(t, dir, nil, hooks{beforeOpen: func(k proto.TimelineKey) {
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
	q, err := proposer.Dial(quick, proposer.DialConfig{Addr: addr, TenantID: tTenant, TimelineID: fast})
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
