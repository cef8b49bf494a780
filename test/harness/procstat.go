package harness

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ProcStat is what the tests and benchmarks read of a process's
// /proc/PID/stat (proc(5)): its parent, its state and its CPU times.
type ProcStat struct {
	PPID  int
	State byte // R, S, D, Z, ...
	// UTime and STime are the clock ticks (ClockTicks per second) the
	// process, all its threads, ran in user and in kernel mode; CUTime
	// and CSTime those of the children it has waited for, so that a
	// backend that exited still counts, through the postmaster that
	// reaped it.
	UTime, STime, CUTime, CSTime uint64
}

// Ticks is the process's own CPU time and that of its reaped children,
// in clock ticks.
func (s ProcStat) Ticks() uint64 { return s.UTime + s.STime + s.CUTime + s.CSTime }

// ParseProcStat parses the contents of /proc/PID/stat.
func ParseProcStat(b []byte) (ProcStat, error) {
	// "pid (comm) S ppid ...": comm may hold spaces and parentheses, so
	// the fields are counted from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ProcStat{}, errors.New("no ')' after comm")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[k] is field k+3 of proc(5): state (3), ppid (4), ..., utime (14),
	// stime, cutime, cstime (17).
	if len(f) < 15 || len(f[0]) != 1 {
		return ProcStat{}, fmt.Errorf("%d fields after comm, want at least 15", len(f))
	}
	s := ProcStat{State: f[0][0]}
	var err error
	if s.PPID, err = strconv.Atoi(f[1]); err != nil {
		return ProcStat{}, fmt.Errorf("ppid %q: %v", f[1], err)
	}
	for k, p := range []*uint64{&s.UTime, &s.STime, &s.CUTime, &s.CSTime} {
		if *p, err = strconv.ParseUint(f[11+k], 10, 64); err != nil {
			return ProcStat{}, fmt.Errorf("CPU time %q is not a tick count", f[11+k])
		}
	}
	return s, nil
}

// ReadProcStat reads and parses /proc/pid/stat.
func ReadProcStat(pid int) (ProcStat, error) {
	path := fmt.Sprintf("/proc/%d/stat", pid)
	b, err := os.ReadFile(path)
	if err != nil {
		return ProcStat{}, err
	}
	s, err := ParseProcStat(b)
	if err != nil {
		return ProcStat{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// ClockTicks is sysconf(_SC_CLK_TCK), the clock ticks per second in which
// /proc/PID/stat counts CPU time (asked of getconf once).
var ClockTicks = sync.OnceValues(func() (int, error) {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err != nil {
		return 0, fmt.Errorf("getconf CLK_TCK: %v", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("getconf CLK_TCK: %q is not a positive integer", out)
	}
	return n, nil
})

// CPUTime returns the user and system CPU time process pid (all its
// threads) has used so far, not counting its children.
func CPUTime(pid int) (time.Duration, error) {
	s, err := ReadProcStat(pid)
	if err != nil {
		return 0, err
	}
	hz, err := ClockTicks()
	if err != nil {
		return 0, err
	}
	return time.Duration(s.UTime+s.STime) * time.Second / time.Duration(hz), nil
}
