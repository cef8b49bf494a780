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
)

// TracedSyscalls are the syscalls a traced pass counts: the durability
// calls and the write family (bbolt writes pages with pwrite64; sockets and
// the log file take write).
var TracedSyscalls = []string{"fsync", "fdatasync", "sync_file_range", "pwrite64", "pwritev", "write", "writev", "ftruncate", "fallocate"}

// Tracer counts a process's syscalls while attached.
type Tracer struct {
	Tool     string // "perf" or "strace"
	cmd      *exec.Cmd
	out      string
	done     chan error // the tool's exit
	ctl, ack *os.File   // perf's control FIFOs
	stopped  bool
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
// perf starts with its events disabled and is enabled through its control
// FIFO, which acknowledges: counting starts at that moment. strace reports
// on stderr when it has attached to the process's threads.
func StartTracer(tool string, pid int, dir string) (*Tracer, error) {
	t := &Tracer{Tool: tool, out: filepath.Join(dir, tool+".out"), done: make(chan error, 1)}
	var ctlPath, ackPath string
	switch tool {
	case "perf":
		var ev []string
		for _, s := range TracedSyscalls {
			ev = append(ev, "syscalls:sys_enter_"+s)
		}
		ctlPath, ackPath = filepath.Join(dir, "perf.ctl"), filepath.Join(dir, "perf.ack")
		for _, p := range []string{ctlPath, ackPath} {
			os.Remove(p)
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				return nil, err
			}
		}
		t.cmd = exec.Command("perf", "stat", "-x", ",", "-o", t.out, "-D", "-1", "--control", "fifo:"+ctlPath+","+ackPath,
			"-e", strings.Join(ev, ","), "-p", strconv.Itoa(pid))
	case "strace":
		t.cmd = exec.Command("strace", "-f", "-c", "-o", t.out, "-e", "trace="+strings.Join(TracedSyscalls, ","), "-p", strconv.Itoa(pid))
	default:
		return nil, fmt.Errorf("no tracer %q", tool)
	}
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
			if !once && tool == "strace" && strings.Contains(sc.Text(), "attached") {
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
	if tool == "strace" {
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
	t.ctl, t.ack, err = openFIFOs(ctlPath, ackPath, t.done)
	if err != nil {
		return fail(err)
	}
	if err := t.control("enable"); err != nil {
		return fail(err)
	}
	return t, nil
}

// openFIFOs opens perf's control FIFO for writing and its ack FIFO for
// reading; each open blocks until perf has the other end open.
func openFIFOs(ctlPath, ackPath string, done chan error) (*os.File, *os.File, error) {
	type res struct {
		ctl, ack *os.File
		err      error
	}
	ch := make(chan res, 1)
	go func() {
		ctl, err := os.OpenFile(ctlPath, os.O_WRONLY, 0)
		if err != nil {
			ch <- res{err: err}
			return
		}
		ack, err := os.OpenFile(ackPath, os.O_RDONLY, 0)
		if err != nil {
			ctl.Close()
		}
		ch <- res{ctl, ack, err}
	}()
	select {
	case r := <-ch:
		return r.ctl, r.ack, r.err
	case err := <-done:
		done <- err
		return nil, nil, fmt.Errorf("exited before opening its control FIFO: %v", err)
	case <-time.After(30 * time.Second):
		return nil, nil, errors.New("control FIFO not opened after 30s")
	}
}

// control sends a perf control command and waits for its ack.
func (t *Tracer) control(cmd string) error {
	if _, err := t.ctl.WriteString(cmd + "\n"); err != nil {
		return err
	}
	t.ack.SetReadDeadline(time.Now().Add(30 * time.Second)) // FIFOs support deadlines
	buf := make([]byte, 64)
	n, err := t.ack.Read(buf)
	if err != nil {
		return fmt.Errorf("%s: no ack: %v", cmd, err)
	}
	if !strings.HasPrefix(string(buf[:n]), "ack") {
		return fmt.Errorf("%s: answered %q", cmd, buf[:n])
	}
	return nil
}

// Kill stops the tracer without reading its counts (cleanup after a
// failure). It is a no-op after Stop.
func (t *Tracer) Kill() {
	if !t.stopped {
		t.stopped = true
		t.cmd.Process.Kill()
		<-t.done
		t.closeFIFOs()
	}
}

func (t *Tracer) closeFIFOs() {
	if t.ctl != nil {
		t.ctl.Close()
		t.ack.Close()
	}
}

// Stop ends the counting (perf: disable, acknowledged), detaches (SIGINT:
// both tools then write their summary) and returns calls per syscall name.
func (t *Tracer) Stop() (map[string]uint64, error) {
	if t.stopped {
		return nil, errors.New("tracer already stopped")
	}
	t.stopped = true
	defer t.closeFIFOs()
	if t.ctl != nil {
		if err := t.control("disable"); err != nil {
			t.cmd.Process.Kill()
			<-t.done
			return nil, err
		}
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
	if t.Tool == "perf" {
		return parsePerfStat(b)
	}
	return parseStraceSummary(b)
}

// parsePerfStat reads `perf stat -x ,` output: count,unit,event,...
func parsePerfStat(b []byte) (map[string]uint64, error) {
	m := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ",")
		if len(f) < 3 || !strings.HasPrefix(f[2], "syscalls:sys_enter_") {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			if !strings.HasPrefix(f[0], "<not") { // <not counted>, <not supported>
				return nil, fmt.Errorf("perf stat: %q: %v", sc.Text(), err)
			}
			n = 0
		}
		m[strings.TrimPrefix(f[2], "syscalls:sys_enter_")] = n
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("perf stat: no counts in %q", b)
	}
	return m, sc.Err()
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
