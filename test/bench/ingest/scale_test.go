package ingest

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
)

// setupParallel bounds how many timelines are created at once.
const setupParallel = 32

// aggregatePass is one push of total bytes split over timelines timelines,
// all streaming at once, into a fresh safekeeper.
type aggregatePass struct {
	timelines int
	bytes     int64         // pushed in all
	setup     time.Duration // dial + greet + vote + ProposerElected of all
	elapsed   time.Duration // barrier to the last timeline's last response
	cpu       time.Duration
	// Memory, only measured with memory set: after setup (no WAL yet), with
	// every connection open and idle after the pass, and after all were
	// closed.
	memSetup, memOpen, memIdle Mem
	memLong                    Mem           // after idleWait closed, when set
	idleWait                   time.Duration // how long memLong waited
	lastGC                     gcTrace       // the process's last GC by then
	gcs                        int           // GCs it ran
	openStable, idleStable     bool
	fdsBefore, fdsOpen         int
	// served is how many timelines answered a fresh greeting, after the
	// memory was measured, with the flush_lsn their push ended at; serve
	// is how long greeting them all took.
	served int
	serve  time.Duration
}

func (p aggregatePass) MBps() float64 { return float64(p.bytes) / 1e6 / p.elapsed.Seconds() }

// runAggregatePass creates timelines timelines on a fresh safekeeper (each
// greeted, elected), then releases them together: each pushes its share of
// total (cut at a record end) in 128 KiB appends. With memory, it then
// measures RSS with the connections open and idle, closes them all and
// measures it again once the server has let them go. With idleWait it
// also waits that long after the close, past Go's forced GC, and reads the
// live heap from the process's GC trace (GODEBUG=gctrace=1, for that
// process only).
func runAggregatePass(t *testing.T, ctx context.Context, w *WAL, timelines int, total int64, memory bool, idleWait time.Duration) aggregatePass {
	t.Helper()
	var n *node
	if idleWait > 0 {
		n = startNodeEnv(t, "GODEBUG", "gctrace=1")
	} else {
		n = startNode(t)
	}
	defer n.drop()
	p := aggregatePass{timelines: timelines}
	var err error
	if p.fdsBefore, err = OpenFDs(n.pid()); err != nil {
		t.Fatal(err)
	}
	share := w.Cut(total / int64(timelines))
	wal := w.Data[:share]
	p.bytes = share * int64(timelines)

	clients := make([]*Client, timelines)
	starts := make([]proto.LSN, timelines)
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}()
	t0 := time.Now()
	if err := forEach(timelines, setupParallel, func(i int) error {
		c, start, err := n.campaign(ctx, i+1)
		clients[i], starts[i] = c, start
		return err
	}); err != nil {
		t.Fatalf("creating %d timelines: %v", timelines, err)
	}
	p.setup = time.Since(t0)
	if memory {
		p.memSetup, _ = settleMem(t, n.pid(), 2*time.Second)
	}

	cpu0, err := harness.CPUTime(n.pid())
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := forEach(timelines, timelines, func(i int) error {
		_, err := clients[i].Stream(ctx, wal, starts[i], StreamOptions{Piece: 128 << 10, Window: *benchWindow, Commit: true})
		if err != nil {
			return fmt.Errorf("timeline %d: %w", i+1, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	p.elapsed = time.Since(t0)
	cpu1, err := harness.CPUTime(n.pid())
	if err != nil {
		t.Fatal(err)
	}
	p.cpu = cpu1 - cpu0
	if !memory {
		return p
	}

	p.memOpen, p.openStable = settleMem(t, n.pid(), 3*time.Second)
	if p.fdsOpen, err = OpenFDs(n.pid()); err != nil {
		t.Fatal(err)
	}
	for i, c := range clients {
		c.Close()
		clients[i] = nil
	}
	// The server has let go of every connection when its descriptors are
	// back to what they were before the first one.
	harness.WaitFor(t, 60*time.Second, "the safekeeper to close every push connection", func() bool {
		fds, err := OpenFDs(n.pid())
		return err == nil && fds <= p.fdsBefore
	})
	closed := time.Now()
	p.memIdle, p.idleStable = settleMem(t, n.pid(), 5*time.Second)
	if idleWait > 0 {
		// Go collects an idle process's garbage only at its forced GC
		// (every 2 minutes) and returns freed memory to the system
		// later still: what is resident after minutes is held.
		for time.Since(closed) < idleWait {
			m, _ := ReadMem(n.pid())
			t.Logf("idle %v: RSS %s (anon %s)", time.Since(closed).Round(time.Second), MB(m.RSS), MB(m.RSSAnon))
			time.Sleep(min(10*time.Second, idleWait-time.Since(closed)))
		}
		p.memLong, _ = settleMem(t, n.pid(), 0)
		p.idleWait = time.Since(closed)
		p.lastGC, p.gcs = lastGC(n.sk.Log())
	}
	// Every timeline is still served: a new connection's greeting is
	// answered with the flush_lsn its push ended at.
	var served atomic.Int64
	t0 = time.Now()
	if err := forEach(timelines, setupParallel, func(i int) error {
		c, err := Dial(ctx, n.sk.Addr, timelineInfo(i+1))
		if err != nil {
			return err
		}
		defer c.Close()
		info, err := c.Greet(ctx)
		if err != nil {
			return fmt.Errorf("timeline %d: %w", i+1, err)
		}
		if want := starts[i] + proto.LSN(share); info.FlushLSN != want {
			return fmt.Errorf("timeline %d: flush_lsn %v after idling, its push ended at %v", i+1, info.FlushLSN, want)
		}
		served.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	p.serve, p.served = time.Since(t0), int(served.Load())
	return p
}

// gcTrace is one line of a Go runtime GC trace (GODEBUG=gctrace=1):
// "gc N @Ts P%: … A->B->C MB, …", C the live heap after the GC.
type gcTrace struct {
	N              int
	At             float64 // seconds since the process started
	Live           int     // MB
	Forced, Parsed bool
}

var gcLine = regexp.MustCompile(`gc (\d+) @([\d.]+)s [^\n]*? (\d+)->(\d+)->(\d+) MB`)

// lastGC finds the last GC in a process's output (the runtime's trace lines
// may be interleaved with the log's) and how many there were.
func lastGC(log string) (gcTrace, int) {
	ms := gcLine.FindAllStringSubmatchIndex(log, -1)
	if len(ms) == 0 {
		return gcTrace{}, 0
	}
	m := ms[len(ms)-1]
	g := gcTrace{Parsed: true}
	g.N, _ = strconv.Atoi(log[m[2]:m[3]])
	g.At, _ = strconv.ParseFloat(log[m[4]:m[5]], 64)
	g.Live, _ = strconv.Atoi(log[m[10]:m[11]])
	// The runtime prints "GC forced" before a forced GC's line.
	before := log[:m[0]]
	if i := strings.LastIndex(before, "GC forced"); i >= 0 && (len(ms) < 2 || i > ms[len(ms)-2][1]) {
		g.Forced = true
	}
	return g, g.N
}

// settleMem samples the process's memory every 250 ms for at least least,
// until its RSS has moved less than 1 MB over the last 2 s (at most 30 s),
// and returns the last sample and whether it settled.
func settleMem(t *testing.T, pid int, least time.Duration) (Mem, bool) {
	t.Helper()
	const every, window, most = 250 * time.Millisecond, 2 * time.Second, 30 * time.Second
	var samples []Mem
	start := time.Now()
	for {
		m, err := ReadMem(pid)
		if err != nil {
			t.Fatal(err)
		}
		samples = append(samples, m)
		k := int(window / every)
		if time.Since(start) >= least && len(samples) > k {
			recent := samples[len(samples)-k-1:]
			lo := slices.MinFunc(recent, func(a, b Mem) int { return int(int64(a.RSS) - int64(b.RSS)) }).RSS
			hi := slices.MaxFunc(recent, func(a, b Mem) int { return int(int64(a.RSS) - int64(b.RSS)) }).RSS
			if hi-lo < 1e6 {
				return m, true
			}
		}
		if time.Since(start) >= most {
			return m, false
		}
		time.Sleep(every)
	}
}

// forEach runs f(0..n-1) with at most par at once and returns the first
// error (the others still run to their end).
func forEach(n, par int, f func(i int) error) error {
	var wg sync.WaitGroup
	sem := make(chan struct{}, par)
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// readerRound is one round of the reader benchmark on one timeline of a
// fresh safekeeper: a prefill, then an ingest with a reader far behind and
// one without, in alternating order.
type readerRound struct {
	prefill       StreamResult
	without, with StreamResult
	readerStart   proto.LSN
	readerTarget  proto.LSN     // the commit_lsn when the reader started: what it was behind
	catchUp       time.Duration // START_REPLICATION to reaching readerTarget
	caughtUpFirst bool          // the reader reached readerTarget before the ingest ended
	tailLag       time.Duration // from the ingest's last response to the reader having it all
}

func (r readerRound) catchUpMBps() float64 {
	return float64(r.readerTarget-r.readerStart) / 1e6 / r.catchUp.Seconds()
}

// runReaderRound: a fresh safekeeper and one timeline; push behind bytes and
// commit them; then two ingests of ingest bytes each continuing the same
// timeline, one while a reader streams from at least behind bytes below the
// head (a segment start), one without a reader; withFirst orders them.
func runReaderRound(t *testing.T, ctx context.Context, w *WAL, behind, ingest int64, withFirst bool) readerRound {
	t.Helper()
	n := startNode(t)
	defer n.drop()
	c, start, err := n.campaign(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var rr readerRound
	opts := StreamOptions{Piece: 128 << 10, Window: *benchWindow, Commit: true}
	a := w.Cut(behind)
	pos := int64(0)
	// push streams w.Data[pos:to] and then a heartbeat that brings commit_lsn
	// to its end, so a reader can have all of it.
	push := func(to int64) StreamResult {
		t.Helper()
		opts.CommitFrom = start + proto.LSN(pos)
		res, err := c.Stream(ctx, w.Data[pos:to], start+proto.LSN(pos), opts)
		if err != nil {
			t.Fatal(err)
		}
		end := start + proto.LSN(to)
		r, err := c.Heartbeat(ctx, end, end)
		if err != nil {
			t.Fatal(err)
		}
		// The response reports the durable commit_lsn, which a heartbeat
		// does not move at once (it is persisted lazily); readers are
		// served the in-memory one, end, right away.
		if r.CommitLSN > end {
			t.Fatalf("commit_lsn %v after a heartbeat with %v", r.CommitLSN, end)
		}
		pos = to
		return res
	}
	rr.prefill = push(a)

	withReader := func() {
		head := start + proto.LSN(pos)
		rr.readerStart = max(TLStart, (head - proto.LSN(behind)).SegmentStart(SegSize))
		rr.readerTarget = head
		to := w.Cut(pos + ingest)
		end := start + proto.LSN(to)
		t0 := time.Now()
		rd, err := StartReader(ctx, n.sk.Addr, timelineKey(1), rr.readerStart)
		if err != nil {
			t.Fatal(err)
		}
		defer rd.Close()
		type followed struct {
			at  []time.Time
			err error
		}
		done := make(chan followed, 1)
		go func() {
			at, err := rd.Follow(ctx, end, []proto.LSN{head, end}, w)
			done <- followed{at, err}
		}()
		rr.with = push(to)
		ingestEnd := time.Now()
		f := <-done
		if f.err != nil {
			t.Fatal(f.err)
		}
		rr.catchUp = f.at[0].Sub(t0)
		rr.caughtUpFirst = f.at[0].Before(ingestEnd)
		rr.tailLag = max(0, f.at[1].Sub(ingestEnd))
	}
	without := func() { rr.without = push(w.Cut(pos + ingest)) }
	if withFirst {
		withReader()
		without()
	} else {
		without()
		withReader()
	}
	return rr
}

// TestBenchScale measures one safekeeper with many timelines and with a
// reader far behind (make bench-scale; doc.go describes the method).
func TestBenchScale(t *testing.T) {
	if !*benchScale {
		t.Skip("benchmark: run with -bench.scale (make bench-scale)")
	}
	envs := []string{"BENCH_TIMELINES", "BENCH_TIMELINES_SMALL", "BENCH_SCALE_BYTES", "BENCH_READER_BEHIND", "BENCH_READER_INGEST", "BENCH_ROUNDS", "BENCH_IDLE_WAIT", "BENCH_WRITE_DOC"}
	many, err := EnvInt("BENCH_TIMELINES", 10000)
	if err != nil {
		t.Fatal(err)
	}
	fewer, err := EnvInt("BENCH_TIMELINES_SMALL", min(1000, many))
	if err != nil {
		t.Fatal(err)
	}
	total, err := EnvSize("BENCH_SCALE_BYTES", 640<<20) // 64 KiB for each of 10,000
	if err != nil {
		t.Fatal(err)
	}
	behind, err := EnvSize("BENCH_READER_BEHIND", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	ingest, err := EnvSize("BENCH_READER_INGEST", 512<<20)
	if err != nil {
		t.Fatal(err)
	}
	rounds, err := EnvInt("BENCH_ROUNDS", 3)
	if err != nil {
		t.Fatal(err)
	}
	idleWait, err := EnvDuration("BENCH_IDLE_WAIT", 0)
	if err != nil {
		t.Fatal(err)
	}
	w := walOf(t, max(total, behind+2*ingest+(1<<20))) // slack: cuts round up to record ends
	dir := t.TempDir()
	machine := DescribeMachine(dir)
	ctx := harness.Context(t, 3*time.Hour)

	// (1) and (2): aggregate ingest of many, fewer and one timeline(s),
	// the order rotated round by round; the passes of many timelines also
	// measure memory.
	counts := []int{many}
	if fewer != many {
		counts = append(counts, fewer)
	}
	counts = append(counts, 1)
	agg := map[int][]aggregatePass{}
	for r := 0; r < rounds; r++ {
		for k := range counts {
			tl := counts[(k+r)%len(counts)]
			wait := time.Duration(0)
			if tl == many && len(agg[many]) == 0 {
				wait = idleWait // once: it takes minutes
			}
			p := runAggregatePass(t, ctx, w, tl, total, tl == many, wait)
			agg[tl] = append(agg[tl], p)
			t.Logf("round %d: %s: %.1f MB/s (setup %v)", r+1, plural(tl, "timeline"), p.MBps(), p.setup.Round(time.Millisecond))
			if tl == many {
				t.Logf("round %d: RSS after setup %s, open and idle %s, closed %s (HWM %s)", r+1, MB(p.memSetup.RSS), MB(p.memOpen.RSS), MB(p.memIdle.RSS), MB(p.memIdle.HWM))
			}
		}
	}
	// (3) a reader behind bytes behind while ingest runs on its timeline.
	var rrs []readerRound
	for r := 0; r < rounds; r++ {
		rr := runReaderRound(t, ctx, w, behind, ingest, r%2 == 0)
		rrs = append(rrs, rr)
		t.Logf("round %d: reader catch-up %.1f MB/s; ingest %.1f MB/s with the reader, %.1f without", r+1, rr.catchUpMBps(), rr.with.MBps(), rr.without.MBps())
	}

	// Figures.
	ratioTo1 := func(tl int) []float64 {
		var xs []float64
		for r := range agg[tl] {
			xs = append(xs, agg[tl][r].MBps()/agg[1][r].MBps())
		}
		return xs
	}
	rates := func(tl int) []float64 {
		var xs []float64
		for _, p := range agg[tl] {
			xs = append(xs, p.MBps())
		}
		return xs
	}
	memOf := func(f func(aggregatePass) uint64) []float64 {
		var xs []float64
		for _, p := range agg[many] {
			xs = append(xs, float64(f(p))/1e6)
		}
		return xs
	}
	idle := memOf(func(p aggregatePass) uint64 { return p.memIdle.RSSAnon })
	var catch, slow, withR, withoutR, prefill []float64
	for _, rr := range rrs {
		catch = append(catch, rr.catchUpMBps())
		slow = append(slow, (1-rr.with.MBps()/rr.without.MBps())*100)
		withR = append(withR, rr.with.MBps())
		withoutR = append(withoutR, rr.without.MBps())
		prefill = append(prefill, rr.prefill.MBps())
	}

	var rep strings.Builder
	fmt.Fprintf(&rep, "Run of %s: %s; one safekeeper; window %d requests in flight per push connection.\n\n", machine.Date, plural(rounds, "round"), *benchWindow)
	rep.WriteString("**Targets.** Medians over the rounds, (min–max) after them; ratios and slowdowns are per round, then the median. MB = 10^6 bytes.\n\n")
	tg := Table{Header: []string{"figure", "measured", "target", "verdict"}}
	tg.Add(fmt.Sprintf("%d timelines, connections closed: idle anonymous RSS (MB), a few seconds after", many), Spread(idle, 1), "≤ 100 MB", Verdict(Median(idle) <= 100))
	long := agg[many][0]
	if long.idleWait > 0 {
		tg.Add(fmt.Sprintf("… and %.0f s after (past Go's forced GC; first round only)", long.idleWait.Seconds()), fmt.Sprintf("%.1f", float64(long.memLong.RSSAnon)/1e6), "≤ 100 MB", Verdict(long.memLong.RSSAnon <= 100e6))
	}
	var setupS []float64
	servedAll := true
	for _, p := range agg[many] {
		setupS = append(setupS, p.setup.Seconds())
		servedAll = servedAll && p.served == many
	}
	tg.Add(fmt.Sprintf("creating the %d timelines, %d at a time (s)", many, setupParallel), Spread(setupS, 1), fmt.Sprintf("≤ %.0f s (2 ms each)", float64(many)*0.002), Verdict(Median(setupS) <= float64(many)*0.002))
	tg.Add(fmt.Sprintf("after that idle time, every one answers a new greeting with its flush_lsn (s for all %d)", many), Spread(func() []float64 {
		var xs []float64
		for _, p := range agg[many] {
			xs = append(xs, p.serve.Seconds())
		}
		return xs
	}(), 1), "all served", Verdict(servedAll))
	for _, tl := range counts[:len(counts)-1] {
		x := ratioTo1(tl)
		tg.Add(fmt.Sprintf("aggregate ingest, %d timelines / one timeline", tl), Spread(x, 2), "≥ 0.80", Verdict(Median(x) >= 0.8))
	}
	tg.Add(fmt.Sprintf("reader %s behind: catch-up MB/s during ingest", HumanSize(behind)), Spread(catch, 1), "≥ 300 MB/s", Verdict(Median(catch) >= 300))
	tg.Add("ingest slowdown with that reader (%)", Spread(slow, 1), "≤ 10%", Verdict(Median(slow) <= 10))
	rep.WriteString(tg.String())

	fmt.Fprintf(&rep, "\n**Memory of %d timelines** (one safekeeper; each timeline greeted, elected and given %s of WAL in 128 KiB appends; VmRSS = RssAnon + RssFile, the latter mostly bbolt's mmap).\n\n",
		many, HumanSize(w.Cut(total/int64(many))))
	mt := Table{Header: []string{"when", "VmRSS", "RssAnon", "RssFile", "settled"}}
	type memRow struct {
		name   string
		get    func(aggregatePass) Mem
		stable func(aggregatePass) bool
	}
	for _, m := range []memRow{
		{"after creating them, before any WAL", func(p aggregatePass) Mem { return p.memSetup }, nil},
		{fmt.Sprintf("after the ingest, %d push connections open and idle", many), func(p aggregatePass) Mem { return p.memOpen }, func(p aggregatePass) bool { return p.openStable }},
		{"all connections closed (server's descriptors back to before), settled", func(p aggregatePass) Mem { return p.memIdle }, func(p aggregatePass) bool { return p.idleStable }},
		{"peak (VmHWM) at the end", func(p aggregatePass) Mem { m := p.memIdle; m.RSS = m.HWM; m.RSSAnon, m.RSSFile = 0, 0; return m }, nil},
	} {
		var rss, anon, file []float64
		settled := 0
		for _, p := range agg[many] {
			v := m.get(p)
			rss, anon, file = append(rss, float64(v.RSS)/1e6), append(anon, float64(v.RSSAnon)/1e6), append(file, float64(v.RSSFile)/1e6)
			if m.stable != nil && m.stable(p) {
				settled++
			}
		}
		st := "–"
		if m.stable != nil {
			st = fmt.Sprintf("%d of %d rounds", settled, len(agg[many]))
		}
		a, f := Spread(anon, 1), Spread(file, 1)
		if Median(anon) == 0 && Median(file) == 0 {
			a, f = "–", "–"
		}
		mt.Add(m.name, Spread(rss, 1), a, f, st)
	}
	rep.WriteString(mt.String())
	if long.idleWait > 0 {
		fmt.Fprintf(&rep, "\nFirst round, %.0f s after the close: VmRSS %s (RssAnon %s, RssFile %s). ", long.idleWait.Seconds(), MB(long.memLong.RSS), MB(long.memLong.RSSAnon), MB(long.memLong.RSSFile))
		if g := long.lastGC; g.Parsed {
			kind := "not forced"
			if g.Forced {
				kind = "forced"
			}
			fmt.Fprintf(&rep, "The process's last GC (GODEBUG=gctrace=1 for that process; gc %d at %.0f s, %s) left a live heap of %d MB.\n", g.N, g.At, kind, g.Live)
		} else {
			rep.WriteString("No GC trace was found in its log.\n")
		}
	} else {
		rep.WriteString("\nThe server gives memory back once no WAL has arrived for about two seconds (server/memory.go: it releases the database mapping and, when more than 64 MiB of heap is garbage or free, collects and returns it), so both figures after the ingest are taken after that; the peak is what the burst needed. BENCH_IDLE_WAIT=360s also waits that long once (first round) and reports RSS and the live heap then.\n")
	}
	fd := agg[many][0]
	fmt.Fprintf(&rep, "\nOpen descriptors of the safekeeper: %d before, %d with the %d connections open. Creating the %d timelines (dial, greet, vote, ProposerElected; %d at a time) took %s.\n",
		fd.fdsBefore, fd.fdsOpen, many, many, setupParallel, Spread(func() []float64 {
			var xs []float64
			for _, p := range agg[many] {
				xs = append(xs, p.setup.Seconds())
			}
			return xs
		}(), 1)+" s")

	rep.WriteString("\n**Aggregate ingest** (every timeline pushes its share at once, 128 KiB appends; timed from the common start to the last response).\n\n")
	at := Table{Header: []string{"timelines", "WAL each", "in all", "MB/s", "/ one timeline", "safekeeper CPU"}}
	for _, tl := range counts {
		var cpu []float64
		for _, p := range agg[tl] {
			cpu = append(cpu, p.cpu.Seconds()/p.elapsed.Seconds()*100)
		}
		ratio := "1"
		if tl != 1 {
			ratio = Spread(ratioTo1(tl), 2)
		}
		at.Add(fmt.Sprint(tl), HumanSize(agg[tl][0].bytes/int64(tl)), HumanSize(agg[tl][0].bytes), Spread(rates(tl), 1), ratio, fmt.Sprintf("%.0f%% of a core", Median(cpu)))
	}
	rep.WriteString(at.String())

	fmt.Fprintf(&rep, "\n**A reader %s behind** (one timeline; the reader and the ingest on the same timeline).\n\n", HumanSize(behind))
	rt := Table{Header: []string{"figure", "measured"}}
	rt.Add(fmt.Sprintf("prefill: %s pushed, then committed (MB/s)", HumanSize(w.Cut(behind))), Spread(prefill, 1))
	rt.Add(fmt.Sprintf("ingest of %s without a reader (MB/s)", HumanSize(ingest)), Spread(withoutR, 1))
	rt.Add(fmt.Sprintf("ingest of %s with the reader catching up (MB/s)", HumanSize(ingest)), Spread(withR, 1))
	rt.Add("slowdown (%)", Spread(slow, 1))
	rt.Add("reader catch-up: START_REPLICATION to the commit_lsn at its start (MB/s)", Spread(catch, 1))
	caught := 0
	var lag []float64
	for _, rr := range rrs {
		if rr.caughtUpFirst {
			caught++
		}
		lag = append(lag, float64(rr.tailLag.Microseconds())/1000)
	}
	rt.Add("reader reached that point before the ingest ended", fmt.Sprintf("%d of %d rounds", caught, len(rrs)))
	rt.Add("reader behind the ingest's last response by (ms)", Spread(lag, 1))
	rep.WriteString(rt.String())

	rep.WriteString("\n**Per round** (MB/s, in the order run).\n\n")
	hdr := []string{"round"}
	for _, tl := range counts {
		hdr = append(hdr, plural(tl, "timeline"))
	}
	hdr = append(hdr, fmt.Sprintf("%d timelines: idle RssAnon (MB)", many), "order", "ingest, no reader", "ingest, reader", "reader catch-up")
	pr := Table{Header: hdr}
	for r := 0; r < rounds; r++ {
		row := []string{fmt.Sprint(r + 1)}
		for _, tl := range counts {
			row = append(row, fmt.Sprintf("%.1f", agg[tl][r].MBps()))
		}
		order := "no reader first"
		if r%2 == 0 {
			order = "reader first"
		}
		row = append(row, fmt.Sprintf("%.1f", idle[r]), order, fmt.Sprintf("%.1f", rrs[r].without.MBps()), fmt.Sprintf("%.1f", rrs[r].with.MBps()), fmt.Sprintf("%.1f", rrs[r].catchUpMBps()))
		pr.Add(row...)
	}
	rep.WriteString(pr.String())

	fmt.Fprintf(&rep, "\n**Method.** Every pass starts a fresh `safekeeper run` (default options: fsync on; the test harness logs at debug level) on an empty data directory in the test's temporary directory, and kills it and removes its data afterwards. "+
		"WAL is %s. "+
		"*Timelines and memory:* %d timelines are created %d at a time over their own push connections (greet, vote, ProposerElected), then all push their share of %s at once in 128 KiB appends "+
		"with at most %d unanswered, each carrying commit_lsn = the flush_lsn acknowledged so far; the pass is timed from that common start to the last response. "+
		"RSS is VmRSS of /proc/PID/status, sampled every 250 ms until it moved less than 1 MB in 2 s (at least 3 s with the connections open, 5 s after they are closed and the server's open descriptors are back to their count before the first connection; at most 30 s); the target is on its anonymous part, RssAnon (RssFile is bbolt's mapped database pages, page cache the kernel reclaims). "+
		"Then every timeline gets a new connection (%d at a time) whose greeting must be answered with the flush_lsn its push ended at. "+
		"*Aggregate ingest:* the same pass with %s timelines and with one timeline pushing the whole %s, in an order rotated round by round; the ratio is per round. "+
		"*Reader:* one timeline; %s is pushed and committed (a heartbeat carries commit_lsn = its end, since ordinary readers get WAL up to commit_lsn only), "+
		"then %s is pushed twice more on the same connection and timeline, once while a reader (pgconn + pglogrepl: START_REPLICATION PHYSICAL, no slot, standby status updates every second, "+
		"every byte compared with what was pushed) streams from the segment start at least %s below the head, and once without; the order alternates by round. "+
		"Catch-up MB/s is the distance to the commit_lsn at the reader's start over the time from connecting to reaching it; the WAL it reads was just written, so it is in the page cache (%.0f GB of memory), as on a safekeeper whose reader fell behind recently.\n\n",
		RecordMix, many, setupParallel, HumanSize(total), *benchWindow, setupParallel, joinInts(counts[:len(counts)-1], " and "), HumanSize(total),
		HumanSize(w.Cut(behind)), HumanSize(ingest), HumanSize(behind), float64(machine.MemTotal)/1e9)
	rep.WriteString("**Machine.**\n\n" + machine.String())
	rep.WriteString("\n**Command.** " + commandLine("bench-scale", envs) + "\n")
	emit(t, "bench-scale", rep.String())
}

func joinInts(xs []int, sep string) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprint(x))
	}
	return strings.Join(s, sep)
}
