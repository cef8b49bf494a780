package controller_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/fleet/controller"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/etcdtest"
	"github.com/safekeeper/safekeeper/test/harness"
)

func connect(t *testing.T, endpoints []string) *fleet.Client {
	t.Helper()
	c, err := fleet.Connect(fleet.ClientConfig{Endpoints: endpoints, Prefix: "/test-" + strings.ToLower(t.Name())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// nodes registers n nodes, node i in zone z<i%zones>.
func nodes(t *testing.T, c *fleet.Client, n, zones int) []*fleet.Registration {
	t.Helper()
	var regs []*fleet.Registration
	for i := 1; i <= n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r, err := c.Register(ctx, fleet.RegisterConfig{
			Node:     fleet.Node{ID: uint64(i), Zone: fmt.Sprintf("z%d", i%zones), PG: fmt.Sprintf("10.0.0.%d:5454", i)},
			Instance: fmt.Sprintf("host%d:/data", i), TTL: 10 * time.Second,
		})
		cancel()
		if err != nil {
			t.Fatalf("register node %d: %v", i, err)
		}
		t.Cleanup(r.Close)
		regs = append(regs, r)
	}
	return regs
}

type ctl struct {
	*controller.Controller
	url  string
	stop func()
}

// start runs a controller on 127.0.0.1:0 until the test ends (or stop).
func start(t *testing.T, c *fleet.Client, ttl time.Duration) *ctl {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k, err := controller.New(controller.Config{Client: c, Listener: ln, ElectionTTL: ttl, RefreshInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("controller Run: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return &ctl{Controller: k, url: "http://" + ln.Addr().String(), stop: stop}
}

// post sends a placement and returns the status and the decoded body.
func post(t *testing.T, base string, tenant, timeline string, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(base+"/v1/tenant/"+tenant+"/timeline/"+timeline, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("POST answered %d with no JSON: %q", resp.StatusCode, b)
	}
	return resp.StatusCode, m
}

// metric is the value of the series named exactly series ("name" or
// `name{label="x"}`) in base's /metrics.
func metric(t *testing.T, base, series string) (float64, bool) {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if ok && name == series {
			f, err := strconv.ParseFloat(val, 64)
			return f, err == nil
		}
	}
	return 0, false
}

const tenant = "0123456789abcdef0123456789abcdef"

func tl(n int) string { return fmt.Sprintf("%032x", n) }

// TestControllerFencedWrite: the leader's placement carries the election
// fence. Its election key deleted behind its back (as a lease expiry does
// while the process sleeps), the controller still believes it leads, yet
// its placement is answered 503 fenced and writes nothing; it then
// campaigns again, leads, and places.
func TestControllerFencedWrite(t *testing.T) {
	etcd := etcdtest.Start(t).Endpoints()
	c := connect(t, etcd)
	nodes(t, c, 3, 3)
	k := start(t, c, 2*time.Second)
	harness.WaitFor(t, 20*time.Second, "the controller to lead", func() bool {
		v, ok := metric(t, k.url, "safekeeper_controller_is_leader")
		return ok && v == 1
	})
	if resp, err := http.Get(k.url + "/healthz"); err != nil {
		t.Fatal(err)
	} else {
		var h map[string]any
		json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if resp.StatusCode != 200 || h["status"] != "ok" || h["leader"] != true {
			t.Errorf("GET /healthz: %d %v; want 200, ok, leader true", resp.StatusCode, h)
		}
	}
	code, m := post(t, k.url, tenant, tl(1), "")
	if code != http.StatusCreated || m["tenant_id"] != tenant || m["timeline_id"] != tl(1) || m["placed"] != true || m["zones"] != 3.0 || len(m["members"].([]any)) != 3 {
		t.Fatalf("first placement: %d %v; want 201, placed, 3 members in 3 zones", code, m)
	}
	if code, m = post(t, k.url, tenant, tl(1), `{"replicas": 3}`); code != http.StatusOK || m["placed"] != false || m["zones"] != 3.0 {
		t.Fatalf("second placement of the same timeline: %d %v; want 200, placed false, 3 zones", code, m)
	}

	// Delete the leader's key: it no longer leads, but has no way to know
	// before it writes.
	ctx := context.Background()
	resp, err := c.Etcd().Delete(ctx, c.ElectionPrefix(), clientv3.WithPrefix())
	if err != nil || resp.Deleted != 1 {
		t.Fatalf("delete the election key: %v, %d deleted", err, resp.Deleted)
	}
	if !k.IsLeader() {
		t.Fatal("the controller noticed the deletion before writing: the test no longer checks the fence")
	}
	code, m = post(t, k.url, tenant, tl(2), "")
	if code != http.StatusServiceUnavailable || m["code"] != "fenced" || !strings.Contains(m["error"].(string), "not the leader") {
		t.Fatalf("placement by a deposed leader: %d %v; want 503 fenced", code, m)
	}
	if _, ok := m["leader"]; !ok {
		t.Errorf("the fenced answer has no \"leader\": %v", m)
	}
	tid, _ := proto.ParseID(tenant)
	tl2, _ := proto.ParseID(tl(2))
	if got, err := c.Etcd().Get(ctx, c.TimelineKey(tid, tl2)); err != nil || len(got.Kvs) != 0 {
		t.Fatalf("the deposed leader wrote %s: %v (err %v)", c.TimelineKey(tid, tl2), got.Kvs, err)
	}
	if v, _ := metric(t, k.url, `safekeeper_controller_placement_errors_total{reason="fenced"}`); v != 1 {
		t.Errorf("placement_errors_total{reason=fenced} = %v; want 1", v)
	}
	// It campaigns again and leads.
	harness.WaitFor(t, 20*time.Second, "the controller to lead again", func() bool {
		l, err := c.Leader(ctx)
		return err == nil && l != "" && k.IsLeader()
	})
	if code, m = post(t, k.url, tenant, tl(2), ""); code != http.StatusCreated {
		t.Fatalf("placement after leading again: %d %v; want 201", code, m)
	}
	if v, _ := metric(t, k.url, "safekeeper_controller_placements_total"); v != 2 {
		t.Errorf("placements_total = %v; want 2", v)
	}
}

// TestControllerFollowerAndErrors: of two controllers one leads; the other
// answers placements 503 not_leader naming the leader. Bad ids and bodies
// are 400, more replicas than nodes 409 no_room, a garbage configuration
// key 409 naming it (and GET /v1/cluster lists it); the metrics count the
// fleet; the leader stopped, the other leads; two nodes gone, its metrics
// show two down and both timelines below quorum; etcd stopped, a placement
// is 503 naming etcd.
func TestControllerFollowerAndErrors(t *testing.T) {
	srv := etcdtest.Start(t)
	etcd := srv.Endpoints()
	c := connect(t, etcd)
	regs := nodes(t, c, 3, 2)
	a := start(t, c, 30*time.Second)
	harness.WaitFor(t, 20*time.Second, "a to lead", a.IsLeader)
	b := start(t, c, 30*time.Second)
	harness.WaitFor(t, 20*time.Second, "b to campaign", func() bool {
		r, err := c.Etcd().Get(context.Background(), c.ElectionPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 2
	})
	code, m := post(t, b.url, tenant, tl(1), "")
	if code != http.StatusServiceUnavailable || m["code"] != "not_leader" || m["leader"] != a.Advertise() ||
		!strings.Contains(m["error"].(string), "not the leader") {
		t.Fatalf("placement sent to the follower: %d %v; want 503 not_leader, leader %s", code, m, a.Advertise())
	}
	if v, _ := metric(t, b.url, "safekeeper_controller_is_leader"); v != 0 {
		t.Errorf("follower's is_leader = %v", v)
	}

	for _, bad := range []struct{ tenant, timeline, body string }{
		{"nothex", tl(1), ""},
		{tenant, "0123", ""},
		{tenant, tl(1), `{"replicas": "three"}`},
		{tenant, tl(1), `{"replica": 3}`},
		{tenant, tl(1), `{"replicas": 99}`},
		{tenant, tl(1), `{"replicas": 3} {}`},
	} {
		if code, m := post(t, a.url, bad.tenant, bad.timeline, bad.body); code != http.StatusBadRequest || m["code"] != "bad_request" {
			t.Errorf("POST %s/%s %q: %d %v; want 400 bad_request", bad.tenant, bad.timeline, bad.body, code, m)
		}
	}
	if code, m := post(t, a.url, tenant, tl(1), `{"replicas": 4}`); code != http.StatusConflict || m["code"] != "no_room" {
		t.Errorf("4 replicas on 3 nodes: %d %v; want 409 no_room", code, m)
	}
	code, m = post(t, a.url, tenant, tl(1), `{"replicas": 3}`)
	if code != http.StatusCreated || m["zones"] != 2.0 || m["spread"] == nil {
		t.Errorf("3 replicas over 2 zones: %d %v; want 201, zones 2, a spread note", code, m)
	}
	garbage := c.Prefix() + "/timelines/" + tenant + "/" + tl(7)
	if _, err := c.Etcd().Put(context.Background(), garbage, "{not json"); err != nil {
		t.Fatal(err)
	}
	if code, m := post(t, a.url, tenant, tl(7), ""); code != http.StatusConflict || m["code"] != "bad_config" || !strings.Contains(m["error"].(string), garbage) {
		t.Errorf("placement over a garbage key: %d %v; want 409 bad_config naming %s", code, m, garbage)
	}
	resp, err := http.Get(b.url + "/v1/cluster")
	if err != nil {
		t.Fatal(err)
	}
	var st fleet.ClusterStatus
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || st.Leader != a.Advertise() || len(st.Nodes) != 3 || st.Timelines != 1 ||
		len(st.Errors) != 1 || !strings.Contains(st.Errors[0], garbage) {
		t.Errorf("GET /v1/cluster: %d %+v (%v); want leader %s, 3 nodes, 1 timeline, 1 error naming %s", resp.StatusCode, st, err, a.Advertise(), garbage)
	}
	harness.WaitFor(t, 10*time.Second, "fleet metrics", func() bool {
		live, _ := metric(t, b.url, `safekeeper_fleet_nodes{state="live"}`)
		tls, _ := metric(t, b.url, "safekeeper_fleet_timelines")
		bad, _ := metric(t, b.url, "safekeeper_fleet_bad_keys")
		below, ok := metric(t, b.url, "safekeeper_fleet_timelines_below_quorum")
		return live == 3 && tls == 1 && bad == 1 && below == 0 && ok
	})

	// The leader stops (and resigns): b leads, at once rather than after
	// the 30 s TTL.
	a.stop()
	harness.WaitFor(t, 10*time.Second, "b to lead", b.IsLeader)
	if code, m := post(t, b.url, tenant, tl(2), ""); code != http.StatusCreated {
		t.Fatalf("placement on the new leader: %d %v", code, m)
	}

	// Two of the three nodes go: both timelines are below quorum.
	regs[1].Close()
	regs[2].Close()
	harness.WaitFor(t, 10*time.Second, "the fleet metrics to see two nodes down", func() bool {
		live, _ := metric(t, b.url, `safekeeper_fleet_nodes{state="live"}`)
		down, _ := metric(t, b.url, `safekeeper_fleet_nodes{state="down"}`)
		tls, _ := metric(t, b.url, "safekeeper_fleet_timelines")
		below, _ := metric(t, b.url, "safekeeper_fleet_timelines_below_quorum")
		return live == 1 && down == 2 && tls == 2 && below == 2
	})

	srv.Stop()
	code, m = post(t, b.url, tenant, tl(3), "")
	if code != http.StatusServiceUnavailable || m["code"] != "etcd_unavailable" || !strings.Contains(m["error"].(string), etcd[0]) {
		t.Errorf("placement with etcd down: %d %v; want 503 etcd_unavailable naming %s", code, m, etcd[0])
	}
}
