package ingest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/safekeeper/safekeeper/test/harness"
)

// ProcIO is /proc/PID/io of a process (all its threads): rchar/wchar are
// the bytes read and written by read/write-family syscalls (files, sockets
// and pipes alike), syscr/syscw their counts. write_bytes (the block layer's
// count) is deliberately not used: it is unreliable on this kernel.
type ProcIO struct {
	RChar, WChar, SyscR, SyscW uint64
}

// ReadProcIO reads /proc/pid/io.
func ReadProcIO(pid int) (ProcIO, error) {
	var io ProcIO
	f, err := readKV(fmt.Sprintf("/proc/%d/io", pid), ":")
	if err != nil {
		return io, err
	}
	io.RChar, io.WChar, io.SyscR, io.SyscW = f["rchar"], f["wchar"], f["syscr"], f["syscw"]
	return io, nil
}

// Sub returns p - o field by field.
func (p ProcIO) Sub(o ProcIO) ProcIO {
	return ProcIO{p.RChar - o.RChar, p.WChar - o.WChar, p.SyscR - o.SyscR, p.SyscW - o.SyscW}
}

// Mem is a process's memory from /proc/PID/status, in bytes.
type Mem struct {
	RSS, RSSAnon, RSSFile, HWM uint64 // VmRSS, RssAnon, RssFile (+RssShmem), VmHWM
}

// ReadMem reads /proc/pid/status.
func ReadMem(pid int) (Mem, error) {
	f, err := readKV(fmt.Sprintf("/proc/%d/status", pid), ":")
	if err != nil {
		return Mem{}, err
	}
	const kB = 1024
	return Mem{RSS: f["VmRSS"] * kB, RSSAnon: f["RssAnon"] * kB, RSSFile: (f["RssFile"] + f["RssShmem"]) * kB, HWM: f["VmHWM"] * kB}, nil
}

// OpenFDs counts the open file descriptors of process pid.
func OpenFDs(pid int) (int, error) {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(es), err
}

// readKV reads "key<sep> value [unit]" lines, keeping the first number.
func readKV(path, sep string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), sep)
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		if n, err := strconv.ParseUint(f[0], 10, 64); err == nil {
			m[strings.TrimSpace(k)] = n
		}
	}
	return m, sc.Err()
}

// Machine describes where a benchmark ran, for the report.
type Machine struct {
	CPUs     int
	CPUModel string
	MemTotal uint64 // bytes
	Kernel   string
	TempFS   string // filesystem of the temporary directory the data lives in
	Go       string
	Describe string // git describe of the tree
	LoadAvg  string // /proc/loadavg at start: the machine is shared
	Date     string
}

// DescribeMachine collects a Machine; dir is the benchmark's temporary
// directory (data directories and dd's file are in it).
func DescribeMachine(dir string) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC().Format("2006-01-02 15:04 UTC")}
	m.CPUModel, m.MemTotal, m.LoadAvg = harness.CPUModel(), harness.MemTotal(), harness.LoadAvg()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("findmnt", "-n", "-o", "FSTYPE,SOURCE,OPTIONS", "-T", dir).Output(); err == nil {
		m.TempFS = strings.Join(strings.Fields(string(out)), " ")
	} else if out, err := exec.Command("stat", "-f", "-c", "%T", dir).Output(); err == nil {
		m.TempFS = strings.TrimSpace(string(out))
	}
	m.TempFS = filepath.Clean(dir) + ": " + m.TempFS
	if root, err := harness.ModuleRoot(); err == nil {
		git := func(args ...string) string {
			cmd := exec.Command("git", args...)
			cmd.Dir = root
			out, _ := cmd.Output()
			return strings.TrimSpace(string(out))
		}
		m.Describe = git("describe", "--always", "--tags")
		// Dirty unless only the report page changed: the harnesses
		// rewrite it themselves.
		if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/performance.md") != "" {
			m.Describe += "-dirty"
		}
		m.Describe += " (branch " + git("rev-parse", "--abbrev-ref", "HEAD") + ")"
	}
	return m
}
