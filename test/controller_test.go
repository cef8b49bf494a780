package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/etcdtest"
	"github.com/safekeeper/safekeeper/test/harness"
)

// controllerListenLine is the line `safekeeper controller` logs once its
// HTTP API listens, with the address it got (the test passes port 0).
var controllerListenLine = regexp.MustCompile(`msg="controller listening" .*?\bhttp=(\S+)`)

// startController starts `safekeeper controller` on 127.0.0.1:0 and returns
// it with its HTTP address.
func startController(t *testing.T, name string, etcd []string, extra ...string) (*harness.Process, string) {
	t.Helper()
	p := harness.StartProcess(t, name, append([]string{"controller", "--listen-http", "127.0.0.1:0"}, append(etcdArgs(etcd), extra...)...)...)
	var addr string
	harness.WaitFor(t, 15*time.Second, name+" to listen", func() bool {
		p.CheckRunning()
		if m := controllerListenLine.FindStringSubmatch(p.Log()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return p, addr
}

// isLeader is the controller's safekeeper_controller_is_leader, -1 when
// it cannot be read.
func isLeader(t *testing.T, addr string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "safekeeper_controller_is_leader "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	return -1
}

// registerNodes registers n nodes in-process, node i in zone z<i%zones>
// (the processes are not the point where it is used).
func registerNodes(t *testing.T, ec *fleet.Client, n, zones int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r, err := ec.Register(ctx, fleet.RegisterConfig{Node: fleet.Node{ID: uint64(i), Zone: fmt.Sprintf("z%d", i%zones), PG: fmt.Sprintf("10.0.0.%d:5454", i)},
			Instance: fmt.Sprintf("host%d:/data", i), TTL: 30 * time.Second})
		cancel()
		if err != nil {
			t.Fatalf("register node %d: %v", i, err)
		}
		t.Cleanup(r.Close)
	}
}

// TestControllerPausedLeaderIsFenced: two controllers with a 2 s election
// TTL; the leader is paused (SIGSTOP) past the TTL and the other leads (its
// /metrics says is_leader 1) and places a timeline. Two placements reach
// the paused one: one it had taken as the leader before it stopped (the
// headers and half the body; the rest arrives while it is stopped), one
// sent whole while it is stopped (it waits in the socket). After SIGCONT
// both are answered 503 and neither timeline's key is written: the first
// is refused by the election fence (503 fenced: the controller did not
// know it was deposed when it wrote; without the fence it writes), the
// second by the fence or by the controller knowing by then (503
// not_leader). The paused one logs that it lost the leadership, and
// campaigns again (a follower now).
func TestControllerPausedLeaderIsFenced(t *testing.T) {
	etcd := etcdtest.Start(t).Endpoints()
	ec, err := fleet.Connect(fleet.ClientConfig{Endpoints: etcd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ec.Close() })
	registerNodes(t, ec, 3, 3)

	a, aAddr := startController(t, "controller-a", etcd, "--election-ttl", "2s", "--log-level", "debug")
	harness.WaitFor(t, 20*time.Second, "controller a to lead", func() bool { return isLeader(t, aAddr) == 1 })
	_, bAddr := startController(t, "controller-b", etcd, "--election-ttl", "2s")
	harness.WaitFor(t, 20*time.Second, "controller b to campaign", func() bool {
		r, err := ec.Etcd().Get(context.Background(), ec.ElectionPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 2
	})
	if v := isLeader(t, bAddr); v != 0 {
		t.Fatalf("b's is_leader %v while a leads", v)
	}

	// A placement under way when the leader stops: a sends the headers
	// and half the body, and a takes its term (it logs "placing as the
	// leader") and waits for the rest.
	tl1, tl2, tl3 := proto.ID{0xc1, 1}, proto.ID{0xc1, 2}, proto.ID{0xc1, 3}
	conn, err := net.Dial("tcp", aAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"replicas": 3}`
	if _, err := fmt.Fprintf(conn, "POST /v1/tenant/%s/timeline/%s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		tenant(1), tl3, aAddr, len(body), body[:8]); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 10*time.Second, "a to take the placement of "+tl3.String()+" as the leader", func() bool {
		return strings.Contains(harness.LastLine(a.Log(), "placing as the leader"), tl3.String())
	})

	if err := syscall.Kill(a.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// kill returns before every thread has stopped: a request sent at
	// once could still be served (and written, as the leader it still
	// is) before the stop takes hold.
	harness.WaitFor(t, 10*time.Second, "every thread of controller a to be stopped", func() bool { return allStopped(a.PID()) })
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(a.PID(), syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	type answer struct {
		code int
		body map[string]any
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		cl := &http.Client{Timeout: 2 * time.Minute}
		resp, err := cl.Post("http://"+aAddr+"/v1/tenant/"+tenant(1).String()+"/timeline/"+tl1.String(), "application/json", nil)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		var m map[string]any
		err = json.NewDecoder(resp.Body).Decode(&m)
		answered <- answer{resp.StatusCode, m, err}
	}()

	harness.WaitFor(t, 30*time.Second, "controller b to lead while a is paused", func() bool { return isLeader(t, bAddr) == 1 })
	if l, err := ec.Leader(context.Background()); err != nil || l != bAddr {
		t.Fatalf("the election's leader is %q (%v); want b at %s", l, err, bAddr)
	}
	select {
	case ans := <-answered:
		t.Fatalf("the paused controller answered: %+v", ans)
	default:
	}
	// The new leader works meanwhile.
	resp, err := http.Post("http://"+bAddr+"/v1/tenant/"+tenant(1).String()+"/timeline/"+tl2.String(), "application/json", strings.NewReader(`{"replicas": 3}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("placement on the new leader: %d", resp.StatusCode)
	}

	// The rest of the body waits in the socket too.
	if _, err := io.WriteString(conn, body[8:]); err != nil {
		t.Fatal(err)
	}

	resume()
	// The placement under way: a's term ended while it was stopped, but it
	// does not know before it writes; the fence refuses the write.
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	r3, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the placement under way when a stopped: %v", err)
	}
	var m3 map[string]any
	err = json.NewDecoder(r3.Body).Decode(&m3)
	r3.Body.Close()
	if err != nil || r3.StatusCode != http.StatusServiceUnavailable || m3["code"] != "fenced" || m3["leader"] != bAddr {
		t.Fatalf("the placement under way when a stopped: %d %v (%v); want 503 fenced, leader %s", r3.StatusCode, m3, err, bAddr)
	}
	var ans answer
	select {
	case ans = <-answered:
	case <-time.After(60 * time.Second):
		t.Fatal("the resumed controller did not answer the placement in 60 s")
	}
	if ans.err != nil || ans.code != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(ans.body["error"]), "not the leader") {
		t.Fatalf("the resumed controller answered %d %v (%v); want 503, not the leader", ans.code, ans.body, ans.err)
	}
	t.Logf("the stale leader's answer: %d %v", ans.code, ans.body)
	for _, tl := range []proto.ID{tl1, tl3} {
		if got, err := ec.Etcd().Get(context.Background(), ec.TimelineKey(tenant(1), tl)); err != nil || len(got.Kvs) != 0 {
			t.Fatalf("the stale leader wrote %s: %s (%v)", ec.TimelineKey(tenant(1), tl), got.Kvs, err)
		}
	}
	if got, err := ec.Etcd().Get(context.Background(), ec.TimelineKey(tenant(1), tl2)); err != nil || len(got.Kvs) != 1 {
		t.Fatalf("the new leader's placement is not in etcd: %v (%v)", got, err)
	}
	harness.WaitFor(t, 20*time.Second, "a to log the lost leadership", func() bool {
		return strings.Contains(a.Log(), "lost the controller leadership") || strings.Contains(a.Log(), "fenced write")
	})
	harness.WaitFor(t, 20*time.Second, "a to campaign again", func() bool {
		r, err := ec.Etcd().Get(context.Background(), ec.ElectionPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 2 && isLeader(t, aAddr) == 0
	})
	if l, _ := ec.Leader(context.Background()); l != bAddr {
		t.Errorf("after a's return the leader is %q; want b (%s)", l, bAddr)
	}
}

// clusterStatus runs `cluster status --json` and decodes it.
func clusterStatus(t *testing.T, etcd []string) fleet.ClusterStatus {
	t.Helper()
	code, stdout, stderr := harness.Run(t, append([]string{"cluster", "status", "--json"}, etcdArgs(etcd)...)...)
	if code != 0 {
		t.Fatalf("cluster status --json: exit %d: %s", code, stderr)
	}
	var s fleet.ClusterStatus
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatalf("cluster status --json: %v: %q", err, stdout)
	}
	return s
}

// TestClusterStatus: three `safekeeper run` registered in three zones, two
// timelines on all three, and a hand-written garbage configuration key.
// `cluster status` shows every node live with its two timelines and
// capacity, three zones, the garbage key as an error naming it, and no
// controller; one safekeeper stopped, it shows it down and no timeline
// below quorum (two of three live); a second stopped, both timelines are
// listed below quorum with the one live member. Usage errors exit 2, etcd
// unreachable 1 naming the endpoint.
func TestClusterStatus(t *testing.T) {
	etcd := etcdtest.Start(t).Endpoints()
	sks, ec := fleetOf(t, etcd, 3, 3)
	tl1, tl2 := proto.ID{0xc2, 1}, proto.ID{0xc2, 2}
	for _, tl := range []proto.ID{tl1, tl2} {
		if _, err := ec.Place(context.Background(), tenant(1), tl, 3); err != nil {
			t.Fatal(err)
		}
	}
	garbage := ec.Prefix() + "/timelines/" + tenant(1).String() + "/not-a-timeline"
	if _, err := ec.Etcd().Put(context.Background(), garbage, `{"generation": 1, "members": [1, 2, 3]}`); err != nil {
		t.Fatal(err)
	}
	// The registrations' capacity follows the timelines created (at most
	// every 5 s); the configurations count at once.
	s := clusterStatus(t, etcd)
	if len(s.Nodes) != 3 || len(s.Zones) != 3 || s.Timelines != 2 || len(s.BelowQuorum) != 0 || s.Leader != "" {
		t.Fatalf("cluster status: %+v; want 3 nodes in 3 zones, 2 timelines, none below quorum, no leader", s)
	}
	for i, n := range s.Nodes {
		if n.ID != uint64(i+1) || !n.Live || n.Timelines != 2 || n.Capacity == nil || n.Capacity.DiskTotalBytes == 0 ||
			n.AdvertisePG != sks[i].Addr || n.AdvertiseHTTP != sks[i].HTTPAddr || n.Zone != fmt.Sprintf("z%d", i) {
			t.Errorf("node %d: %+v; want live in z%d at %s/%s with 2 timelines and a capacity", i+1, n, i, sks[i].Addr, sks[i].HTTPAddr)
		}
	}
	if len(s.Errors) != 1 || !strings.Contains(s.Errors[0], garbage) {
		t.Errorf("errors %q; want one naming %s", s.Errors, garbage)
	}
	code, stdout, stderr := harness.Run(t, append([]string{"cluster", "status"}, etcdArgs(etcd)...)...)
	if code != 0 || !strings.Contains(stdout, "3 live, 0 down; timelines: 2; below quorum: 0; controller leader: none") ||
		!strings.Contains(stdout, "error: ") || !strings.Contains(stdout, garbage) {
		t.Errorf("cluster status: exit %d\n%s%s", code, stdout, stderr)
	}

	if err := sks[2].Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 20*time.Second, "node 3 down in cluster status", func() bool {
		s = clusterStatus(t, etcd)
		return len(s.Nodes) == 3 && !s.Nodes[2].Live
	})
	if !s.Nodes[0].Live || !s.Nodes[1].Live || s.Nodes[2].Timelines != 2 || s.Nodes[2].Capacity != nil || len(s.BelowQuorum) != 0 {
		t.Errorf("node 3 stopped: %+v; want 1 and 2 live, 3 down still holding 2 timelines, none below quorum", s)
	}
	if err := sks[1].Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 20*time.Second, "node 2 down in cluster status", func() bool {
		s = clusterStatus(t, etcd)
		return len(s.Nodes) == 3 && !s.Nodes[1].Live
	})
	if len(s.BelowQuorum) != 2 {
		t.Fatalf("two of three members down: below quorum %+v; want both timelines", s.BelowQuorum)
	}
	for i, q := range s.BelowQuorum {
		want := []proto.ID{tl1, tl2}[i]
		if q.Tenant != tenant(1).String() || q.Timeline != want.String() || fmt.Sprint(q.Live) != "[1]" || len(q.Members) != 3 {
			t.Errorf("below quorum %d: %+v; want %s with live [1] of 3 members", i, q, want)
		}
	}
	code, stdout, _ = harness.Run(t, append([]string{"cluster", "status"}, etcdArgs(etcd)...)...)
	if code != 0 || !strings.Contains(stdout, "1 live, 2 down") || !strings.Contains(stdout, "below quorum") ||
		!strings.Contains(stdout, tenant(1).String()+"/"+tl1.String()) || !strings.Contains(stdout, tenant(1).String()+"/"+tl2.String()) {
		t.Errorf("cluster status with two down: exit %d\n%s", code, stdout)
	}

	// Usage and an unreachable etcd.
	if code, _, stderr := harness.Run(t, "cluster", "status"); code != 2 || !strings.Contains(stderr, "etcd-endpoints") {
		t.Errorf("cluster status without --etcd-endpoints: exit %d %q; want 2", code, stderr)
	}
	if code, _, stderr := harness.Run(t, "cluster", "status", "--etcd-endpoints", "127.0.0.1:2379"); code != 2 {
		t.Errorf("cluster status with an endpoint that is no URL: exit %d %q; want 2", code, stderr)
	}
	dead := "http://" + harness.RefusedAddr(t)
	if code, _, stderr := harness.Run(t, "cluster", "status", "--etcd-endpoints", dead); code != 1 || !strings.Contains(stderr, dead) {
		t.Errorf("cluster status with etcd unreachable: exit %d %q; want 1 naming %s", code, stderr, dead)
	}
}

// allStopped reports whether every thread of process pid is stopped by a
// signal (state T in /proc/PID/task/TID/stat).
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// The state follows the command's closing parenthesis.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}
