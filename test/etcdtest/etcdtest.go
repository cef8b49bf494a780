package etcdtest

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/procnet"
)

const (
	// startTimeout bounds a member's start (until it listens) and a
	// cluster's wait for every member to be healthy, on a loaded machine.
	startTimeout = 60 * time.Second
	// stopTimeout bounds Stop's wait for etcd to exit after SIGTERM (a
	// leader first tries to hand its leadership over) before SIGKILL.
	stopTimeout = 30 * time.Second
	// healthTimeout bounds one /health request.
	healthTimeout = 3 * time.Second
	// logTail is how many lines of each member's log a failed test shows.
	logTail = 30
)

// Binary returns the etcd binary's path ($ETCD, else etcd on PATH), or an
// error naming where it looked and how to install it.
func Binary() (string, error) {
	if p := os.Getenv("ETCD"); p != "" {
		if st, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("etcdtest: ETCD=%s: %v", p, err)
		} else if st.IsDir() {
			return "", fmt.Errorf("etcdtest: ETCD=%s is a directory", p)
		}
		return p, nil
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	return "", errors.New("etcdtest: etcd not found ($ETCD unset, no etcd on PATH); " +
		"install etcd 3.4 with apt-get install etcd-server (as .ci/run does) or set ETCD to the binary")
}

// Cluster is a set of etcd members started together, one initial
// cluster.
type Cluster struct {
	// Dir holds every member's data directory, log and peer socket; it is
	// every member's working directory, removed at cleanup.
	Dir string
	// Token is the --initial-cluster-token, new for each cluster.
	Token string

	t       testing.TB
	bin     string
	initial string // --initial-cluster
	members []*Server
	tls     *TLS // nil: plain HTTP
}

func (c *Cluster) scheme() string {
	if c.tls != nil {
		return "https://"
	}
	return "http://"
}

// Server is one etcd member.
type Server struct {
	// Name is its member name (m0, m1, …).
	Name string
	// DataDir is its --data-dir.
	DataDir string
	// LogFile holds its output, every run appended.
	LogFile string
	// PeerURL is its peer URL, a Unix socket in Cluster.Dir (see the
	// package comment).
	PeerURL string

	c    *Cluster
	addr string // 127.0.0.1:PORT, the client address its first run got

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil when not running
	done   chan struct{} // closed when the last run has exited
	err    error         // that run's Wait result, once done is closed
	paused bool
}

// Start starts a one-member cluster and returns its member; see
// StartCluster.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartCluster(t, 1).Member(0)
}

// TLS serves a cluster's client URLs over TLS (https://) with the
// member's certificate, and requires clients to present a certificate of
// CAFile (etcd's --client-cert-auth). The harness's own requests (/health)
// present ClientCert.
type TLS struct {
	CertFile, KeyFile             string // the members' certificate
	CAFile                        string // verifies clients, and the members for the harness
	ClientCertFile, ClientKeyFile string
}

// StartTLS is Start with t's client URLs over TLS.
func StartTLS(t testing.TB, tc TLS) *Server {
	t.Helper()
	return startCluster(t, 1, &tc).Member(0)
}

// StartCluster starts an n-member cluster on 127.0.0.1 and returns once
// every member is healthy. Its cleanup kills every member and removes its
// directory, logging each member's log tail if t failed. Any failure fails
// t.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return startCluster(t, n, nil)
}

func startCluster(t testing.TB, n int, tc *TLS) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("etcdtest: a cluster of %d members", n)
	}
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Dir: t.TempDir(), Token: "etcdtest-" + randomHex(8), t: t, bin: bin, tls: tc}
	var initial []string
	for i := range n {
		s := &Server{
			Name:    fmt.Sprintf("m%d", i),
			PeerURL: fmt.Sprintf("unix://peer-%d:0", i),
			c:       c,
		}
		s.DataDir = filepath.Join(c.Dir, s.Name)
		s.LogFile = filepath.Join(c.Dir, s.Name+".log")
		c.members = append(c.members, s)
		initial = append(initial, s.Name+"="+s.PeerURL)
	}
	c.initial = strings.Join(initial, ",")
	t.Cleanup(c.cleanup)
	// All at once: no member of a new cluster is ready before a quorum is
	// up, but each binds its client port at once.
	for _, s := range c.members {
		s.launch("127.0.0.1:0")
	}
	deadline := time.Now().Add(startTimeout)
	for _, s := range c.members {
		addr, exited := s.waitListening(deadline)
		if exited {
			t.Fatalf("etcdtest: %s exited at start (%v):\n%s", s.Name, s.exitErr(), harness.TailFile(s.LogFile, logTail))
		}
		s.addr = addr
	}
	c.WaitHealthy()
	return c
}

// Member returns member i (0 ≤ i < n).
func (c *Cluster) Member(i int) *Server {
	c.t.Helper()
	if i < 0 || i >= len(c.members) {
		c.t.Fatalf("etcdtest: member %d of a cluster of %d", i, len(c.members))
	}
	return c.members[i]
}

// Members returns every member, in order.
func (c *Cluster) Members() []*Server { return append([]*Server(nil), c.members...) }

// Endpoints returns every member's client URL, running or not (a member
// keeps its address across restarts).
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, s := range c.members {
		out = append(out, s.Endpoint())
	}
	return out
}

// WaitHealthy waits until every member that runs and is not paused
// answers /health with true (it has a leader and can commit), within
// startTimeout; else it fails the test with each unhealthy member's error.
func (c *Cluster) WaitHealthy() {
	c.t.Helper()
	var pending []*Server
	for _, s := range c.members {
		if s.Running() && !s.Paused() {
			pending = append(pending, s)
		}
	}
	c.waitHealthy(pending)
}

func (c *Cluster) waitHealthy(members []*Server) {
	c.t.Helper()
	lastErr := map[*Server]error{}
	for _, s := range members {
		lastErr[s] = errors.New("not asked yet")
	}
	poll(time.Now().Add(startTimeout), func() bool {
		ok := true
		for _, s := range members { // healthy once is enough
			if lastErr[s] != nil {
				lastErr[s] = s.Healthy()
				ok = ok && lastErr[s] == nil
			}
		}
		return ok
	})
	var bad []string
	for _, s := range members {
		if err := lastErr[s]; err != nil {
			bad = append(bad, fmt.Sprintf("%s (%s): %v", s.Name, s.addr, err))
		}
	}
	if len(bad) > 0 {
		c.t.Fatalf("etcdtest: not healthy after %v: %s", startTimeout, strings.Join(bad, "; "))
	}
}

// cleanup kills every member and, if the test failed, logs their log
// tails.
func (c *Cluster) cleanup() {
	for _, s := range c.members {
		s.signal(syscall.SIGKILL, 0)
	}
	if c.t.Failed() {
		for _, s := range c.members {
			c.t.Logf("etcdtest: %s log (%s), last %d lines:\n%s", s.Name, s.LogFile, logTail, harness.TailFile(s.LogFile, logTail))
		}
	}
}

// Endpoint is the member's client URL, http://127.0.0.1:PORT: the same
// before a stop and after a start.
func (s *Server) Endpoint() string { return s.c.scheme() + s.addr }

// Endpoints is []string{Endpoint()}, for a client of a one-member
// cluster.
func (s *Server) Endpoints() []string { return []string{s.Endpoint()} }

// Addr is the member's client address, 127.0.0.1:PORT.
func (s *Server) Addr() string { return s.addr }

// Cluster is the cluster s belongs to.
func (s *Server) Cluster() *Cluster { return s.c }

// Running reports whether the member's process runs (paused or not).
func (s *Server) Running() bool {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Paused reports whether Pause stopped the member and Resume has not
// woken it.
func (s *Server) Paused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused && s.cmd != nil
}

// PID is the running process's id, 0 when none runs.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Healthy asks the member's /health once: nil when it answers true.
func (s *Server) Healthy() error {
	tr := &http.Transport{DisableKeepAlives: true}
	if tc := s.c.tls; tc != nil {
		cfg, err := tc.clientConfig()
		if err != nil {
			return err
		}
		tr.TLSClientConfig = cfg
	}
	client := &http.Client{Timeout: healthTimeout, Transport: tr}
	resp, err := client.Get(s.Endpoint() + "/health")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return err
	}
	var h struct {
		Health string `json:"health"`
	}
	if err := json.Unmarshal(body, &h); err != nil {
		return fmt.Errorf("/health answered %s %q: %v", resp.Status, body, err)
	}
	if h.Health != "true" {
		return fmt.Errorf("/health answered %s", body)
	}
	return nil
}

// WaitHealthy waits until the member answers /health with true, within
// startTimeout; else it fails the test.
func (s *Server) WaitHealthy() {
	s.c.t.Helper()
	s.c.waitHealthy([]*Server{s})
}

// Start starts the member again, on its data directory and at its client
// address (see the package comment), and returns once it listens: before
// it has rejoined a quorum if none is up (WaitHealthy waits for that). It
// fails the test if the member runs or does not come up.
func (s *Server) Start() {
	t := s.c.t
	t.Helper()
	if s.Running() {
		t.Fatalf("etcdtest: %s is already running", s.Name)
	}
	deadline := time.Now().Add(startTimeout)
	for {
		from := harness.FileSize(s.LogFile)
		s.launch(s.addr)
		got, exited := s.waitListening(deadline)
		out := harness.ReadFrom(s.LogFile, from)
		switch {
		case exited && !strings.Contains(out, syscall.EADDRINUSE.Error()):
			t.Fatalf("etcdtest: %s exited at start (%v):\n%s", s.Name, s.exitErr(), harness.Tail(out, logTail))
		case !exited && got != s.addr:
			t.Fatalf("etcdtest: %s listens on %s, want %s", s.Name, got, s.addr)
		case !exited:
			return
		}
		// Its address was taken while it was down.
		t.Logf("etcdtest: %s: its address %s was taken while it was down (%s); starting it again once it is free",
			s.Name, s.addr, lastLine(out))
		if !poll(deadline, func() bool { return bindable(s.addr) }) {
			t.Fatalf("etcdtest: %s's address %s is still taken after %v", s.Name, s.addr, startTimeout)
		}
	}
}

// Stop stops the member with SIGTERM (etcd's graceful stop) and waits for
// it to exit; after stopTimeout it sends SIGKILL and says so in the test's
// log. No-op when it does not run.
func (s *Server) Stop() {
	if _, late := s.signal(syscall.SIGTERM, stopTimeout); late {
		s.c.t.Logf("etcdtest: %s did not exit within %v of SIGTERM; killed", s.Name, stopTimeout)
	}
}

// Kill kills the member with SIGKILL (a crash) and waits for it to be
// gone. No-op when it does not run.
func (s *Server) Kill() { s.signal(syscall.SIGKILL, 0) }

// Pause stops the member's process with SIGSTOP: it keeps its sockets but
// answers nothing, to its peers or its clients, until Resume.
func (s *Server) Pause() { s.pauseResume(syscall.SIGSTOP, true) }

// Resume lets a paused member go on (SIGCONT).
func (s *Server) Resume() { s.pauseResume(syscall.SIGCONT, false) }

func (s *Server) pauseResume(sig syscall.Signal, paused bool) {
	s.c.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.c.t.Fatalf("etcdtest: %s does not run", s.Name)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.c.t.Fatalf("etcdtest: %s: %v: %v", s.Name, sig, err)
	}
	s.paused = paused
}

// launch starts one run of etcd with its clients on listen (host:port),
// output appended to LogFile.
func (s *Server) launch(listen string) {
	t := s.c.t
	t.Helper()
	logf, err := os.OpenFile(s.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{
		"--name", s.Name,
		"--data-dir", s.DataDir,
		"--listen-client-urls", s.c.scheme() + listen,
		"--advertise-client-urls", s.c.scheme() + "127.0.0.1:0",
		"--listen-peer-urls", s.PeerURL,
		"--initial-advertise-peer-urls", s.PeerURL,
		"--initial-cluster", s.c.initial,
		"--initial-cluster-state", "new", // ignored once DataDir holds a member
		"--initial-cluster-token", s.c.Token,
		"--enable-grpc-gateway=false",
		"--logger", "zap", "--log-outputs", "stderr",
	}
	if tc := s.c.tls; tc != nil {
		args = append(args, "--cert-file", tc.CertFile, "--key-file", tc.KeyFile, "--trusted-ca-file", tc.CAFile, "--client-cert-auth")
	}
	cmd := exec.Command(s.c.bin, args...)
	cmd.Dir = s.c.Dir // where the peer sockets are
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// etcd reads ETCD_* variables as flags: none of the test's.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + s.c.Dir}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("etcdtest: start %s: %v", s.c.bin, err)
	}
	done := make(chan struct{})
	s.mu.Lock()
	s.cmd, s.done, s.err, s.paused = cmd, done, nil, false
	s.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(done)
	}()
}

// waitListening waits until the running process listens on 127.0.0.1
// and returns that address, or until it exits (exited is true). It fails
// the test if neither happens by the deadline.
func (s *Server) waitListening(deadline time.Time) (addr string, exited bool) {
	t := s.c.t
	t.Helper()
	s.mu.Lock()
	pid, done := s.cmd.Process.Pid, s.done
	s.mu.Unlock()
	var lastErr error
	poll(deadline, func() bool {
		select {
		case <-done:
			exited = true
			return true
		default:
		}
		addrs, err := procnet.Listening(pid)
		lastErr = err
		for _, a := range addrs {
			if a.Addr().String() == "127.0.0.1" {
				addr = a.String()
				return true
			}
		}
		return false
	})
	if exited {
		s.mu.Lock()
		s.cmd = nil
		s.mu.Unlock()
		return "", true
	}
	if addr == "" {
		t.Fatalf("etcdtest: %s does not listen on 127.0.0.1 after %v (last: %v):\n%s",
			s.Name, startTimeout, lastErr, harness.TailFile(s.LogFile, logTail))
	}
	return addr, false
}

// exitErr is the exit error of the last run, once it has exited.
func (s *Server) exitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// signal sends sig to the running process (SIGCONT first, if it is
// paused) and waits for it to exit: with timeout 0 for as long as it
// takes, else up to timeout and then it sends SIGKILL (late is true). It
// returns the run's exit error; nil and not late when nothing runs.
func (s *Server) signal(sig syscall.Signal, timeout time.Duration) (err error, late bool) {
	s.mu.Lock()
	cmd, done, paused := s.cmd, s.done, s.paused
	s.cmd, s.paused = nil, false
	s.mu.Unlock()
	if cmd == nil {
		return nil, false
	}
	cmd.Process.Signal(sig)
	if paused && sig != syscall.SIGKILL {
		cmd.Process.Signal(syscall.SIGCONT) // a stopped process acts on SIGTERM only once woken
	}
	if timeout > 0 {
		select {
		case <-done:
		case <-time.After(timeout):
			cmd.Process.Signal(syscall.SIGKILL)
			<-done
			late = true
		}
	} else {
		<-done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err, late
}

// poll calls cond until it is true or deadline passes, backing off from 5
// to 200 ms between calls; it reports whether cond came true.
func poll(deadline time.Time, cond func() bool) bool {
	delay := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(delay)
		delay = min(delay*2, 200*time.Millisecond)
	}
	return true
}

// bindable reports whether a listener could bind addr now (the probe is
// closed at once; it only tells when a restart may try again).
func bindable(addr string) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return strings.TrimSpace(s)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// clientConfig is the harness's TLS client: the members verified against
// CAFile, ClientCert presented.
func (tc *TLS) clientConfig() (*tls.Config, error) {
	pem, err := os.ReadFile(tc.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("etcdtest: no certificate in %s", tc.CAFile)
	}
	pair, err := tls.LoadX509KeyPair(tc.ClientCertFile, tc.ClientKeyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}
