package pgtest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// killWait bounds how long Kill waits for the killed processes to be gone.
const killWait = 30 * time.Second

// Pid returns the postmaster's process id, read from postmaster.pid.
func (c *Cluster) Pid() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.DataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgtest: %w", err)
	}
	first, _, _ := bytes.Cut(b, []byte("\n"))
	pid, err := strconv.Atoi(strings.TrimSpace(string(first)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pgtest: postmaster.pid: bad pid %q", first)
	}
	return pid, nil
}

// Kill crashes the server: SIGKILL to the postmaster and every process it
// started, at once, as a machine crash would end them (pg_ctl stop -m
// immediate is not a crash: it sends SIGQUIT and the backends exit
// cleanly). WAL the server had written to the kernel survives; nothing else
// happens to the data directory. Kill waits until every process is gone and
// then removes the stale postmaster.pid, so Stop and cleanup are no-ops until
// Restart. For the test goroutine only.
func (c *Cluster) Kill(t testing.TB) {
	t.Helper()
	pid, err := c.Pid()
	if err != nil {
		t.Fatalf("pgtest: kill: %v", err)
	}
	procs := append([]int{pid}, children(pid)...)
	for _, p := range procs {
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("pgtest: kill -9 %d: %v", p, err)
		}
	}
	deadline := time.Now().Add(killWait)
	delay := 5 * time.Millisecond
	for _, p := range procs {
		for alive(p) {
			if time.Now().After(deadline) {
				t.Fatalf("pgtest: process %d still alive %v after SIGKILL", p, killWait)
			}
			time.Sleep(delay)
			delay = min(2*delay, 100*time.Millisecond)
		}
	}
	// A zombie postmaster (nobody reaps it in some containers) would still
	// answer kill(pid, 0), and the next postmaster would refuse its lock
	// files; every process is gone or a zombie now, so they are stale.
	for _, lock := range []string{
		filepath.Join(c.DataDir, "postmaster.pid"),
		filepath.Join(c.SocketDir, ".s.PGSQL."+strconv.Itoa(c.Port)+".lock"),
	} {
		if err := os.Remove(lock); err != nil && !os.IsNotExist(err) {
			t.Fatalf("pgtest: %v", err)
		}
	}
}

// Restart starts the server again on the same data directory and port,
// after Stop or Kill (crash recovery runs then); a running server is first
// stopped (immediate mode). Cleanup stops it again. For the test goroutine
// only.
func (c *Cluster) Restart(t testing.TB) {
	t.Helper()
	c.stop(t)
	c.Start(t)
}

// children returns the pids whose parent is pid (from /proc).
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := procStat(p); ok && ppid == pid {
			out = append(out, p)
		}
	}
	return out
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != 'Z' && state != 'X'
}

// procStat reads the parent pid and state of pid from /proc/pid/stat.
func procStat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// "pid (comm) S ppid ...": comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0][0], err == nil
}
