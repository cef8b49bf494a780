package archive

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// Sides of phase 1.
const (
	sideSK        = "safekeeper"
	sidePB        = "pgbackrest"
	sidePBNoAsync = "pgbackrest, no async"
)

// timing is one timed upload or restore of the segments.
type timing struct {
	what  string // "upload" or "restore"
	side  string
	round int
	dur   time.Duration
	// start is, for the safekeeper's upload, the part of dur until the
	// process listened, and firstStored until it logged the first segment
	// stored.
	start, firstStored time.Duration
	bytes              int64 // WAL bytes moved
}

// rate is MiB of WAL per second.
func (tm timing) rate() float64 { return float64(tm.bytes) / (1 << 20) / tm.dur.Seconds() }

// phaseSegments makes the segments, then uploads and restores them round
// by round with both tools.
func (b *bench) phaseSegments() {
	b.makeSegments()
	for round := 1; round <= b.p.rounds; round++ {
		up := []func(int) timing{b.uploadSK, b.uploadPB}
		down := []func(int) timing{b.fetchSK, b.fetchPB(true), b.fetchPB(false)}
		if round%2 == 0 { // the other order every other round: drift falls on both
			slices.Reverse(up)
			slices.Reverse(down)
		}
		for _, f := range append(up, down...) {
			tm := f(round)
			b.say("%-7s round %d/%d %-21s %d segments in %7.3f s: %7.1f MiB/s%s", tm.what, round, b.p.rounds, tm.side, len(b.segs),
				tm.dur.Seconds(), tm.rate(), startNote(tm))
			if tm.what == "upload" {
				b.uploads = append(b.uploads, tm)
			} else {
				b.fetches = append(b.fetches, tm)
			}
		}
	}
}

func startNote(tm timing) string {
	if tm.start == 0 {
		return ""
	}
	return fmt.Sprintf(" (listening after %.3f s, the first segment stored after %.3f s)", tm.start.Seconds(), tm.firstStored.Seconds())
}

var archivedRe = regexp.MustCompile(`(?m)^time=(\S+) level=DEBUG msg="archived segment" `)

// archivedTimes are the times of a safekeeper log's "archived segment"
// lines, in order.
func archivedTimes(log string) []time.Time {
	var out []time.Time
	for _, m := range archivedRe.FindAllStringSubmatch(log, -1) {
		if at, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
			out = append(out, at)
		}
	}
	return out
}

// makeSegments streams pgbench's WAL to one safekeeper (no archive) until
// BENCH_SEGMENTS whole segments lie behind its timeline's start, stops it
// (its data directory is the template), and copies the same segment files
// from the primary's pg_wal into a data directory's layout for
// archive-push.
func (b *bench) makeSegments() {
	t, n := b.t, b.p.segments
	b.say("phase 1: %d segments of pgbench WAL (synchronous_commit off, -c %d -j %d) through a proposer to one safekeeper without an archive",
		n, b.p.clients, b.p.jobs)
	sk := harness.StartSafekeeper(t, 1)
	harness.CreateTimeline(t, b.pg.TCPConnString(), []string{sk.Addr}, tenantID.String(), uploadTimelID.String())
	prop := b.startProposer(uploadTimelID, "phase1", []*harness.Safekeeper{sk})
	var start proto.LSN
	b.poll(90*time.Second, "the phase 1 proposer to be elected and stream", func() (bool, string) {
		prop.CheckRunning()
		v, err := timelineView(context.Background(), sk, uploadTimelID)
		if err != nil {
			return false, err.Error()
		}
		start = v.TimelineStartLSN
		return start != 0, "timeline_start_lsn 0/0"
	})
	b.first = start.SegmentStart(segSize)
	if b.first < start {
		b.first += segSize
	}
	end := b.first + proto.LSN(n)*segSize

	b.exec("ALTER SYSTEM SET synchronous_commit = off")
	b.exec("SELECT pg_reload_conf()")
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	cmd := b.pg.Cmd(ctx, "pgbench", "-h", b.pg.SocketDir, "-p", strconv.Itoa(b.pg.Port), "-U", "postgres",
		"-n", "-c", strconv.Itoa(b.p.clients), "-j", strconv.Itoa(b.p.jobs), "-T", "3600", "postgres")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("pgbench: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	began := time.Now()
	// The segments are whole once the primary has written past the last
	// one's end; pgbench stops then, so the next segment stays unfinished
	// and the safekeeper has exactly n whole ones to upload.
	for {
		if l := b.lsn("SELECT pg_current_wal_lsn()::text"); l > end {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("pgbench exited before %d segments were written: %v\n%s", n, err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(began) > 50*time.Minute {
			t.Fatalf("pgbench wrote less than %d segments in 50 minutes", n)
		}
	}
	_ = cmd.Process.Signal(os.Interrupt)
	<-exited
	b.exec("ALTER SYSTEM RESET synchronous_commit")
	b.exec("SELECT pg_reload_conf()")
	b.say("pgbench wrote %s..%s in %.1f s", b.first, end, time.Since(began).Seconds())
	b.poll(5*time.Minute, fmt.Sprintf("the safekeeper's commit_lsn to pass %s", end), func() (bool, string) {
		prop.CheckRunning()
		v, err := timelineView(context.Background(), sk, uploadTimelID)
		if err != nil {
			return false, err.Error()
		}
		return v.CommitLSN > end, "commit_lsn " + v.CommitLSN.String()
	})
	b.stopProposer(prop, "phase1")
	if err := sk.Stop(60 * time.Second); err != nil {
		t.Fatalf("safekeeper 1: exit after SIGTERM: %v", err)
	}
	b.exec("SELECT pg_drop_replication_slot('phase1')")
	b.tmplDir = sk.DataDir

	// The same segments as files, laid out as PostgreSQL leaves them for
	// its archiver.
	b.pbData = b.pb.mkdir("pgdata")
	for _, d := range []string{"global", "pg_wal/archive_status"} {
		if err := os.MkdirAll(filepath.Join(b.pbData, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"global/pg_control", "PG_VERSION"} {
		copyFile(t, filepath.Join(b.pg.DataDir, f), filepath.Join(b.pbData, f))
	}
	for i := range n {
		at := b.first + proto.LSN(i)*segSize
		name := proto.SegmentFileName(1, at, segSize)
		data, err := os.ReadFile(filepath.Join(b.pg.WALDir(), name))
		if err != nil {
			t.Fatalf("segment %s from the primary's pg_wal: %v", name, err)
		}
		if len(data) != segSize {
			t.Fatalf("segment %s: %d bytes", name, len(data))
		}
		if err := os.WriteFile(filepath.Join(b.pbData, "pg_wal", name), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(b.pbData, "pg_wal", "archive_status", name+".ready"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		b.segs = append(b.segs, segment{name: name, start: at, sum: sha256.Sum256(data)})
	}
	if err := pgtest.ChownToPostgres(b.pbData); err != nil {
		t.Fatal(err)
	}
	b.say("segments %s to %s: the safekeeper's data directory is the template; the files are copied for archive-push", b.segs[0].name, b.segs[n-1].name)
}

func copyFile(t interface{ Fatal(...any) }, from, to string) {
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func (b *bench) walBytes() int64 { return int64(len(b.segs)) * segSize }

func (b *bench) end() proto.LSN { return b.first + proto.LSN(len(b.segs))*segSize }

// skPrefix is the archive prefix of round's safekeeper upload.
func skPrefix(round int) string { return fmt.Sprintf("sk-upload-%d", round) }

// syncTree fsyncs every file under dir.
func syncTree(dir string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	})
}

// pbRepo is the repository path of round's pgBackRest upload.
func pbRepo(round int) string { return fmt.Sprintf("/pgbackrest-upload-%d", round) }

// uploadSK starts a copy of the template safekeeper with --remote-storage
// and times it until backup_lsn reaches the end of the last segment.
func (b *bench) uploadSK(round int) timing {
	t := b.t
	dir := filepath.Join(t.TempDir(), "data")
	if out, err := exec.Command("cp", "-a", b.tmplDir, dir).CombinedOutput(); err != nil {
		t.Fatalf("copy the template safekeeper: %v\n%s", err, out)
	}
	defer os.RemoveAll(dir)
	// Flushed before the clock, as a data directory is on a restart: the
	// copy's dirty pages would be written back by the safekeeper's first
	// fsync (its open's), inside the clock.
	if err := syncTree(dir); err != nil {
		t.Fatalf("flush the copy: %v", err)
	}
	sk := harness.NewSafekeeper(t, 1, dir, "--remote-storage", b.storeURL(skPrefix(round)))
	end := b.end()
	began := time.Now()
	sk.Start()
	listening := time.Since(began)
	deadline := began.Add(10 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		v, err := timelineView(ctx, sk, uploadTimelID)
		cancel()
		if err == nil && v.BackupLSN >= end {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the safekeeper's backup_lsn did not reach %s in 10 minutes (%v)\n%s", end, err, harness.Tail(sk.Log(), 30))
		}
		time.Sleep(10 * time.Millisecond)
	}
	dur := time.Since(began)
	if err := sk.Stop(60 * time.Second); err != nil {
		t.Fatalf("safekeeper: exit after SIGTERM: %v", err)
	}
	stored := archivedTimes(sk.Log())
	if len(stored) < len(b.segs) {
		t.Fatalf("the safekeeper logged %d \"archived segment\" lines for %d segments", len(stored), len(b.segs))
	}
	// Every segment is an object of its own under T/L/wal/; countStored
	// fails the run if backup_lsn passed one that is not there.
	root := filepath.Join(b.s3.ObjectPath(skPrefix(round)), tenantID.String(), uploadTimelID.String(), "wal")
	b.countStored(sideSK, round, root, func(name string) bool { return len(name) == 24 })
	return timing{what: "upload", side: sideSK, round: round, dur: dur, start: listening, firstStored: stored[0].Sub(began), bytes: b.walBytes()}
}

// uploadPB runs archive-push for each segment in order, as PostgreSQL's
// archiver does, into a fresh repository, and times the calls.
func (b *bench) uploadPB(round int) timing {
	repo := pbRepo(round)
	b.pb.stanzaCreate(repo)
	spool := b.pb.newSpool()
	began := time.Now()
	for _, s := range b.segs {
		out, err := b.pb.run(10*time.Minute, "--repo1-path="+repo, "--spool-path="+spool, "--pg1-path="+b.pbData,
			"archive-push", filepath.Join(b.pbData, "pg_wal", s.name))
		if err != nil {
			b.t.Fatalf("pgbackrest archive-push %s: %v\n%s", s.name, err, out)
		}
	}
	dur := time.Since(began)
	b.pb.waitIdle()
	root := filepath.Join(b.s3.ObjectPath(strings.TrimPrefix(repo, "/")), "archive", stanza)
	b.countStored(sidePB, round, root, func(name string) bool { return strings.HasSuffix(name, ".zst") })
	return timing{what: "upload", side: sidePB, round: round, dur: dur, bytes: b.walBytes()}
}

// countStored checks that every segment has its object under root (the
// versitygw directory of the archive) and, in round 1, records the bytes
// they take.
func (b *bench) countStored(side string, round int, root string, isSegment func(string) bool) {
	want := map[string]bool{}
	for _, s := range b.segs {
		want[s.name] = true
	}
	var total int64
	found := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !isSegment(d.Name()) {
			return err
		}
		if !want[d.Name()[:24]] {
			return nil // the segment after ours, say (none is whole)
		}
		st, err := d.Info()
		if err != nil {
			return err
		}
		found++
		total += st.Size()
		return nil
	})
	if err != nil {
		b.t.Fatalf("%s: the archive's objects in %s: %v", side, root, err)
	}
	if found != len(b.segs) {
		b.t.Fatalf("%s round %d: %d of the %d segments' objects in %s", side, round, found, len(b.segs), root)
	}
	if round == 1 {
		b.stored[side] = total
	}
}

// fetchSK restores round's safekeeper archive segment by segment with
// `safekeeper wal fetch --remote-storage`, as restore_command does.
func (b *bench) fetchSK(round int) timing {
	t := b.t
	dir := t.TempDir()
	url := b.storeURL(skPrefix(round))
	began := time.Now()
	for _, s := range b.segs {
		code, _, stderr := harness.Run(t, "wal", "fetch", "--remote-storage", url, "--tenant-id", tenantID.String(),
			"--timeline-id", uploadTimelID.String(), s.name, filepath.Join(dir, s.name))
		if code != 0 {
			t.Fatalf("safekeeper wal fetch %s: exit %d\n%s", s.name, code, stderr)
		}
	}
	dur := time.Since(began)
	b.checkRestored(sideSK, dir)
	os.RemoveAll(dir)
	return timing{what: "restore", side: sideSK, round: round, dur: dur, bytes: b.walBytes()}
}

// fetchPB restores round's pgBackRest repository segment by segment with
// archive-get, as restore_command does: async (its prefetch, 4
// processes) or not.
func (b *bench) fetchPB(async bool) func(int) timing {
	side := sidePB
	if !async {
		side = sidePBNoAsync
	}
	return func(round int) timing {
		dir := b.pb.mkdir(fmt.Sprintf("restore-%d-%t", round, async))
		opts := []string{"--repo1-path=" + pbRepo(round), "--pg1-path=" + b.pbData, "--archive-async=n"}
		spool := ""
		if async {
			spool = b.pb.newSpool()
			opts = append(opts[:2], "--archive-async=y", "--spool-path="+spool)
		}
		began := time.Now()
		for _, s := range b.segs {
			out, err := b.pb.run(10*time.Minute, append(opts, "archive-get", s.name, filepath.Join(dir, s.name))...)
			if err != nil {
				b.t.Fatalf("pgbackrest archive-get %s: %v\n%s", s.name, err, out)
			}
		}
		dur := time.Since(began)
		b.pb.waitIdle()
		b.checkRestored(side, dir)
		os.RemoveAll(dir)
		if spool != "" {
			os.RemoveAll(spool)
		}
		return timing{what: "restore", side: side, round: round, dur: dur, bytes: b.walBytes()}
	}
}

// checkRestored fails the test unless dir holds every segment, byte for
// byte.
func (b *bench) checkRestored(side, dir string) {
	for _, s := range b.segs {
		data, err := os.ReadFile(filepath.Join(dir, s.name))
		if err != nil {
			b.t.Fatalf("%s restore: %v", side, err)
		}
		if sha256.Sum256(data) != s.sum {
			b.t.Fatalf("%s restore: %s (%d bytes) differs from the primary's", side, s.name, len(data))
		}
	}
}
