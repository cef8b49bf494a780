package e2e

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
			return fmt.Errorf("perf stat -e %s: %v: %s", strings.Join(events, ","), err, firstLine(out))
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

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
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
	counts          perfCounts
	err             error // perf failed on this node; counts is nil
}

// perfCounts are the counted events of one perf stat run: task-clock in
// µs, the others in occurrences. An event perf did not count is absent.
type perfCounts map[string]float64

// parsePerfStat reads the output of perf stat -x, (the -o file): one line
// per event, "value,unit,event,run time,percentage,metric,metric unit";
// comments ("# started on …"), blank lines and perf's "Events enabled"
// notices are skipped, "<not counted>" and "<not supported>" values leave
// the event out. task-clock (msec) comes back in µs. No counted event at
// all is an error.
func parsePerfStat(out string) (perfCounts, error) {
	c := perfCounts{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || !strings.Contains(line, ",") {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) < 3 {
			return nil, fmt.Errorf("line %d: %d fields, want at least 3: %q", n, len(f), line)
		}
		value, unit, event := f[0], f[1], f[2]
		if strings.HasPrefix(value, "<") { // <not counted>, <not supported>
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: value %q of %s: %v", n, value, event, err)
		}
		switch unit {
		case "msec":
			v *= 1000
		case "usec":
		case "nsec":
			v /= 1000
		case "":
		default:
			return nil, fmt.Errorf("line %d: unit %q of %s", n, unit, event)
		}
		c[event] += v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(c) == 0 {
		return nil, errors.New("perf stat counted no event")
	}
	return c, nil
}

// perfSession is perf stat attached to one process, its counters
// disabled until enable.
type perfSession struct {
	node     *perfNode
	cmd      *exec.Cmd
	ctl, ack *os.File // perf's control and acknowledgement pipes (our ends)
	outFile  string
	stderr   bytes.Buffer
}

// attach starts perf stat -p pid with its counters disabled.
func (pt perfTool) attach(node *perfNode, dir string) (*perfSession, error) {
	s := &perfSession{node: node, outFile: filepath.Join(dir, fmt.Sprintf("perf-%d.csv", node.pid))}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, err
	}
	// In the child, ExtraFiles[0] is fd 3 and ExtraFiles[1] fd 4.
	s.cmd = exec.Command(pt.path, "stat", "-x,", "-o", s.outFile, "--control", "fd:3,4", "-D", "-1",
		"-e", strings.Join(pt.events, ","), "-p", strconv.Itoa(node.pid))
	s.cmd.ExtraFiles = []*os.File{ctlR, ackW}
	s.cmd.Stderr = &s.stderr
	err = s.cmd.Start()
	ctlR.Close()
	ackW.Close()
	if err != nil {
		ctlW.Close()
		ackR.Close()
		return nil, err
	}
	s.ctl, s.ack = ctlW, ackR
	return s, nil
}

// control sends perf one command (enable, disable) and waits for its ack.
func (s *perfSession) control(command string, timeout time.Duration) error {
	if _, err := s.ctl.Write([]byte(command + "\n")); err != nil {
		return fmt.Errorf("perf stat %s: %v (%s)", command, err, firstLine(s.stderr.Bytes()))
	}
	if err := s.ack.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	buf := make([]byte, 64)
	n, err := s.ack.Read(buf)
	if err != nil {
		return fmt.Errorf("perf stat %s: no ack: %v (%s)", command, err, firstLine(s.stderr.Bytes()))
	}
	if !bytes.HasPrefix(buf[:n], []byte("ack")) {
		return fmt.Errorf("perf stat %s: answered %q", command, buf[:n])
	}
	return nil
}

// finish disables the counters, stops perf (SIGINT: it prints its counts
// and exits) and reads what it counted.
func (s *perfSession) finish() (perfCounts, error) {
	errDisable := s.control("disable", 30*time.Second)
	s.ctl.Close()
	s.ack.Close()
	s.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-done
		return nil, fmt.Errorf("perf stat did not exit after SIGINT (%s)", firstLine(s.stderr.Bytes()))
	}
	defer os.Remove(s.outFile)
	if errDisable != nil {
		return nil, errDisable
	}
	out, err := os.ReadFile(s.outFile)
	if err != nil {
		return nil, fmt.Errorf("perf stat output: %v (%s)", err, firstLine(s.stderr.Bytes()))
	}
	c, err := parsePerfStat(string(out))
	if err != nil {
		return nil, fmt.Errorf("perf stat output: %v", err)
	}
	return c, nil
}

// abort stops perf without reading its counts (a round that failed to
// start them).
func (s *perfSession) abort() {
	s.ctl.Close()
	s.ack.Close()
	s.cmd.Process.Kill()
	s.cmd.Wait()
	os.Remove(s.outFile)
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
		pt, err := readProcs()
		if err != nil {
			return nil, err
		}
		for _, pid := range pt.tree(s.pid()) {
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
func (b *bench) startPerf(c config) ([]*perfNode, []*perfSession) {
	nodes, err := b.perfNodes(c)
	if err != nil {
		b.say("perf stat: %v", err)
		return []*perfNode{{label: c.name, err: err}}, nil
	}
	sessions := make([]*perfSession, len(nodes))
	for i, n := range nodes {
		s, err := b.perf.attach(n, b.perfDir)
		if err == nil {
			if err = s.control("enable", 30*time.Second); err != nil {
				s.abort()
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
func (b *bench) stopPerf(nodes []*perfNode, sessions []*perfSession) []perfNode {
	var out []perfNode
	for i, n := range nodes {
		if i < len(sessions) && sessions[i] != nil {
			n.counts, n.err = sessions[i].finish()
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
func (row perfRow) sum(c perfCounts) (v float64, ok bool) {
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
