package ingest

import (
	"strings"
	"testing"

	"github.com/safekeeper/safekeeper/test/perfstat"
)

// The helpers below run in make test (they are pure); the benchmarks
// themselves skip without their flags.

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1GiB": 1 << 30, "512M": 512 << 20, "64MiB": 64 << 20, "8k": 8 << 10, "65536": 65536, " 2 G ": 2 << 30, "100B": 100} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1M", "1.5G", "1GB", "x"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) did not fail", in)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(c.xs); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}

func TestParseTracerOutput(t *testing.T) {
	perf := "# started on Tue Dec  1 10:51:14 2026\n\n85,,syscalls:sys_enter_write,131053115,100.00,,\n<not counted>,,syscalls:sys_enter_fsync,0,100.00,,\n12,,syscalls:sys_enter_fdatasync,131053115,100.00,,Events disabled\n"
	c, err := perfstat.Parse([]byte(perf))
	m := syscallCounts(c)
	if err != nil || m["write"] != 85 || m["fdatasync"] != 12 || m["fsync"] != 0 {
		t.Fatalf("perf: %v %v", m, err)
	}
	strace := strings.Join([]string{
		"% time     seconds  usecs/call     calls    errors syscall",
		"------ ----------- ----------- --------- --------- ----------------",
		" 90.00    0.009000          34       260           fdatasync",
		" 10.00    0.001000           1      1037           pwrite64",
		"  0.00    0.000000           0         4         1 fsync",
		"------ ----------- ----------- --------- --------- ----------------",
		"100.00    0.010000                  1301         1 total",
	}, "\n")
	m, err = parseStraceSummary([]byte(strace))
	if err != nil || m["fdatasync"] != 260 || m["pwrite64"] != 1037 || m["fsync"] != 4 || len(m) != 3 {
		t.Fatalf("strace: %v %v", m, err)
	}
}

func TestWALCut(t *testing.T) {
	w := GenerateWAL(1 << 20)
	if int64(len(w.Data)) < 1<<20 {
		t.Fatalf("generated %d bytes", len(w.Data))
	}
	for _, off := range []int64{0, 1, 100000, 1 << 20, int64(len(w.Data)) + 5} {
		c := w.Cut(off)
		if c > max(off, int64(w.ends[0])) || c <= 0 {
			t.Errorf("Cut(%d) = %d", off, c)
		}
	}
}

func TestLastGC(t *testing.T) {
	log := "gc 17 @7.483s 11%: 4.1+256+0.012 ms clock, 8.2+20/133/0+0.024 ms cpu, 2411->2576->1514 MB, 2832 MB goal, 6 MB stacks, 0 MB globals, 2 P\n" +
		"gc 18 @8.134s 11%: 0.32+146+2.9 ms clock, 0.64+time=2026-12-01T11:03:34.676Z level=INFO msg=\"created timeline\"\n1.7/76/102+5.8 ms cpu, 2584->2640->1964 MB, 3036 MB goal, 6 MB stacks, 0 MB globals, 2 P\n" +
		"GC forced\ngc 19 @139.653s 0%: 1.8+21+0.007 ms clock, 3.7+0/7.9/20+0.014 ms cpu, 3059->3059->14 MB, 3256 MB goal, 1 MB stacks, 0 MB globals, 2 P\n"
	g, n := lastGC(log)
	if n != 19 || g.N != 19 || g.Live != 14 || !g.Forced || g.At != 139.653 {
		t.Fatalf("lastGC: %+v, %d", g, n)
	}
	if g, _ := lastGC(log[:strings.Index(log, "GC forced")]); g.N != 17 || g.Forced || g.Live != 1514 {
		// gc 18's line is broken by a log line: the last whole one is 17.
		t.Fatalf("lastGC without the forced GC: %+v", g)
	}
}

func TestHumanSize(t *testing.T) {
	for n, want := range map[int64]string{1 << 30: "1 GiB", 1<<30 - 5000: "1.00 GiB", 1045216: "1.00 MiB", 128 << 10: "128 KiB", 3 << 19: "1.50 MiB", 100: "100 B", 512 << 20: "512 MiB"} {
		if got := HumanSize(n); got != want {
			t.Errorf("HumanSize(%d) = %q, want %q", n, got, want)
		}
	}
}
