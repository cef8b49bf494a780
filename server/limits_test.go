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
