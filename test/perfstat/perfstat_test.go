package perfstat

import (
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// perf stat -x, -o FILE output of perf 6.1 (the Events lines are its
// notices for --control enable/disable).
const perfOut = `# started on Wed Dec  2 04:56:27 2026

Events disabled
Events enabled
Events disabled
2412.50,msec,task-clock,2412496221,100.00,0.161,CPUs utilized
86000,,context-switches,2412496221,100.00,35.648,K/sec
8500,,syscalls:sys_enter_fdatasync,2412496221,100.00,3.523,K/sec
<not counted>,,syscalls:sys_enter_fsync,0,100.00,,
30300,,syscalls:sys_enter_pwrite64,2412496221,100.00,12.560,K/sec
<not supported>,,syscalls:sys_enter_pwritev,0,100.00,,
20000,,syscalls:sys_enter_read,2412496221,100.00,8.290,K/sec
5400,,syscalls:sys_enter_write,2412496221,100.00,2.238,K/sec
16600,,syscalls:sys_enter_futex,2412496221,100.00,6.881,K/sec
34300,,syscalls:sys_enter_nanosleep,2412496221,100.00,14.218,K/sec
14800,,syscalls:sys_enter_epoll_pwait,2412496221,100.00,6.135,K/sec
`

func TestParse(t *testing.T) {
	c, err := Parse([]byte(perfOut))
	if err != nil {
		t.Fatal(err)
	}
	want := Counts{"task-clock": 2412500, "context-switches": 86000, "syscalls:sys_enter_fdatasync": 8500,
		"syscalls:sys_enter_pwrite64": 30300, "syscalls:sys_enter_read": 20000, "syscalls:sys_enter_write": 5400,
		"syscalls:sys_enter_futex": 16600, "syscalls:sys_enter_nanosleep": 34300, "syscalls:sys_enter_epoll_pwait": 14800}
	if len(c) != len(want) {
		t.Errorf("got %d events, want %d (not counted / not supported left out): %v", len(c), len(want), c)
	}
	for ev, v := range want {
		if math.Abs(c[ev]-v) > 1e-6 {
			t.Errorf("%s = %v, want %v", ev, c[ev], v)
		}
	}
	for _, bad := range []string{"", "# started on x\n\n<not counted>,msec,task-clock,0,100.00,,\n",
		"12x,,context-switches,1,100.00,,\n", "1,furlongs,task-clock,1,100.00,,\n", "5,context-switches\n"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) did not fail", bad)
		}
	}
}

// TestSession attaches perf stat to this test process: only the system
// calls made while its counters are enabled count.
func TestSession(t *testing.T) {
	events := []string{"task-clock", "syscalls:sys_enter_write"}
	perf, err := exec.LookPath("perf")
	if err != nil {
		t.Skip("no perf in PATH")
	}
	if out, err := exec.Command(perf, "stat", "-x,", "-e", strings.Join(events, ","), "--", "true").CombinedOutput(); err != nil {
		t.Skipf("perf cannot count write(2) here: %v: %s", err, FirstLine(out))
	}
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	writes := func(n int) {
		for range n {
			if _, err := f.Write([]byte{0}); err != nil {
				t.Fatal(err)
			}
		}
	}
	s, err := Start(perf, events, os.Getpid(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// ping's ack: perf has attached, its counters disabled (-D -1).
	if err := s.Control("ping", time.Minute); err != nil {
		s.Abort()
		t.Fatal(err)
	}
	writes(3000) // attached, not enabled
	if err := s.Control("enable", time.Minute); err != nil {
		s.Abort()
		t.Fatal(err)
	}
	writes(1000)
	c, err := s.Finish()
	if err != nil {
		t.Fatal(err)
	}
	writes(3000) // after finish
	if n := c["syscalls:sys_enter_write"]; n < 1000 || n >= 3000 {
		t.Errorf("perf counted %v writes, want the 1000 made while enabled (plus a few of the runtime's)", n)
	}
	if c["task-clock"] <= 0 {
		t.Errorf("task-clock = %v µs", c["task-clock"])
	}
}
