package archive

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
	"github.com/safekeeper/safekeeper/test/s3test"
	"github.com/safekeeper/safekeeper/test/tlstest"
)

// The benchmark's knobs: flags, defaulting to the environment variables
// make bench-archive passes through. Five rounds of 20 s rather than
// three of 30: the TPS of a round on this shared machine moves by 10 to
// 20%, and the median of five per-cycle ratios hides one bad cycle where
// that of three shows it.
var (
	flagRun      = flag.Bool("bench.archive", false, "run the archive benchmark (make bench-archive); without it TestBenchArchive skips")
	flagRounds   = flag.Int("bench.rounds", knobs.Int("BENCH_ROUNDS", 5), "rounds per side and measurement (env BENCH_ROUNDS)")
	flagSegments = flag.Int("bench.segments", knobs.Int("BENCH_SEGMENTS", 32), "16 MiB segments uploaded and restored per round (env BENCH_SEGMENTS)")
	flagSeconds  = flag.Int("bench.seconds", knobs.Int("BENCH_SECONDS", 20), "pgbench -T of each round under load (env BENCH_SECONDS)")
	flagClients  = flag.Int("bench.clients", knobs.Int("BENCH_CLIENTS", 8), "pgbench -c (env BENCH_CLIENTS)")
	flagJobs     = flag.Int("bench.jobs", knobs.Int("BENCH_JOBS", 2), "pgbench -j (env BENCH_JOBS)")
	flagScale    = flag.Int("bench.scale", knobs.Int("BENCH_SCALE", 10), "pgbench -i -s (env BENCH_SCALE)")
	flagWarmup   = flag.Int("bench.warmup", knobs.Int("BENCH_WARMUP", 10), "seconds of one unreported round per configuration under load before the measured ones, 0 for none (env BENCH_WARMUP)")
	flagDoc      = flag.Bool("bench.doc", knobs.Int("BENCH_WRITE_DOC", 1) != 0, "rewrite the bench-archive section of docs/performance.md (env BENCH_WRITE_DOC=0: leave it)")
)

var knobs harness.Knobs // the flags' defaults from BENCH_* (TestBench* fails on a bad one)

type params struct {
	rounds, segments, seconds, clients, jobs, scale, warmup int
	writeDoc                                                bool
}

func (p params) validate() error {
	var errs []error
	for _, c := range []struct {
		name   string
		v, min int
	}{{"BENCH_ROUNDS", p.rounds, 1}, {"BENCH_SEGMENTS", p.segments, 1}, {"BENCH_SECONDS", p.seconds, 1},
		{"BENCH_CLIENTS", p.clients, 1}, {"BENCH_JOBS", p.jobs, 1}, {"BENCH_SCALE", p.scale, 1}, {"BENCH_WARMUP", p.warmup, 0}} {
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
	return fmt.Sprintf("BENCH_ROUNDS=%d BENCH_SEGMENTS=%d BENCH_SECONDS=%d BENCH_CLIENTS=%d BENCH_JOBS=%d BENCH_SCALE=%d BENCH_WARMUP=%d make bench-archive",
		p.rounds, p.segments, p.seconds, p.clients, p.jobs, p.scale, p.warmup)
}

func TestMain(m *testing.M) { harness.Main(m) }

// segSize is the primary's WAL segment size (initdb's default).
const segSize = 16 << 20

var (
	// The timeline of phase 1 (one safekeeper, the template) and of
	// phase 2 (three safekeepers under load).
	tenantID      = proto.ID{0xa7, 0xc4, 1}
	uploadTimelID = proto.ID{0xa7, 0xc4, 2}
	loadTimelID   = proto.ID{0xa7, 0xc4, 3}
)

type bench struct {
	t       *testing.T
	p       params
	started time.Time
	machine machine

	pg  *pgtest.Cluster
	mon *pgx.Conn // the harness's one connection to the primary (TCP)

	ca  *tlstest.CA
	s3  *s3test.Server
	pb  *pgBackRest
	dir string // owned by the postgres user: pgBackRest's files, the segment copies

	// Phase 1.
	segs    []segment // the segments uploaded and restored
	first   proto.LSN // the first one's start
	tmplDir string    // the stopped template safekeeper's data directory
	pbData  string    // the segments laid out as a data directory, for archive-push
	uploads []timing
	fetches []timing
	stored  map[string]int64 // side -> bytes the segments' objects take, round 1

	// Phase 2.
	sks     []*harness.Safekeeper
	prop    *harness.Process
	loads   []loadResult
	skCount int // rounds whose figures are in loads, per configuration
}

// segment is one WAL segment file of phase 1.
type segment struct {
	name  string
	start proto.LSN
	sum   [32]byte
}

// TestBenchArchive is make bench-archive: see the package comment.
func TestBenchArchive(t *testing.T) {
	if !*flagRun {
		t.Skip("the archive benchmark runs only with -bench.archive (make bench-archive)")
	}
	p := params{rounds: *flagRounds, segments: *flagSegments, seconds: *flagSeconds, clients: *flagClients,
		jobs: *flagJobs, scale: *flagScale, warmup: *flagWarmup, writeDoc: *flagDoc}
	if err := errors.Join(knobs.Err(), p.validate()); err != nil {
		t.Fatal(err)
	}
	b := setup(t, p)
	b.phaseSegments()
	b.phaseLoad()
	b.report()
}

func (b *bench) say(format string, args ...any) {
	fmt.Printf("[bench-archive %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// primaryConf: no checkpoint starts inside a round by itself, and the
// segments of phase 1 stay in pg_wal until they are copied.
var primaryConf = []string{
	"synchronous_standby_names = ''",
	"max_wal_size = '8GB'",
	"checkpoint_timeout = '30min'",
	"wal_sender_timeout = '60s'",
	"archive_mode = on",
	"archive_command = 'true'",
	"archive_timeout = '60s'",
}

// setup starts the primary, loads pgbench's tables, makes the CA, starts
// versitygw with TLS and writes pgBackRest's configuration.
func setup(t *testing.T, p params) *bench {
	b := &bench{t: t, p: p, started: time.Now(), stored: map[string]int64{}}
	pbBin, err := exec.LookPath("pgbackrest")
	if err != nil {
		t.Fatalf("pgbackrest not found on PATH (apt-get install pgbackrest; .ci/run installs it): %v", err)
	}
	// About 5 s per segment of pgbench WAL to make (TPC-B-like WAL once
	// the full-page images after the CHECKPOINT thin out), 0.6 s per
	// segment and round to upload and restore it (both sides, three
	// restores), the load rounds with their waits.
	est := float64(p.segments)*5 + float64(p.segments*p.rounds)*0.6 + float64(3*p.rounds*(p.seconds+15)) + 60
	if p.warmup > 0 {
		est += float64(3 * (p.warmup + 15))
	}
	b.say("%s: about %.0f minutes", p.command(), math.Ceil(est/60))
	harness.Binary(t)
	conf := append(slices.Clone(primaryConf), fmt.Sprintf("wal_keep_size = '%dMB'", (p.segments+8)*segSize>>20))
	b.pg = pgtest.Start(t, pgtest.Options{Conf: conf, TCP: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if b.mon, err = pgx.Connect(ctx, b.pg.TCPConnString()); err != nil {
		t.Fatalf("connect to the primary: %v", err)
	}
	t.Cleanup(func() { b.mon.Close(context.Background()) })
	b.machine = describeMachine(b)
	b.say("primary: PostgreSQL %s in %s; pgBackRest %s", b.machine.pgVersion, b.pg.Dir, b.machine.pgbrVersion)

	b.dir = pgtest.Dir(t, "bench-archive-")
	b.ca = tlstest.NewCA(t, b.dir)
	certFile, keyFile := filepath.Join(t.TempDir(), "s3.crt"), filepath.Join(t.TempDir(), "s3.key")
	b.ca.Issue(t, "versitygw", certFile, keyFile)
	b.s3 = s3test.StartWith(t, s3test.Options{CertFile: certFile, KeyFile: keyFile})
	b.s3.SetEnv(t) // the safekeepers and wal fetch inherit the environment
	t.Setenv("AWS_CA_BUNDLE", b.ca.CertFile)
	b.say("S3: versitygw %s at %s (TLS, a certificate of the benchmark's CA), directory %s", s3test.Version, b.s3.Endpoint, b.s3.Root)
	b.pb = newPgBackRest(b, pbBin)

	b.say("pgbench -i -s %d", p.scale)
	if out, err := b.runPG(30*time.Minute, "pgbench", "-i", "-s", strconv.Itoa(p.scale), "-q",
		"-h", b.pg.SocketDir, "-p", strconv.Itoa(b.pg.Port), "-U", "postgres", "postgres"); err != nil {
		t.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	b.exec("CHECKPOINT")
	return b
}

// storeURL is the --remote-storage URL of prefix in the S3 server.
func (b *bench) storeURL(prefix string) string { return b.s3.URL(prefix) }

// timelineView is a safekeeper's GET /v1/tenant/T/timeline/L.
func timelineView(ctx context.Context, sk *harness.Safekeeper, tl proto.ID) (*httpapi.Timeline, error) {
	v, _, err := httpapi.NewClient(sk.HTTPAddr, nil, "").Timeline(ctx, proto.TimelineKey{TenantID: tenantID, TimelineID: tl})
	return v, err
}

// runPG runs a program as the postgres user (pgtest.Cmd) with a time
// limit and returns its combined output.
func (b *bench) runPG(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := b.pg.Cmd(ctx, name, args...).CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v: %w", timeout, err)
	}
	return string(out), err
}

// exec runs sql on the primary through the monitor connection.
func (b *bench) exec(sql string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := b.mon.Exec(ctx, sql); err != nil {
		b.t.Fatalf("primary: %s: %v", sql, err)
	}
}

// query returns the one value sql selects, as text.
func (b *bench) query(sql string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var v string
	if err := b.mon.QueryRow(ctx, sql).Scan(&v); err != nil {
		b.t.Fatalf("primary: %s: %v", sql, err)
	}
	return v
}

func (b *bench) lsn(sql string) proto.LSN {
	b.t.Helper()
	l, err := proto.ParseLSN(b.query(sql))
	if err != nil {
		b.t.Fatal(err)
	}
	return l
}

// poll calls cond with a growing delay (5 ms up to 200 ms) until it is
// true, failing the test after timeout with the last status it returned.
func (b *bench) poll(timeout time.Duration, what string, cond func() (bool, string)) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	delay := 5 * time.Millisecond
	for {
		ok, status := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out after %v waiting for %s; last seen: %s", timeout, what, status)
		}
		time.Sleep(delay)
		delay = min(delay*2, 200*time.Millisecond)
	}
}

// startProposer starts `safekeeper propose` for timeline tl on sks (the
// timeline created first) with its own slot, and waits until it streams.
func (b *bench) startProposer(tl proto.ID, slot string, sks []*harness.Safekeeper) *harness.Process {
	addrs := harness.Addrs(sks)
	return harness.StartProposer(b.t, harness.ProposerOptions{Name: "proposer " + slot, Upstream: b.pg.TCPConnString(), Safekeepers: addrs,
		Tenant: tenantID.String(), Timeline: tl.String(), Slot: slot, ApplicationName: slot})
}

// stopProposer stops p with SIGTERM and waits until the primary has no
// walsender for it.
func (b *bench) stopProposer(p *harness.Process, app string) {
	if p == nil || p.PID() == 0 {
		return
	}
	if exited, code := p.Exited(); exited {
		b.t.Fatalf("the proposer exited by itself (code %d):\n%s", code, harness.Tail(p.Log(), 40))
	}
	if err := p.Stop(60 * time.Second); err != nil {
		b.t.Fatalf("proposer: exit after SIGTERM: %v\n%s", err, harness.Tail(p.Log(), 40))
	}
	b.poll(time.Minute, "the primary's walsender for "+app+" to exit", func() (bool, string) {
		n := b.query(fmt.Sprintf("SELECT count(*) FROM pg_stat_replication WHERE application_name = '%s'", app))
		return n == "0", n + " left"
	})
}
