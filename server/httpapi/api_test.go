package httpapi_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/server/timeline"
	"github.com/safekeeper/safekeeper/storage"
)

// host is a process as the API reads it.
type host struct {
	stopping atomic.Bool
	refused  atomic.Pointer[httpapi.WALRefused]
}

func (h *host) Stopping() bool                  { return h.stopping.Load() }
func (h *host) PGAddr() net.Addr                { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5454} }
func (h *host) WALRefused() *httpapi.WALRefused { return h.refused.Load() }
func (h *host) Connections() int                { return 3 }
func (h *host) CheckWritable() error            { return nil }
func (h *host) FileSize() int64                 { return 1 << 20 }

// TestAPIOverTheRegistry: the API stands on the timeline registry and a
// Host alone (no server): status, the timeline list and detail and a
// delete through the Client, a timeline the registry does not hold is 404
// not_found, and a stopping registry's refusal is 503 shutting_down.
func TestAPIOverTheRegistry(t *testing.T) {
	db, err := storage.Open(filepath.Join(t.TempDir(), timeline.DatabaseFile), storage.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	reg := timeline.NewRegistry(db, timeline.Config{NodeID: 1})
	defer reg.Close()
	key := proto.TimelineKey{TenantID: proto.ID{0xaa, 1}, TimelineID: proto.ID{0xbb, 1}}
	if _, err := reg.OpenOrCreate(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: 42,
		TenantID: key.TenantID, TimelineID: key.TimelineID, PgTimeline: 1, WalSegSize: 16 << 20}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &host{}
	api := httpapi.New(ln, httpapi.Config{NodeID: 7, DataDir: t.TempDir(), Version: "test", Registry: reg, Host: h,
		Metrics: httpapi.NewMetrics(time.Second), ReadTimeout: 10 * time.Second, IdleTimeout: time.Minute})
	go api.Serve(nil)
	defer api.Shutdown(context.Background())
	c := httpapi.NewClient(ln.Addr().String(), nil, "")
	ctx := context.Background()

	st, _, err := c.Status(ctx)
	if err != nil || st.ID != 7 || st.Version != "test" || st.Timelines != 1 || st.ListenPG != "127.0.0.1:5454" || st.WALRefused != nil {
		t.Fatalf("status: %+v %v", st, err)
	}
	h.refused.Store(&httpapi.WALRefused{Reason: httpapi.RefusedMaxDiskUsage, Detail: "full", Since: time.Now()})
	if st, _, err = c.Status(ctx); err != nil || st.WALRefused == nil || st.WALRefused.Reason != httpapi.RefusedMaxDiskUsage {
		t.Fatalf("status with the breaker tripped: %+v %v", st, err)
	}
	list, _, err := c.Timelines(ctx)
	if err != nil || len(list) != 1 || list[0].TenantID != key.TenantID.String() || list[0].TimelineID != key.TimelineID.String() {
		t.Fatalf("timelines: %+v %v", list, err)
	}
	tl, _, err := c.Timeline(ctx, key)
	if err != nil || tl.SystemID != 42 || tl.WalSegSize != 16<<20 || tl.Proposer != nil || tl.Readers == nil || tl.Slots == nil {
		t.Fatalf("timeline: %+v %v", tl, err)
	}
	other := proto.TimelineKey{TenantID: key.TenantID, TimelineID: proto.ID{0xbb, 2}}
	if _, _, err := c.Timeline(ctx, other); err == nil || !strings.Contains(err.Error(), "(HTTP 404 not_found)") {
		t.Fatalf("a timeline not held: %v, want 404 not_found", err)
	}
	res, _, err := c.DeleteTimeline(ctx, key, false, false)
	if err != nil || !res.DirExisted || res.WasActive {
		t.Fatalf("delete: %+v %v", res, err)
	}
	if _, _, err := c.Timeline(ctx, key); err == nil || !strings.Contains(err.Error(), "(HTTP 404 not_found)") {
		t.Fatalf("the deleted timeline: %v, want 404 not_found", err)
	}
	reg.Stop()
	if _, _, err := c.Timeline(ctx, other); err == nil || !strings.Contains(err.Error(), "(HTTP 503 shutting_down)") {
		t.Fatalf("a timeline asked for while the registry stops: %v, want 503 shutting_down", err)
	}
	var he *httpapi.HTTPSError
	if errors.As(err, &he) {
		t.Fatalf("%v is no HTTPS error", err)
	}
}
