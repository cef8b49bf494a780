package archive

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
)

// Configurations of phase 2.
const (
	cfgNone = "none"
	cfgSK   = "sk"
	cfgPB   = "pgbackrest"
)

var loadConfigs = []string{cfgNone, cfgSK, cfgPB}

// The archive of phase 2: the safekeepers' prefix, pgBackRest's
// repository path.
const (
	loadPrefix = "sk-load"
	loadRepo   = "/pgbackrest-load"
)

// loadResult is one round of phase 2.
type loadResult struct {
	cfg      string
	cycle    int // 1..rounds; 0 for the warm-up
	seconds  int
	tps      float64
	txns     int64
	walBytes int64   // written by the primary during the round
	lag      []int64 // bytes, one per sample: flush_lsn minus the archive's end
	samples  int     // taken in every configuration alike
	// cpuTicks is the CPU time the servers used over the round (clock
	// ticks): the primary's process tree (its archiver and the
	// archive_command it runs included), the proposer, the safekeepers.
	cpuTicks uint64
}

// phaseLoad runs the rounds under pgbench: none, sk, pgbackrest, none, …
func (b *bench) phaseLoad() {
	t := b.t
	b.say("phase 2: pgbench -c %d -j %d for %d s per round through the proposer to three safekeepers; configurations %v alternate",
		b.p.clients, b.p.jobs, b.p.seconds, loadConfigs)
	b.sks = harness.StartSafekeepers(t, 3)
	harness.CreateTimeline(t, b.pg.TCPConnString(), harness.Addrs(b.sks), tenantID.String(), loadTimelID.String())
	b.exec("ALTER SYSTEM SET synchronous_standby_names = 'proposer'")
	b.exec("SELECT pg_reload_conf()")
	b.prop = b.startProposer(loadTimelID, "proposer", b.sks)
	harness.WaitSyncStandby(t, b.pg, b.prop, "proposer", 90*time.Second)
	b.pb.stanzaCreate(loadRepo)
	spool := b.pb.newSpool()
	if b.p.warmup > 0 {
		b.say("warm-up: one %d s round per configuration, not reported", b.p.warmup)
		for _, c := range loadConfigs {
			b.sayLoad(b.loadRound(c, 0, b.p.warmup, spool))
		}
	}
	for cycle := 1; cycle <= b.p.rounds; cycle++ {
		for _, c := range cycleOrder(cycle) {
			r := b.loadRound(c, cycle, b.p.seconds, spool)
			b.sayLoad(r)
			b.loads = append(b.loads, r)
		}
	}
	b.stopProposer(b.prop, "proposer")
	for _, sk := range b.sks {
		if err := sk.Stop(60 * time.Second); err != nil {
			t.Fatalf("safekeeper %d: exit after SIGTERM: %v", sk.ID, err)
		}
	}
	b.exec("ALTER SYSTEM SET archive_command = 'true'")
	b.exec("SELECT pg_reload_conf()")
	b.pb.waitIdle()
}

// cycleOrder is the order of the configurations in cycle n: rotated by
// one each cycle, so that a drift within a cycle (the machine warming up
// or getting busier) does not always fall on the same configuration.
func cycleOrder(n int) []string {
	k := (n - 1) % len(loadConfigs)
	return append(slices.Clone(loadConfigs[k:]), loadConfigs[:k]...)
}

func (b *bench) sayLoad(r loadResult) {
	label := fmt.Sprintf("round %d/%d", r.cycle, b.p.rounds)
	if r.cycle == 0 {
		label = "warm-up"
	}
	b.say("load %-11s %-10s tps %7.1f  WAL %5.2f MiB/s  archive lag p50 %s p99 %s max %s (%d samples)",
		label, r.cfg, r.tps, float64(r.walBytes)/(1<<20)/float64(r.seconds),
		mib(lagPct(r, 0.50)), mib(lagPct(r, 0.99)), mib(lagPct(r, 1)), r.samples)
}

// skArgs are the safekeepers' extra flags in configuration c.
func (b *bench) skArgs(c string) []string {
	if c == cfgSK {
		return []string{"--remote-storage", b.storeURL(loadPrefix)}
	}
	return nil
}

// switchTo makes c the configuration: archive_command, then the
// safekeepers restarted with c's flags if they differ (the proposer
// stopped meanwhile, and waited for as the synchronous standby again).
func (b *bench) switchTo(c, spool string) {
	cmd := "true"
	if c == cfgPB {
		cmd = b.pb.archiveCommand(loadRepo, spool)
	}
	b.exec(fmt.Sprintf("ALTER SYSTEM SET archive_command = '%s'", cmd))
	b.exec("SELECT pg_reload_conf()")
	want := b.skArgs(c)
	if slices.Equal(b.sks[0].Args, want) {
		return
	}
	b.stopProposer(b.prop, "proposer")
	for _, sk := range b.sks {
		if err := sk.Stop(60 * time.Second); err != nil {
			b.t.Fatalf("safekeeper %d: exit after SIGTERM: %v", sk.ID, err)
		}
		sk.Args = want
		sk.Start()
	}
	b.prop.Start()
	harness.WaitSyncStandby(b.t, b.pg, b.prop, "proposer", 90*time.Second)
}

// archived is what one sample reads: the primary's flush LSN, the
// archive's end for each configuration.
type archived struct {
	flush, sk, pb proto.LSN
}

// sample reads the primary's flush LSN, pg_stat_archiver and the three
// safekeepers' backup_lsn (each query with its own deadline).
func (b *bench) sample() (archived, error) {
	var a archived
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var flush, last string
	if err := b.mon.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text, COALESCE(last_archived_wal, '') FROM pg_stat_archiver").Scan(&flush, &last); err != nil {
		return a, err
	}
	var err error
	if a.flush, err = proto.ParseLSN(flush); err != nil {
		return a, err
	}
	if last != "" {
		if a.pb, err = segmentEnd(last, segSize); err != nil {
			return a, err
		}
	}
	for _, sk := range b.sks {
		v, err := timelineView(ctx, sk, loadTimelID)
		if err != nil {
			return a, fmt.Errorf("safekeeper %d: %w", sk.ID, err)
		}
		a.sk = max(a.sk, v.BackupLSN)
	}
	return a, nil
}

// lagOf is the configuration's archive lag in a sample.
func lagOf(c string, a archived) (int64, bool) {
	var end proto.LSN
	switch c {
	case cfgSK:
		end = a.sk
	case cfgPB:
		end = a.pb
	default:
		return 0, false
	}
	if end >= a.flush {
		return 0, true
	}
	return int64(a.flush - end), true
}

// settle is the quiet spell before every round under load.
const settle = 5 * time.Second

// loadRound prepares the primary and runs one pgbench round under c.
func (b *bench) loadRound(c string, cycle, secs int, spool string) loadResult {
	t := b.t
	b.switchTo(c, spool)
	b.exec("TRUNCATE pgbench_history")
	b.exec("VACUUM pgbench_branches")
	b.exec("VACUUM pgbench_tellers")
	b.exec("CHECKPOINT")
	// Close the segment, then wait until the configuration's archive holds
	// everything up to it: every round starts with the archive caught up.
	target := b.lsn("SELECT pg_switch_wal()::text")
	if target.SegmentOffset(segSize) != 0 {
		target = target.SegmentStart(segSize) + segSize
	}
	b.poll(5*time.Minute, fmt.Sprintf("%s: the proposer and the archive to reach %s", c, target), func() (bool, string) {
		b.prop.CheckRunning()
		n := b.query(fmt.Sprintf("SELECT count(*) FROM pg_stat_replication WHERE application_name = 'proposer' AND sync_state = 'sync' AND flush_lsn >= '%s'", target))
		if n != "1" {
			return false, "the proposer has not flushed it"
		}
		a, err := b.sample()
		if err != nil {
			return false, err.Error()
		}
		switch c {
		case cfgSK:
			return a.sk >= target, "backup_lsn " + a.sk.String()
		case cfgPB:
			return a.pb >= target, "archived up to " + a.pb.String()
		}
		return true, ""
	})
	// The same quiet spell before every round: a none round has nothing
	// to wait for above, and would otherwise start while the work the
	// round before left (the other configuration's uploads, the
	// checkpoint's writeback) still runs, and the others would not.
	time.Sleep(settle)

	stop := make(chan struct{})
	done := make(chan loadResult, 1)
	sampleErr := make(chan error, 1)
	go func() {
		var r loadResult
		defer func() { done <- r }()
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			a, err := b.sample()
			if err != nil {
				sampleErr <- err
				return
			}
			r.samples++
			if lag, ok := lagOf(c, a); ok {
				r.lag = append(r.lag, lag)
			}
		}
	}()
	from := b.lsn("SELECT pg_current_wal_flush_lsn()::text")
	pgPID, err := b.pg.Pid()
	if err != nil {
		t.Fatal(err)
	}
	cpuBefore := b.serverTicks(pgPID)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second+5*time.Minute)
	defer cancel()
	cmd := b.pg.Cmd(ctx, "pgbench", "-h", b.pg.SocketDir, "-p", strconv.Itoa(b.pg.Port), "-U", "postgres",
		"-n", "-c", strconv.Itoa(b.p.clients), "-j", strconv.Itoa(b.p.jobs), "-T", strconv.Itoa(secs), "postgres")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	close(stop)
	r := <-done
	// pgbench's backends reaped, their CPU time is the postmaster's.
	harness.WaitNoLocalClients(t, pgPID, 30*time.Second)
	r.cpuTicks = b.serverTicks(pgPID) - cpuBefore
	select {
	case serr := <-sampleErr:
		t.Fatalf("%s round %d: sampling: %v", c, cycle, serr)
	default:
	}
	if err != nil {
		t.Fatalf("%s round %d: pgbench: %v\n%s", c, cycle, err, out.String())
	}
	sum, err := parsePgbench(out.String())
	if err != nil {
		t.Fatalf("%s round %d: pgbench output: %v\n%s", c, cycle, err, out.String())
	}
	to := b.lsn("SELECT pg_current_wal_flush_lsn()::text")
	r.cfg, r.cycle, r.seconds, r.tps, r.txns, r.walBytes = c, cycle, secs, sum.tps, sum.txns, int64(to-from)
	if (c == cfgSK || c == cfgPB) && len(r.lag) == 0 {
		t.Fatalf("%s round %d: no lag sample", c, cycle)
	}
	if c == cfgSK {
		b.checkLoadArchive()
	}
	return r
}

// serverTicks is the CPU time so far of the primary's process tree
// (postmaster pgPID), the proposer and the safekeepers, in clock ticks.
func (b *bench) serverTicks(pgPID int) uint64 {
	pt, err := harness.ReadProcs()
	if err != nil {
		b.t.Fatal(err)
	}
	var sum uint64
	for _, pid := range append([]int{pgPID, b.prop.PID()}, sksPIDs(b.sks)...) {
		n, err := pt.TreeTicks(pid)
		if err != nil {
			b.t.Fatalf("CPU of the servers: %v (one exited during the round?)", err)
		}
		sum += n
	}
	return sum
}

func sksPIDs(sks []*harness.Safekeeper) []int {
	var pids []int
	for _, sk := range sks {
		pids = append(pids, sk.PID())
	}
	return pids
}

// checkLoadArchive fails the run unless every whole segment from the
// timeline's start up to the highest backup_lsn is an object of the
// safekeepers' archive: a backup_lsn past a segment that is not there
// would be a lag that is not real.
func (b *bench) checkLoadArchive() {
	a, err := b.sample()
	if err != nil {
		b.t.Fatal(err)
	}
	v, err := timelineView(context.Background(), b.sks[0], loadTimelID)
	if err != nil {
		b.t.Fatal(err)
	}
	from := v.TimelineStartLSN.SegmentStart(segSize)
	if from < v.TimelineStartLSN {
		from += segSize
	}
	dir := filepath.Join(b.s3.ObjectPath(loadPrefix), tenantID.String(), loadTimelID.String(), "wal")
	for at := from; at+segSize <= a.sk; at += segSize {
		name := proto.SegmentFileName(1, at, segSize)
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			b.t.Fatalf("the safekeepers report backup_lsn %s, but segment %s is not in their archive (%v): the lag measured would not be real", a.sk, name, err)
		}
	}
}
