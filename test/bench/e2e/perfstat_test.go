package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/perfstat"
)

// The per-node table: `perf stat` attached, for one round of each
// configuration (the main pass's last), to one node of each kind: the
// walreceiver of standby s1 (A1, A3), safekeeper 1 and the proposer (B).
// It counts the node's CPU time, context switches and the system calls of
// its commit path, divided by the round's transactions. perf stat -x,
// (CSV) is the stable output; --control fd:… with -D -1 starts it with
// its counters disabled, so that they are enabled (and acknowledged) just
// before pgbench starts and disabled when it ends, however long perf
// takes to attach.

// perfEvents are what the table counts, in its order. Those this kernel
// or perf lacks are left out when perf is probed (probePerf).
var perfEvents = []string{
	"task-clock", "context-switches",
	"syscalls:sys_enter_fdatasync", "syscalls:sys_enter_fsync",
	"syscalls:sys_enter_pwrite64", "syscalls:sys_enter_pwritev",
	"syscalls:sys_enter_read", "syscalls:sys_enter_recvfrom", "syscalls:sys_enter_recvmsg",
	"syscalls:sys_enter_write", "syscalls:sys_enter_writev", "syscalls:sys_enter_sendto", "syscalls:sys_enter_sendmsg",
	"syscalls:sys_enter_futex",
	"syscalls:sys_enter_nanosleep", "syscalls:sys_enter_clock_nanosleep",
	"syscalls:sys_enter_epoll_wait", "syscalls:sys_enter_epoll_pwait",
}

// perfTool is perf as found on this machine.
type perfTool struct {
	path    string
	events  []string // the perfEvents that count here
	missing []string // the perfEvents that do not
	off     string   // why there is no per-node table; "" if there is
}

// probePerf finds perf and the events it can count here: all at once, or
// else one by one. Without perf, or without task-clock, the table is off
// and off says why; the benchmark goes on without it.
func probePerf(enabled bool) perfTool {
	if !enabled {
		return perfTool{off: "BENCH_PERF=0"}
	}
	path, err := exec.LookPath("perf")
	if err != nil {
		return perfTool{off: "no perf in PATH (Debian: apt-get install linux-perf)"}
	}
	pt := perfTool{path: path}
	try := func(events ...string) error {
		out, err := exec.Command(path, "stat", "-x,", "-e", strings.Join(events, ","), "--", "true").CombinedOutput()
		if err != nil {
			return fmt.Errorf("perf stat -e %s: %v: %s", strings.Join(events, ","), err, perfstat.FirstLine(out))
		}
		return nil
	}
	if try(perfEvents...) == nil {
		pt.events = perfEvents
		return pt
	}
	var firstErr error
	for _, ev := range perfEvents {
		if err := try(ev); err != nil {
			pt.missing = append(pt.missing, ev)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		pt.events = append(pt.events, ev)
	}
	if len(pt.events) == 0 || pt.events[0] != "task-clock" {
		pt.off = fmt.Sprintf("perf cannot count here: %v", firstErr)
	}
	return pt
}

// perfNode is one node the table has a column for, and what perf counted
// on it during the round.
type perfNode struct {
	label string
	pid   int
	// fsyncsPerCommit is how many fdatasyncs make one commit of this
	// node's WAL: 1 for a walreceiver (one per flush), 2 for a safekeeper
	// (bbolt's two per transaction: pages, then meta); 0: no commit to
	// speak of (the proposer).
	fsyncsPerCommit float64
	counts          perfstat.Counts
	err             error // perf failed on this node; counts is nil
}

// attach starts perf stat on node, its counters disabled.
func (pt perfTool) attach(node *perfNode, dir string) (*perfstat.Session, error) {
	return perfstat.Start(pt.path, pt.events, node.pid, dir)
}

// perfNodes are the nodes of c the table counts: the walreceiver of
// standby s1 (found by its process title among the standby's processes),
// or safekeeper 1 and the proposer.
func (b *bench) perfNodes(c config) ([]*perfNode, error) {
	if c.proposer {
		return []*perfNode{
			{label: fmt.Sprintf("safekeeper %d", b.sks[0].ID), pid: b.sks[0].PID(), fsyncsPerCommit: 2},
			{label: "proposer", pid: b.prop.PID()},
		}, nil
	}
	for _, s := range b.standbys {
		if !c.has(s.name) {
			continue
		}
		pt, err := harness.ReadProcs()
		if err != nil {
			return nil, err
		}
		for _, pid := range pt.Tree(s.pid()) {
			title, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if bytes.Contains(title, []byte("walreceiver")) {
				return []*perfNode{{label: "walreceiver of " + s.name, pid: pid, fsyncsPerCommit: 1}}, nil
			}
		}
		return nil, fmt.Errorf("standby %s: no walreceiver process among its postmaster's children", s.name)
	}
	return nil, fmt.Errorf("%s runs no standby", c.name)
}

// startPerf attaches perf stat to c's nodes and enables its counters.
// A node perf fails on keeps the error (reported under the table); the
// round goes on.
func (b *bench) startPerf(c config) ([]*perfNode, []*perfstat.Session) {
	nodes, err := b.perfNodes(c)
	if err != nil {
		b.say("perf stat: %v", err)
		return []*perfNode{{label: c.name, err: err}}, nil
	}
	sessions := make([]*perfstat.Session, len(nodes))
	for i, n := range nodes {
		s, err := b.perf.attach(n, b.perfDir)
		if err == nil {
			if err = s.Control("enable", 30*time.Second); err != nil {
				s.Abort()
			}
		}
		if err != nil {
			n.err = err
			b.say("perf stat -p %d (%s): %v", n.pid, n.label, err)
			continue
		}
		sessions[i] = s
	}
	return nodes, sessions
}

// stopPerf stops the sessions and returns the nodes with their counts.
func (b *bench) stopPerf(nodes []*perfNode, sessions []*perfstat.Session) []perfNode {
	var out []perfNode
	for i, n := range nodes {
		if i < len(sessions) && sessions[i] != nil {
			n.counts, n.err = sessions[i].Finish()
			if n.err != nil {
				b.say("perf stat -p %d (%s): %v", n.pid, n.label, n.err)
			}
		}
		out = append(out, *n)
	}
	return out
}

// perfRow is one row of the per-node table: the sum of its events.
type perfRow struct {
	label  string
	prec   int
	events []string
}

var perfRows = []perfRow{
	{"CPU µs (task-clock)", 0, []string{"task-clock"}},
	{"context switches", 2, []string{"context-switches"}},
	{"fdatasync", 2, []string{"syscalls:sys_enter_fdatasync"}},
	{"fsync", 2, []string{"syscalls:sys_enter_fsync"}},
	{"pwrite64 + pwritev", 2, []string{"syscalls:sys_enter_pwrite64", "syscalls:sys_enter_pwritev"}},
	{"read", 2, []string{"syscalls:sys_enter_read"}},
	{"recvfrom + recvmsg", 2, []string{"syscalls:sys_enter_recvfrom", "syscalls:sys_enter_recvmsg"}},
	{"write + writev", 2, []string{"syscalls:sys_enter_write", "syscalls:sys_enter_writev"}},
	{"sendto + sendmsg", 2, []string{"syscalls:sys_enter_sendto", "syscalls:sys_enter_sendmsg"}},
	{"futex", 2, []string{"syscalls:sys_enter_futex"}},
	{"nanosleep + clock_nanosleep", 2, []string{"syscalls:sys_enter_nanosleep", "syscalls:sys_enter_clock_nanosleep"}},
	{"epoll_wait + epoll_pwait", 2, []string{"syscalls:sys_enter_epoll_wait", "syscalls:sys_enter_epoll_pwait"}},
}

// sum is the row's value over c; ok is false if none of its events was
// counted.
func (row perfRow) sum(c perfstat.Counts) (v float64, ok bool) {
	for _, ev := range row.events {
		if x, found := c[ev]; found {
			v += x
			ok = true
		}
	}
	return v, ok
}

// commits is how many WAL commits the node made in the round (see
// fsyncsPerCommit); 0 if that means nothing for it.
func (n perfNode) commits() float64 {
	if n.fsyncsPerCommit == 0 || n.counts == nil {
		return 0
	}
	return n.counts["syscalls:sys_enter_fdatasync"] / n.fsyncsPerCommit
}

// perfTable is the per-node table of the rounds that have one: per
// transaction of the round, and per commit of the node in parentheses.
func perfTable(results []result) string {
	type col struct {
		r result
		n perfNode
	}
	var cols []col
	var notes []string
	for _, r := range results {
		for _, n := range r.nodes {
			if n.err != nil {
				notes = append(notes, fmt.Sprintf("%s, %s round %d: %v", n.label, r.cfg, r.cycle, n.err))
				continue
			}
			cols = append(cols, col{r, n})
		}
	}
	var sb strings.Builder
	if len(cols) > 0 {
		head := []string{"per transaction (per commit)"}
		for _, c := range cols {
			head = append(head, fmt.Sprintf("%s (%s)", c.n.label, c.r.cfg))
		}
		sb.WriteString(mdRow(head...))
		sb.WriteString(mdSep(len(head)))
		row := []string{"round"}
		for _, c := range cols {
			row = append(row, fmt.Sprintf("%d, %.1f TPS, %d txns", c.r.cycle, c.r.tps, c.r.txns))
		}
		sb.WriteString(mdRow(row...))
		row = []string{"commits (walreceiver: fdatasyncs; safekeeper: fdatasyncs / 2)"}
		for _, c := range cols {
			if cm := c.n.commits(); cm > 0 {
				row = append(row, fmt.Sprintf("%.3f (%.0f)", cm/float64(c.r.txns), cm))
			} else {
				row = append(row, "-")
			}
		}
		sb.WriteString(mdRow(row...))
		for _, pr := range perfRows {
			row := []string{pr.label}
			for _, c := range cols {
				v, ok := pr.sum(c.n.counts)
				if !ok {
					row = append(row, "-")
					continue
				}
				cell := fnum(v/float64(c.r.txns), pr.prec)
				if cm := c.n.commits(); cm > 0 {
					cell += fmt.Sprintf(" (%s)", fnum(v/cm, max(pr.prec-1, 0)))
				}
				row = append(row, cell)
			}
			sb.WriteString(mdRow(row...))
		}
	}
	for _, n := range notes {
		sb.WriteString("\nperf stat failed: " + n + "\n")
	}
	return sb.String()
}
