package e2e

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/perfstat"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// The benchmark's knobs: flags, defaulting to the environment variables
// make bench-e2e passes through.
var (
	flagRun     = flag.Bool("bench.e2e", false, "run the end-to-end benchmark (make bench-e2e); without it TestBenchE2E skips")
	flagRounds  = flag.Int("bench.rounds", knobs.Int("BENCH_ROUNDS", 3), "measured rounds per configuration (env BENCH_ROUNDS)")
	flagSeconds = flag.Int("bench.seconds", knobs.Int("BENCH_SECONDS", 15), "pgbench -T of each round (env BENCH_SECONDS)")
	flagClients = flag.Int("bench.clients", knobs.Int("BENCH_CLIENTS", 8), "pgbench -c (env BENCH_CLIENTS)")
	flagJobs    = flag.Int("bench.jobs", knobs.Int("BENCH_JOBS", 2), "pgbench -j (env BENCH_JOBS)")
	flagLow     = flag.Int("bench.clients-low", knobs.Int("BENCH_CLIENTS_LOW", 1), "pgbench -c of the second pass (-j 1 for 1 client), 0 for no second pass (env BENCH_CLIENTS_LOW)")
	flagScale   = flag.Int("bench.scale", knobs.Int("BENCH_SCALE", 10), "pgbench -i -s (env BENCH_SCALE)")
	flagWarmup  = flag.Int("bench.warmup", knobs.Int("BENCH_WARMUP", 3), "seconds of one unreported warm-up round per configuration, 0 for none (env BENCH_WARMUP)")
	flagPerf    = flag.Bool("bench.perf", knobs.Int("BENCH_PERF", 1) != 0, "attach perf stat to one node of each kind in the main pass's last round of each configuration (env BENCH_PERF=0: not)")
	flagDoc     = flag.Bool("bench.doc", knobs.Int("BENCH_WRITE_DOC", 1) != 0, "rewrite the bench-e2e section of docs/performance.md (env BENCH_WRITE_DOC=0: leave it)")
)

var knobs harness.Knobs // the flags' defaults from BENCH_* (TestBench* fails on a bad one)

type params struct {
	rounds, seconds, clients, jobs, scale, warmup int
	clientsLow                                    int // the second pass's pgbench -c; 0: no second pass
	perf                                          bool
	writeDoc                                      bool
}

// pass is one series of rounds at one pgbench client count: the main pass
// (BENCH_CLIENTS) and the low one (BENCH_CLIENTS_LOW: commit latency
// without CPU contention).
type pass struct {
	n             int // index in params.passes: 0 main, 1 low
	clients, jobs int
}

func (ps pass) label() string {
	if ps.clients == 1 {
		return "1 client"
	}
	return fmt.Sprintf("%d clients", ps.clients)
}

// passes are the passes a run makes, the main one first.
func (p params) passes() []pass {
	out := []pass{{n: 0, clients: p.clients, jobs: p.jobs}}
	if p.clientsLow > 0 {
		out = append(out, pass{n: 1, clients: p.clientsLow, jobs: min(p.jobs, p.clientsLow)})
	}
	return out
}

func (p params) validate() error {
	var errs []error
	for _, c := range []struct {
		name   string
		v, min int
	}{{"BENCH_ROUNDS", p.rounds, 1}, {"BENCH_SECONDS", p.seconds, 1}, {"BENCH_CLIENTS", p.clients, 1},
		{"BENCH_JOBS", p.jobs, 1}, {"BENCH_CLIENTS_LOW", p.clientsLow, 0}, {"BENCH_SCALE", p.scale, 1}, {"BENCH_WARMUP", p.warmup, 0}} {
		if c.v < c.min {
			errs = append(errs, fmt.Errorf("%s = %d, want at least %d", c.name, c.v, c.min))
		}
	}
	if p.jobs > p.clients {
		errs = append(errs, fmt.Errorf("BENCH_JOBS = %d exceeds BENCH_CLIENTS = %d (pgbench refuses more threads than clients)", p.jobs, p.clients))
	}
	return errors.Join(errs...)
}

// command is the command line that reproduces a run with p.
func (p params) command() string {
	perf := ""
	if !p.perf {
		perf = "BENCH_PERF=0 "
	}
	return fmt.Sprintf("BENCH_ROUNDS=%d BENCH_SECONDS=%d BENCH_CLIENTS=%d BENCH_JOBS=%d BENCH_CLIENTS_LOW=%d BENCH_SCALE=%d BENCH_WARMUP=%d %smake bench-e2e",
		p.rounds, p.seconds, p.clients, p.jobs, p.clientsLow, p.scale, p.warmup, perf)
}

func TestMain(m *testing.M) { harness.Main(m) }

// The process groups whose CPU time a round reports.
const (
	gPrimary = iota
	gStandbys
	gProposer
	gSafekeepers
	gPgbench
	nGroups
)

var groupNames = [nGroups]string{"primary", "standbys", "proposer", "safekeepers", "pgbench"}

// result is one round.
type result struct {
	cfg        string
	pass       pass
	cycle      int // 1..rounds; 0 for the warm-up
	seconds    int
	txns       int64
	tps        float64
	latP50     float64 // ms
	latP99     float64 // ms
	lagP50     float64 // ms; NaN: no sample
	lagSamples int
	cpu        [nGroups]float64 // µs per transaction; NaN: the group did not run
	gap        time.Duration    // longest max_response_gap of the proposer's links (B only)
	late       int64            // responses that ended a wait over 100 ms (B only)
	hasGap     bool
	catchupGap time.Duration // the same, of the proposer run restarted before the round
	nodes      []perfNode    // perf stat's counts per node, in the round that has them
}

// server is the CPU per transaction of everything but pgbench.
func (r result) server() float64 {
	var sum float64
	for g := range gPgbench {
		if !math.IsNaN(r.cpu[g]) {
			sum += r.cpu[g]
		}
	}
	return sum
}

type bench struct {
	t        *testing.T
	p        params
	clk      float64 // clock ticks per second
	pg       *pgtest.Cluster
	mon      *pgx.Conn // the harness's one connection to the primary
	standbys []*standby
	sks      []*harness.Safekeeper
	prop     *harness.Process
	logDir   string // pgbench's per-transaction logs (owned by postgres)
	started  time.Time
	machine  machine
	results  []result
	perf     perfTool
	perfDir  string // perf stat's output files

	propLogFrom int // where the running proposer's part of its log begins
}

// TestBenchE2E is make bench-e2e: see the package comment.
func TestBenchE2E(t *testing.T) {
	if !*flagRun {
		t.Skip("the end-to-end benchmark runs only with -bench.e2e (make bench-e2e)")
	}
	p := params{rounds: *flagRounds, seconds: *flagSeconds, clients: *flagClients, jobs: *flagJobs,
		clientsLow: *flagLow, scale: *flagScale, warmup: *flagWarmup, perf: *flagPerf, writeDoc: *flagDoc}
	if err := errors.Join(knobs.Err(), p.validate()); err != nil {
		t.Fatal(err)
	}
	b := setup(t, p)
	b.run()
	b.report()
}

func (b *bench) say(format string, args ...any) {
	fmt.Printf("[bench-e2e %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// setup starts the primary, loads pgbench's tables and takes the three
// standbys' base backups (slots s1, s2, s3). Standbys, safekeepers and the
// proposer start when a configuration needs them.
func setup(t *testing.T, p params) *bench {
	b := &bench{t: t, p: p, started: time.Now()}
	hz, err := harness.ClockTicks()
	if err != nil {
		t.Fatal(err)
	}
	b.clk = float64(hz)
	// About 5 s per round for switching, cleanup, CHECKPOINT and waits;
	// pgbench -i and the base backups take about 2 s per unit of scale.
	cycles := float64(p.rounds)
	if p.warmup > 0 {
		cycles++
	}
	cycles += float64(p.rounds * (len(p.passes()) - 1))
	est := (float64(len(configs))*(float64(len(p.passes())*p.rounds*p.seconds+p.warmup)+5*cycles) + 10 + 2*float64(p.scale)) / 60
	b.say("%s: about %.0f minutes", p.command(), math.Ceil(est))
	b.say("building the safekeeper binary")
	harness.Binary(t)
	// TCP: the standbys and the proposer stream from the primary over
	// loopback TCP, as they would over a network (a Unix socket would
	// flatter them); pgbench uses its socket. So does nothing else for
	// long: the monitor connection comes over TCP, so that waitNoClients
	// can tell pgbench's backends ("[local]") from it.
	b.pg = pgtest.Start(t, pgtest.Options{Conf: primaryConf, TCP: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if b.mon, err = pgx.Connect(ctx, b.pg.TCPConnString()); err != nil {
		t.Fatalf("connect to the primary: %v", err)
	}
	t.Cleanup(func() { b.mon.Close(context.Background()) })
	b.machine = describeMachine(b)
	b.say("primary: PostgreSQL %s on port %d in %s", b.machine.pgVersion, b.pg.Port, b.pg.Dir)
	b.logDir = pgtest.Dir(t, "bench-e2e-pgbench-")
	b.perf = probePerf(p.perf)
	b.perfDir = t.TempDir()
	switch {
	case b.perf.off != "":
		b.say("no per-node table: %s", b.perf.off)
	case len(b.perf.missing) > 0:
		b.say("perf stat: per-node table without %s (not countable here)", strings.Join(b.perf.missing, ", "))
	default:
		b.say("perf stat: per-node table in round %d of each configuration (%s)", p.rounds, b.perf.path)
	}

	b.say("pgbench -i -s %d (no synchronous standby yet; the base backups below copy the result)", p.scale)
	out, err := b.runPG(30*time.Minute, "pgbench", "-i", "-s", strconv.Itoa(p.scale), "-q",
		"-h", b.pg.SocketDir, "-p", strconv.Itoa(b.pg.Port), "-U", "postgres", "postgres")
	if err != nil {
		t.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	b.exec("CHECKPOINT")
	for _, name := range []string{"s1", "s2", "s3"} {
		b.say("base backup for standby %s (pg_basebackup -X stream -C -S %s)", name, name)
		b.standbys = append(b.standbys, b.newStandby(name))
	}
	return b
}

// run runs the warm-up rounds, then the measured ones of each pass: A1,
// A3, B, A1, … at BENCH_CLIENTS clients, then the same at
// BENCH_CLIENTS_LOW.
func (b *bench) run() {
	p := b.p
	b.say("before each round: switch the configuration (stop what it does not use), wait until its members are synchronous and caught up, " +
		"TRUNCATE pgbench_history, VACUUM pgbench_branches and pgbench_tellers, CHECKPOINT, wait again; for B restart the proposer once caught up (its link stats then cover the round only)")
	passes := p.passes()
	if p.warmup > 0 {
		b.say("warm-up: one %d s round per configuration, not reported in the medians", p.warmup)
		for _, c := range configs {
			r := b.round(c, passes[0], 0, p.warmup)
			fmt.Println(roundLine(r, p.rounds))
		}
	}
	for _, ps := range passes {
		b.say("pass: pgbench -c %d -j %d, %d rounds per configuration", ps.clients, ps.jobs, p.rounds)
		for cycle := 1; cycle <= p.rounds; cycle++ {
			for _, c := range configs {
				r := b.round(c, ps, cycle, p.seconds)
				fmt.Println(roundLine(r, p.rounds))
				b.results = append(b.results, r)
			}
		}
	}
	b.stopProposer()
	b.stopSafekeepers()
	for _, s := range b.standbys {
		if s.running {
			s.stop()
		}
	}
}

// round switches to c, prepares the primary and runs one pgbench round of
// secs seconds with ps's clients.
func (b *bench) round(c config, ps pass, cycle, secs int) result {
	b.switchTo(c)
	b.exec("TRUNCATE pgbench_history")
	b.exec("VACUUM pgbench_branches")
	b.exec("VACUUM pgbench_tellers")
	b.exec("CHECKPOINT")
	b.waitReady(c)
	var catchup time.Duration
	if c.proposer {
		catchup = maxGap(b.stopProposer())
		b.startProposer()
		b.waitReady(c)
	}
	r := b.measure(c, ps, cycle, secs)
	r.catchupGap = catchup
	return r
}

func maxGap(st []linkStat) time.Duration {
	var d time.Duration
	for _, s := range st {
		d = max(d, s.maxGap)
	}
	return d
}

// roots are the processes whose trees make up each group during a round.
type roots [nGroups][]int

func (b *bench) roots(c config) roots {
	var r roots
	pid, err := b.pg.Pid()
	if err != nil {
		b.t.Fatal(err)
	}
	r[gPrimary] = []int{pid}
	for _, s := range b.standbys {
		if c.has(s.name) {
			r[gStandbys] = append(r[gStandbys], s.pid())
		}
	}
	if c.proposer {
		r[gProposer] = []int{b.prop.PID()}
		for _, sk := range b.sks {
			r[gSafekeepers] = append(r[gSafekeepers], sk.PID())
		}
	}
	return r
}

// snapshot reads the CPU ticks of each group's trees.
func (b *bench) snapshot(r roots) [nGroups]uint64 {
	pt, err := harness.ReadProcs()
	if err != nil {
		b.t.Fatal(err)
	}
	var out [nGroups]uint64
	for g, pids := range r {
		for _, pid := range pids {
			n, err := pt.TreeTicks(pid)
			if err != nil {
				b.t.Fatalf("CPU of the %s: %v (it exited during the round?)", groupNames[g], err)
			}
			out[g] += n
		}
	}
	return out
}

// waitNoClients waits until the primary has no pgbench backend left and
// has reaped every exited child (harness.WaitNoLocalClients), so that
// their CPU time is in the postmaster's cutime/cstime.
func (b *bench) waitNoClients() {
	pid, err := b.pg.Pid()
	if err != nil {
		b.t.Fatal(err)
	}
	harness.WaitNoLocalClients(b.t, pid, 30*time.Second)
}

// sampleLag samples the synchronous standbys' flush_lag every 100 ms until
// stop is closed, through the monitor connection (which nothing else uses
// meanwhile). Each query gets its own deadline: cancelling one would close
// the connection.
func (b *bench) sampleLag(stop <-chan struct{}, done chan<- lagSamples) {
	var s lagSamples
	defer func() { done <- s }()
	tk := time.NewTicker(100 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tk.C:
		}
		s.polls++
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rows, err := b.mon.Query(ctx, "SELECT (EXTRACT(epoch FROM flush_lag) * 1000)::float8 FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum') AND flush_lag IS NOT NULL")
		if err == nil {
			for rows.Next() {
				var ms float64
				if err = rows.Scan(&ms); err != nil {
					break
				}
				s.ms = append(s.ms, ms)
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		cancel()
		if err != nil {
			s.err = fmt.Errorf("sampling pg_stat_replication.flush_lag: %w", err)
			return
		}
	}
}

type lagSamples struct {
	ms    []float64
	polls int
	err   error
}

// measure runs one pgbench round of secs seconds with ps's clients under
// c, which is ready, and returns its figures.
func (b *bench) measure(c config, ps pass, cycle, secs int) result {
	t := b.t
	what := fmt.Sprintf("%s round %d (%s)", c.name, cycle, ps.label())
	b.waitNoClients()
	rts := b.roots(c)
	before := b.snapshot(rts)
	stop := make(chan struct{})
	lagDone := make(chan lagSamples, 1)
	go b.sampleLag(stop, lagDone)
	stopped := false
	stopSampler := func() lagSamples {
		if stopped {
			return lagSamples{}
		}
		stopped = true
		close(stop)
		return <-lagDone
	}
	defer stopSampler() // on a failure below: the goroutine must end before the connection closes

	var perfNodes []*perfNode
	var perfSessions []*perfstat.Session
	if b.perf.off == "" && ps.n == 0 && cycle == b.p.rounds {
		perfNodes, perfSessions = b.startPerf(c)
	}
	stoppedPerf := false
	defer func() {
		if !stoppedPerf {
			for _, s := range perfSessions {
				if s != nil {
					s.Abort()
				}
			}
		}
	}()

	prefix := filepath.Join(b.logDir, fmt.Sprintf("%s-c%d-%d", c.name, ps.clients, cycle))
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second+5*time.Minute)
	defer cancel()
	cmd := b.pg.Cmd(ctx, "pgbench", "-h", b.pg.SocketDir, "-p", strconv.Itoa(b.pg.Port), "-U", "postgres",
		"-n", "-c", strconv.Itoa(ps.clients), "-j", strconv.Itoa(ps.jobs), "-T", strconv.Itoa(secs),
		"-l", "--log-prefix", prefix, "postgres")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	nodes := b.stopPerf(perfNodes, perfSessions)
	stoppedPerf = true
	lag := stopSampler()
	if err != nil {
		t.Fatalf("%s: pgbench: %v\n%s", what, err, out.String())
	}
	pgbenchCPU := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	b.waitNoClients()
	after := b.snapshot(rts)
	if lag.err != nil {
		t.Fatalf("%s: %v", what, lag.err)
	}
	b.checkStillSync(c)

	sum, err := parsePgbench(out.String())
	if err != nil {
		t.Fatalf("%s: pgbench output: %v\n%s", what, err, out.String())
	}
	if sum.failed > 0 {
		t.Fatalf("%s: %d failed transactions\n%s", what, sum.failed, out.String())
	}
	files, err := filepath.Glob(prefix + ".*")
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: no pgbench log files %s.* (%v)", what, prefix, err)
	}
	lat, other, err := readLatencies(files)
	if err != nil {
		t.Fatalf("%s: pgbench log: %v", what, err)
	}
	for _, f := range files {
		os.Remove(f)
	}
	if len(lat) == 0 {
		t.Fatalf("%s: no latency in the pgbench logs", what)
	}
	if int64(len(lat)) != sum.txns {
		b.say("%s: the pgbench logs hold %d latencies (%d other lines), pgbench reported %d transactions", what, len(lat), other, sum.txns)
	}
	slices.Sort(lat)

	r := result{cfg: c.name, pass: ps, cycle: cycle, seconds: secs, txns: sum.txns, tps: sum.tps,
		latP50: percentile(lat, 0.50) / 1000, latP99: percentile(lat, 0.99) / 1000,
		lagP50: median(lag.ms), lagSamples: len(lag.ms), nodes: nodes}
	perTxn := 1e6 / b.clk / float64(sum.txns)
	for g := range gPgbench {
		r.cpu[g] = math.NaN()
		if len(rts[g]) > 0 {
			r.cpu[g] = float64(after[g]-before[g]) * perTxn
		}
	}
	r.cpu[gPgbench] = float64(pgbenchCPU.Microseconds()) / float64(sum.txns)
	if c.proposer {
		st := b.stopProposer()
		r.hasGap, r.gap = true, maxGap(st)
		for _, s := range st {
			r.late += s.late
			if s.responses == 0 {
				t.Fatalf("%s: the proposer got no SafeKeeperResponse from %s", what, s.safekeeper)
			}
		}
	}
	return r
}
