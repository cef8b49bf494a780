package harness

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestParseProcStat: the fields counted from the last ')' (a comm with
// spaces and parentheses), the four CPU times; short, malformed or
// negative lines are errors.
func TestParseProcStat(t *testing.T) {
	// utime 110, stime 20, cutime 300, cstime 4.
	line := "4242 (postgres: a) b) S 4000 4242 4242 0 -1 4194560 2090 0 0 0 110 20 300 4 20 0 1 0 4600 224239616 3577 18446744073709551615"
	s, err := ParseProcStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := ProcStat{PPID: 4000, State: 'S', UTime: 110, STime: 20, CUTime: 300, CSTime: 4}
	if s != want || s.Ticks() != 434 {
		t.Fatalf("got %+v (ticks %d), want %+v (ticks 434)", s, s.Ticks(), want)
	}
	for _, bad := range []string{"", "1 (x) S 0 1 2", "1 (x) S 0 1 1 0 -1 0 0 0 0 0 ten 20 0 0",
		"1 (x) S 0 1 1 0 -1 0 0 0 0 0 10 20 -3 0", "1 (x) SS 0 1 1 0 -1 0 0 0 0 0 10 20 0 0"} {
		if _, err := ParseProcStat([]byte(bad)); err == nil {
			t.Errorf("ParseProcStat(%q) did not fail", bad)
		}
	}
}

// TestCPUTime: this process's own entry parses, its parent is the one the
// kernel names, and the CPU time it reports grows as it spins.
func TestCPUTime(t *testing.T) {
	s, err := ReadProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// The state is the main thread's, which may sleep while another reads.
	if s.PPID != os.Getppid() || !strings.ContainsRune("RSD", rune(s.State)) {
		t.Fatalf("own /proc stat: %+v; want ppid %d and state R, S or D", s, os.Getppid())
	}
	if hz, err := ClockTicks(); err != nil || hz <= 0 {
		t.Fatalf("ClockTicks() = %d, %v", hz, err)
	}
	before, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	WaitFor(t, 30*time.Second, "this process's CPU time to grow", func() bool {
		for i := range 1 << 20 {
			x ^= i
		}
		now, err := CPUTime(os.Getpid())
		return err == nil && now > before
	})
	_ = x
	if _, err := ReadProcStat(0x7fffffff); err == nil {
		t.Error("ReadProcStat of a pid that does not exist did not fail")
	}
}
