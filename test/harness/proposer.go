package harness

import (
	"fmt"
	"os"
	"path/filepath"
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

	proc child
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
	p.proc.launch(p.t, fmt.Sprint(p.Args), p.LogPath, p.Args)
}

// Exited reports whether the process has exited, and its exit code.
func (p *Process) Exited() (bool, int) { return p.proc.exited() }

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
func (p *Process) Kill() { p.proc.signal(syscall.SIGKILL, 0) }

// Stop sends SIGTERM and waits up to timeout, then SIGKILL (failing the
// test); it returns the exit error (nil for exit 0).
func (p *Process) Stop(timeout time.Duration) error {
	p.t.Helper()
	err, late := p.proc.signal(syscall.SIGTERM, timeout)
	if late {
		p.t.Errorf("%v did not exit within %v of %v", p.Args, timeout, syscall.SIGTERM)
	}
	return err
}

// PID returns the process id of the running process, 0 when it is stopped.
func (p *Process) PID() int { return p.proc.pid() }

// Log returns the process's log so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}
