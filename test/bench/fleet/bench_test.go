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
	flagSKs        = flag.Int("bench.safekeepers", knobs.Int("BENCH_SAFEKEEPERS", 6), "safekeepers registered in etcd, at least 6: each primary has three of its own (env BENCH_SAFEKEEPERS)")
	flagZones      = flag.Int("bench.zones", knobs.Int("BENCH_ZONES", 3), "zones they are spread over (env BENCH_ZONES)")
	flagLeaseTTL   = flag.Int("bench.lease-ttl", knobs.Int("BENCH_LEASE_TTL", 10), "the safekeepers' --etcd-lease-ttl in seconds (env BENCH_LEASE_TTL)")
	flagRounds     = flag.Int("bench.rounds", knobs.Int("BENCH_ROUNDS", 8), "cycles, an even number: a paired round and an etcd-low round each (env BENCH_ROUNDS)")
	flagSeconds    = flag.Int("bench.seconds", knobs.Int("BENCH_SECONDS", 20), "pgbench -T of each round (env BENCH_SECONDS)")
	flagClients    = flag.Int("bench.clients", knobs.Int("BENCH_CLIENTS", 4), "pgbench -c on each primary in the paired rounds (env BENCH_CLIENTS)")
	flagClientsLow = flag.Int("bench.clients-low", knobs.Int("BENCH_CLIENTS_LOW", 1), "pgbench -c of the etcd-low rounds (env BENCH_CLIENTS_LOW)")
	flagJobs       = flag.Int("bench.jobs", knobs.Int("BENCH_JOBS", 2), "pgbench -j, at most the clients of a round (env BENCH_JOBS)")
	flagScale      = flag.Int("bench.scale", knobs.Int("BENCH_SCALE", 10), "pgbench -i -s (env BENCH_SCALE)")
	flagIdle       = flag.Int("bench.idle", knobs.Int("BENCH_IDLE", 20), "seconds of the idle window measured before the rounds (env BENCH_IDLE)")
	flagWarmup     = flag.Int("bench.warmup", knobs.Int("BENCH_WARMUP", 5), "seconds of one unreported paired round, 0 for none (env BENCH_WARMUP)")
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
	}{{"BENCH_TIMELINES", p.timelines, 0}, {"BENCH_SAFEKEEPERS", p.sks, 6}, {"BENCH_ZONES", p.zones, 1}, {"BENCH_LEASE_TTL", p.leaseTTL, 2},
		{"BENCH_ROUNDS", p.rounds, 1}, {"BENCH_SECONDS", p.seconds, 1}, {"BENCH_CLIENTS", p.clients, 1}, {"BENCH_CLIENTS_LOW", p.clientsLow, 1},
		{"BENCH_JOBS", p.jobs, 1}, {"BENCH_SCALE", p.scale, 1}, {"BENCH_IDLE", p.idle, 1}, {"BENCH_WARMUP", p.warmup, 0}} {
		if c.v < c.min {
			errs = append(errs, fmt.Errorf("%s = %d, want at least %d", c.name, c.v, c.min))
		}
	}
	if p.rounds%2 != 0 {
		errs = append(errs, fmt.Errorf("BENCH_ROUNDS = %d, want an even number (each primary runs etcd as often as static)", p.rounds))
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

var tenantID = proto.ID{0xf1, 0xee, 0x7b}

// primary is one of the two primaries under load, its timeline and that
// timeline's members: three safekeepers of its own, so that neither
// primary's commits wait on the other's fsyncs.
type primary struct {
	name    string // A or B
	pg      *pgtest.Cluster
	tl      proto.ID
	members []uint64
	addrs   []string // the members' addresses, as etcd resolves them
}

// benchSystemID is the system id of the timelines no primary writes to.
const benchSystemID = 7312345678901234567

type bench struct {
	t       *testing.T
	p       params
	started time.Time

	etcd *etcdtest.Server
	ec   *fleet.Client
	sks  []*harness.Safekeeper
	pri  [2]*primary

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
	primary string // A or B; "" in the idle window
	cycle   int    // 1..rounds; 0: warm-up or idle
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
	// About 40 s to start, 20 ms per timeline placed, 6 s around each round.
	est := 40 + float64(p.timelines)*0.02 + float64(p.idle+10) + float64(2*(p.rounds*(p.seconds+6)+p.warmup+6))
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
	for i, name := range []string{"A", "B"} {
		pr := &primary{name: name, tl: proto.ID{0xf1, 0xee, 0x7b, 0xff, byte(i)}, members: []uint64{uint64(3*i + 1), uint64(3*i + 2), uint64(3*i + 3)}}
		pr.pg = pgtest.Start(t, pgtest.Options{Conf: []string{"wal_sender_timeout = '60s'",
			"max_wal_size = '8GB'", "checkpoint_timeout = '30min'"}, TCP: true})
		b.pri[i] = pr
		b.pgbench(pr, "-i", "-s", strconv.Itoa(b.p.scale), "-q")
		// From now on every commit waits for the proposer.
		pr.pg.Exec(t, "ALTER SYSTEM SET synchronous_standby_names = 'proposer'")
		pr.pg.Exec(t, "SELECT pg_reload_conf()")
	}
	b.machine = fmt.Sprintf("%d CPUs (nproc), %s, %.1f GiB memory; PostgreSQL %s, etcd %s (one member), %s",
		runtime.NumCPU(), harness.CPUModel(), float64(harness.MemTotal())/(1<<30), b.pri[0].pg.Exec(t, "SHOW server_version"), etcdVersion(), runtime.Version())
	b.say("etcd at %s, %d safekeepers in %d zones, primaries in %s and %s", eps, b.p.sks, b.p.zones, b.pri[0].pg.Dir, b.pri[1].pg.Dir)
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

func (b *bench) pgbench(pr *primary, args ...string) string {
	return pr.pg.Run(b.t, "pgbench", pgbenchArgs(pr, args...)...)
}

func pgbenchArgs(pr *primary, args ...string) []string {
	return append(append([]string{"-h", pr.pg.SocketDir, "-p", strconv.Itoa(pr.pg.Port), "-U", "postgres"}, args...), "postgres")
}

// place places one timeline and creates it on its members, as timeline
// create --etcd-endpoints does (with members: --members).
func (b *bench) place(ctx context.Context, tl proto.ID, cc proposer.CreateConfig, members ...uint64) (fleet.Placement, error) {
	var p fleet.Placement
	var err error
	if members == nil {
		p, err = b.ec.Place(ctx, tenantID, tl, fleet.DefaultReplicas)
	} else {
		p, err = b.ec.Assign(ctx, tenantID, tl, members)
	}
	if err != nil {
		return p, fmt.Errorf("place %s: %w", tl, err)
	}
	addrs, err := fleet.Resolved{Config: p.Config, Members: p.Members}.Addrs()
	if err != nil {
		return p, err
	}
	cc.Safekeepers, cc.TenantID, cc.TimelineID, cc.Configuration = addrs, tenantID, tl, p.Config
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
	for _, pr := range b.pri {
		if _, err := b.place(ctx, pr.tl, proposer.CreateConfig{Upstream: pr.pg.TCPConnString()}, pr.members...); err != nil {
			t.Fatal(err)
		}
		r, err := b.ec.Resolve(ctx, tenantID, pr.tl)
		if err != nil {
			t.Fatal(err)
		}
		if pr.addrs, err = r.Addrs(); err != nil {
			t.Fatal(err)
		}
		b.say("primary %s: timeline %s/%s on %s", pr.name, tenantID, pr.tl, r.Config)
	}
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

// proposerArgs are the flags of pr's proposer in configuration c.
func (b *bench) proposerArgs(pr *primary, c string) []string {
	// Over TCP: the client backends on the unix socket are pgbench's
	// (WaitNoLocalClients).
	args := []string{"propose", "--upstream", pr.pg.TCPConnString(), "--tenant-id", tenantID.String(), "--timeline-id", pr.tl.String(),
		"--slot", "proposer", "--application-name", "proposer", "--proposer-lease", "0"}
	if c == cfgStatic {
		return append(args, "--safekeepers", strings.Join(pr.addrs, ","))
	}
	return append(args, "--etcd-endpoints", strings.Join(b.etcd.Endpoints(), ","))
}

// settle is the quiet spell before every measured window.
const settle = 3 * time.Second

func (b *bench) load() {
	t := b.t
	// The idle window: both proposers (etcd) running, no pgbench.
	var props []*harness.Process
	for _, pr := range b.pri {
		prop := harness.StartProcess(t, "proposer-idle-"+pr.name, b.proposerArgs(pr, cfgEtcd)...)
		harness.WaitSyncStandby(t, pr.pg, prop, "proposer", 90*time.Second)
		props = append(props, prop)
	}
	time.Sleep(settle)
	before, from := b.metrics(), time.Now()
	time.Sleep(time.Duration(b.p.idle) * time.Second)
	secs := time.Since(from).Seconds()
	idle := round{cfg: cfgIdle, secs: secs, rates: rates(before, b.metrics(), secs)}
	b.sayRound(idle)
	b.rounds = append(b.rounds, idle)
	for _, prop := range props {
		b.stopProposer(prop)
	}
	if b.p.warmup > 0 {
		for _, r := range b.pairRound(0, b.p.warmup) {
			b.sayRound(r)
		}
	}
	for cycle := 1; cycle <= b.p.rounds; cycle++ {
		for _, r := range b.pairRound(cycle, b.p.seconds) {
			b.sayRound(r)
			b.rounds = append(b.rounds, r)
		}
		r := b.lowRound(b.pri[cycle%2], cycle, b.p.seconds)
		b.sayRound(r)
		b.rounds = append(b.rounds, r)
	}
}

// etcdPrimary is the primary whose proposer finds its safekeepers through
// etcd in cycle's paired round: A in odd cycles, B in even ones.
func (b *bench) etcdPrimary(cycle int) int { return 1 - cycle%2 }

func (b *bench) stopProposer(p *harness.Process) {
	if err := p.Stop(60 * time.Second); err != nil {
		b.t.Fatalf("%s: exit after SIGTERM: %v\n%s", p.Name, err, harness.TailFile(p.LogPath, 20))
	}
}

var (
	tpsRe  = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
	txnsRe = regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`)
)

// ticks is the CPU time so far of pr's proposer and of all pr's servers
// (its primary's process tree, the proposer, its members).
func (b *bench) ticks(pr *primary, pgPID int, prop *harness.Process) (propTicks, all uint64) {
	pt, err := harness.ReadProcs()
	if err != nil {
		b.t.Fatal(err)
	}
	pids := []int{prop.PID(), pgPID}
	for _, sk := range b.sks {
		if slices.Contains(pr.members, sk.ID) {
			pids = append(pids, sk.PID())
		}
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

// run is one primary's part of a round.
type run struct {
	pr      *primary
	cfg     string
	clients int
	prop    *harness.Process
	pgPID   int
	prop0   uint64
	all0    uint64
	out     []byte
	err     error
}

// measure runs pgbench on every primary of runs at once, each with its
// proposer in its configuration started fresh: the rounds of one window.
func (b *bench) measure(cycle, secs int, runs []*run) []round {
	t := b.t
	for _, r := range runs {
		r.prop = harness.StartProcess(t, fmt.Sprintf("proposer-%s-%s-%d", r.pr.name, r.cfg, cycle), b.proposerArgs(r.pr, r.cfg)...)
		defer b.stopProposer(r.prop)
	}
	for _, r := range runs {
		harness.WaitSyncStandby(t, r.pr.pg, r.prop, "proposer", 90*time.Second)
		r.pr.pg.Exec(t, "TRUNCATE pgbench_history")
		r.pr.pg.Exec(t, "CHECKPOINT")
		var err error
		if r.pgPID, err = r.pr.pg.Pid(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(settle)
	for _, r := range runs {
		r.prop0, r.all0 = b.ticks(r.pr, r.pgPID, r.prop)
	}
	before, from := b.metrics(), time.Now()
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second+2*time.Minute)
			defer cancel()
			r.out, r.err = r.pr.pg.Cmd(ctx, "pgbench", pgbenchArgs(r.pr, "-n", "-c", strconv.Itoa(r.clients),
				"-j", strconv.Itoa(min(b.p.jobs, r.clients)), "-T", strconv.Itoa(secs))...).CombinedOutput()
		}()
	}
	wg.Wait()
	elapsed := time.Since(from).Seconds()
	windowRates := rates(before, b.metrics(), elapsed)
	var out []round
	for _, r := range runs {
		if r.err != nil {
			t.Fatalf("primary %s, %s round %d: pgbench: %v\n%s", r.pr.name, r.cfg, cycle, r.err, r.out)
		}
		// pgbench's backends reaped, their CPU time is the postmaster's.
		harness.WaitNoLocalClients(t, r.pgPID, 30*time.Second)
		prop1, all1 := b.ticks(r.pr, r.pgPID, r.prop)
		rd := round{cfg: r.cfg, primary: r.pr.name, cycle: cycle, clients: r.clients, secs: elapsed, rates: windowRates,
			propTicks: prop1 - r.prop0, allTicks: all1 - r.all0}
		m := tpsRe.FindSubmatch(r.out)
		n := txnsRe.FindSubmatch(r.out)
		if m == nil || n == nil {
			t.Fatalf("primary %s, %s round %d: no tps or transactions in pgbench's output:\n%s", r.pr.name, r.cfg, cycle, r.out)
		}
		rd.tps, _ = strconv.ParseFloat(string(m[1]), 64)
		rd.txns, _ = strconv.ParseInt(string(n[1]), 10, 64)
		r.prop.CheckRunning()
		out = append(out, rd)
	}
	return out
}

// pairRound runs both primaries at once, one proposer through etcd, the
// other with static addresses (etcdPrimary says which).
func (b *bench) pairRound(cycle, secs int) []round {
	e := b.etcdPrimary(cycle)
	runs := make([]*run, 2)
	for i, pr := range b.pri {
		runs[i] = &run{pr: pr, cfg: cfgStatic, clients: b.p.clients}
		if i == e {
			runs[i].cfg = cfgEtcd
		}
	}
	return b.measure(cycle, secs, runs)
}

// lowRound runs pr alone through etcd at BENCH_CLIENTS_LOW clients: a
// second commit rate for etcd's writes.
func (b *bench) lowRound(pr *primary, cycle, secs int) round {
	return b.measure(cycle, secs, []*run{{pr: pr, cfg: cfgEtcdLow, clients: b.p.clientsLow}})[0]
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
	b.say("%-10s %-1s %-8s -c %d  tps %7.1f  proposer %s µs/txn, servers %s µs/txn  etcd per second: %s", label, r.primary, r.cfg, r.clients, r.tps,
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

// ratios are etcd's figure over static's in each cycle's paired round
// (both primaries under load at once), cycle by cycle.
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

// pairs are the geometric means of the ratios of cycles 2k-1 and 2k.
// Primary A ran through etcd in one and B in the other, so whatever makes
// one primary faster than the other (where its files landed, its
// safekeepers) cancels: (Ae/Bs · Be/As)^½.
func pairs(xs []float64) []float64 {
	var out []float64
	for i := 0; i+1 < len(xs); i += 2 {
		out = append(out, math.Sqrt(xs[i]*xs[i+1]))
	}
	return out
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
			clients = fmt.Sprintf("%d + %d", b.p.clients, b.p.clients)
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
	ratio := median(pairs(ratios))
	fmt.Fprintf(&sb, "\n**TPS, the proposer finding its safekeepers through etcd against static addresses**, side by side (two primaries at once, pgbench -c %d -j %d on each, %d s rounds): etcd/static **%s**, the median over pairs of cycles (%s; each the geometric mean of a cycle with A through etcd and one with B); per cycle %s. Goal ≥ 0.98×: %s.\n\n",
		b.p.clients, min(b.p.jobs, b.p.clients), b.p.seconds, fnum(ratio, 3), list(pairs(ratios), 3), list(ratios, 3), verdict(ratio >= 0.98))
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
	fmt.Fprintf(&sb, "\nCPU per transaction, etcd/static (the same pairs of paired rounds; a primary's servers are its postmaster tree, its proposer and its three safekeepers): the proposer %s (pairs %s), the servers %s (pairs %s).\n\n",
		fnum(median(pairs(pr)), 3), list(pairs(pr), 3), fnum(median(pairs(ar)), 3), list(pairs(ar), 3))
	hi := max(b.figure(cfgEtcd, writesPerSec), b.figure(cfgEtcdLow, writesPerSec), b.figure(cfgStatic, writesPerSec))
	fmt.Fprintf(&sb, "**etcd writes under load**: at most %s per second in any configuration (idle %s), at %s and %s TPS. Goal a handful per second, independent of the commit rate: %s.\n\n",
		fnum(hi, 2), fnum(b.figure(cfgIdle, writesPerSec), 2), fnum(b.figure(cfgEtcdLow, func(r round) float64 { return r.tps }), 0),
		fnum(b.figure(cfgEtcd, func(r round) float64 { return r.tps }), 0), verdict(hi <= 5))
	sb.WriteString("Every round:\n\n")
	head = []string{"cycle", "primary", "configuration", "pgbench -c", "seconds", "TPS", "proposer µs/txn", "servers µs/txn", "writes/s"}
	for _, m := range metricNames {
		head = append(head, m.label+"/s")
	}
	sb.WriteString(mdRow(head...))
	sb.WriteString("|" + strings.Repeat("---|", len(head)) + "\n")
	for _, r := range b.rounds {
		row := []string{strconv.Itoa(r.cycle), r.primary, r.cfg, strconv.Itoa(r.clients), fnum(r.secs, 1), fnum(r.tps, 1),
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
		"the timelines placed, then two PostgreSQL primaries A and B (pgbench scale %d each, synchronous_standby_names = 'proposer'), each with a timeline on three safekeepers of its own (1, 2, 3 and 4, 5, 6, assigned through etcd). "+
		"Each of %d cycles (after a %d s warm-up) has two rounds of %d s: a paired round, pgbench on both primaries at once, one proposer with --etcd-endpoints only (watching the configuration), the other with --safekeepers (the members' addresses), A through etcd in odd cycles and B in even ones; "+
		"then etcd-low, one primary alone through etcd at pgbench -c %d (a second commit rate for etcd's writes). Each round starts fresh proposers, truncates pgbench_history, checkpoints and waits %v. "+
		"etcd's counters are read from its /metrics before and after each pgbench run and divided by the wall time between; in etcd 3.4 a lease keepalive is no Raft proposal (the leader renews it in memory), so those are counted apart, as lease renewals and as messages on the LeaseKeepAlive streams.\n\n",
		b.p.sks, b.p.zones, b.p.leaseTTL, b.p.scale, b.p.rounds, b.p.warmup, b.p.seconds, b.p.clientsLow, settle)
	sb.WriteString(res)
	path, err := harness.WriteDocSection("docs/performance.md", "bench-fleet", sb.String())
	if err != nil {
		b.t.Fatalf("docs/performance.md: %v", err)
	}
	b.say("wrote the bench-fleet section of %s", path)
}
