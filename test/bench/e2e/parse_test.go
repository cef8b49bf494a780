package e2e

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/test/perfstat"
)

// These run in make test: the benchmark's parsers, without PostgreSQL.

const pgbenchOut = `pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: <builtin: TPC-B (sort of)>
scaling factor: 10
query mode: simple
number of clients: 8
number of threads: 2
maximum number of tries: 1
duration: 15 s
number of transactions actually processed: 12345
number of failed transactions: 0 (0.000%)
latency average = 9.713 ms
initial connection time = 21.409 ms
tps = 823.612345 (without initial connection time)
`

func TestParsePgbench(t *testing.T) {
	s, err := parsePgbench(pgbenchOut)
	if err != nil {
		t.Fatal(err)
	}
	if s.txns != 12345 || s.failed != 0 || s.tps != 823.612345 {
		t.Fatalf("got %+v", s)
	}
	for _, bad := range []string{"", "tps = 5 (without initial connection time)\n",
		"number of transactions actually processed: 0\ntps = 0.0 (without initial connection time)\n"} {
		if _, err := parsePgbench(bad); err == nil {
			t.Errorf("parsePgbench(%q) did not fail", bad)
		}
	}
}

func TestReadLatencies(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "r.1")
	b := filepath.Join(dir, "r.1.1")
	os.WriteFile(a, []byte("0 0 1500 0 1700000000 123\n1 0 2500 0 1700000000 456\n"), 0o644)
	os.WriteFile(b, []byte("2 0 failed 0 1700000000 789\n\n3 0 500 0 1700000001 1\n"), 0o644)
	lat, other, err := readLatencies([]string{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if len(lat) != 3 || other != 1 || lat[0] != 1500 || lat[2] != 500 {
		t.Fatalf("got %v, %d other", lat, other)
	}
	os.WriteFile(b, []byte("2 0 12\n"), 0o644)
	if _, _, err := readLatencies([]string{b}); err == nil {
		t.Error("a short line did not fail")
	}
}

func TestPercentileMedian(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if p := percentile(xs, 0.5); p != 5 {
		t.Errorf("p50 = %v, want 5", p)
	}
	if p := percentile(xs, 0.99); p != 10 {
		t.Errorf("p99 = %v, want 10", p)
	}
	if !math.IsNaN(percentile(nil, 0.5)) {
		t.Error("percentile of nothing is not NaN")
	}
	if m := median([]float64{3, math.NaN(), 1, 2}); m != 2 {
		t.Errorf("median = %v, want 2 (NaN ignored)", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median = %v, want 2.5", m)
	}
}

func TestParseLinkStats(t *testing.T) {
	log := `time=2026-01-01T00:00:00Z level=INFO msg=stopped
time=2026-01-01T00:00:00Z level=INFO msg="safekeeper link stats" safekeeper=127.0.0.1:5001 responses=9000 max_response_gap=31.5ms late_responses=0
time=2026-01-01T00:00:00Z level=INFO msg="safekeeper link stats" tenant_id=7e570100000000000000000000000000 timeline_id=7e570200000000000000000000000000 safekeeper=127.0.0.1:5002 responses=8000 max_response_gap=850µs late_responses=2
`
	st, err := parseLinkStats(log)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[0].maxGap != 31500*time.Microsecond || st[1].maxGap != 850*time.Microsecond || st[1].late != 2 || st[0].responses != 9000 {
		t.Fatalf("got %+v", st)
	}
}

// TestRatioPairsCycles: a ratio is B over the base of the same cycle, the
// median over cycles; a group that did not run is "-" in the summary.
func TestRatioPairsCycles(t *testing.T) {
	nan := math.NaN()
	var rs []result
	for i, v := range []struct{ a1, b float64 }{{2, 1}, {4, 2}, {12, 3}} {
		rs = append(rs,
			result{cfg: "A1", cycle: i + 1, tps: v.a1, cpu: [nGroups]float64{100, 10, nan, nan, 5}},
			result{cfg: "B", cycle: i + 1, tps: v.b, cpu: [nGroups]float64{150, nan, 20, 90, 5}, hasGap: true})
	}
	if got := ratio(rs, "A1", figureByName("TPS")); got != 0.5 {
		t.Errorf("B/A1 TPS = %v, want 0.5 (median of 0.5, 0.5, 0.25)", got)
	}
	if got := ratio(rs, "A1", figureByName("server total")); got != 260.0/110 {
		t.Errorf("B/A1 server CPU = %v, want %v", got, 260.0/110)
	}
	if got := ratio(rs, "A3", figureByName("TPS")); !math.IsNaN(got) {
		t.Errorf("B/A3 without A3 rounds = %v, want NaN", got)
	}
	rs[1].gap, rs[1].late = 150*time.Millisecond, 2
	rs[3].gap = 30 * time.Millisecond
	if got, want := gapSummary(rs), "of the 3 B rounds: 150.0 ms; waits over the protocol's 100 ms in them: 2."; !strings.Contains(got, want) {
		t.Errorf("gapSummary = %q, want it to hold %q", got, want)
	}
	sum := summaryTable(rs)
	for _, want := range []string{"| A1 | 3 | 4.0 | ", "| 100 | 10 | - | - | 110 | 5 | - | - |", "| B | 3 | 2.0 |"} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary lacks %q:\n%s", want, sum)
		}
	}
}

// TestPasses: the low pass runs with at most as many threads as clients
// (pgbench refuses more), BENCH_CLIENTS_LOW=0 drops it, and each pass's
// ratios pair only its own rounds.
func TestPasses(t *testing.T) {
	p := params{rounds: 1, seconds: 1, clients: 8, jobs: 2, clientsLow: 1, scale: 1}
	if err := p.validate(); err != nil {
		t.Fatal(err)
	}
	ps := p.passes()
	if len(ps) != 2 || ps[0] != (pass{n: 0, clients: 8, jobs: 2}) || ps[1] != (pass{n: 1, clients: 1, jobs: 1}) {
		t.Fatalf("passes = %+v", ps)
	}
	if ps[1].label() != "1 client" || ps[0].label() != "8 clients" {
		t.Errorf("labels %q, %q", ps[0].label(), ps[1].label())
	}
	p.clientsLow = 0
	if ps := p.passes(); len(ps) != 1 {
		t.Errorf("BENCH_CLIENTS_LOW=0: passes = %+v, want the main one only", ps)
	}
	p.clientsLow = -1
	if err := p.validate(); err == nil {
		t.Error("BENCH_CLIENTS_LOW=-1 did not fail validation")
	}

	nan := math.NaN()
	main, low := ps[0], ps[1]
	rs := []result{
		{cfg: "A3", pass: main, cycle: 1, tps: 1000, cpu: [nGroups]float64{500, 390, nan, nan, 100}},
		{cfg: "B", pass: main, cycle: 1, tps: 700, cpu: [nGroups]float64{500, nan, 140, 585, 100}},
		{cfg: "A3", pass: low, cycle: 1, tps: 250, cpu: [nGroups]float64{600, 400, nan, nan, 100}},
		{cfg: "B", pass: low, cycle: 1, tps: 150, cpu: [nGroups]float64{600, nan, 200, 800, 100}},
	}
	if got := ratio(ofPass(rs, 0), "A3", figureByName("TPS")); got != 0.7 {
		t.Errorf("8 clients: B/A3 TPS = %v, want 0.7", got)
	}
	if got := ratio(ofPass(rs, 1), "A3", figureByName("TPS")); got != 0.6 {
		t.Errorf("1 client: B/A3 TPS = %v, want 0.6", got)
	}
	if got := ratio(ofPass(rs, 0), "A3", figureByName("replicas")); got != 1.5 {
		t.Errorf("8 clients: safekeepers/standbys = %v, want 1.5", got)
	}
	if tab := ratioTable(ofPass(rs, 1)); !strings.Contains(tab, "| B/A3 | 0.60 |") || !strings.Contains(tab, "| 2.00 |\n") {
		t.Errorf("1-client ratio table:\n%s", tab)
	}
}

// TestPerfTable: counts per transaction, per commit in parentheses (a
// safekeeper's commit is two fdatasyncs, a walreceiver's one), "-" for an
// event not counted; a node perf failed on is named under the table.
func TestPerfTable(t *testing.T) {
	c := perfstat.Counts{"task-clock": 2412500, "context-switches": 86000, "syscalls:sys_enter_fdatasync": 8500,
		"syscalls:sys_enter_pwrite64": 30300, "syscalls:sys_enter_read": 20000, "syscalls:sys_enter_write": 5400,
		"syscalls:sys_enter_futex": 16600, "syscalls:sys_enter_nanosleep": 34300, "syscalls:sys_enter_epoll_pwait": 14800}
	rs := []result{
		{cfg: "A1", cycle: 3, tps: 2000, txns: 10000, nodes: []perfNode{{label: "walreceiver of s1", fsyncsPerCommit: 1,
			counts: perfstat.Counts{"task-clock": 1120000, "syscalls:sys_enter_fdatasync": 7400, "syscalls:sys_enter_recvfrom": 20000, "syscalls:sys_enter_read": 100}}}},
		{cfg: "B", cycle: 3, tps: 1000, txns: 10000, nodes: []perfNode{
			{label: "safekeeper 1", fsyncsPerCommit: 2, counts: c},
			{label: "proposer", err: errors.New("perf stat did not exit after SIGINT")}}},
	}
	tab := perfTable(rs)
	for _, want := range []string{
		"| per transaction (per commit) | walreceiver of s1 (A1) | safekeeper 1 (B) |\n",
		"| round | 3, 2000.0 TPS, 10000 txns | 3, 1000.0 TPS, 10000 txns |\n",
		"| commits (walreceiver: fdatasyncs; safekeeper: fdatasyncs / 2) | 0.740 (7400) | 0.425 (4250) |\n",
		"| CPU µs (task-clock) | 112 (151) | 241 (568) |\n",
		"| pwrite64 + pwritev | - | 3.03 (7.1) |\n",
		"| read | 0.01 (0.0) | 2.00 (4.7) |\n",
		"| recvfrom + recvmsg | 2.00 (2.7) | - |\n",
		"| context switches | - | 8.60 (20.2) |\n",
		"perf stat failed: proposer, B round 3: perf stat did not exit after SIGINT",
	} {
		if !strings.Contains(tab, want) {
			t.Errorf("table lacks %q:\n%s", want, tab)
		}
	}
}

// TestDocSection: the generated section has each pass's medians and
// ratios under its own label, and the per-node table, or why there is
// none.
func TestDocSection(t *testing.T) {
	nan := math.NaN()
	p := params{rounds: 1, seconds: 5, clients: 8, jobs: 2, clientsLow: 1, scale: 1, perf: true}
	ps := p.passes()
	b := &bench{t: t, p: p, started: time.Now(), perf: perfTool{events: perfEvents}}
	for i, c := range configs {
		for _, pass := range ps {
			r := result{cfg: c.name, pass: pass, cycle: 1, seconds: 5, txns: 1000, tps: float64(100*(i+1) + pass.clients),
				cpu: [nGroups]float64{500, 100, nan, nan, 50}}
			if pass.n == 0 {
				r.nodes = []perfNode{{label: "node " + c.name, fsyncsPerCommit: 1, counts: perfstat.Counts{"task-clock": 200000, "syscalls:sys_enter_fdatasync": 500}}}
			}
			b.results = append(b.results, r)
		}
	}
	doc := b.docSection(time.Minute)
	for _, want := range []string{
		"BENCH_CLIENTS_LOW=1 ",
		"**8 clients** (`pgbench -c 8 -j 2`), medians over 1 rounds per configuration:\n\n| config |",
		"| A1 | 1 | 108.0 |",
		"**1 client** (`pgbench -c 1 -j 1`), medians over 1 rounds per configuration:\n\n| config |",
		"| A1 | 1 | 101.0 |",
		"| B/A1 | 2.85 |", // 308/108, 8 clients
		"| B/A1 | 2.98 |", // 301/101, 1 client
		"**Per node** (`perf stat`, round 1 of A1, A3, B, 8 clients):\n\n| per transaction (per commit) | node A1 (A1) | node A3 (A3) | node B (B) |",
		"| CPU µs (task-clock) | 200 (400) |",
		"| 1 | B | 1 | 301.0 |",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("doc section lacks %q:\n%s", want, doc)
		}
	}
	b.perf = perfTool{off: "no perf in PATH"}
	if doc := b.docSection(time.Minute); !strings.Contains(doc, "No per-node table: no perf in PATH.") {
		t.Errorf("without perf the doc section does not say so:\n%s", doc)
	}
}
