package harness

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a long-running safekeeper subcommand other than run, e.g.
// `safekeeper propose ...`: started with Start, stopped by t.Cleanup.
type Process struct {
	t       testing.TB
	Name    string   // names it in failures
	Args    []string // full argument list after the binary
	LogPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartProcess starts the safekeeper binary with args, logging to a file in
// a test temporary directory.
func StartProcess(t testing.TB, name string, args ...string) *Process {
	t.Helper()
	p := &Process{t: t, Name: name, Args: args, LogPath: filepath.Join(t.TempDir(), name+".log")}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("%s log tail:\n%s", name, TailFile(p.LogPath, 60))
		}
	})
	p.Start()
	return p
}

// Start (re)starts the process.
func (p *Process) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.t.Fatalf("%v already running", p.Args)
	}
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(Binary(p.t), p.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		p.t.Fatalf("start %v: %v", p.Args, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.err = cmd, done, nil
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
}

// Exited reports whether the process has exited, and its exit code.
func (p *Process) Exited() (bool, int) {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return true, 0
	}
	select {
	case <-done:
	default:
		return false, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return true, ee.ExitCode()
	}
	return true, 0
}

// CheckRunning fails the test if the process has exited, naming its exit
// code and the tail of its log. For the test goroutine (a WaitFor
// condition, say) only.
func (p *Process) CheckRunning() {
	p.t.Helper()
	if exited, code := p.Exited(); exited {
		p.t.Fatalf("%s exited with code %d:\n%s", p.Name, code, TailFile(p.LogPath, 40))
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Process) Kill() { p.signal(syscall.SIGKILL, 0) }

// Stop sends SIGTERM and waits up to timeout, then SIGKILL (failing the test).
func (p *Process) Stop(timeout time.Duration) error {
	p.t.Helper()
	return p.signal(syscall.SIGTERM, timeout)
}

func (p *Process) signal(sig syscall.Signal, timeout time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	cmd.Process.Signal(sig)
	if timeout > 0 {
		select {
		case <-done:
		case <-time.After(timeout):
			cmd.Process.Signal(syscall.SIGKILL)
			<-done
			p.t.Errorf("%v did not exit within %v of %v", p.Args, timeout, sig)
		}
	} else {
		<-done
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// PID returns the process id of the running process, 0 when it is stopped.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Log returns the process's log so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}
