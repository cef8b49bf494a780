package fleetbench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/etcdtest"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

var (
	flagRun        = flag.Bool("bench.fleet", false, "run the fleet benchmark (make bench-fleet); without it TestBenchFleet skips")
	flagTimelines  = flag.Int("bench.timelines", knobs.Int("BENCH_TIMELINES", 1000), "timelines placed through etcd before the load (env BENCH_TIMELINES)")
	flagSKs        = flag.Int("bench.safekeepers", knobs.Int("BENCH_SAFEKEEPERS", 3), "safekeepers registered in etcd (env BENCH_SAFEKEEPERS)")
	flagZones      = flag.Int("bench.zones", knobs.Int("BENCH_ZONES", 3), "zones they are spread over (env BENCH_ZONES)")
	flagLeaseTTL   = flag.Int("bench.lease-ttl", knobs.Int("BENCH_LEASE_TTL", 10), "the safekeepers' --etcd-lease-ttl in seconds (env BENCH_LEASE_TTL)")
	flagRounds     = flag.Int("bench.rounds", knobs.Int("BENCH_ROUNDS", 6), "cycles of the three configurations (env BENCH_ROUNDS)")
	flagSeconds    = flag.Int("bench.seconds", knobs.Int("BENCH_SECONDS", 20), "pgbench -T of each round (env BENCH_SECONDS)")
	flagClients    = flag.Int("bench.clients", knobs.Int("BENCH_CLIENTS", 8), "pgbench -c of the static and etcd rounds (env BENCH_CLIENTS)")
	flagClientsLow = flag.Int("bench.clients-low", knobs.Int("BENCH_CLIENTS_LOW", 1), "pgbench -c of the etcd-low rounds (env BENCH_CLIENTS_LOW)")
	flagJobs       = flag.Int("bench.jobs", knobs.Int("BENCH_JOBS", 2), "pgbench -j, at most the clients of a round (env BENCH_JOBS)")
	flagScale      = flag.Int("bench.scale", knobs.Int("BENCH_SCALE", 10), "pgbench -i -s (env BENCH_SCALE)")
	flagIdle       = flag.Int("bench.idle", knobs.Int("BENCH_IDLE", 20), "seconds of the idle window measured before the rounds (env BENCH_IDLE)")
	flagWarmup     = flag.Int("bench.warmup", knobs.Int("BENCH_WARMUP", 5), "seconds of one unreported round per configuration, 0 for none (env BENCH_WARMUP)")
	flagDoc        = flag.Bool("bench.doc", knobs.Int("BENCH_WRITE_DOC", 1) != 0, "rewrite the bench-fleet section of docs/performance.md (env BENCH_WRITE_DOC=0: leave it)")
)

var knobs harness.Knobs // the flags' defaults from BENCH_* (TestBench* fails on a bad one)

type params struct {
	timelines, sks, zones, leaseTTL, rounds, seconds, clients, clientsLow, jobs, scale, idle, warmup int
	writeDoc                                                                                         bool
}

func (p params) validate() error {
	var errs []error
	for _, c := range []struct {
		name   string
		v, min int
	}{{"BENCH_TIMELINES", p.timelines, 0}, {"BENCH_SAFEKEEPERS", p.sks, 3}, {"BENCH_ZONES", p.zones, 1}, {"BENCH_LEASE_TTL", p.leaseTTL, 2},
		{"BENCH_ROUNDS", p.rounds, 1}, {"BENCH_SECONDS", p.seconds, 1}, {"BENCH_CLIENTS", p.clients, 1}, {"BENCH_CLIENTS_LOW", p.clientsLow, 1},
		{"BENCH_JOBS", p.jobs, 1}, {"BENCH_SCALE", p.scale, 1}, {"BENCH_IDLE", p.idle, 1}, {"BENCH_WARMUP", p.warmup, 0}} {
		if c.v < c.min {
			errs = append(errs, fmt.Errorf("%s = %d, want at least %d", c.name, c.v, c.min))
		}
	}
	return errors.Join(errs...)
}

func (p params) command() string {
	return fmt.Sprintf("BENCH_TIMELINES=%d BENCH_SAFEKEEPERS=%d BENCH_ZONES=%d BENCH_LEASE_TTL=%d BENCH_ROUNDS=%d BENCH_SECONDS=%d BENCH_CLIENTS=%d BENCH_CLIENTS_LOW=%d BENCH_JOBS=%d BENCH_SCALE=%d BENCH_IDLE=%d BENCH_WARMUP=%d make bench-fleet",
		p.timelines, p.sks, p.zones, p.leaseTTL, p.rounds, p.seconds, p.clients, p.clientsLow, p.jobs, p.scale, p.idle, p.warmup)
}

func TestMain(m *testing.M) { harness.Main(m) }

// The configurations of the rounds.
const (
	cfgStatic  = "static"
	cfgEtcd    = "etcd"
	cfgEtcdLow = "etcd-low"
	cfgIdle    = "idle"
)

var configs = []string{cfgStatic, cfgEtcd, cfgEtcdLow}

var (
	tenantID = proto.ID{0xf1, 0xee, 0x7b}
	loadTL   = proto.ID{0xf1, 0xee, 0x7b, 0xff}
)

// benchSystemID is the system id of the timelines no primary writes to.
const benchSystemID = 7312345678901234567

type bench struct {
	t       *testing.T
	p       params
	started time.Time

	etcd  *etcdtest.Server
	ec    *fleet.Client
	sks   []*harness.Safekeeper
	pg    *pgtest.Cluster
	addrs []string // the load timeline's members

	placeTook time.Duration
	placed    int
	placeOps  map[string]float64 // etcd's counters over the placements (totals, not rates)
	zoneSpan  map[int]int        // timelines by the zones their members span
	held      map[uint64]int
	rounds    []round
	loadStart string
	machine   string
}

// round is one measured window: a pgbench round, or the idle window.
type round struct {
	cfg     string
	cycle   int // 1..rounds; 0: warm-up or idle
	clients int
	secs    float64 // wall time between the two metric reads
	tps     float64
	txns    int64
	rates   map[string]float64 // per second, by metricNames' label
	// propTicks and allTicks are the CPU time over the pgbench run, in
	// clock ticks, of the proposer and of all the servers (the primary's
	// process tree, the proposer, the safekeepers).
	propTicks, allTicks uint64
}

// TestBenchFleet is make bench-fleet: see the package comment.
func TestBenchFleet(t *testing.T) {
	if !*flagRun {
		t.Skip("the fleet benchmark runs only with -bench.fleet (make bench-fleet)")
	}
	p := params{timelines: *flagTimelines, sks: *flagSKs, zones: *flagZones, leaseTTL: *flagLeaseTTL, rounds: *flagRounds,
		seconds: *flagSeconds, clients: *flagClients, clientsLow: *flagClientsLow, jobs: *flagJobs, scale: *flagScale,
		idle: *flagIdle, warmup: *flagWarmup, writeDoc: *flagDoc}
	if err := errors.Join(knobs.Err(), p.validate()); err != nil {
		t.Fatal(err)
	}
	b := &bench{t: t, p: p, started: time.Now(), zoneSpan: map[int]int{}, held: map[uint64]int{}}
	// About 30 s to start, 20 ms per timeline placed, 4 s around each round.
	est := 30 + float64(p.timelines)*0.02 + float64(p.idle+10) + float64(3*(p.rounds*(p.seconds+4)+p.warmup+4))
	b.say("%s: about %.0f minutes", p.command(), math.Ceil(est/60))
	b.setup()
	b.placeTimelines()
	b.load()
	b.report()
}

func (b *bench) say(format string, args ...any) {
	fmt.Printf("[bench-fleet %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (b *bench) setup() {
	t := b.t
	harness.Binary(t)
	b.loadStart = harness.LoadAvg()
	b.etcd = etcdtest.Start(t)
	var err error
	if b.ec, err = fleet.Connect(fleet.ClientConfig{Endpoints: b.etcd.Endpoints()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.ec.Close() })
	eps := strings.Join(b.etcd.Endpoints(), ",")
	for i := 1; i <= b.p.sks; i++ {
		b.sks = append(b.sks, harness.StartSafekeeper(t, uint64(i), "--etcd-endpoints", eps, "--zone", fmt.Sprintf("z%d", (i-1)%b.p.zones),
			"--etcd-lease-ttl", fmt.Sprintf("%ds", b.p.leaseTTL)))
	}
	harness.WaitFor(t, 30*time.Second, fmt.Sprintf("%d safekeepers live in etcd", b.p.sks), func() bool {
		nodes, _, _, err := b.ec.Nodes(context.Background())
		live := 0
		for _, n := range nodes {
			if n.Live() {
				live++
			}
		}
		return err == nil && live == b.p.sks
	})
	b.pg = pgtest.Start(t, pgtest.Options{Conf: []string{"wal_sender_timeout = '60s'",
		"max_wal_size = '8GB'", "checkpoint_timeout = '30min'"}, TCP: true})
	b.machine = fmt.Sprintf("%d CPUs (nproc), %s, %.1f GiB memory; PostgreSQL %s, etcd %s (one member), %s",
		runtime.NumCPU(), harness.CPUModel(), float64(harness.MemTotal())/(1<<30), b.pg.Exec(t, "SHOW server_version"), etcdVersion(), runtime.Version())
	b.say("etcd at %s, %d safekeepers in %d zones, primary in %s", eps, b.p.sks, b.p.zones, b.pg.Dir)
	b.pgbench("-i", "-s", strconv.Itoa(b.p.scale), "-q")
	// From now on every commit waits for the proposer.
	b.pg.Exec(t, "ALTER SYSTEM SET synchronous_standby_names = 'proposer'")
	b.pg.Exec(t, "SELECT pg_reload_conf()")
}

func etcdVersion() string {
	bin, err := etcdtest.Binary()
	if err != nil {
		return "unknown"
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "unknown"
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(strings.TrimPrefix(first, "etcd Version:"))
}

func (b *bench) pgbench(args ...string) string {
	return b.pg.Run(b.t, "pgbench", append(append([]string{"-h", b.pg.SocketDir, "-p", strconv.Itoa(b.pg.Port), "-U", "postgres"}, args...), "postgres")...)
}

// place places one timeline and creates it on its members, as timeline
// create --etcd-endpoints does.
func (b *bench) place(ctx context.Context, tl proto.ID, cc proposer.CreateConfig) (fleet.Placement, error) {
	p, err := b.ec.Place(ctx, tenantID, tl, fleet.DefaultReplicas)
	if err != nil {
		return p, fmt.Errorf("place %s: %w", tl, err)
	}
	addrs, err := fleet.Resolved{Config: p.Config, Members: p.Members}.Addrs()
	if err != nil {
		return p, err
	}
	cc.Safekeepers, cc.TenantID, cc.TimelineID = addrs, tenantID, tl
	res, err := proposer.CreateTimeline(ctx, cc)
	if err != nil {
		return p, fmt.Errorf("create %s: %w", tl, err)
	}
	for _, r := range res {
		if r.Err != nil {
			return p, fmt.Errorf("create %s on %s: %w", tl, r.Addr, r.Err)
		}
	}
	return p, nil
}

// placeTimelines places BENCH_TIMELINES timelines, four at a time, then the
// load timeline.
func (b *bench) placeTimelines() {
	t := b.t
	before := b.metrics()
	start := time.Now()
	var next atomic.Int64
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.p.timelines) {
					return
				}
				tl := proto.ID{0xf1, 0xee, 0x7b, 0, byte(i >> 8), byte(i)}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				p, err := b.place(ctx, tl, proposer.CreateConfig{SystemID: benchSystemID})
				cancel()
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					b.placed++
					b.zoneSpan[p.Zones]++
					for _, id := range p.Config.Members {
						b.held[id]++
					}
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	b.placeTook = time.Since(start)
	b.placeOps = rates(before, b.metrics(), 1)
	b.say("%d timelines placed and created in %v (%.0f/s); timelines per safekeeper %s; by zones spanned %s; etcd per timeline placed: %.2f proposals, %.2f puts, %.2f ranges",
		b.placed, b.placeTook.Round(time.Millisecond), float64(b.placed)/b.placeTook.Seconds(), countsOf(b.held), countsOf(b.zoneSpan),
		b.placeOps["proposals"]/float64(max(b.placed, 1)), b.placeOps["puts"]/float64(max(b.placed, 1)), b.placeOps["ranges"]/float64(max(b.placed, 1)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := b.place(ctx, loadTL, proposer.CreateConfig{Upstream: b.pg.TCPConnString()}); err != nil {
		t.Fatal(err)
	}
	r, err := b.ec.Resolve(ctx, tenantID, loadTL)
	if err != nil {
		t.Fatal(err)
	}
	if b.addrs, err = r.Addrs(); err != nil {
		t.Fatal(err)
	}
	b.say("load timeline %s/%s on %s", tenantID, loadTL, r.Config)
}

// metricNames are the series read from etcd's /metrics, by label.
var metricNames = []struct{ label, series string }{
	{"proposals", "etcd_server_proposals_committed_total"},
	{"puts", "etcd_mvcc_put_total"},
	{"txns", "etcd_mvcc_txn_total"},
	{"deletes", "etcd_mvcc_delete_total"},
	{"ranges", "etcd_mvcc_range_total"},
	{"lease renewals", "etcd_debugging_lease_renewed_total"},
	{"keepalive msgs", `grpc_server_msg_received_total{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"}`},
}

// metrics reads etcd's /metrics: each series of metricNames (missing: 0).
func (b *bench) metrics() map[string]float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.etcd.Endpoint()+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.t.Fatalf("etcd /metrics: %v", err)
	}
	defer resp.Body.Close()
	all := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			all[line[:i]] = v
		}
	}
	if err := sc.Err(); err != nil {
		b.t.Fatalf("etcd /metrics: %v", err)
	}
	out := map[string]float64{}
	for _, m := range metricNames {
		out[m.label] = all[m.series]
	}
	if _, ok := all[metricNames[0].series]; !ok {
		b.t.Fatalf("etcd /metrics has no %s", metricNames[0].series)
	}
	return out
}

// countsOf formats a count per key as "k: n, ...", in key order.
func countsOf[K uint64 | int](m map[K]int) string {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%v: %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func rates(before, after map[string]float64, secs float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		out[k] = (v - before[k]) / secs
	}
	return out
}

// proposerArgs are the proposer's flags in configuration c.
func (b *bench) proposerArgs(c string) []string {
	// Over TCP: the client backends on the unix socket are pgbench's
	// (WaitNoLocalClients).
	args := []string{"propose", "--upstream", b.pg.TCPConnString(), "--tenant-id", tenantID.String(), "--timeline-id", loadTL.String(),
		"--slot", "proposer", "--application-name", "proposer", "--proposer-lease", "0"}
	if c == cfgStatic {
		return append(args, "--safekeepers", strings.Join(b.addrs, ","))
	}
	return append(args, "--etcd-endpoints", strings.Join(b.etcd.Endpoints(), ","))
}

// settle is the quiet spell before every measured window.
const settle = 3 * time.Second

func (b *bench) load() {
	t := b.t
	// The idle window: the proposer (etcd) running, no pgbench.
	prop := harness.StartProcess(t, "proposer-idle", b.proposerArgs(cfgEtcd)...)
	harness.WaitSyncStandby(t, b.pg, prop, "proposer", 90*time.Second)
	time.Sleep(settle)
	before, from := b.metrics(), time.Now()
	time.Sleep(time.Duration(b.p.idle) * time.Second)
	secs := time.Since(from).Seconds()
	idle := round{cfg: cfgIdle, secs: secs, rates: rates(before, b.metrics(), secs)}
	b.sayRound(idle)
	b.rounds = append(b.rounds, idle)
	b.stopProposer(prop)
	if b.p.warmup > 0 {
		for _, c := range configs {
			b.sayRound(b.round(c, 0, b.p.warmup))
		}
	}
	for cycle := 1; cycle <= b.p.rounds; cycle++ {
		k := (cycle - 1) % len(configs)
		for _, c := range append(slices.Clone(configs[k:]), configs[:k]...) {
			r := b.round(c, cycle, b.p.seconds)
			b.sayRound(r)
			b.rounds = append(b.rounds, r)
		}
	}
}

func (b *bench) stopProposer(p *harness.Process) {
	if err := p.Stop(60 * time.Second); err != nil {
		b.t.Fatalf("%s: exit after SIGTERM: %v\n%s", p.Name, err, harness.TailFile(p.LogPath, 20))
	}
}

var (
	tpsRe  = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
	txnsRe = regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`)
)

// ticks is the CPU time so far of the proposer and of all the servers
// (the primary's process tree, the proposer, the safekeepers).
func (b *bench) ticks(pgPID int, prop *harness.Process) (propTicks, all uint64) {
	pt, err := harness.ReadProcs()
	if err != nil {
		b.t.Fatal(err)
	}
	pids := []int{prop.PID(), pgPID}
	for _, sk := range b.sks {
		pids = append(pids, sk.PID())
	}
	for i, pid := range pids {
		n, err := pt.TreeTicks(pid)
		if err != nil {
			b.t.Fatalf("CPU of the servers: %v", err)
		}
		if i == 0 {
			propTicks = n
		}
		all += n
	}
	return propTicks, all
}

// cpuPerTxn is ticks per transaction of r, in µs.
func cpuPerTxn(ticks uint64, r round) float64 {
	hz, err := harness.ClockTicks()
	if err != nil || r.txns == 0 {
		return math.NaN()
	}
	return float64(ticks) * 1e6 / float64(hz) / float64(r.txns)
}

// round runs one pgbench round under configuration c with a fresh proposer.
func (b *bench) round(c string, cycle, secs int) round {
	t := b.t
	prop := harness.StartProcess(t, fmt.Sprintf("proposer-%s-%d", c, cycle), b.proposerArgs(c)...)
	defer b.stopProposer(prop)
	harness.WaitSyncStandby(t, b.pg, prop, "proposer", 90*time.Second)
	b.pg.Exec(t, "TRUNCATE pgbench_history")
	b.pg.Exec(t, "CHECKPOINT")
	time.Sleep(settle)
	clients := b.p.clients
	if c == cfgEtcdLow {
		clients = b.p.clientsLow
	}
	pgPID, err := b.pg.Pid()
	if err != nil {
		t.Fatal(err)
	}
	prop0, all0 := b.ticks(pgPID, prop)
	before, from := b.metrics(), time.Now()
	out := b.pgbench("-n", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(b.p.jobs, clients)), "-T", strconv.Itoa(secs))
	elapsed := time.Since(from).Seconds()
	r := round{cfg: c, cycle: cycle, clients: clients, secs: elapsed, rates: rates(before, b.metrics(), elapsed)}
	// pgbench's backends reaped, their CPU time is the postmaster's.
	harness.WaitNoLocalClients(t, pgPID, 30*time.Second)
	prop1, all1 := b.ticks(pgPID, prop)
	r.propTicks, r.allTicks = prop1-prop0, all1-all0
	m := tpsRe.FindStringSubmatch(out)
	n := txnsRe.FindStringSubmatch(out)
	if m == nil || n == nil {
		t.Fatalf("%s round %d: no tps or transactions in pgbench's output:\n%s", c, cycle, out)
	}
	r.tps, _ = strconv.ParseFloat(m[1], 64)
	r.txns, _ = strconv.ParseInt(n[1], 10, 64)
	prop.CheckRunning()
	return r
}

func (b *bench) sayRound(r round) {
	label := fmt.Sprintf("round %d/%d", r.cycle, b.p.rounds)
	switch {
	case r.cfg == cfgIdle:
		label = "idle"
	case r.cycle == 0:
		label = "warm-up"
	}
	var parts []string
	for _, m := range metricNames {
		parts = append(parts, fmt.Sprintf("%s %.2f", m.label, r.rates[m.label]))
	}
	b.say("%-10s %-8s -c %d  tps %7.1f  proposer %s µs/txn, servers %s µs/txn  etcd per second: %s", label, r.cfg, r.clients, r.tps,
		fnum(cpuPerTxn(r.propTicks, r), 0), fnum(cpuPerTxn(r.allTicks, r), 0), strings.Join(parts, ", "))
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// figure is the median over c's rounds of f.
func (b *bench) figure(c string, f func(round) float64) float64 {
	var xs []float64
	for _, r := range b.rounds {
		if r.cfg == c {
			xs = append(xs, f(r))
		}
	}
	return median(xs)
}

// tpsRatios are etcd's TPS over static's, cycle by cycle.
func (b *bench) tpsRatios() []float64 { return b.ratios(func(r round) float64 { return r.tps }) }

// ratios are etcd's figure over static's, cycle by cycle.
func (b *bench) ratios(f func(round) float64) []float64 {
	by := map[int]map[string]float64{}
	for _, r := range b.rounds {
		if r.cycle > 0 {
			if by[r.cycle] == nil {
				by[r.cycle] = map[string]float64{}
			}
			by[r.cycle][r.cfg] = f(r)
		}
	}
	var xs []float64
	for cycle := 1; cycle <= len(by); cycle++ {
		if x, ok := by[cycle][cfgEtcd]; ok {
			if y, ok := by[cycle][cfgStatic]; ok {
				xs = append(xs, x/y)
			}
		}
	}
	return xs
}

func fnum(x float64, prec int) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return strconv.FormatFloat(x, 'f', prec, 64)
}

func mdRow(cells ...string) string { return "| " + strings.Join(cells, " | ") + " |\n" }

func list(xs []float64, prec int) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fnum(x, prec)
	}
	return strings.Join(out, ", ")
}

// writesPerSec is a window's writes to etcd: puts and deletes (each txn's
// included).
func writesPerSec(r round) float64 { return r.rates["puts"] + r.rates["deletes"] }

// results are the tables of a run.
func (b *bench) results() string {
	var sb strings.Builder
	per := func(k string) string { return fnum(b.placeOps[k]/float64(max(b.placed, 1)), 2) }
	fmt.Fprintf(&sb, "**Setup.** %d timelines placed through etcd and created on their members in %v (%.0f per second, four at a time, in-process: fleet.Client.Place then proposer.CreateTimeline, the two steps of `timeline create --etcd-endpoints --system-id`); timelines per safekeeper (id: count) %s; timelines by the zones their members span (zones: count) %s. "+
		"etcd per timeline placed: %s Raft proposals, %s puts, %s txns, %s ranges (the placement's reads and its compare-and-swap, retried when placements race, and the members' capacity updates meanwhile).\n\n",
		b.placed, b.placeTook.Round(time.Millisecond), float64(b.placed)/b.placeTook.Seconds(), countsOf(b.held), countsOf(b.zoneSpan),
		per("proposals"), per("puts"), per("txns"), per("ranges"))
	fmt.Fprintf(&sb, "**etcd's load per second**, from its /metrics around each window (medians over rounds; the idle window once, %d s):\n\n", b.p.idle)
	head := []string{"window", "pgbench -c", "TPS", "writes (puts + deletes)"}
	for _, m := range metricNames {
		head = append(head, m.label)
	}
	sb.WriteString(mdRow(head...))
	sb.WriteString("|" + strings.Repeat("---|", len(head)) + "\n")
	for _, c := range append([]string{cfgIdle}, configs...) {
		clients := "0"
		switch c {
		case cfgStatic, cfgEtcd:
			clients = strconv.Itoa(b.p.clients)
		case cfgEtcdLow:
			clients = strconv.Itoa(b.p.clientsLow)
		}
		row := []string{c, clients, fnum(b.figure(c, func(r round) float64 { return r.tps }), 1), fnum(b.figure(c, writesPerSec), 2)}
		for _, m := range metricNames {
			row = append(row, fnum(b.figure(c, func(r round) float64 { return r.rates[m.label] }), 2))
		}
		sb.WriteString(mdRow(row...))
	}
	ratios := b.tpsRatios()
	ratio := median(ratios)
	fmt.Fprintf(&sb, "\n**TPS, the proposer finding its safekeepers through etcd against static addresses** (pgbench -c %d -j %d, %d s rounds): etcd/static %s, the median of the per-cycle ratios %s. Goal ≥ 0.98×: %s.\n\n",
		b.p.clients, min(b.p.jobs, b.p.clients), b.p.seconds, fnum(ratio, 3), list(ratios, 3), verdict(ratio >= 0.98))
	propCPU := func(r round) float64 { return cpuPerTxn(r.propTicks, r) }
	allCPU := func(r round) float64 { return cpuPerTxn(r.allTicks, r) }
	sb.WriteString(mdRow("configuration", "pgbench -c", "TPS", "proposer CPU µs/txn", "servers' CPU µs/txn"))
	sb.WriteString("|---|---|---|---|---|\n")
	for _, c := range configs {
		clients := b.p.clients
		if c == cfgEtcdLow {
			clients = b.p.clientsLow
		}
		sb.WriteString(mdRow(c, strconv.Itoa(clients), fnum(b.figure(c, func(r round) float64 { return r.tps }), 1),
			fnum(b.figure(c, propCPU), 0), fnum(b.figure(c, allCPU), 0)))
	}
	pr, ar := b.ratios(propCPU), b.ratios(allCPU)
	fmt.Fprintf(&sb, "\nCPU per transaction, etcd/static (medians of the per-cycle ratios; the figure the machine's noise moves least): the proposer %s (%s), the servers %s (%s).\n\n",
		fnum(median(pr), 3), list(pr, 3), fnum(median(ar), 3), list(ar, 3))
	hi := max(b.figure(cfgEtcd, writesPerSec), b.figure(cfgEtcdLow, writesPerSec), b.figure(cfgStatic, writesPerSec))
	fmt.Fprintf(&sb, "**etcd writes under load**: at most %s per second in any configuration (idle %s), at %s and %s TPS. Goal a handful per second, independent of the commit rate: %s.\n\n",
		fnum(hi, 2), fnum(b.figure(cfgIdle, writesPerSec), 2), fnum(b.figure(cfgEtcdLow, func(r round) float64 { return r.tps }), 0),
		fnum(b.figure(cfgEtcd, func(r round) float64 { return r.tps }), 0), verdict(hi <= 5))
	sb.WriteString("Every round:\n\n")
	head = []string{"cycle", "configuration", "pgbench -c", "seconds", "TPS", "proposer µs/txn", "servers µs/txn", "writes/s"}
	for _, m := range metricNames {
		head = append(head, m.label+"/s")
	}
	sb.WriteString(mdRow(head...))
	sb.WriteString("|" + strings.Repeat("---|", len(head)) + "\n")
	for _, r := range b.rounds {
		row := []string{strconv.Itoa(r.cycle), r.cfg, strconv.Itoa(r.clients), fnum(r.secs, 1), fnum(r.tps, 1),
			fnum(cpuPerTxn(r.propTicks, r), 0), fnum(cpuPerTxn(r.allTicks, r), 0), fnum(writesPerSec(r), 2)}
		for _, m := range metricNames {
			row = append(row, fnum(r.rates[m.label], 2))
		}
		sb.WriteString(mdRow(row...))
	}
	return sb.String()
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func (b *bench) report() {
	took := time.Since(b.started).Round(time.Second)
	res := b.results()
	fmt.Println(res)
	if !b.p.writeDoc {
		return
	}
	describe := "unknown"
	if root, err := harness.ModuleRoot(); err == nil {
		if out, err := exec.Command("git", "-C", root, "describe", "--always", "--dirty", "--tags").Output(); err == nil {
			describe = strings.TrimSpace(string(out))
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "Generated by `make bench-fleet` (test/bench/fleet) on %s UTC, build `%s`; the run took %v. Do not edit by hand: rerun it.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04"), describe, took)
	fmt.Fprintf(&sb, "Command:\n\n    %s\n\nwhich runs `go test ./test/bench/fleet -run '^TestBenchFleet$' -count=1 -timeout 0 -v -args -bench.fleet` (BENCH_WRITE_DOC=0 leaves this file alone).\n\n", b.p.command())
	fmt.Fprintf(&sb, "Machine: %s; shared with other work: load average %s at the start, %s at the end.\n\n", b.machine, b.loadStart, harness.LoadAvg())
	fmt.Fprintf(&sb, "Method (test/bench/fleet/doc.go has it in full): one etcd member; %d safekeepers in %d zones registered with --etcd-lease-ttl %ds; "+
		"the timelines placed, then a PostgreSQL primary (pgbench scale %d, synchronous_standby_names = 'proposer') whose timeline was placed the same way. "+
		"Rounds of %d s alternate, the order rotated each cycle, %d cycles after a %d s warm-up round per configuration: static (the proposer with --safekeepers, the members' addresses), "+
		"etcd (the proposer with --etcd-endpoints only, watching the configuration), etcd-low (the same at pgbench -c %d). Each round starts a fresh proposer, truncates pgbench_history, checkpoints and waits %v. "+
		"etcd's counters are read from its /metrics before and after each pgbench run and divided by the wall time between; in etcd 3.4 a lease keepalive is no Raft proposal (the leader renews it in memory), so those are counted apart, as lease renewals and as messages on the LeaseKeepAlive streams.\n\n",
		b.p.sks, b.p.zones, b.p.leaseTTL, b.p.scale, b.p.seconds, b.p.rounds, b.p.warmup, b.p.clientsLow, settle)
	sb.WriteString(res)
	path, err := harness.WriteDocSection("docs/performance.md", "bench-fleet", sb.String())
	if err != nil {
		b.t.Fatalf("docs/performance.md: %v", err)
	}
	b.say("wrote the bench-fleet section of %s", path)
}
