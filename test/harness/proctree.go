package harness

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// ProcTable is one pass over /proc: every process's stat.
type ProcTable map[int]ProcStat

// ReadProcs reads every process's /proc/PID/stat.
func ReadProcs() (ProcTable, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	pt := ProcTable{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		p, err := ParseProcStat(b)
		if err != nil {
			return nil, fmt.Errorf("/proc/%d/stat: %v", pid, err)
		}
		pt[pid] = p
	}
	return pt, nil
}

// Tree returns root and all its descendants.
func (pt ProcTable) Tree(root int) []int {
	kids := map[int][]int{}
	for pid, p := range pt {
		kids[p.PPID] = append(kids[p.PPID], pid)
	}
	var out []int
	var walk func(int)
	walk = func(pid int) {
		out = append(out, pid)
		for _, k := range kids[pid] {
			walk(k)
		}
	}
	if _, ok := pt[root]; ok {
		walk(root)
	}
	return out
}

// TreeTicks is the CPU time of root's process tree. Counted so, the delta
// between two snapshots is what the tree used in between, as long as every
// process that exited in between was reaped by a parent inside the tree
// (backends by the postmaster) before the second one.
func (pt ProcTable) TreeTicks(root int) (uint64, error) {
	if _, ok := pt[root]; !ok {
		return 0, fmt.Errorf("process %d is gone", root)
	}
	var sum uint64
	for _, pid := range pt.Tree(root) {
		sum += pt[pid].Ticks()
	}
	return sum, nil
}

// WaitNoLocalClients waits until the PostgreSQL whose postmaster is pid
// has no backend of a client on its unix socket left ("[local]" in their
// process title: pgbench's in the benchmarks) and has reaped every exited
// child, so that their CPU time is in the postmaster's cutime/cstime.
func WaitNoLocalClients(t testing.TB, pid int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		status, err := "", error(nil)
		var pt ProcTable
		if pt, err = ReadProcs(); err != nil {
			status = err.Error()
		} else {
			for _, p := range pt.Tree(pid) {
				title, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
				if why := localClientNotDone(pt[p].State, title); why != "" {
					status = fmt.Sprintf("process %d %s", p, why)
					break
				}
			}
		}
		if status == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for the clients' backends of postmaster %d to exit; last seen: %s", timeout, pid, status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// localClientNotDone says why a process of the primary's tree keeps
// WaitNoLocalClients waiting, "" if it does not: a client's backend
// ("[local]" in its title), a zombie, or a process with no command line,
// which is one on its way out (the kernel drops it with the process's
// memory, before the process becomes a zombie; every live child of the
// postmaster has a title) or one gone since /proc was read. Counted as
// done, an exiting backend could be reaped between the reads of the
// postmaster's stat and its own in the next snapshot, and its CPU time
// would be in neither.
func localClientNotDone(state byte, cmdline []byte) string {
	switch {
	case state == 'Z':
		return "is a zombie"
	case len(cmdline) == 0:
		return "is exiting (no command line)"
	case bytes.Contains(cmdline, []byte("[local]")):
		return fmt.Sprintf("is %q", bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
	}
	return ""
}
