package e2e

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/safekeeper/safekeeper/test/harness"
)

// fnum formats x with prec decimals, "-" for NaN.
func fnum(x float64, prec int) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return strconv.FormatFloat(x, 'f', prec, 64)
}

func gapString(r result) string {
	if !r.hasGap {
		return "-"
	}
	return fmt.Sprintf("%.1fms (%d late)", float64(r.gap)/float64(time.Millisecond), r.late)
}

// roundLine is the one line printed per round.
func roundLine(r result, rounds int) string {
	label := fmt.Sprintf("round %d/%d", r.cycle, rounds)
	if r.cycle == 0 {
		label = "warm-up"
	}
	label += fmt.Sprintf(" -c %d", r.pass.clients)
	line := fmt.Sprintf("%-3s %-15s %3ds: tps %7.1f  latency p50 %6.2f ms p99 %6.2f ms  flush_lag p50 %s ms (%d samples)  "+
		"CPU µs/txn: primary %s standbys %s proposer %s safekeepers %s pgbench %s (server total %s)  max_response_gap %s",
		r.cfg, label, r.seconds, r.tps, r.latP50, r.latP99, fnum(r.lagP50, 2), r.lagSamples,
		fnum(r.cpu[gPrimary], 0), fnum(r.cpu[gStandbys], 0), fnum(r.cpu[gProposer], 0), fnum(r.cpu[gSafekeepers], 0),
		fnum(r.cpu[gPgbench], 0), fnum(r.server(), 0), gapString(r))
	if r.hasGap {
		line += fmt.Sprintf(" (before the round, catching up: %.1fms)", float64(r.catchupGap)/float64(time.Millisecond))
	}
	return line
}

// figure is one column of the summary.
type figure struct {
	name string
	prec int
	get  func(result) float64
}

var figures = []figure{
	{"TPS", 1, func(r result) float64 { return r.tps }},
	{"latency p50 ms", 2, func(r result) float64 { return r.latP50 }},
	{"latency p99 ms", 2, func(r result) float64 { return r.latP99 }},
	{"flush_lag p50 ms", 2, func(r result) float64 { return r.lagP50 }},
	{"CPU µs/txn primary", 0, func(r result) float64 { return r.cpu[gPrimary] }},
	{"standbys", 0, func(r result) float64 { return r.cpu[gStandbys] }},
	{"proposer", 0, func(r result) float64 { return r.cpu[gProposer] }},
	{"safekeepers", 0, func(r result) float64 { return r.cpu[gSafekeepers] }},
	{"server total", 0, func(r result) float64 { return r.server() }},
	{"pgbench", 0, func(r result) float64 { return r.cpu[gPgbench] }},
	{"max_response_gap ms", 1, func(r result) float64 {
		if !r.hasGap {
			return math.NaN()
		}
		return float64(r.gap) / float64(time.Millisecond)
	}},
	{"catch-up max_response_gap ms", 1, func(r result) float64 {
		if !r.hasGap {
			return math.NaN()
		}
		return float64(r.catchupGap) / float64(time.Millisecond)
	}},
}

// replicas is the CPU per transaction of what keeps the copies of the WAL:
// the standbys (A) or the safekeepers (B). It is no column of the summary
// (both are); its ratio compares the two.
var replicas = figure{"replicas", 0, func(r result) float64 {
	if !math.IsNaN(r.cpu[gStandbys]) {
		return r.cpu[gStandbys]
	}
	return r.cpu[gSafekeepers]
}}

// ratioFigures are the figures whose B/A ratios are reported, with their
// labels there.
var ratioFigures = []struct{ figure, label string }{
	{"TPS", "TPS"}, {"latency p50 ms", "latency p50"}, {"latency p99 ms", "latency p99"}, {"flush_lag p50 ms", "flush_lag p50"},
	{"CPU µs/txn primary", "CPU/txn primary"}, {"server total", "CPU/txn server total"},
	{"replicas", "CPU/txn safekeepers / standbys"},
}

func figureByName(name string) figure {
	for _, f := range append(slices.Clone(figures), replicas) {
		if f.name == name {
			return f
		}
	}
	panic("no figure " + name)
}

func mdRow(cells ...string) string { return "| " + strings.Join(cells, " | ") + " |\n" }

func mdSep(n int) string { return "|" + strings.Repeat("---|", n) + "\n" }

// summaryTable is the median of each figure per configuration.
func summaryTable(results []result) string {
	var sb strings.Builder
	head := []string{"config", "rounds"}
	for _, f := range figures {
		head = append(head, f.name)
	}
	sb.WriteString(mdRow(head...))
	sb.WriteString(mdSep(len(head)))
	for _, c := range configs {
		var rs []result
		for _, r := range results {
			if r.cfg == c.name {
				rs = append(rs, r)
			}
		}
		row := []string{c.name, strconv.Itoa(len(rs))}
		for _, f := range figures {
			var xs []float64
			for _, r := range rs {
				xs = append(xs, f.get(r))
			}
			row = append(row, fnum(median(xs), f.prec))
		}
		sb.WriteString(mdRow(row...))
	}
	return sb.String()
}

// gapSummary names the longest wait for a SafeKeeperResponse of all B
// rounds and how many waits broke the protocol's 100 ms (the median hides
// a single bad round).
func gapSummary(results []result) string {
	var longest time.Duration
	var late int64
	n := 0
	for _, r := range results {
		if r.hasGap {
			n++
			longest = max(longest, r.gap)
			late += r.late
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("Longest max_response_gap of the %d B rounds: %.1f ms; waits over the protocol's 100 ms in them: %d.\n",
		n, float64(longest)/float64(time.Millisecond), late)
}

// ofPass are the results of pass n.
func ofPass(results []result, n int) []result {
	var out []result
	for _, r := range results {
		if r.pass.n == n {
			out = append(out, r)
		}
	}
	return out
}

// ratio is the median over cycles of B's figure divided by base's in the
// same cycle (pairs are adjacent in time, so drift cancels).
func ratio(results []result, base string, f figure) float64 {
	byCycle := map[int]map[string]result{}
	for _, r := range results {
		if byCycle[r.cycle] == nil {
			byCycle[r.cycle] = map[string]result{}
		}
		byCycle[r.cycle][r.cfg] = r
	}
	var xs []float64
	for _, m := range byCycle {
		bv, ok1 := m["B"]
		av, ok2 := m[base]
		if ok1 && ok2 {
			xs = append(xs, f.get(bv)/f.get(av))
		}
	}
	return median(xs)
}

func ratioTable(results []result) string {
	var sb strings.Builder
	head := []string{"median of per-cycle ratios"}
	for _, f := range ratioFigures {
		head = append(head, f.label)
	}
	sb.WriteString(mdRow(head...))
	sb.WriteString(mdSep(len(head)))
	for _, base := range []string{"A1", "A3"} {
		row := []string{"B/" + base}
		for _, f := range ratioFigures {
			row = append(row, fnum(ratio(results, base, figureByName(f.figure)), 2))
		}
		sb.WriteString(mdRow(row...))
	}
	return sb.String()
}

func roundsTable(results []result) string {
	var sb strings.Builder
	head := []string{"round", "config", "clients"}
	for _, f := range figures {
		head = append(head, f.name)
	}
	sb.WriteString(mdRow(head...))
	sb.WriteString(mdSep(len(head)))
	for _, r := range results {
		row := []string{strconv.Itoa(r.cycle), r.cfg, strconv.Itoa(r.pass.clients)}
		for _, f := range figures {
			row = append(row, fnum(f.get(r), f.prec))
		}
		sb.WriteString(mdRow(row...))
	}
	return sb.String()
}

// machine describes where a run ran.
type machine struct {
	nproc     int
	cpu       string
	memGiB    float64
	kernel    string
	tmpDir    string
	tmpFS     string
	pgVersion string
	goVersion string
	describe  string
	loadStart string
}

func describeMachine(b *bench) machine {
	m := machine{nproc: runtime.NumCPU(), goVersion: runtime.Version(), tmpDir: os.TempDir()}
	m.cpu = harness.CPUModel()
	if m.cpu == "" {
		m.cpu = "unknown"
	}
	m.memGiB = float64(harness.MemTotal()) / (1 << 30)
	ostype, _ := os.ReadFile("/proc/sys/kernel/ostype")
	rel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	m.kernel = strings.TrimSpace(string(ostype)) + " " + strings.TrimSpace(string(rel)) + " " + runtime.GOARCH
	m.tmpFS = filesystemOf(m.tmpDir)
	m.pgVersion = b.query("SHOW server_version")
	m.describe = "unknown"
	if root, err := harness.ModuleRoot(); err == nil {
		if out, err := exec.Command("git", "-C", root, "describe", "--always", "--dirty", "--tags").Output(); err == nil {
			m.describe = strings.TrimSpace(string(out))
		}
	}
	m.loadStart = loadAvg()
	return m
}

func loadAvg() string {
	if l := harness.LoadAvg(); l != "" {
		return l
	}
	return "unknown"
}

// filesystemOf names the file system type and source of the mount that
// holds dir (the longest mount point that is a prefix of it).
func filesystemOf(dir string) string {
	if d, err := filepath.EvalSymlinks(dir); err == nil {
		dir = d
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "unknown"
	}
	best, fs := -1, "unknown"
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 2 {
			continue
		}
		mp := strings.ReplaceAll(f[4], `\040`, " ")
		if (dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > best {
			best, fs = len(mp), fmt.Sprintf("%s (%s, mounted at %s)", g[0], g[1], mp)
		}
	}
	return fs
}

// perfScope says which rounds the per-node table covers.
func (b *bench) perfScope() string {
	if b.perf.off != "" {
		return "not measured"
	}
	return fmt.Sprintf("round %d of %s, %s", b.p.rounds, strings.Join(configNames(), ", "), b.p.passes()[0].label())
}

func configNames() []string {
	var out []string
	for _, c := range configs {
		out = append(out, c.name)
	}
	return out
}

// perfSection is the per-node table, or why there is none.
func (b *bench) perfSection() string {
	if b.perf.off != "" {
		return "No per-node table: " + b.perf.off + ".\n"
	}
	s := perfTable(b.results)
	if len(b.perf.missing) > 0 {
		s += "\nNot countable here, left out: " + strings.Join(b.perf.missing, ", ") + ".\n"
	}
	return s
}

// report prints the medians and ratios and rewrites the doc section.
func (b *bench) report() {
	took := time.Since(b.started).Round(time.Second)
	for _, ps := range b.p.passes() {
		rs := ofPass(b.results, ps.n)
		fmt.Printf("\n================ bench-e2e, %s (pgbench -c %d -j %d): medians over %d rounds per configuration ================\n",
			ps.label(), ps.clients, ps.jobs, b.p.rounds)
		fmt.Print(summaryTable(rs))
		fmt.Print(gapSummary(rs))
		fmt.Println()
		fmt.Print(ratioTable(rs))
	}
	fmt.Printf("\n================ bench-e2e: perf stat per node, %s ================\n", b.perfScope())
	fmt.Print(b.perfSection())
	fmt.Printf("(run took %v; load average at start %s, at end %s)\n", took, b.machine.loadStart, loadAvg())
	if !b.p.writeDoc {
		b.say("BENCH_WRITE_DOC=0: docs/performance.md left alone")
		return
	}
	path, err := harness.WriteDocSection("docs/performance.md", "bench-e2e", b.docSection(took))
	if err != nil {
		b.t.Fatal(err)
	}
	b.say("wrote the bench-e2e section of %s", path)
}

func (b *bench) docSection(took time.Duration) string {
	p, m := b.p, b.machine
	var sb strings.Builder
	fmt.Fprintf(&sb, "Generated by `make bench-e2e` (test/bench/e2e) on %s, build `%s`; the run took %v. Do not edit by hand: rerun it.\n\n",
		b.started.UTC().Format("2006-01-02 15:04 UTC"), m.describe, took)
	sb.WriteString("Command:\n\n")
	fmt.Fprintf(&sb, "    %s\n\n", p.command())
	fmt.Fprintf(&sb, "which runs `go test ./test/bench/e2e -run '^TestBenchE2E$' -count=1 -timeout 0 -v -args -bench.e2e` "+
		"(flags -bench.rounds, -bench.seconds, -bench.clients, -bench.jobs, -bench.clients-low, -bench.scale, -bench.warmup override the variables; "+
		"BENCH_PERF=0 or -bench.perf=false leaves out the per-node table; BENCH_WRITE_DOC=0 leaves this file alone).\n\n")
	sb.WriteString("Machine:\n\n")
	fmt.Fprintf(&sb, "- %d CPUs (nproc), %s, %.1f GiB memory\n", m.nproc, m.cpu, m.memGiB)
	fmt.Fprintf(&sb, "- kernel %s; temporary directories in %s on %s\n", m.kernel, m.tmpDir, m.tmpFS)
	fmt.Fprintf(&sb, "- PostgreSQL %s, %s\n", m.pgVersion, m.goVersion)
	fmt.Fprintf(&sb, "- shared with other work: load average %s at the start, %s at the end\n\n", m.loadStart, loadAvg())
	sb.WriteString("Method:\n\n")
	fmt.Fprintf(&sb, "- One PostgreSQL 15 primary (fsync on, synchronous_commit on, max_wal_size 8GB, checkpoint_timeout 30min so that no checkpoint starts inside a round), "+
		"`pgbench -i -s %d` once, before the base backups. Each round is `pgbench -n -c %d -j %d -T %d -l` over the unix socket "+
		"(TPC-B-like; -n because the harness does pgbench's cleanup itself, outside the measured window).", p.scale, p.clients, p.jobs, p.seconds)
	if ps := p.passes(); len(ps) > 1 {
		fmt.Fprintf(&sb, " A second pass, **%s**, runs the same rounds with `pgbench -c %d -j %d`: commit latency with no CPU contention.\n", ps[1].label(), ps[1].clients, ps[1].jobs)
	} else {
		sb.WriteString(" No second pass with fewer clients (BENCH_CLIENTS_LOW=0).\n")
	}
	sb.WriteString("- Configurations: **A1** one stock streaming standby s1 (pg_basebackup, standby.signal, physical slot), " +
		"`synchronous_standby_names = 's1'`; **A3** three stock standbys, `'ANY 2 (s1,s2,s3)'`; **B** `safekeeper propose` and three " +
		"`safekeeper run` (fsync on), `'proposer'`. Every standby and the proposer reach the primary over TCP on loopback.\n")
	fmt.Fprintf(&sb, "- Rounds alternate A1, A3, B, A1, … (%d each per pass; the second pass after the first). Before each: synchronous_standby_names set (ALTER SYSTEM, reload); "+
		"every standby, proposer and safekeeper the configuration does not use stopped (nothing idle streams or replays); its members started "+
		"and waited for until synchronous with everything flushed (standbys: replayed); TRUNCATE pgbench_history, VACUUM pgbench_branches and "+
		"pgbench_tellers, CHECKPOINT, wait again; for B the proposer is restarted, so its link stats cover the round, not its catch-up after the A rounds.", p.rounds)
	if p.warmup > 0 {
		fmt.Fprintf(&sb, " First one %d s warm-up round per configuration, not counted.\n", p.warmup)
	} else {
		sb.WriteString(" No warm-up.\n")
	}
	sb.WriteString("- TPS: pgbench's (without initial connection time). Latency: p50/p99 of the per-transaction log's latency column. " +
		"flush_lag: pg_stat_replication.flush_lag of the synchronous standbys (sync or quorum) sampled every 100 ms, median over samples and standbys.\n")
	sb.WriteString("- CPU µs per transaction: the delta over the round of utime+stime+cutime+cstime (/proc, clock ticks) of each process tree, " +
		"after the exited backends are reaped: the primary's postmaster with all its children (backends, walsenders), each running standby's postmaster " +
		"tree, the proposer, the safekeepers; pgbench from its rusage. Server total = all but pgbench. The ratio \"CPU/txn safekeepers / standbys\" divides B's safekeepers by A's standbys.\n")
	sb.WriteString("- max_response_gap (B): the longest time any proposer↔safekeeper connection waited for a SafeKeeperResponse with a request outstanding, " +
		"from the proposer's `safekeeper link stats` log lines at SIGTERM (the protocol's bound is 100 ms; \"late\" counts waits above it). " +
		"It is timed where the proposer's owner goroutine queues requests and handles responses, so proposer-side delays count too: an upper bound on the safekeepers' silence. " +
		"catch-up max_response_gap: the same figure of the proposer run the harness restarts before a B round: its start, and the catch-up of the WAL written since the last B round.\n")
	sb.WriteString("- Per node: in the last round of the first pass of each configuration, `perf stat -x, -p PID` (started with its counters disabled, `-D -1 --control fd:…`; " +
		"enabled just before pgbench starts, disabled when it ends) on one node of each kind: the walreceiver of standby s1 (A1, A3; found by its process title), " +
		"safekeeper 1 and the proposer (B). Counts are divided by the round's transactions; in parentheses by the node's commits of WAL: a walreceiver's fdatasyncs " +
		"(one per flush), half a safekeeper's (bbolt makes two per transaction: pages, then meta). A Go process reads and writes its sockets with read and write (a safekeeper reads bbolt through its mmap, " +
		"writes it with pwrite64), libpq with recvfrom and sendto; a walreceiver writes WAL with pwrite64, and PostgreSQL's read also drains its latch's wakeup descriptor (a latch set by another process); nanosleep in a Go process is mostly the runtime's sysmon polling while a thread is in a blocking system call. " +
		"perf's counting adds a little to these rounds' cost; their other figures are in the medians like any round's.\n")
	sb.WriteString("- Ratios: for each cycle B's figure over A1's (A3's) from the same cycle, then the median over cycles. The machine is shared, " +
		"so absolute figures are noisy; the ratios are the result.\n\n")
	for _, ps := range p.passes() {
		rs := ofPass(b.results, ps.n)
		fmt.Fprintf(&sb, "**%s** (`pgbench -c %d -j %d`), medians over %d rounds per configuration:\n\n", ps.label(), ps.clients, ps.jobs, p.rounds)
		sb.WriteString(summaryTable(rs))
		sb.WriteString("\n" + gapSummary(rs) + "\n")
		sb.WriteString(ratioTable(rs))
		sb.WriteString("\n")
	}
	fmt.Fprintf(&sb, "**Per node** (`perf stat`, %s):\n\n", b.perfScope())
	sb.WriteString(b.perfSection())
	sb.WriteString("\nEvery round:\n\n")
	sb.WriteString(roundsTable(b.results))
	return sb.String()
}
