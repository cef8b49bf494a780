package ingest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/test/harness"
)

// ingestPass is one measured push of WAL into a fresh safekeeper.
type ingestPass struct {
	piece     int
	res       StreamResult
	delta     counters // of the safekeeper process over the stream
	dataBytes int64    // size of the data directory afterwards
	syscalls  map[string]uint64
}

// diskWritten is the bytes the safekeeper passed to write-family syscalls
// for anything but its responses on the socket and its log file: bbolt's
// pwrites of WAL, tree and meta pages.
func (p ingestPass) diskWritten() int64 {
	return int64(p.delta.io.WChar) - int64(p.res.Requests*responseFrameSize) - p.delta.log
}

func (p ingestPass) writtenPerWALByte() float64 {
	return float64(p.diskWritten()) / float64(p.res.Bytes)
}

// runIngestPass starts a fresh safekeeper, wins a term on a new timeline and
// pushes wal in pieces of piece bytes, measuring the stream alone (the
// handshake and the process start are outside it). With a tracer tool its
// syscalls are counted over the stream.
func runIngestPass(t *testing.T, ctx context.Context, wal []byte, piece int, tool string) ingestPass {
	t.Helper()
	n := startNode(t)
	defer n.drop()
	c, start, err := n.campaign(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := n.counters()
	var tr *Tracer
	if tool != "" {
		if tr, err = StartTracer(tool, n.pid(), filepath.Dir(n.sk.DataDir)); err != nil {
			t.Fatal(err)
		}
		defer tr.Kill()
	}
	p := ingestPass{piece: piece}
	p.res, err = c.Stream(ctx, wal, start, StreamOptions{Piece: piece, Window: *benchWindow, Commit: true})
	if err != nil {
		t.Fatalf("push %s in %s appends: %v", HumanSize(int64(len(wal))), HumanSize(int64(piece)), err)
	}
	if tr != nil {
		if p.syscalls, err = tr.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	after := n.counters()
	p.delta = counters{io: after.io.Sub(before.io), cpu: after.cpu - before.cpu, log: after.log - before.log}
	p.dataBytes = n.dataBytes()
	return p
}

// TestBenchIngest measures one safekeeper's ingest over one push connection
// against dd's O_DSYNC writes on the same filesystem (make bench-ingest; doc.go
// describes the method).
func TestBenchIngest(t *testing.T) {
	if !*benchIngest {
		t.Skip("benchmark: run with -bench.ingest (make bench-ingest)")
	}
	envs := []string{"BENCH_INGEST_BYTES", "BENCH_ROUNDS", "BENCH_DD8K_BYTES", "BENCH_TRACE_BYTES", "BENCH_WRITE_DOC"}
	total, err := EnvSize("BENCH_INGEST_BYTES", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	rounds, err := EnvInt("BENCH_ROUNDS", 3)
	if err != nil {
		t.Fatal(err)
	}
	dd8kBytes, err := EnvSize("BENCH_DD8K_BYTES", min(total, 128<<20))
	if err != nil {
		t.Fatal(err)
	}
	traceBytes, err := EnvSize("BENCH_TRACE_BYTES", min(total, 256<<20))
	if err != nil {
		t.Fatal(err)
	}
	tool, err := PickTracer(*benchTracer)
	if err != nil {
		t.Fatal(err)
	}
	w := walOf(t, total)
	wal := w.Data[:w.Cut(total)]
	traced := w.Data[:w.Cut(traceBytes)]
	dir := t.TempDir()
	machine := DescribeMachine(dir)
	ctx := harness.Context(t, 3*time.Hour)

	type blockSize struct {
		piece   int
		ddCount int
		sk      []ingestPass
		dd      []float64 // MB/s
		ratio   []float64 // safekeeper / dd, per round
		trace   ingestPass
	}
	sizes := []*blockSize{
		{piece: 128 << 10, ddCount: int(max(1, total/(128<<10)))},
		{piece: 8 << 10, ddCount: int(max(1, dd8kBytes/(8<<10)))},
	}
	// Alternate dd and safekeeper passes, round by round, so that the
	// machine's other load falls on both alike; which of a pair goes first
	// alternates too (a pass may pay for the writeback or the device
	// throttling its predecessor left behind).
	for r := 1; r <= rounds; r++ {
		for _, b := range sizes {
			var ddRate float64
			dd := func() {
				d, err := DD(ctx, dir, b.piece, b.ddCount)
				if err != nil {
					t.Fatal(err)
				}
				ddRate = float64(b.piece) * float64(b.ddCount) / 1e6 / d.Seconds()
			}
			var p ingestPass
			sk := func() { p = runIngestPass(t, ctx, wal, b.piece, "") }
			if r%2 == 1 {
				dd()
				sk()
			} else {
				sk()
				dd()
			}
			b.dd = append(b.dd, ddRate)
			b.sk = append(b.sk, p)
			b.ratio = append(b.ratio, p.res.MBps()/ddRate)
			t.Logf("round %d, %s: dd %.1f MB/s, safekeeper %.1f MB/s (ratio %.2f), %.2f bytes written per WAL byte",
				r, HumanSize(int64(b.piece)), ddRate, p.res.MBps(), p.res.MBps()/ddRate, p.writtenPerWALByte())
		}
	}
	if tool != "none" {
		for _, b := range sizes {
			b.trace = runIngestPass(t, ctx, traced, b.piece, tool)
			t.Logf("traced pass, %s: %v", HumanSize(int64(b.piece)), b.trace.syscalls)
		}
	}

	col := func(b *blockSize, f func(ingestPass) float64) []float64 {
		var xs []float64
		for _, p := range b.sk {
			xs = append(xs, f(p))
		}
		return xs
	}
	rate := func(p ingestPass) float64 { return p.res.MBps() }
	wpb := func(p ingestPass) float64 { return p.writtenPerWALByte() }
	big, small := sizes[0], sizes[1]

	var rep strings.Builder
	fmt.Fprintf(&rep, "Run of %s: %s; one safekeeper, one push connection, window %d requests in flight.\n\n", machine.Date, plural(rounds, "round"), *benchWindow)
	rep.WriteString("**Targets.** Medians over the rounds, (min–max) after them; ratios are per round, then the median.\n\n")
	tg := Table{Header: []string{"figure", "measured", "target", "verdict"}}
	r128 := Median(big.ratio)
	tg.Add("128 KiB appends: safekeeper / dd dsync rate (same block size)", Spread(big.ratio, 2), "≥ 0.80", Verdict(r128 >= 0.8))
	tg.Add("128 KiB appends: bytes written per WAL byte", Spread(col(big, wpb), 2), "≤ 1.5", Verdict(Median(col(big, wpb)) <= 1.5))
	s8 := Median(col(small, rate))
	tg.Add("8 KiB appends: MB/s", Spread(col(small, rate), 1), "≥ 150 MB/s", Verdict(s8 >= 150))
	tg.Add("8 KiB appends: bytes written per WAL byte", Spread(col(small, wpb), 2), "≤ 1.5", Verdict(Median(col(small, wpb)) <= 1.5))
	rep.WriteString(tg.String())

	rep.WriteString("\n**Rates** (MB = 10^6 bytes).\n\n")
	rt := Table{Header: []string{"pass", "safekeeper MB/s", "dd dsync MB/s", "safekeeper / dd", "ack p50 / p99", "safekeeper CPU", "data dir / WAL"}}
	for _, b := range sizes {
		var p50, p99, cpu, space []float64
		for _, p := range b.sk {
			p50 = append(p50, float64(p.res.AckP50.Microseconds())/1000)
			p99 = append(p99, float64(p.res.AckP99.Microseconds())/1000)
			cpu = append(cpu, p.delta.cpu.Seconds()/p.res.Elapsed.Seconds()*100)
			space = append(space, float64(p.dataBytes)/float64(p.res.Bytes))
		}
		rt.Add(fmt.Sprintf("%s appends (%d requests)", HumanSize(int64(b.piece)), b.sk[0].res.Requests),
			Spread(col(b, rate), 1),
			fmt.Sprintf("%s (bs=%s, %s)", Spread(b.dd, 1), HumanSize(int64(b.piece)), HumanSize(int64(b.piece)*int64(b.ddCount))),
			Spread(b.ratio, 2),
			fmt.Sprintf("%.1f / %.1f ms", Median(p50), Median(p99)),
			fmt.Sprintf("%.0f%% of a core", Median(cpu)),
			fmt.Sprintf("%.2f", Median(space)))
	}
	rep.WriteString(rt.String())

	rep.WriteString("\n**Writes** (from /proc/PID/io of the safekeeper over each timed pass; medians).\n\n")
	wt := Table{Header: []string{"pass", "wchar / WAL byte", "− responses on the socket", "− log file", "= bytes written per WAL byte", "write syscalls (syscw) / request"}}
	for _, b := range sizes {
		var raw, resp, logb, syscw []float64
		for _, p := range b.sk {
			raw = append(raw, float64(p.delta.io.WChar)/float64(p.res.Bytes))
			resp = append(resp, float64(p.res.Requests*responseFrameSize)/float64(p.res.Bytes))
			logb = append(logb, float64(p.delta.log)/float64(p.res.Bytes))
			syscw = append(syscw, float64(p.delta.io.SyscW)/float64(p.res.Requests))
		}
		wt.Add(HumanSize(int64(b.piece))+" appends", fmt.Sprintf("%.3f", Median(raw)), fmt.Sprintf("%.4f (%d B each)", Median(resp), responseFrameSize),
			fmt.Sprintf("%.4f", Median(logb)), Spread(col(b, wpb), 3), fmt.Sprintf("%.2f", Median(syscw)))
	}
	rep.WriteString(wt.String())

	if tool != "none" {
		fmt.Fprintf(&rep, "\n**Syscalls per request**: a separate pass of %s per block size under `%s` (attached to every thread of the safekeeper for the stream only); traced passes are not timed and not in the rates above.\n\n", HumanSize(int64(len(traced))), tracerCommand(tool))
		st := Table{Header: []string{"pass", "requests", "fsync+fdatasync / request", "pwrite64 / request", "bytes / pwrite64", "write+writev / request", "other"}}
		for _, b := range sizes {
			p := b.trace
			sc := p.syscalls
			req := float64(p.res.Requests)
			var other []string
			for _, k := range []string{"sync_file_range", "pwritev", "ftruncate", "fallocate"} {
				if sc[k] > 0 {
					other = append(other, fmt.Sprintf("%s %d", k, sc[k]))
				}
			}
			perPwrite := "–"
			if sc["pwrite64"] > 0 {
				perPwrite = fmt.Sprintf("%.0f", float64(p.diskWritten())/float64(sc["pwrite64"]))
			}
			st.Add(HumanSize(int64(b.piece))+" appends", fmt.Sprint(p.res.Requests),
				fmt.Sprintf("%.3f (%d fsync, %d fdatasync)", float64(sc["fsync"]+sc["fdatasync"])/req, sc["fsync"], sc["fdatasync"]),
				fmt.Sprintf("%.2f", float64(sc["pwrite64"])/req), perPwrite,
				fmt.Sprintf("%.2f", float64(sc["write"]+sc["writev"])/req), strings.Join(other, ", "))
		}
		rep.WriteString(st.String())
		rep.WriteString("\nbytes / pwrite64 is the disk share of wchar (as above) over the pwrite64 count.\n")
	} else {
		rep.WriteString("\nNo syscall tracer (perf or strace) was available: fsyncs per request not measured.\n")
	}

	rep.WriteString("\n**Per round** (MB/s; 128 KiB pair, then 8 KiB pair; in odd rounds dd runs first in each pair, in even rounds the safekeeper).\n\n")
	pr := Table{Header: []string{"round", "dd 128 KiB", "safekeeper 128 KiB", "dd 8 KiB", "safekeeper 8 KiB"}}
	for r := 0; r < rounds; r++ {
		pr.Add(fmt.Sprint(r+1), fmt.Sprintf("%.1f", big.dd[r]), fmt.Sprintf("%.1f", big.sk[r].res.MBps()),
			fmt.Sprintf("%.1f", small.dd[r]), fmt.Sprintf("%.1f", small.sk[r].res.MBps()))
	}
	rep.WriteString(pr.String())

	fmt.Fprintf(&rep, "\n**Method.** Each safekeeper pass starts a fresh `safekeeper run` (default options: fsync on; the test harness logs at debug level) with an empty data directory, "+
		"dials one START_WAL_PUSH connection, greets, wins term 1 and sends ProposerElected for a new timeline, then pushes %s of WAL (%s) as SafeKeeperRequests "+
		"of 128 KiB or 8 KiB, at most %d unanswered (written with writev, several per write when the window allows), each carrying commit_lsn = the highest flush_lsn acknowledged so far. "+
		"A pass is timed from its first request to the response whose flush_lsn reaches the end of the WAL; the process is then killed and its data removed. "+
		"The baseline, run next to each safekeeper pass of the same block size (before it in odd rounds, after it in even ones) in the same temporary directory, is `%s` and `%s` (8 KiB dsync writes are slow, so that one writes less; both are reported as MB/s). "+
		"Bytes written per WAL byte is the safekeeper's wchar (/proc/PID/io: bytes passed to write-family syscalls; block-layer write_bytes is unreliable on this kernel) over the pass, "+
		"less its SafeKeeperResponses on the socket and its log file growth, divided by the WAL bytes pushed. The data directory is on the same filesystem as dd's file.\n\n",
		HumanSize(int64(len(wal))), RecordMix, *benchWindow, DDCommand(big.piece, big.ddCount), DDCommand(small.piece, small.ddCount))
	rep.WriteString("**Machine.**\n\n" + machine.String())
	rep.WriteString("\n**Command.** " + commandLine("bench-ingest", envs) + "\n")
	emit(t, "bench-ingest", rep.String())
}

// tracerCommand is how a tool is attached, for the report.
func tracerCommand(tool string) string {
	if tool == "perf" {
		return "perf stat -e syscalls:sys_enter_{" + strings.Join(TracedSyscalls, ",") + "} -p PID"
	}
	return "strace -f -c -e trace=" + strings.Join(TracedSyscalls, ",") + " -p PID"
}
