package server

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

// TestStalledPushersOfOneTenantDoNotStopOthers: connections of one tenant
// that announce a 1 MiB body and then stall hold at most that tenant's
// share of the WAL budget: another tenant's proposer still streams, and the
// stalled tenant's own other timelines wait. (Before, the budget was shared
// by all: 32 such connections stopped every tenant's ingest.)
func TestStalledPushersOfOneTenantDoNotStopOthers(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.MaxBufferedWAL = 4 << 20 })
	addr := s.Addr().String()
	// Eight timelines of tenant tTenant, handshakes done, then each
	// announces a 1 MiB body and stalls: 8 MiB, twice the whole budget.
	var stalled []*testPush
	for i := 0; i < 8; i++ {
		p := newTestPush(t, addr, proto.ID{0xbb, byte(10 + i)}, 1, hist1(tStart), tStart)
		p.heartbeat()
		stalled = append(stalled, p)
	}
	for _, p := range stalled {
		hdr := []byte{'d', 0, 0, 0, 0}
		binary.BigEndian.PutUint32(hdr[1:], 1<<20+4)
		if _, err := p.c.NetConn().Write(append(hdr, 'a')); err != nil {
			t.Fatal(err)
		}
	}
	// Another tenant streams.
	other := proto.ID{0xcd, 1}
	saved := tTenant
	tTenant = other
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	tTenant = saved
	_, resp := p.push(20, 8000, 0)
	if resp.FlushLSN != p.pos {
		t.Fatalf("the other tenant's push: flush_lsn %s, want %s", resp.FlushLSN, p.pos)
	}
}

// TestBudgetForgetsIdleTenants: a tenant's share is kept only while it
// holds or waits for budget, so tenant churn does not grow the map; a
// share dropped and made again is whole.
func TestBudgetForgetsIdleTenants(t *testing.T) {
	b := newBudget(4 << 20)
	ctx := context.Background()
	for i := range 100 {
		id := proto.ID{0xee, byte(i)}
		if err := b.acquire(ctx, id, b.share); err != nil {
			t.Fatal(err)
		}
		b.release(id, b.share)
	}
	// One that waits and gives up, one that holds.
	held := proto.ID{0xee, 0xff}
	if err := b.acquire(ctx, held, b.share); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.acquire(cctx, held, 1); err == nil {
		t.Fatal("an acquire over the tenant's share succeeded")
	}
	if n := len(b.tenants); n != 1 {
		t.Fatalf("%d tenants remembered, want 1 (the one holding budget)", n)
	}
	b.release(held, b.share)
	if n := len(b.tenants); n != 0 {
		t.Fatalf("%d tenants remembered after every release, want 0", n)
	}
	if err := b.acquire(ctx, held, b.share); err != nil {
		t.Fatalf("the whole share again: %v", err)
	}
	b.release(held, b.share)
	// The owner gives back a group commit's messages in one release.
	for range 3 {
		if err := b.acquire(ctx, held, 1000); err != nil {
			t.Fatal(err)
		}
	}
	b.release(held, 3000)
	if n := len(b.tenants); n != 0 {
		t.Fatalf("%d tenants remembered after one release of three acquires, want 0", n)
	}
}

// TestWALBudgetForgetsTenantAfterPush: after a push whose messages the
// owner gave back in group commits, the tenant holds no share entry.
func TestWALBudgetForgetsTenantAfterPush(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	p.push(200, 8000, 0)
	waitFor(t, "the tenant's budget share to be dropped", func() bool {
		s.walBudget.mu.Lock()
		defer s.walBudget.mu.Unlock()
		return len(s.walBudget.tenants) == 0
	})
}
