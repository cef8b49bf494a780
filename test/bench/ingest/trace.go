package ingest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/safekeeper/safekeeper/test/perfstat"
)

// TracedSyscalls are the syscalls a traced pass counts: the durability
// calls and the write family (bbolt writes pages with pwrite64; sockets and
// the log file take write).
var TracedSyscalls = []string{"fsync", "fdatasync", "sync_file_range", "pwrite64", "pwritev", "write", "writev", "ftruncate", "fallocate"}

// Tracer counts a process's syscalls while attached.
type Tracer struct {
	Tool    string            // "perf" or "strace"
	perf    *perfstat.Session // perf
	cmd     *exec.Cmd         // strace
	out     string            // strace's summary file
	done    chan error        // strace's exit
	stopped bool
}

// PickTracer returns the tool to use: want ("perf", "strace", "none" or
// "auto": perf if its syscall tracepoints work here, else strace if
// installed, else none).
func PickTracer(want string) (string, error) {
	switch want {
	case "perf", "strace", "none":
		if want != "none" {
			if _, err := exec.LookPath(want); err != nil {
				return "", fmt.Errorf("tracer %s: %w", want, err)
			}
		}
		return want, nil
	case "auto", "":
	default:
		return "", fmt.Errorf("tracer %q: want perf, strace, none or auto", want)
	}
	if _, err := exec.LookPath("perf"); err == nil {
		if exec.Command("perf", "stat", "-x", ",", "-e", "syscalls:sys_enter_fdatasync", "true").Run() == nil {
			return "perf", nil
		}
	}
	if _, err := exec.LookPath("strace"); err == nil {
		return "strace", nil
	}
	return "none", nil
}

// StartTracer attaches tool to every thread of process pid, writing its
// summary into dir, and returns once it counts. Stop detaches and returns
// the counts.
//
// perf starts with its counters disabled and is enabled through its
// control channel, which acknowledges: counting starts at that moment
// (test/perfstat). strace reports on stderr when it has attached to the
// process's threads.
func StartTracer(tool string, pid int, dir string) (*Tracer, error) {
	t := &Tracer{Tool: tool}
	switch tool {
	case "perf":
		var ev []string
		for _, s := range TracedSyscalls {
			ev = append(ev, "syscalls:sys_enter_"+s)
		}
		s, err := perfstat.Start("perf", ev, pid, dir)
		if err != nil {
			return nil, fmt.Errorf("perf: %w", err)
		}
		if err := s.Control("enable", 30*time.Second); err != nil {
			s.Abort()
			return nil, fmt.Errorf("perf: %w", err)
		}
		t.perf = s
		return t, nil
	case "strace":
	default:
		return nil, fmt.Errorf("no tracer %q", tool)
	}
	t.out, t.done = filepath.Join(dir, tool+".out"), make(chan error, 1)
	t.cmd = exec.Command("strace", "-f", "-c", "-o", t.out, "-e", "trace="+strings.Join(TracedSyscalls, ","), "-p", strconv.Itoa(pid))
	stderr, err := t.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := t.cmd.Start(); err != nil {
		return nil, err
	}
	attached := make(chan struct{})
	var errText bytes.Buffer
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			errText.WriteString(sc.Text() + "\n")
			if !once && strings.Contains(sc.Text(), "attached") {
				once = true
				close(attached)
			}
		}
		err := t.cmd.Wait()
		if err != nil && errText.Len() > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(errText.String()))
		}
		t.done <- err
	}()
	fail := func(err error) (*Tracer, error) {
		t.cmd.Process.Kill()
		<-t.done
		return nil, fmt.Errorf("%s: %w", tool, err)
	}
	select {
	case <-attached:
		return t, nil
	case err := <-t.done:
		t.done <- err
		return fail(fmt.Errorf("exited at attach: %v", err))
	case <-time.After(30 * time.Second):
		return fail(errors.New("not attached after 30s"))
	}
}

// Kill stops the tracer without reading its counts (cleanup after a
// failure). It is a no-op after Stop.
func (t *Tracer) Kill() {
	if t.stopped {
		return
	}
	t.stopped = true
	if t.perf != nil {
		t.perf.Abort()
		return
	}
	t.cmd.Process.Kill()
	<-t.done
}

// Stop ends the counting (perf: disable, acknowledged), detaches (SIGINT:
// both tools then write their summary) and returns calls per syscall name.
func (t *Tracer) Stop() (map[string]uint64, error) {
	if t.stopped {
		return nil, errors.New("tracer already stopped")
	}
	t.stopped = true
	if t.perf != nil {
		c, err := t.perf.Finish()
		if err != nil {
			return nil, err
		}
		return syscallCounts(c), nil
	}
	t.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-t.done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			return nil, err
		}
	case <-time.After(30 * time.Second):
		t.cmd.Process.Kill()
		<-t.done
		return nil, fmt.Errorf("%s did not stop within 30s of SIGINT", t.Tool)
	}
	b, err := os.ReadFile(t.out)
	if err != nil {
		return nil, err
	}
	return parseStraceSummary(b)
}

// syscallCounts are perf's syscall tracepoint counts by syscall name.
func syscallCounts(c perfstat.Counts) map[string]uint64 {
	m := map[string]uint64{}
	for ev, v := range c {
		if name, ok := strings.CutPrefix(ev, "syscalls:sys_enter_"); ok {
			m[name] = uint64(v)
		}
	}
	return m
}

// parseStraceSummary reads the table of `strace -c`:
// % time, seconds, usecs/call, calls, [errors,] syscall.
func parseStraceSummary(b []byte) (map[string]uint64, error) {
	m := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || f[len(f)-1] == "total" || f[len(f)-1] == "syscall" {
			continue
		}
		if _, err := strconv.ParseFloat(f[0], 64); err != nil {
			continue
		}
		n, err := strconv.ParseUint(f[3], 10, 64)
		if err != nil {
			continue
		}
		m[f[len(f)-1]] = n
	}
	return m, sc.Err()
}
