package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server"
)

// TestStatusAndTimelineCommands: `status`, `timeline list` and `timeline
// show` read a running safekeeper's HTTP API, as tables or (--json) as the
// API's JSON; an unknown timeline is one line naming the 404 and exit 1; an
// unreachable API is one line and exit 1.
func TestStatusAndTimelineCommands(t *testing.T) {
	srv, err := server.New(server.Config{NodeID: 5, ListenPG: "127.0.0.1:0", ListenHTTP: "127.0.0.1:0", DataDir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-served
	})
	httpAddr := srv.HTTPAddr().String()
	// A timeline: a greeting creates it.
	tenant, timeline := proto.ID{0xa1}, proto.ID{0xb2}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := proposer.Dial(ctx, proposer.DialConfig{Addr: srv.Addr().String(), TenantID: tenant, TimelineID: timeline})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if err := pc.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: 424242, TenantID: tenant,
		TimelineID: timeline, PgTimeline: 1, WalSegSize: 16 << 20, ProposerUUID: proto.ID{1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(append([]string{"safekeeper"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, stderr := cli("status", "--http", httpAddr)
	if code != 0 || !strings.Contains(out, "node id") || !strings.Contains(out, "5") || !strings.Contains(out, "timelines") {
		t.Fatalf("status: exit %d\n%s%s", code, out, stderr)
	}
	code, out, _ = cli("status", "--http", httpAddr, "--json")
	var st map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st["id"] != 5.0 || st["timelines"] != 1.0 {
		t.Fatalf("status --json: exit %d %q", code, out)
	}
	code, out, _ = cli("timeline", "list", "--http", httpAddr)
	if code != 0 || !strings.Contains(out, "TENANT") || !strings.Contains(out, tenant.String()) || !strings.Contains(out, timeline.String()) {
		t.Fatalf("timeline list: exit %d\n%s", code, out)
	}
	code, out, stderr = cli("timeline", "show", "--http", httpAddr, "--tenant-id", tenant.String(), "--timeline-id", timeline.String())
	if code != 0 || !strings.Contains(out, "system id") || !strings.Contains(out, "424242") || !strings.Contains(out, "16777216") ||
		!strings.Contains(out, "proposer") || !strings.Contains(out, "readers: 0") {
		t.Fatalf("timeline show: exit %d\n%s%s", code, out, stderr)
	}
	code, _, stderr = cli("timeline", "show", "--http", httpAddr, "--tenant-id", tenant.String(), "--timeline-id", proto.ID{9}.String())
	if code != 1 || !strings.Contains(stderr, "HTTP 404 not_found") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Fatalf("timeline show of an unknown timeline: exit %d %q", code, stderr)
	}
	code, _, stderr = cli("status", "--http", "127.0.0.1:1")
	if code != 1 || !strings.Contains(stderr, "cannot reach the safekeeper's HTTP API at 127.0.0.1:1") {
		t.Fatalf("status of nothing: exit %d %q", code, stderr)
	}
	if code, _, _ := cli("timeline", "show", "--http", httpAddr); code != exitUsage {
		t.Fatalf("timeline show without ids: exit %d, want %d", code, exitUsage)
	}

	// timeline delete: refused while the proposer's connection is open,
	// then done with --force.
	ids := []string{"--http", httpAddr, "--tenant-id", tenant.String(), "--timeline-id", timeline.String()}
	code, _, stderr = cli(append([]string{"timeline", "delete"}, ids...)...)
	if code != 1 || !strings.Contains(stderr, "HTTP 409 busy") {
		t.Fatalf("timeline delete with a proposer connected: exit %d %q", code, stderr)
	}
	code, out, stderr = cli(append([]string{"timeline", "delete", "--force"}, ids...)...)
	if code != 0 || !strings.Contains(out, "deleted timeline "+tenant.String()+"/"+timeline.String()+" (its connections were ended)") {
		t.Fatalf("timeline delete --force: exit %d\n%s%s", code, out, stderr)
	}
	if _, err := pc.Recv(ctx); err == nil || !strings.Contains(err.Error(), "57P01") {
		t.Fatalf("the proposer's connection after the delete: %v, want FATAL 57P01", err)
	}
	code, out, _ = cli("timeline", "list", "--http", httpAddr)
	if code != 0 || strings.Contains(out, timeline.String()) {
		t.Fatalf("timeline list after the delete: exit %d\n%s", code, out)
	}
	code, _, stderr = cli(append([]string{"timeline", "delete"}, ids...)...)
	if code != 1 || !strings.Contains(stderr, "HTTP 404 not_found") {
		t.Fatalf("second timeline delete: exit %d %q", code, stderr)
	}
}
