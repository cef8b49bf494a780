package server

import (
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

// TestWALBudgetForgetsTenantAfterPush: after a push whose messages the
// owner gave back in group commits, the tenant holds no share entry.
func TestWALBudgetForgetsTenantAfterPush(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	p.push(200, 8000, 0)
	waitFor(t, "the tenant's budget share to be dropped", func() bool {
		return s.reg.Budget().Tenants() == 0
	})
}
