package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// binDirPrefix names the temporary directories Binary builds into:
// safekeeper-bin-<pid of the test process>-<random>.
const binDirPrefix = "safekeeper-bin-"

// Main runs a test binary's tests (call it from TestMain) and then removes
// the safekeeper binary Binary built for them. First it removes the build
// directories of earlier test processes that are gone without removing
// theirs (killed by go test's -timeout, or by a signal).
func Main(m *testing.M) {
	removeStaleBuilds()
	code := m.Run()
	if buildPath != "" {
		os.RemoveAll(filepath.Dir(buildPath))
	}
	os.Exit(code)
}

// removeStaleBuilds removes every safekeeper-bin-<pid>-* directory in the
// temporary directory whose process no longer exists.
func removeStaleBuilds() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), binDirPrefix+"*"))
	for _, d := range dirs {
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(d), binDirPrefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 {
			continue // not ours, or from a build without the pid: leave it
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
}

// Binary builds ./cmd/safekeeper once per test process and returns its path.
// SAFEKEEPER_BIN overrides it with a prebuilt binary. A package that calls
// it runs its tests through Main, which removes the build.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("SAFEKEEPER_BIN"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		root, err := ModuleRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", binDirPrefix, os.Getpid()))
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "safekeeper")
		cmd := exec.Command("go", "build", "-o", buildPath, "./cmd/safekeeper")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("harness: %v", buildErr)
	}
	return buildPath
}

// ModuleRoot is the directory of the safekeeper module's go.mod.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("harness: not inside the safekeeper module")
	}
	return filepath.Dir(mod), nil
}

// Safekeeper is one safekeeper process.
type Safekeeper struct {
	t  testing.TB
	ID uint64
	// Addr is the PostgreSQL-protocol listener's 127.0.0.1:port and
	// HTTPAddr the HTTP API's. The first Start asks for port 0 and reads
	// the ports the process bound from its log (ListenAddrs); every later
	// Start binds the same ones again, so that clients configured with
	// them (a proposer's --safekeepers, a standby's primary_conninfo)
	// find the restarted process. See Start for why that is safe.
	Addr     string
	HTTPAddr string
	DataDir  string
	LogPath  string
	Args     []string // extra flags for run

	proc child
}

// startTimeout bounds one Start: until the process logs that it listens,
// including, on a restart, the wait for its ports to be free again.
const startTimeout = 30 * time.Second

// StartSafekeeper starts `safekeeper run` with node id id, listening on
// 127.0.0.1 at ports the process binds itself (port 0), and a fresh data
// directory, and waits until it listens.
func StartSafekeeper(t testing.TB, id uint64, extra ...string) *Safekeeper {
	t.Helper()
	dir := t.TempDir()
	sk := &Safekeeper{
		t: t, ID: id,
		DataDir: filepath.Join(dir, "data"), LogPath: filepath.Join(dir, "safekeeper.log"), Args: extra,
	}
	t.Cleanup(func() {
		sk.Kill()
		if t.Failed() {
			t.Logf("safekeeper %d log tail:\n%s", sk.ID, TailFile(sk.LogPath, 40))
		}
	})
	sk.Start()
	return sk
}

// NewSafekeeper returns safekeeper id on an existing data directory (a
// copy of a stopped safekeeper's, say), not started: Start starts it on
// ports of its own (port 0). The same cleanup as StartSafekeeper's kills
// it; dataDir is the caller's to remove.
func NewSafekeeper(t testing.TB, id uint64, dataDir string, extra ...string) *Safekeeper {
	t.Helper()
	sk := &Safekeeper{t: t, ID: id, DataDir: dataDir, LogPath: filepath.Join(t.TempDir(), "safekeeper.log"), Args: extra}
	t.Cleanup(func() {
		sk.Kill()
		if t.Failed() {
			t.Logf("safekeeper %d log tail:\n%s", sk.ID, TailFile(sk.LogPath, 40))
		}
	})
	return sk
}

// Start (re)starts the process on the same data directory and returns once
// it has logged its "safekeeper listening" line; it fails the test if the
// process exits first. The first start binds port 0 and sets Addr and
// HTTPAddr from that line.
//
// A restart binds Addr and HTTPAddr again. These ports were the kernel's
// choice for this very process, not numbers probed and handed on, and
// between a stop and the next start the kernel gives them to nobody else
// in the usual case: most restarts follow the stop at once, and while the
// old process's connections linger in TIME_WAIT (a minute) neither an
// outgoing connection nor another server's port-0 bind is given the port.
// Only once it is wholly free can a new socket get it, one chance in the
// ephemeral range's thousands of ports. If that happened (the process
// exits with "address already in use"), Start waits until the port can be
// bound again (an outgoing connection ends) and starts it once more,
// within startTimeout; a listener that took it fails the test, naming the
// port. The alternative, a proxy in front of every safekeeper, would make
// every kill look like a reset instead of a refusal and add a hop to every
// byte.
func (sk *Safekeeper) Start() {
	sk.t.Helper()
	pg, http := sk.Addr, sk.HTTPAddr
	first := pg == ""
	if first {
		pg, http = "127.0.0.1:0", "127.0.0.1:0"
	}
	deadline := time.Now().Add(startTimeout)
	for {
		from := FileSize(sk.LogPath)
		args := append([]string{"--log-level", "debug", "run", "--id", strconv.FormatUint(sk.ID, 10),
			"--listen-pg", pg, "--listen-http", http, "--data-dir", sk.DataDir}, sk.Args...)
		done := sk.proc.launch(sk.t, fmt.Sprintf("safekeeper %d", sk.ID), sk.LogPath, args)
		var gotPG, gotHTTP string
		exited := false
		WaitFor(sk.t, time.Until(deadline), fmt.Sprintf("safekeeper %d to log %q", sk.ID, listeningMsg), func() bool {
			select {
			case <-done:
				exited = true
				return true
			default:
			}
			var ok bool
			gotPG, gotHTTP, ok = ListenAddrs(ReadFrom(sk.LogPath, from))
			return ok
		})
		if !exited {
			if first {
				sk.Addr, sk.HTTPAddr = gotPG, gotHTTP
			} else if gotPG != sk.Addr || gotHTTP != sk.HTTPAddr {
				sk.t.Fatalf("safekeeper %d restarted on %s (HTTP %s), want %s (HTTP %s)", sk.ID, gotPG, gotHTTP, sk.Addr, sk.HTTPAddr)
			}
			return
		}
		err := sk.proc.exitedRun()
		out := ReadFrom(sk.LogPath, from)
		if first || !strings.Contains(out, syscall.EADDRINUSE.Error()) {
			sk.t.Fatalf("safekeeper %d exited at start: %v\n%s", sk.ID, err, TailFile(sk.LogPath, 30))
		}
		sk.t.Logf("safekeeper %d: its address was taken while it was down (%s); starting it again once %s and %s are free",
			sk.ID, Tail(out, 1), pg, http)
		WaitFor(sk.t, time.Until(deadline), fmt.Sprintf("safekeeper %d's ports %s and %s to be free again", sk.ID, pg, http), func() bool {
			return bindable(pg) && (http == "" || bindable(http))
		})
	}
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

// FileSize is the size of path, 0 if it does not exist.
func FileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// ReadFrom returns path's contents from offset on ("" if it cannot be
// read or is shorter).
func ReadFrom(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}

// Kill sends SIGKILL and waits for the process to be gone. No-op if stopped.
func (sk *Safekeeper) Kill() { sk.proc.signal(syscall.SIGKILL, 0) }

// Stop sends SIGTERM and returns the exit error (nil for exit 0); it fails
// the test if the process is still running after timeout.
func (sk *Safekeeper) Stop(timeout time.Duration) error {
	sk.t.Helper()
	err, late := sk.proc.signal(syscall.SIGTERM, timeout)
	if late {
		sk.t.Fatalf("safekeeper %d did not exit within %v of SIGTERM", sk.ID, timeout)
	}
	return err
}

// Restart kills the process with SIGKILL and starts it again.
func (sk *Safekeeper) Restart() {
	sk.t.Helper()
	sk.Kill()
	sk.Start()
}

// PID returns the process id of the running process, 0 when it is stopped.
// Benchmarks read its /proc entries (I/O counters, RSS) and attach tracers.
func (sk *Safekeeper) PID() int { return sk.proc.pid() }

// Log returns the process's log so far.
func (sk *Safekeeper) Log() string {
	b, _ := os.ReadFile(sk.LogPath)
	return string(b)
}

// WaitFor polls cond until it is true, failing the test with what after
// timeout. It is the harness's only way to wait: no fixed sleeps.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// poll is WaitFor for any goroutine: it reports whether cond came true
// within timeout.
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
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

// Context returns a context cancelled after d or at the end of the test.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// ConnString returns a libpq connection string for sk's
// PostgreSQL-protocol listener that names timeline tenant/timeline in its
// startup options (-c tenant_id, -c timeline_id), as a reader of the
// timeline's WAL gives it: a standby's primary_conninfo, pg_receivewal's
// -d. Append keywords such as application_name as needed.
func (sk *Safekeeper) ConnString(tenant, timeline string) string {
	host, port, _ := strings.Cut(sk.Addr, ":")
	return fmt.Sprintf("host=%s port=%s user=postgres options='-c tenant_id=%s -c timeline_id=%s'", host, port, tenant, timeline)
}

// Run runs the binary with args to its end, within two minutes, and
// returns its exit code (-1 if it did not exit by itself), stdout and
// stderr: a command an operator types, such as `safekeeper sync`.
func Run(t testing.TB, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.CommandContext(Context(t, 2*time.Minute), Binary(t), args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Run()
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}
