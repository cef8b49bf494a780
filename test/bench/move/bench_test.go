package movebench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/test/etcdtest"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

var (
	flagRun     = flag.Bool("bench.move", false, "run the move benchmark (make bench-move); without it TestBenchMove skips")
	flagMoves   = flag.Int("bench.moves", knobs.Int("BENCH_MOVES", 6), "moves (env BENCH_MOVES)")
	flagSeconds = flag.Int("bench.seconds", knobs.Int("BENCH_SECONDS", 10), "steady seconds before each move and after the last (env BENCH_SECONDS)")
	flagClients = flag.Int("bench.clients", knobs.Int("BENCH_CLIENTS", 4), "pgbench -c (env BENCH_CLIENTS)")
	flagScale   = flag.Int("bench.scale", knobs.Int("BENCH_SCALE", 10), "pgbench -i -s (env BENCH_SCALE)")
	flagDoc     = flag.Bool("bench.doc", knobs.Int("BENCH_WRITE_DOC", 1) != 0, "rewrite the bench-move section of docs/performance.md (env BENCH_WRITE_DOC=0: leave it)")
)

var knobs harness.Knobs

func TestMain(m *testing.M) { harness.Main(m) }

type params struct {
	moves, seconds, clients, scale int
	writeDoc                       bool
}

func (p params) validate() error {
	var errs []error
	for _, c := range []struct {
		name   string
		v, min int
	}{{"BENCH_MOVES", p.moves, 1}, {"BENCH_SECONDS", p.seconds, 2}, {"BENCH_CLIENTS", p.clients, 1}, {"BENCH_SCALE", p.scale, 1}} {
		if c.v < c.min {
			errs = append(errs, fmt.Errorf("%s = %d, want at least %d", c.name, c.v, c.min))
		}
	}
	return errors.Join(errs...)
}

func (p params) command() string {
	return fmt.Sprintf("BENCH_MOVES=%d BENCH_SECONDS=%d BENCH_CLIENTS=%d BENCH_SCALE=%d make bench-move", p.moves, p.seconds, p.clients, p.scale)
}

// move is one move's window.
type move struct {
	to         []uint64
	start, end time.Time
}

// txn is one line of pgbench's latency log: when it ended, how long it took.
type txn struct {
	end     time.Time
	latency time.Duration
}

const tenant, timeline = "b0e70000000000000000000000000001", "b0e70000000000000000000000000002"

func TestBenchMove(t *testing.T) {
	if !*flagRun {
		t.Skip("the move benchmark runs only with -bench.move (make bench-move)")
	}
	p := params{moves: *flagMoves, seconds: *flagSeconds, clients: *flagClients, scale: *flagScale, writeDoc: *flagDoc}
	if err := errors.Join(knobs.Err(), p.validate()); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	say := func(format string, args ...any) {
		fmt.Printf("[bench-move %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	say("%s: about %d minutes", p.command(), int(math.Ceil(float64(40+(p.moves+1)*p.seconds+p.moves*5)/60)))
	harness.Binary(t)
	loadStart := harness.LoadAvg()
	etcd := etcdtest.Start(t).Endpoints()
	eps := strings.Join(etcd, ",")
	for i := 1; i <= 6; i++ {
		harness.StartSafekeeper(t, uint64(i), "--etcd-endpoints", eps, "--zone", fmt.Sprintf("z%d", (i-1)%3), "--etcd-lease-ttl", "5s")
	}
	ec, err := fleet.Connect(fleet.ClientConfig{Endpoints: etcd})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	harness.WaitFor(t, 30*time.Second, "6 safekeepers live in etcd", func() bool {
		nodes, _, _, err := ec.Nodes(context.Background())
		live := 0
		for _, n := range nodes {
			if n.Live() {
				live++
			}
		}
		return err == nil && live == 6
	})
	pg := pgtest.Start(t, pgtest.Options{Conf: []string{"wal_sender_timeout = '20s'", "max_wal_size = '8GB'", "checkpoint_timeout = '30min'"}})
	machine := fmt.Sprintf("%d CPUs (nproc), %s, %.1f GiB memory; PostgreSQL %s, %s", runtime.NumCPU(), harness.CPUModel(),
		float64(harness.MemTotal())/(1<<30), pg.Exec(t, "SHOW server_version"), runtime.Version())
	if code, out, errOut := harness.Run(t, "timeline", "create", "--tenant-id", tenant, "--timeline-id", timeline, "--members", "1,2,3",
		"--upstream", pg.ConnString(), "--etcd-endpoints", eps); code != 0 {
		t.Fatalf("timeline create: exit %d\n%s%s", code, out, errOut)
	}
	prop := harness.StartProcess(t, "proposer", "propose", "--upstream", pg.ConnString(), "--tenant-id", tenant, "--timeline-id", timeline,
		"--application-name", "proposer", "--etcd-endpoints", eps)
	bench := func(args ...string) []string {
		return append(append([]string{"-h", pg.SocketDir, "-p", strconv.Itoa(pg.Port), "-U", "postgres"}, args...), "postgres")
	}
	pg.Run(t, "pgbench", bench("-i", "-s", strconv.Itoa(p.scale), "-q")...)
	pg.Exec(t, "ALTER SYSTEM SET synchronous_standby_names = 'proposer'")
	pg.Exec(t, "SELECT pg_reload_conf()")
	harness.WaitSyncStandby(t, pg, prop, "proposer", 60*time.Second)
	ctl := harness.StartProcess(t, "controller", "controller", "--listen-http", "127.0.0.1:0", "--etcd-endpoints", eps)

	logDir := pgtest.Dir(t, "bench-move-log")
	total := (p.moves+1)*p.seconds + p.moves*60
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pgb := pg.Cmd(ctx, "pgbench", bench("-n", "-c", strconv.Itoa(p.clients), "-j", strconv.Itoa(min(2, p.clients)), "-T", strconv.Itoa(total),
		"-l", "--log-prefix", filepath.Join(logDir, "tx"))...)
	var pgbOut strings.Builder
	pgb.Stdout, pgb.Stderr = &pgbOut, &pgbOut
	loadFrom := time.Now()
	if err := pgb.Start(); err != nil {
		t.Fatal(err)
	}
	var moves []move
	for i := 0; i < p.moves; i++ {
		time.Sleep(time.Duration(p.seconds) * time.Second)
		to := []uint64{4, 5, 6}
		if i%2 == 1 {
			to = []uint64{1, 2, 3}
		}
		m := move{to: to, start: time.Now()}
		code, out, errOut := harness.Run(t, "timeline", "migrate", "--tenant-id", tenant, "--timeline-id", timeline, "--members",
			ids(to), "--timeout", "3m", "--etcd-endpoints", eps)
		m.end = time.Now()
		if code != 0 {
			t.Fatalf("move %d to %v: exit %d\n%s%s\ncontroller:\n%s", i+1, to, code, out, errOut, harness.TailFile(ctl.LogPath, 30))
		}
		say("move %d to %v in %v", i+1, to, m.end.Sub(m.start).Round(time.Millisecond))
		moves = append(moves, m)
	}
	time.Sleep(time.Duration(p.seconds) * time.Second)
	loadTo := time.Now()
	cancel()
	pgb.Wait()
	txns := readLogs(t, logDir)
	if len(txns) == 0 {
		t.Fatalf("no transactions in pgbench's latency log\n%s", pgbOut.String())
	}
	res := results(p, moves, txns, loadFrom, loadTo)
	fmt.Println(res)
	if !p.writeDoc {
		return
	}
	describe := "unknown"
	if root, err := harness.ModuleRoot(); err == nil {
		if out, err := exec.Command("git", "-C", root, "describe", "--always", "--dirty", "--tags").Output(); err == nil {
			describe = strings.TrimSpace(string(out))
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "Generated by `make bench-move` (test/bench/move) on %s UTC, build `%s`; the run took %v. Do not edit by hand: rerun it.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04"), describe, time.Since(started).Round(time.Second))
	fmt.Fprintf(&sb, "Command:\n\n    %s\n\nwhich runs `go test ./test/bench/move -run '^TestBenchMove$' -count=1 -timeout 0 -v -args -bench.move` (BENCH_WRITE_DOC=0 leaves this file alone).\n\n", p.command())
	fmt.Fprintf(&sb, "Machine: %s; shared with other work: load average %s at the start, %s at the end.\n\n", machine, loadStart, harness.LoadAvg())
	fmt.Fprintf(&sb, "Method (test/bench/move/doc.go has it in full): one etcd member, six safekeepers in three zones, a controller; a primary (pgbench scale %d) whose proposer finds its members through etcd. One `pgbench -c %d -l` for the whole run; every %d s `timeline migrate --members` moves the timeline between {1,2,3} and {4,5,6} (every member replaced), %d times, waiting for each. A transaction belongs to the window its end falls in: a move (the command's run, plus 1 s) or the steady spells between them (the baseline).\n\n",
		p.scale, p.clients, p.seconds, p.moves)
	sb.WriteString(res)
	path, err := harness.WriteDocSection("docs/performance.md", "bench-move", sb.String())
	if err != nil {
		t.Fatal(err)
	}
	say("wrote the bench-move section of %s", path)
}

// readLogs reads every latency log pgbench wrote in dir (one per thread):
// client_id transaction_no time script_no time_epoch time_us.
func readLogs(t *testing.T, dir string) []txn {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []txn
	for _, e := range ents {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 6 {
				continue
			}
			lat, err1 := strconv.ParseInt(fs[2], 10, 64)
			sec, err2 := strconv.ParseInt(fs[4], 10, 64)
			us, err3 := strconv.ParseInt(fs[5], 10, 64)
			if err := errors.Join(err1, err2, err3); err != nil {
				f.Close()
				t.Fatalf("%s: %q: %v", e.Name(), sc.Text(), err)
			}
			out = append(out, txn{end: time.Unix(sec, us*1000), latency: time.Duration(lat) * time.Microsecond})
		}
		f.Close()
	}
	return out
}

func pct(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64)
}

// results are the tables of a run.
func results(p params, moves []move, txns []txn, from, to time.Time) string {
	var moving, steady []time.Duration
	per := make([][]time.Duration, len(moves))
	for _, x := range txns {
		if x.end.Before(from) || x.end.After(to) {
			continue
		}
		in := -1
		for i, m := range moves {
			if !x.end.Before(m.start) && !x.end.After(m.end.Add(time.Second)) {
				in = i
			}
		}
		if in >= 0 {
			per[in] = append(per[in], x.latency)
			moving = append(moving, x.latency)
		} else {
			steady = append(steady, x.latency)
		}
	}
	var sb strings.Builder
	sb.WriteString("| move | to | took s | transactions | p50 ms | p99 ms | longest ms |\n|---|---|---|---|---|---|---|\n")
	for i, m := range moves {
		fmt.Fprintf(&sb, "| %d | %v | %.2f | %d | %s | %s | %s |\n", i+1, m.to, m.end.Sub(m.start).Seconds(), len(per[i]), ms(pct(per[i], 0.5)), ms(pct(per[i], 0.99)), ms(pct(per[i], 1)))
	}
	p100 := pct(moving, 1)
	verdict := "met"
	if p100 >= time.Second {
		verdict = "NOT met"
	}
	fmt.Fprintf(&sb, "\n| window | transactions | p50 ms | p99 ms | p100 ms |\n|---|---|---|---|---|\n| during moves | %d | %s | %s | %s |\n| steady (baseline) | %d | %s | %s | %s |\n",
		len(moving), ms(pct(moving, 0.5)), ms(pct(moving, 0.99)), ms(p100), len(steady), ms(pct(steady, 0.5)), ms(pct(steady, 0.99)), ms(pct(steady, 1)))
	fmt.Fprintf(&sb, "\n**The longest commit stall during a move: %s ms** (the longest transaction whose end fell in a move's window; steady p100 %s ms). Goal under 1 s at p100: %s.\n",
		ms(p100), ms(pct(steady, 1)), verdict)
	return sb.String()
}

// ids joins node ids for --members.
func ids(xs []uint64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(parts, ",")
}
