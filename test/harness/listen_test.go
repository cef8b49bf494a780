package harness

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m) }

// TestListenAddrs: the last "safekeeper listening" line of a text or a JSON
// log names the addresses; other lines and a log without one do not.
func TestListenAddrs(t *testing.T) {
	for _, tc := range []struct {
		name, log, pg, http string
		ok                  bool
	}{
		{"text", `time=2025-01-01T00:00:00Z level=INFO msg="opening the database" path="/a b/c"
time=2025-01-01T00:00:00Z level=INFO msg="safekeeper listening" pg=127.0.0.1:40001 http=127.0.0.1:40002 node_id=1 data_dir="/tmp/x y" tls=false tls_required=false
`, "127.0.0.1:40001", "127.0.0.1:40002", true},
		{"text without http", `level=INFO msg="safekeeper listening" pg=[::]:5454 node_id=1` + "\n", "[::]:5454", "", true},
		{"the last start wins", `msg="safekeeper listening" pg=127.0.0.1:1 http=127.0.0.1:2
msg="safekeeper listening" pg=127.0.0.1:3 http=127.0.0.1:4
`, "127.0.0.1:3", "127.0.0.1:4", true},
		{"json", `{"time":"x","level":"INFO","msg":"safekeeper listening","pg":"127.0.0.1:5","http":"127.0.0.1:6","node_id":1,"tls":false}` + "\n", "127.0.0.1:5", "127.0.0.1:6", true},
		{"another message", `msg="not safekeeper listening" pg=127.0.0.1:7 http=127.0.0.1:8` + "\n", "", "", false},
		{"a value, not the message", `msg="shutting down" note="msg=\"safekeeper listening\" pg=127.0.0.1:9"` + "\n", "", "", false},
		{"empty", "", "", "", false},
	} {
		pg, http, ok := ListenAddrs(tc.log)
		if pg != tc.pg || http != tc.http || ok != tc.ok {
			t.Errorf("%s: ListenAddrs = %q, %q, %v; want %q, %q, %v", tc.name, pg, http, ok, tc.pg, tc.http, tc.ok)
		}
	}
}

// TestRefusedAddr: a connection to it is refused, and nobody can listen
// there while the test holds it.
func TestRefusedAddr(t *testing.T) {
	addr := RefusedAddr(t)
	if _, err := net.DialTimeout("tcp", addr, 5*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want ECONNREFUSED", addr, err)
	}
	if l, err := net.Listen("tcp", addr); !errors.Is(err, syscall.EADDRINUSE) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("listen on %s: %v, want EADDRINUSE", addr, err)
	}
}

// TestSafekeeperBindsItsOwnPorts: StartSafekeeper's process binds port 0
// and the harness learns the ports from its log; a restart (kill -9)
// listens on the same ones again, also when something held the port
// while it was down (the restart waits for it).
func TestSafekeeperBindsItsOwnPorts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	sk := StartSafekeeper(t, 1)
	for _, a := range []string{sk.Addr, sk.HTTPAddr} {
		if !strings.HasPrefix(a, "127.0.0.1:") || strings.HasSuffix(a, ":0") {
			t.Fatalf("addresses %q, %q: want 127.0.0.1 and the ports bound", sk.Addr, sk.HTTPAddr)
		}
	}
	ready := func() {
		t.Helper()
		c, err := net.DialTimeout("tcp", sk.Addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", sk.Addr, err)
		}
		c.Close()
		resp, err := http.Get("http://" + sk.HTTPAddr + "/healthz")
		if err != nil {
			t.Fatalf("GET /healthz: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /healthz: %s", resp.Status)
		}
	}
	ready()
	pg, httpAddr := sk.Addr, sk.HTTPAddr

	sk.Restart()
	if sk.Addr != pg || sk.HTTPAddr != httpAddr {
		t.Fatalf("after a restart: %s, %s; want %s, %s", sk.Addr, sk.HTTPAddr, pg, httpAddr)
	}
	ready()

	// The port taken while the process is down: the start fails with
	// "address already in use", and Start tries again once it is free.
	sk.Kill()
	holder, err := net.Listen("tcp", pg)
	if err != nil {
		t.Fatalf("hold %s: %v", pg, err)
	}
	from := FileSize(sk.LogPath)
	released := make(chan struct{})
	go func() {
		defer close(released)
		poll(startTimeout, func() bool { return strings.Contains(ReadFrom(sk.LogPath, from), syscall.EADDRINUSE.Error()) })
		holder.Close()
	}()
	sk.Start()
	<-released
	if !strings.Contains(ReadFrom(sk.LogPath, from), syscall.EADDRINUSE.Error()) {
		t.Fatalf("the start did not meet the held port:\n%s", ReadFrom(sk.LogPath, from))
	}
	if sk.Addr != pg {
		t.Fatalf("after the port was held: %s, want %s", sk.Addr, pg)
	}
	ready()
}
