package archive

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/safekeeper/safekeeper/test/harness"
)

// machine describes where a run ran.
type machine struct {
	nproc       int
	cpu         string
	memGiB      float64
	kernel      string
	pgVersion   string
	pgbrVersion string
	goVersion   string
	describe    string
	loadStart   string
}

func describeMachine(b *bench) machine {
	m := machine{nproc: runtime.NumCPU(), goVersion: runtime.Version(), cpu: harness.CPUModel()}
	if m.cpu == "" {
		m.cpu = "unknown"
	}
	m.memGiB = float64(harness.MemTotal()) / (1 << 30)
	ostype, _ := os.ReadFile("/proc/sys/kernel/ostype")
	rel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	m.kernel = strings.TrimSpace(string(ostype)) + " " + strings.TrimSpace(string(rel)) + " " + runtime.GOARCH
	m.pgVersion = b.query("SHOW server_version")
	m.pgbrVersion = "unknown"
	if out, err := exec.Command("pgbackrest", "version").Output(); err == nil {
		m.pgbrVersion = strings.TrimPrefix(strings.TrimSpace(string(out)), "pgBackRest ")
	}
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

// fnum formats x with prec decimals, "-" for NaN.
func fnum(x float64, prec int) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return strconv.FormatFloat(x, 'f', prec, 64)
}

// mib formats a byte count as MiB.
func mib(bytes float64) string { return fnum(bytes/(1<<20), 2) + " MiB" }

func mdRow(cells ...string) string { return "| " + strings.Join(cells, " | ") + " |\n" }

func mdSep(n int) string { return "|" + strings.Repeat("---|", n) + "\n" }

// lagPct is the p-quantile of a round's lag samples, in bytes.
func lagPct(r loadResult, p float64) float64 {
	xs := make([]float64, len(r.lag))
	for i, l := range r.lag {
		xs[i] = float64(l)
	}
	slices.Sort(xs)
	return percentile(xs, p)
}

// medianRate is the median MiB/s of side's timings in tms.
func medianRate(tms []timing, side string) float64 {
	var xs []float64
	for _, tm := range tms {
		if tm.side == side {
			xs = append(xs, tm.rate())
		}
	}
	return median(xs)
}

// rateRatio is the median over rounds of a's rate over b's in the same
// round.
func rateRatio(tms []timing, a, b string) float64 { return median(rateRatios(tms, a, b)) }

// rateRatios are a's rate over b's, round by round.
func rateRatios(tms []timing, a, b string) []float64 {
	by := map[int]map[string]float64{}
	for _, tm := range tms {
		if by[tm.round] == nil {
			by[tm.round] = map[string]float64{}
		}
		by[tm.round][tm.side] = tm.rate()
	}
	var xs []float64
	for round := 1; round <= len(by); round++ {
		m := by[round]
		if x, ok := m[a]; ok {
			if y, ok := m[b]; ok {
				xs = append(xs, x/y)
			}
		}
	}
	return xs
}

// loadFigure is the median over rounds of c's figure.
func (b *bench) loadFigure(c string, f func(loadResult) float64) float64 {
	var xs []float64
	for _, r := range b.loads {
		if r.cfg == c {
			xs = append(xs, f(r))
		}
	}
	return median(xs)
}

// tpsRatio is the median over cycles of c's TPS over base's in the same
// cycle (adjacent in time, so drift cancels).
func (b *bench) tpsRatio(c, base string) float64 { return median(b.tpsRatios(c, base)) }

// tpsRatios are c's TPS over base's, cycle by cycle.
func (b *bench) tpsRatios(c, base string) []float64 {
	return b.loadRatios(c, base, func(r loadResult) float64 { return r.tps })
}

// cpuPerTxn is a round's server CPU time per transaction, in µs.
func cpuPerTxn(r loadResult) float64 {
	hz, err := harness.ClockTicks()
	if err != nil || r.txns == 0 {
		return math.NaN()
	}
	return float64(r.cpuTicks) * 1e6 / float64(hz) / float64(r.txns)
}

// loadRatios are c's figure over base's, cycle by cycle.
func (b *bench) loadRatios(c, base string, f func(loadResult) float64) []float64 {
	by := map[int]map[string]float64{}
	for _, r := range b.loads {
		if by[r.cycle] == nil {
			by[r.cycle] = map[string]float64{}
		}
		by[r.cycle][r.cfg] = f(r)
	}
	var xs []float64
	for cycle := 1; cycle <= len(by); cycle++ {
		m := by[cycle]
		if x, ok := m[c]; ok {
			if y, ok := m[base]; ok {
				xs = append(xs, x/y)
			}
		}
	}
	return xs
}

// list formats xs with prec decimals, comma-separated.
func list(xs []float64, prec int) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fnum(x, prec)
	}
	return strings.Join(out, ", ")
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// results are the tables of a run, for the terminal and the document.
func (b *bench) results() string {
	var sb strings.Builder
	n := len(b.segs)
	walMiB := float64(b.walBytes()) / (1 << 20)
	fmt.Fprintf(&sb, "**Upload** of the same %d segments (%.0f MiB of pgbench WAL) into versitygw over TLS, zstd; medians over %d rounds:\n\n", n, walMiB, b.p.rounds)
	sb.WriteString(mdRow("side", "what is timed", "MiB/s of WAL", "/ pgBackRest", "compressed / WAL"))
	sb.WriteString(mdSep(5))
	ratio := func(side string) string { return fnum(float64(b.stored[side])/float64(b.walBytes()), 3) }
	sb.WriteString(mdRow("safekeeper", "start of `safekeeper run --remote-storage` on a copy of the stopped safekeeper holding the WAL committed → backup_lsn at the last segment's end",
		fnum(medianRate(b.uploads, sideSK), 1), fnum(rateRatio(b.uploads, sideSK, sidePB), 2), ratio(sideSK)))
	sb.WriteString(mdRow("pgBackRest", "`archive-push` of each segment in order (async, process-max 4) → the last call returns",
		fnum(medianRate(b.uploads, sidePB), 1), "1.00", ratio(sidePB)))
	up := rateRatio(b.uploads, sideSK, sidePB)
	fmt.Fprintf(&sb, "\nUpload rate safekeeper / pgBackRest (median of per-round ratios; per round: %s): **%s** (goal ≥ 1.5: %s). "+
		"Stored bytes: the segments' objects as versitygw keeps them (headers included), round 1.\n\n",
		list(rateRatios(b.uploads, sideSK, sidePB), 2), fnum(up, 2), verdict(up >= 1.5))
	var starts, firsts []float64
	for _, tm := range b.uploads {
		if tm.side == sideSK {
			starts = append(starts, tm.start.Seconds())
			firsts = append(firsts, tm.firstStored.Seconds())
		}
	}
	fmt.Fprintf(&sb, "Of the safekeeper's time (medians), %s s pass before it listens (start-up), and %s s before it logs the first segment stored "+
		"(start-up, the first look at the archive, the wait for its turn, the first batch's uploads).\n\n", fnum(median(starts), 3), fnum(median(firsts), 3))

	fmt.Fprintf(&sb, "**Restore** of the same %d segments, one command per segment as restore_command runs them, every segment's SHA-256 checked; medians over %d rounds:\n\n", n, b.p.rounds)
	sb.WriteString(mdRow("side", "command", "MiB/s of WAL", "safekeeper / this"))
	sb.WriteString(mdSep(4))
	sb.WriteString(mdRow("safekeeper", "`safekeeper wal fetch --remote-storage URL %f %p`", fnum(medianRate(b.fetches, sideSK), 1), "1.00"))
	sb.WriteString(mdRow("pgBackRest", "`pgbackrest archive-get %f %p` (async: prefetch with process-max 4)", fnum(medianRate(b.fetches, sidePB), 1),
		fnum(rateRatio(b.fetches, sideSK, sidePB), 2)))
	sb.WriteString(mdRow("pgBackRest, no async", "`pgbackrest --archive-async=n archive-get %f %p`", fnum(medianRate(b.fetches, sidePBNoAsync), 1),
		fnum(rateRatio(b.fetches, sideSK, sidePBNoAsync), 2)))

	fmt.Fprintf(&sb, "\n**Under pgbench** (`-c %d -j %d -T %d`, three safekeepers behind the proposer as the synchronous standby), medians over %d rounds per configuration; "+
		"lag = the primary's pg_current_wal_flush_lsn() minus the archive's end, sampled every 100 ms:\n\n", b.p.clients, b.p.jobs, b.p.seconds, b.p.rounds)
	sb.WriteString(mdRow("configuration", "TPS", "TPS / none", "CPU µs/txn", "CPU/txn / none", "WAL MiB/s", "lag p50", "lag p99", "lag max"))
	sb.WriteString(mdSep(9))
	names := map[string]string{cfgNone: "none (no archive)", cfgSK: "safekeeper --remote-storage", cfgPB: "archive_command = pgbackrest archive-push, archive_timeout 60s"}
	for _, c := range loadConfigs {
		row := []string{names[c], fnum(b.loadFigure(c, func(r loadResult) float64 { return r.tps }), 1), fnum(b.tpsRatio(c, cfgNone), 3),
			fnum(b.loadFigure(c, cpuPerTxn), 0), fnum(median(b.loadRatios(c, cfgNone, cpuPerTxn)), 3),
			fnum(b.loadFigure(c, func(r loadResult) float64 { return float64(r.walBytes) / (1 << 20) / float64(r.seconds) }), 2)}
		if c == cfgNone {
			row = append(row, "-", "-", "-")
		} else {
			for _, p := range []float64{0.5, 0.99, 1} {
				row = append(row, mib(b.loadFigure(c, func(r loadResult) float64 { return lagPct(r, p) })))
			}
		}
		sb.WriteString(mdRow(row...))
	}
	loss := 1 - b.tpsRatio(cfgSK, cfgNone)
	fmt.Fprintf(&sb, "\nTPS lost to the safekeepers' archive (1 - median of per-cycle sk/none; negative: none measurable): **%s%%** (goal ≤ 5%%: %s). "+
		"The per-cycle ratios, sk/none: %s; pgbackrest/none: %s: their spread is the noise a single figure hides.\n\n",
		fnum(100*loss, 1), verdict(loss <= 0.05), list(b.tpsRatios(cfgSK, cfgNone), 3), list(b.tpsRatios(cfgPB, cfgNone), 3))
	cost := median(b.loadRatios(cfgSK, cfgNone, cpuPerTxn)) - 1
	fmt.Fprintf(&sb, "CPU per transaction of the servers (the primary's process tree with its archiver and archive_command, the proposer, the safekeepers), "+
		"the figure this machine's noise moves least: the safekeepers' archive adds **%s%%** (median of per-cycle sk/none: %s); "+
		"pgBackRest's archive_command %s%% (pgbackrest/none: %s).\n\n",
		fnum(100*cost, 1), list(b.loadRatios(cfgSK, cfgNone, cpuPerTxn), 3),
		fnum(100*(median(b.loadRatios(cfgPB, cfgNone, cpuPerTxn))-1), 1), list(b.loadRatios(cfgPB, cfgNone, cpuPerTxn), 3))

	sb.WriteString("Every round:\n\n")
	sb.WriteString(mdRow("phase", "round", "side / configuration", "seconds", "MiB/s", "TPS", "CPU µs/txn", "lag p50", "lag p99", "samples"))
	sb.WriteString(mdSep(10))
	for _, tm := range slices.Concat(b.uploads, b.fetches) {
		sb.WriteString(mdRow(tm.what, strconv.Itoa(tm.round), tm.side, fnum(tm.dur.Seconds(), 3), fnum(tm.rate(), 1), "", "", "", "", ""))
	}
	for _, r := range b.loads {
		p50, p99 := "-", "-"
		if r.cfg != cfgNone {
			p50, p99 = mib(lagPct(r, 0.5)), mib(lagPct(r, 0.99))
		}
		sb.WriteString(mdRow("load", strconv.Itoa(r.cycle), r.cfg, strconv.Itoa(r.seconds), fnum(float64(r.walBytes)/(1<<20)/float64(r.seconds), 2),
			fnum(r.tps, 1), fnum(cpuPerTxn(r), 0), p50, p99, strconv.Itoa(r.samples)))
	}
	return sb.String()
}

// report prints the results and rewrites the doc section.
func (b *bench) report() {
	took := time.Since(b.started).Round(time.Second)
	fmt.Printf("\n================ bench-archive ================\n")
	fmt.Print(b.results())
	fmt.Printf("(run took %v; load average at start %s, at end %s)\n", took, b.machine.loadStart, loadAvg())
	if !b.p.writeDoc {
		b.say("BENCH_WRITE_DOC=0: docs/performance.md left alone")
		return
	}
	path, err := harness.WriteDocSection("docs/performance.md", "bench-archive", b.docSection(took))
	if err != nil {
		b.t.Fatal(err)
	}
	b.say("wrote the bench-archive section of %s", path)
}

func (b *bench) docSection(took time.Duration) string {
	p, m := b.p, b.machine
	var sb strings.Builder
	fmt.Fprintf(&sb, "Generated by `make bench-archive` (test/bench/archive) on %s, build `%s`; the run took %v. Do not edit by hand: rerun it.\n\n",
		b.started.UTC().Format("2006-01-02 15:04 UTC"), m.describe, took)
	sb.WriteString("Command:\n\n")
	fmt.Fprintf(&sb, "    %s\n\n", p.command())
	sb.WriteString("which runs `go test ./test/bench/archive -run '^TestBenchArchive$' -count=1 -timeout 0 -v -args -bench.archive` " +
		"(flags -bench.rounds, -bench.segments, -bench.seconds, -bench.clients, -bench.jobs, -bench.scale, -bench.warmup override the variables; " +
		"BENCH_WRITE_DOC=0 leaves this file alone).\n\n")
	sb.WriteString("Machine:\n\n")
	fmt.Fprintf(&sb, "- %d CPUs (nproc), %s, %.1f GiB memory; kernel %s\n", m.nproc, m.cpu, m.memGiB, m.kernel)
	fmt.Fprintf(&sb, "- PostgreSQL %s, pgBackRest %s, versitygw %s (posix backend, on the same disk), %s\n", m.pgVersion, m.pgbrVersion, "v1.8.0", m.goVersion)
	fmt.Fprintf(&sb, "- shared with other work: load average %s at the start, %s at the end\n\n", m.loadStart, loadAvg())
	sb.WriteString("Method (test/bench/archive/doc.go has it in full):\n\n")
	sb.WriteString("- The store: one versitygw on 127.0.0.1 serving TLS with a certificate of a CA the run makes; both clients verify it " +
		"(the safekeeper through AWS_CA_BUNDLE; pgBackRest through repo1-storage-ca-file, addressed as localhost because pgBackRest 2.45 matches names, not IP addresses). " +
		"pgBackRest: `archive-async=y`, `process-max=4`, `compress-type=zst` (level 3), `repo1-s3-uri-style=path`, run as the postgres user. " +
		"The safekeeper: its defaults (`--backup-parallel-jobs 4`, zstd, `--partial-backup-interval 10s`).\n")
	fmt.Fprintf(&sb, "- Upload and restore: pgbench (`-c %d -j %d`, synchronous_commit off, scale %d) writes %d whole 16 MiB segments through a proposer to one safekeeper without an archive, "+
		"which is then stopped (its data directory is the template); the same segment files are copied from the primary's pg_wal into a data directory's layout "+
		"with an `archive_status/*.ready` per segment, as the archiver finds them. Each round, in alternating order: a copy of the template, flushed to disk as a data directory is when its safekeeper restarts, is started with "+
		"`--remote-storage` (a fresh prefix) and timed from the start until its backup_lsn (HTTP, polled every 10 ms) reaches the last segment's end — the WAL is already "+
		"committed and on its disk, so this is the archive's upload, start-up included; `pgbackrest archive-push` of each segment in order, as the archiver calls it "+
		"(the first call starts the async process, which pushes every ready segment with 4 processes; later calls return once theirs is pushed), timed until the last returns "+
		"(stanza-create of a fresh repository path before the clock). Then both archives are restored, one command per segment into a file, "+
		"`safekeeper wal fetch --remote-storage` and `pgbackrest archive-get` with and without async; each restored segment's SHA-256 is checked against the original. "+
		"Files are in the page cache on both sides.\n", p.clients, p.jobs, p.scale, p.segments)
	fmt.Fprintf(&sb, "- Under pgbench: the same primary with the proposer and three safekeepers as its synchronous standby (`synchronous_standby_names = 'proposer'`), "+
		"archive_mode on. Rounds of %d s alternate none (no archive: archive_command `true`, the safekeepers without `--remote-storage`), sk (the safekeepers with "+
		"`--remote-storage`), pgbackrest (`archive_command = 'pgbackrest ... archive-push %%p'`, archive_timeout 60s), the order rotated by one each cycle, "+
		"after one unreported warm-up round of %d s per configuration (0: none). Before each: the safekeepers restarted if their flags change, "+
		"pgbench_history truncated, VACUUM, CHECKPOINT, pg_switch_wal(), a wait until the configuration's archive holds everything, so each round starts caught up, and then 5 s in every configuration alike, so that none (with nothing to wait for) does not start while the round before still has work running. "+
		"Every 100 ms, in every configuration alike, the harness reads pg_current_wal_flush_lsn(), pg_stat_archiver and the three safekeepers' backup_lsn (HTTP); "+
		"the lag is the flush LSN minus the highest backup_lsn (sk) or the end of last_archived_wal (pgbackrest); p50/p99/max per round, then the median over rounds. "+
		"After each sk round every whole segment below the highest backup_lsn is checked to be in the store. CPU µs/txn: the delta over the round of utime+stime+cutime+cstime (/proc) of the primary's process tree (its archiver and the archive_command it runs included), the proposer and the three safekeepers, taken once pgbench's backends are reaped, over the round's transactions.\n", p.seconds, p.warmup)
	sb.WriteString("- Ratios: per round (per cycle) the two sides' figures divided, then the median. The machine is shared, so absolute figures are noisy.\n\n")
	sb.WriteString(b.results())
	return sb.String()
}
