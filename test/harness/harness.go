package harness

import (
	"bytes"
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

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Safekeeper is one safekeeper process.
type Safekeeper struct {
	t        testing.TB
	ID       uint64
	Addr     string // 127.0.0.1:port
	HTTPAddr string // the HTTP API's 127.0.0.1:port
	DataDir  string
	LogPath  string
	Args     []string // extra flags for run

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's result once done is closed
}

// StartSafekeeper starts `safekeeper run` with node id id on a free port
// and a fresh data directory, and waits until it accepts connections.
func StartSafekeeper(t testing.TB, id uint64, extra ...string) *Safekeeper {
	t.Helper()
	dir := t.TempDir()
	sk := &Safekeeper{
		t: t, ID: id, Addr: "127.0.0.1:" + strconv.Itoa(FreePort(t)), HTTPAddr: "127.0.0.1:" + strconv.Itoa(FreePort(t)),
		DataDir: filepath.Join(dir, "data"), LogPath: filepath.Join(dir, "safekeeper.log"), Args: extra,
	}
	t.Cleanup(func() {
		sk.Kill()
		if t.Failed() {
			t.Logf("safekeeper %d log tail:\n%s", sk.ID, tail(sk.LogPath, 40))
		}
	})
	sk.Start()
	return sk
}

// Start (re)starts the process on the same port and data directory.
func (sk *Safekeeper) Start() {
	sk.t.Helper()
	sk.mu.Lock()
	if sk.cmd != nil {
		sk.mu.Unlock()
		sk.t.Fatalf("safekeeper %d already running", sk.ID)
	}
	logf, err := os.OpenFile(sk.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		sk.mu.Unlock()
		sk.t.Fatal(err)
	}
	args := append([]string{"--log-level", "debug", "run", "--id", strconv.FormatUint(sk.ID, 10),
		"--listen-pg", sk.Addr, "--listen-http", sk.HTTPAddr, "--data-dir", sk.DataDir}, sk.Args...)
	cmd := exec.Command(Binary(sk.t), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		sk.mu.Unlock()
		logf.Close()
		sk.t.Fatalf("start safekeeper: %v", err)
	}
	done := make(chan struct{})
	sk.cmd, sk.done = cmd, done
	go func() {
		err := cmd.Wait()
		logf.Close()
		sk.mu.Lock()
		sk.err = err
		sk.mu.Unlock()
		close(done)
	}()
	sk.mu.Unlock()
	WaitFor(sk.t, 15*time.Second, fmt.Sprintf("safekeeper %d listening on %s", sk.ID, sk.Addr), func() bool {
		select {
		case <-done:
			sk.t.Fatalf("safekeeper %d exited at start: %v\n%s", sk.ID, sk.err, tail(sk.LogPath, 30))
		default:
		}
		c, err := net.DialTimeout("tcp", sk.Addr, time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

// Kill sends SIGKILL and waits for the process to be gone. No-op if stopped.
func (sk *Safekeeper) Kill() {
	sk.mu.Lock()
	cmd, done := sk.cmd, sk.done
	sk.cmd = nil
	sk.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Stop sends SIGTERM and returns the exit error (nil for exit 0); it fails
// the test if the process is still running after timeout.
func (sk *Safekeeper) Stop(timeout time.Duration) error {
	sk.t.Helper()
	sk.mu.Lock()
	cmd, done := sk.cmd, sk.done
	sk.cmd = nil
	sk.mu.Unlock()
	if cmd == nil {
		return nil
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(timeout):
		cmd.Process.Signal(syscall.SIGKILL)
		<-done
		sk.t.Fatalf("safekeeper %d did not exit within %v of SIGTERM", sk.ID, timeout)
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	return sk.err
}

// Restart kills the process with SIGKILL and starts it again.
func (sk *Safekeeper) Restart() {
	sk.t.Helper()
	sk.Kill()
	sk.Start()
}

// PID returns the process id of the running process, 0 when it is stopped.
// Benchmarks read its /proc entries (I/O counters, RSS) and attach tracers.
func (sk *Safekeeper) PID() int {
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if sk.cmd == nil || sk.cmd.Process == nil {
		return 0
	}
	return sk.cmd.Process.Pid
}

// Log returns the process's log so far.
func (sk *Safekeeper) Log() string {
	b, _ := os.ReadFile(sk.LogPath)
	return string(b)
}

// WaitFor polls cond until it is true, failing the test with what after
// timeout. It is the harness's only way to wait: no fixed sleeps.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	delay := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(delay)
		delay = min(delay*2, 200*time.Millisecond)
	}
}

// Context returns a context cancelled after d or at the end of the test.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
