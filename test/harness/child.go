package harness

import (
	"errors"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// child is what Safekeeper and Process share: one run of the binary at a
// time, its output appended to a log file, its exit waited for by a
// goroutine of its own.
type child struct {
	mu   sync.Mutex
	cmd  *exec.Cmd     // nil when not running
	done chan struct{} // closed when the last run has exited
	err  error         // that run's Wait result, once done is closed
}

// launch starts the binary with args, appending stdout and stderr to
// logPath, and returns the channel closed once it has exited. It fails the
// test if a run of what is still going.
func (c *child) launch(t testing.TB, what, logPath string, args []string) chan struct{} {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		t.Fatalf("%s already running", what)
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(Binary(t), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", what, err)
	}
	done := make(chan struct{})
	c.cmd, c.done, c.err = cmd, done, nil
	go func() {
		err := cmd.Wait()
		logf.Close()
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(done)
	}()
	return done
}

// signal sends sig to the running process and waits for its exit: with
// timeout 0 for as long as it takes, else up to timeout and then it sends
// SIGKILL (late is true). It returns the exit error (nil for exit 0); nil
// and not late when nothing runs.
func (c *child) signal(sig syscall.Signal, timeout time.Duration) (err error, late bool) {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return nil, false
	}
	cmd.Process.Signal(sig)
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
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err, late
}

// exitedRun is called once done is closed (the run exited by itself): it
// forgets the run and returns its exit error.
func (c *child) exitedRun() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cmd = nil
	return c.err
}

// exited reports whether the last run has exited (or none was started),
// and its exit code.
func (c *child) exited() (bool, int) {
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if done == nil {
		return true, 0
	}
	select {
	case <-done:
	default:
		return false, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		return true, ee.ExitCode()
	}
	return true, 0
}

// pid is the running process's id, 0 when none runs.
func (c *child) pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil || c.cmd.Process == nil {
		return 0
	}
	return c.cmd.Process.Pid
}
