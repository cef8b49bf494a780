package server

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
)

// TestTimelineAndSlotLimits: a greeting that would create a timeline past
// MaxTimelines gets 53400 and creates nothing; a slot past MaxSlots gets
// 53400 "all replication slots are in use", temporary ones counted; both
// are counted in safekeeper_refused_total.
func TestTimelineAndSlotLimits(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.MaxTimelines, c.MaxSlots = 2, 2 })
	addr := s.Addr().String()
	newTestPush(t, addr, proto.ID{0xbb, 1}, 1, hist1(tStart), tStart)
	newTestPush(t, addr, proto.ID{0xbb, 2}, 1, hist1(tStart), tStart)
	ctx := testCtx(t)
	c, err := proposer.Dial(ctx, proposer.DialConfig{Addr: addr, TenantID: tTenant, TimelineID: proto.ID{0xbb, 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
		TimelineID: proto.ID{0xbb, 3}, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xcc}})
	_, err = c.Recv(ctx)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != pgwire.ConfigurationLimitExceeded {
		t.Fatalf("third timeline: %v, want 53400", err)
	}
	if keys, _ := s.db.Timelines(); len(keys) != 2 {
		t.Fatalf("timelines stored: %v", keys)
	}
	rc := replConnect(t, addr, false, "-c tenant_id="+tTenant.String()+" -c timeline_id="+proto.ID{0xbb, 1}.String())
	if _, err := exec(t, rc, `CREATE_REPLICATION_SLOT "a" PHYSICAL`); err != nil {
		t.Fatal(err)
	}
	if _, err := exec(t, rc, `CREATE_REPLICATION_SLOT "b" TEMPORARY PHYSICAL`); err != nil {
		t.Fatal(err)
	}
	_, err = exec(t, rc, `CREATE_REPLICATION_SLOT "c" PHYSICAL`)
	if e := wantCode(t, err, pgwire.ConfigurationLimitExceeded); e.Message != "all replication slots are in use" || e.Hint == "" {
		t.Fatalf("third slot: %+v", e)
	}
	if _, err := exec(t, rc, `DROP_REPLICATION_SLOT "a"`); err != nil {
		t.Fatal(err)
	}
	if _, err := exec(t, rc, `CREATE_REPLICATION_SLOT "c" PHYSICAL`); err != nil {
		t.Fatalf("a slot after one was dropped: %v", err)
	}
	if n := testutil.ToFloat64(s.metrics.refused.WithLabelValues("timelines")); n != 1 {
		t.Errorf("refused timelines %v", n)
	}
	if n := testutil.ToFloat64(s.metrics.refused.WithLabelValues("slots")); n != 1 {
		t.Errorf("refused slots %v", n)
	}
}

// TestAutoDiskReserve: --min-free-disk auto keeps 2% of the file system,
// at most 1 GiB, but at least twice the WAL buffer (what is written after
// the breaker trips), that floor at most a quarter of the file system.
func TestAutoDiskReserve(t *testing.T) {
	const (
		mib    = 1 << 20
		gib    = 1 << 30
		buffer = 32 * mib // Config.MaxBufferedWAL's default
	)
	for _, c := range []struct {
		name   string
		total  uint64
		buffer int64
		want   uint64
	}{
		{"empty", 0, buffer, 0},
		{"a 16 MiB tmpfs: a quarter", 16 * mib, buffer, 4 * mib},
		{"a 64 MiB tmpfs: a quarter, not 2% (1.3 MiB)", 64 * mib, buffer, 16 * mib},
		{"256 MiB: the quarter meets twice the buffer", 256 * mib, buffer, 64 * mib},
		{"1 GiB: twice the buffer, not 2% (20 MiB)", gib, buffer, 64 * mib},
		{"3200 MiB: 2% is twice the buffer", 3200 * mib, buffer, 64 * mib},
		{"10 GiB: 2%", 10 * gib, buffer, 10 * gib / 50},
		{"50 GiB: 2% is 1 GiB", 50 * gib, buffer, gib},
		{"1 TiB: at most 1 GiB", 1024 * gib, buffer, gib},
		{"a larger buffer raises the floor", 10 * gib, 256 * mib, 512 * mib},
		{"a buffer above 1 GiB: the floor wins over the cap", 1024 * gib, 2 * gib, 4 * gib},
	} {
		if got := autoDiskReserve(c.total, c.buffer); got != c.want {
			t.Errorf("%s: autoDiskReserve(%d, %d) = %d, want %d", c.name, c.total, c.buffer, got, c.want)
		}
	}
}
