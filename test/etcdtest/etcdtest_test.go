package etcdtest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/safekeeper/safekeeper/test/etcdtest"
	"github.com/safekeeper/safekeeper/test/procnet"
)

const (
	// shortTimeout bounds each request: a write that must fail for want
	// of a quorum, and each try of one that must succeed (the same write
	// succeeds within it while the cluster is whole).
	shortTimeout = 2 * time.Second
	// recoverTimeout bounds the wait for writes to work again after a
	// fault (an election, a member rejoining).
	recoverTimeout = 60 * time.Second
)

// newClient is a client of endpoints, closed at cleanup.
func newClient(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("clientv3.New(%v): %v", endpoints, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func put(cli *clientv3.Client, timeout time.Duration, key, val string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err := cli.Put(ctx, key, val)
	return err
}

// mustPut puts key=val, trying again on an error within recoverTimeout:
// a request that meets an election (which a loaded machine can cause)
// fails with "leader changed" or times out, and putting the same value
// again is harmless.
func mustPut(t *testing.T, cli *clientv3.Client, what, key, val string) {
	t.Helper()
	eventually(t, what, func() error { return put(cli, shortTimeout, key, val) })
}

// mustGet reads key with a linearizable read (the client's default: it
// goes through the quorum and sees every write committed before it),
// trying again on an error within recoverTimeout, and returns its value.
// A read that succeeds without the key fails the test at once.
func mustGet(t *testing.T, cli *clientv3.Client, what, key string) string {
	t.Helper()
	var resp *clientv3.GetResponse
	eventually(t, what, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), shortTimeout)
		defer cancel()
		var err error
		resp, err = cli.Get(ctx, key)
		return err
	})
	if len(resp.Kvs) != 1 {
		t.Fatalf("%s: %d keys %q, want 1", what, len(resp.Kvs), key)
	}
	return string(resp.Kvs[0].Value)
}

// memberList is the cluster's members as one member sees them.
func memberList(t *testing.T, cli *clientv3.Client) *clientv3.MemberListResponse {
	t.Helper()
	var resp *clientv3.MemberListResponse
	eventually(t, "the member list", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), shortTimeout)
		defer cancel()
		var err error
		resp, err = cli.MemberList(ctx)
		return err
	})
	return resp
}

// eventually retries f until it returns nil, within recoverTimeout.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(recoverTimeout)
	delay := 10 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %v: %v", what, recoverTimeout, err)
		}
		time.Sleep(delay)
		delay = min(delay*2, 500*time.Millisecond)
	}
}

// A one-member server listens on a 127.0.0.1 port the kernel chose, which
// is its Endpoint, and a value put through the real client is read back.
func TestStartPutGet(t *testing.T) {
	s := etcdtest.Start(t)
	addrs, err := procnet.Listening(s.PID())
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].String() != s.Addr() || addrs[0].Port() == 0 {
		t.Fatalf("etcd (pid %d) listens on %v; Addr() = %s", s.PID(), addrs, s.Addr())
	}
	if got, want := s.Endpoint(), "http://"+s.Addr(); got != want {
		t.Fatalf("Endpoint() = %s, want %s", got, want)
	}

	cli := newClient(t, s.Endpoints()...)
	mustPut(t, cli, "put", "/test/k", "v1")
	if v := mustGet(t, cli, "get", "/test/k"); v != "v1" {
		t.Fatalf("get = %q, want v1", v)
	}
	members := memberList(t, cli)
	if len(members.Members) != 1 || members.Members[0].Name != s.Name {
		t.Fatalf("member list %v, want only %s", members.Members, s.Name)
	}
}

// Three members make one cluster: a write through one member is read
// through another (a linearizable read, through the quorum), and every
// member knows the other two by their Unix-socket peer URLs.
func TestClusterWriteThroughOneReadThroughAnother(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	eps := c.Endpoints()
	if len(eps) != 3 || eps[0] == eps[1] || eps[1] == eps[2] || eps[0] == eps[2] {
		t.Fatalf("Endpoints() = %v, want 3 different URLs", eps)
	}
	w := newClient(t, c.Member(0).Endpoint())
	r := newClient(t, c.Member(2).Endpoint())
	mustPut(t, w, "put through m0", "/test/k", "through m0")
	if v := mustGet(t, r, "get through m2", "/test/k"); v != "through m0" {
		t.Fatalf("get through m2 = %q, want %q", v, "through m0")
	}

	members := memberList(t, r)
	var got []string
	for _, m := range members.Members {
		got = append(got, m.Name+"="+strings.Join(m.PeerURLs, ","))
	}
	want := []string{"m0=unix://peer-0:0", "m1=unix://peer-1:0", "m2=unix://peer-2:0"}
	for _, w := range want {
		if !contains(got, w) || len(got) != len(want) {
			t.Fatalf("member list %v, want %v", got, want)
		}
	}
}

// With one member of three stopped the cluster still commits writes; with
// a second killed it commits none; with both started again (at their
// addresses, on their data) it commits again, and each restarted member
// serves what was written while it was down.
func TestClusterOutage(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cli := newClient(t, c.Endpoints()...)
	// The write that will fail without a quorum succeeds within the same
	// deadline while the cluster is whole.
	mustPut(t, cli, "a write to the whole cluster", "/test/k", "3 of 3")

	c.Member(0).Stop()
	if c.Member(0).Running() {
		t.Fatal("m0 runs after Stop")
	}
	mustPut(t, cli, "a write with 2 members of 3", "/test/k", "2 of 3")

	c.Member(1).Kill()
	err := put(cli, shortTimeout, "/test/lost", "1 of 3")
	if err == nil {
		t.Fatal("a write with 1 member of 3 succeeded")
	}
	t.Logf("a write with 1 member of 3: %v", err)

	addr0, addr1 := c.Member(0).Addr(), c.Member(1).Addr()
	c.Member(0).Start()
	c.Member(1).Start()
	if c.Member(0).Addr() != addr0 || c.Member(1).Addr() != addr1 {
		t.Fatalf("restarted at %s and %s, want %s and %s", c.Member(0).Addr(), c.Member(1).Addr(), addr0, addr1)
	}
	mustPut(t, cli, "a write once both are back", "/test/k", "3 of 3 again")
	for _, i := range []int{0, 1} {
		one := newClient(t, c.Member(i).Endpoint())
		what := fmt.Sprintf("a read through restarted m%d", i)
		if v := mustGet(t, one, what, "/test/k"); v != "3 of 3 again" {
			t.Fatalf("%s = %q, want %q", what, v, "3 of 3 again")
		}
	}
}

// A member paused (SIGSTOP) is as good as gone to its peers: with two of
// three paused no write commits; resumed, they serve again.
func TestClusterPauseResume(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cli := newClient(t, c.Member(2).Endpoint())
	mustPut(t, cli, "a write to the whole cluster", "/test/k", "before")

	c.Member(0).Pause()
	c.Member(1).Pause()
	if !c.Member(0).Paused() || !c.Member(0).Running() {
		t.Fatalf("m0: Paused() = %v, Running() = %v after Pause", c.Member(0).Paused(), c.Member(0).Running())
	}
	if err := put(cli, shortTimeout, "/test/lost", "paused"); err == nil {
		t.Fatal("a write with 2 members of 3 paused succeeded")
	}

	c.Member(0).Resume()
	c.Member(1).Resume()
	mustPut(t, cli, "a write once both resumed", "/test/k", "after")
	c.WaitHealthy()
}

// A member killed and started again keeps its address and its data.
func TestRestartKeepsAddressAndData(t *testing.T) {
	s := etcdtest.Start(t)
	cli := newClient(t, s.Endpoints()...)
	mustPut(t, cli, "put", "/test/k", "durable")
	addr, pid := s.Addr(), s.PID()
	s.Kill()
	if s.Running() || processExists(pid) {
		t.Fatalf("pid %d runs after Kill", pid)
	}
	s.Start()
	if s.Addr() != addr || s.PID() == pid {
		t.Fatalf("restarted as pid %d at %s, was pid %d at %s", s.PID(), s.Addr(), pid, addr)
	}
	addrs, err := procnet.Listening(s.PID())
	if err != nil || len(addrs) != 1 || addrs[0].String() != addr {
		t.Fatalf("the restarted etcd listens on %v (%v), want %s", addrs, err, addr)
	}
	s.WaitHealthy()
	if v := mustGet(t, cli, "a read after the restart", "/test/k"); v != "durable" {
		t.Fatalf("a read after the restart = %q, want durable", v)
	}
}

// A test that fails leaves no etcd running (a paused one included) and
// shows each member's log tail.
func TestCleanupOnFailure(t *testing.T) {
	rec := &recorder{TB: t}
	t.Cleanup(rec.cleanup) // if the cluster does not start, its members go too
	var pids []int
	rec.run(func() {
		c := etcdtest.StartCluster(rec, 3)
		for _, m := range c.Members() {
			pids = append(pids, m.PID())
		}
		c.Member(1).Pause()
		rec.Fatalf("the test fails")
	})
	if len(pids) != 3 {
		t.Fatalf("the cluster did not start: %v", rec.logs)
	}
	for _, pid := range pids {
		if !processExists(pid) {
			t.Fatalf("pid %d gone before cleanup", pid)
		}
	}
	rec.cleanup()
	for _, pid := range pids {
		if processExists(pid) {
			t.Errorf("pid %d still runs after cleanup", pid)
		}
	}
	logs := strings.Join(rec.logs, "\n")
	for _, name := range []string{"m0", "m1", "m2"} {
		if !strings.Contains(logs, "etcdtest: "+name+" log") {
			t.Errorf("no log tail of %s after a failure:\n%s", name, logs)
		}
	}
}

// A missing binary fails the test, naming the package to install; it
// never skips.
func TestMissingBinaryFails(t *testing.T) {
	t.Setenv("ETCD", "/nonexistent/etcd")
	rec := &recorder{TB: t}
	rec.run(func() { etcdtest.Start(rec) })
	rec.cleanup()
	if rec.skipped || !rec.failed {
		t.Fatalf("failed %v, skipped %v; want a failure", rec.failed, rec.skipped)
	}
	t.Setenv("ETCD", "")
	t.Setenv("PATH", t.TempDir())
	_, err := etcdtest.Binary()
	if err == nil || !strings.Contains(err.Error(), "etcd-server") {
		t.Fatalf("Binary() with no etcd on PATH: %v, want an error naming etcd-server", err)
	}
}

func processExists(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

// recorder is a testing.TB for a harness call that must fail: it records
// failures, skips and log lines instead of passing them on, ends the
// goroutine on Fatal or Skip as testing does, and runs its cleanups when
// told. Everything else goes to the real test.
type recorder struct {
	testing.TB
	mu       sync.Mutex
	failed   bool
	skipped  bool
	logs     []string
	cleanups []func()
}

// run calls f in a goroutine of its own (Fatal ends it) and waits.
func (r *recorder) run(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

// cleanup runs the registered cleanups, last first.
func (r *recorder) cleanup() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Helper()          {}
func (r *recorder) Log(args ...any)  { r.Logf("%s", fmt.Sprint(args...)) }
func (r *recorder) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fail() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
}
func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}
func (r *recorder) Error(args ...any)                 { r.Log(args...); r.Fail() }
func (r *recorder) Errorf(format string, args ...any) { r.Logf(format, args...); r.Fail() }
func (r *recorder) FailNow()                          { r.Fail(); runtime.Goexit() }
func (r *recorder) Fatal(args ...any)                 { r.Log(args...); r.FailNow() }
func (r *recorder) Fatalf(format string, args ...any) { r.Logf(format, args...); r.FailNow() }
func (r *recorder) SkipNow() {
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	runtime.Goexit()
}
func (r *recorder) Skip(args ...any)                 { r.Log(args...); r.SkipNow() }
func (r *recorder) Skipf(format string, args ...any) { r.Logf(format, args...); r.SkipNow() }
func (r *recorder) Skipped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.skipped
}
