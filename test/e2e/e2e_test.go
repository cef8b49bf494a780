package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// WAL written by the pgbench run before safekeeper 3 is killed, and while it
// is down. pgbench -c 8 writes about 150 kB/s of WAL here (commits wait for
// two fsyncs on the primary and one on the safekeepers).
const (
	killAfter = 200 << 10
	downFor   = 500 << 10
)

var (
	tenantID   = proto.ID{0x7e, 0x57, 1}
	timelineID = proto.ID{0x7e, 0x57, 2}
)

// cluster is the pipeline under test.
type cluster struct {
	t     *testing.T
	pg    *pgtest.Cluster
	sks   []*harness.Safekeeper
	prop  *harness.Process
	si    proto.ServerInfo // what a greeting needs to name the timeline
	start time.Time
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{t: t, start: time.Now()}
	hc := harness.StartCluster(t, harness.ClusterOptions{Tenant: tenantID.String(), Timeline: timelineID.String(),
		ProposerArgs: []string{"--buffer-size", "1MiB"}})
	c.pg, c.sks, c.prop = hc.PG, hc.Safekeepers, hc.Proposer
	sysid, err := strconv.ParseUint(c.pg.Exec(t, "SELECT system_identifier FROM pg_control_system()"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	ver, _ := strconv.ParseUint(c.pg.Exec(t, "SHOW server_version_num"), 10, 32)
	c.si = proto.ServerInfo{
		ProtocolVersion: proto.ProtocolVersion, PgVersion: uint32(ver), SystemID: sysid, TenantID: tenantID, TimelineID: timelineID,
		PgTimeline: 1, WalSegSize: uint32(c.pg.WALSegSize), ProposerUUID: proto.ID{0xee},
	}
	return c
}

func (c *cluster) waitFor(d time.Duration, what string, cond func() bool) {
	c.t.Helper()
	harness.WaitFor(c.t, d, what, cond)
}

// info reads a safekeeper's state through a greeting (ServerInfo, then
// SafeKeeperInfo, then close): it changes nothing on the safekeeper.
func (c *cluster) info(sk *harness.Safekeeper) (*proto.SafeKeeperInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := proposer.Dial(ctx, proposer.DialConfig{Addr: sk.Addr, TenantID: tenantID, TimelineID: timelineID, ApplicationName: "e2e-probe"})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.Send(&c.si); err != nil {
		return nil, err
	}
	m, err := conn.Recv(ctx)
	if err != nil {
		return nil, err
	}
	info, ok := m.(*proto.SafeKeeperInfo)
	if !ok {
		return nil, fmt.Errorf("greeting answered with %T", m)
	}
	return info, nil
}

func (c *cluster) lsn(sql string) proto.LSN {
	c.t.Helper()
	l, err := proto.ParseLSN(c.pg.Exec(c.t, sql))
	if err != nil {
		c.t.Fatal(err)
	}
	return l
}

// pgbench runs pgbench against the primary (as the postgres user when we
// are root, like pgtest) and returns its output.
func (c *cluster) pgbench(ctx context.Context, args ...string) (string, error) {
	bin := c.pg.PgBin("pgbench")
	args = append([]string{"-h", c.pg.SocketDir, "-p", strconv.Itoa(c.pg.Port), "-U", "postgres"}, args...)
	args = append(args, "postgres")
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", bin}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, bin, args...)
	}
	cmd.Dir = "/"
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

var (
	tpsRe    = regexp.MustCompile(`tps = ([0-9.]+)`)
	failedRe = regexp.MustCompile(`number of failed transactions: (\d+)`)
	doneRe   = regexp.MustCompile(`number of transactions actually processed: (\d+)`)
)

// TestEndToEnd is the whole pipeline: pgbench through the proposer
// into three safekeepers with one of them killed -9 mid-run, then the
// durability check (every safekeeper killed -9 at once), then byte-identical
// WAL on every safekeeper.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test: skipped in -short mode")
	}
	c := startCluster(t)
	walStart := c.lsn("SELECT pg_current_wal_flush_lsn()")

	ctx := harness.Context(t, 150*time.Second)
	if out, err := c.pgbench(ctx, "-i", "-s", "5", "-q"); err != nil {
		t.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	c.prop.CheckRunning()
	t.Logf("pgbench -i done at %v", time.Since(c.start).Round(time.Millisecond))

	// 10 s of pgbench -c 8; safekeeper 3 is killed -9 once the run has
	// written killAfter bytes of WAL and restarted after downFor more. The
	// proposer runs with a 1 MiB buffer, so the restarted safekeeper must
	// catch up through a second replication stream from the primary.
	type result struct {
		out string
		err error
	}
	benchDone := make(chan result, 1)
	runStart := c.lsn("SELECT pg_current_wal_flush_lsn()")
	go func() {
		out, err := c.pgbench(ctx, "-c", "8", "-j", "2", "-T", "10", "-n")
		benchDone <- result{out, err}
	}()
	victim := c.sks[2]
	c.waitFor(30*time.Second, "WAL from the pgbench run", func() bool {
		return c.lsn("SELECT pg_current_wal_flush_lsn()") >= runStart+killAfter
	})
	victim.Kill()
	killedAt := c.lsn("SELECT pg_current_wal_flush_lsn()")
	var r *result
	c.waitFor(30*time.Second, "WAL committed with safekeeper 3 down", func() bool {
		select {
		case res := <-benchDone:
			r = &res
			return true
		default:
		}
		return c.lsn("SELECT pg_current_wal_flush_lsn()") >= killedAt+downFor
	})
	downWAL := c.lsn("SELECT pg_current_wal_flush_lsn()") - killedAt
	if downWAL < 64<<10 {
		t.Fatalf("only %d bytes of WAL committed while safekeeper 3 was down", downWAL)
	}
	victim.Start()
	if r == nil {
		res := <-benchDone
		r = &res
	}
	if r.err != nil {
		t.Fatalf("pgbench: %v\n%s", r.err, r.out)
	}
	tps := 0.0
	if m := tpsRe.FindStringSubmatch(r.out); m != nil {
		tps, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := failedRe.FindStringSubmatch(r.out); m == nil || m[1] != "0" || tps <= 0 {
		t.Fatalf("pgbench with one safekeeper killed: want no failed transactions and tps > 0:\n%s", r.out)
	}
	done := doneRe.FindStringSubmatch(r.out)
	runEnd := c.lsn("SELECT pg_current_wal_flush_lsn()")
	t.Logf("pgbench -c 8 -T 10: tps %.0f, %s transactions, %.1f MB of WAL; safekeeper 3 down from %s for %.1f MB",
		tps, done[1], float64(runEnd-runStart)/1e6, killedAt, float64(downWAL)/1e6)
	c.prop.CheckRunning()

	// Durability: the flush LSN after the last acknowledged commit is on at
	// least 2 of 3 safekeepers even if all are killed -9 at once.
	c.pg.Exec(t, "CREATE TABLE IF NOT EXISTS e2e_marker(x int)")
	c.pg.Exec(t, "INSERT INTO e2e_marker VALUES (1)") // returns only once quorum-durable
	acked := c.lsn("SELECT pg_current_wal_flush_lsn()")
	for _, sk := range c.sks {
		sk.Kill()
	}
	for _, sk := range c.sks {
		sk.Start()
	}
	have := 0
	for _, sk := range c.sks {
		info, err := c.info(sk)
		if err != nil {
			t.Fatalf("safekeeper %d after restart: %v", sk.ID, err)
		}
		if info.FlushLSN >= acked {
			have++
		}
		t.Logf("after kill -9 of all: safekeeper %d flush_lsn %s commit_lsn %s (acked %s)", sk.ID, info.FlushLSN, info.CommitLSN, acked)
	}
	if have < 2 {
		t.Fatalf("only %d of 3 safekeepers have the acknowledged WAL up to %s after kill -9", have, acked)
	}
	c.waitFor(60*time.Second, "commit_lsn reaching the acknowledged LSN on every safekeeper after the restart", func() bool {
		c.prop.CheckRunning()
		return c.allCommitted(acked)
	})

	// Final: switch segments so the last one is complete, then everything
	// up to the primary's flush must be committed everywhere.
	c.pg.Exec(t, "SELECT pg_switch_wal()")
	final := c.lsn("SELECT pg_current_wal_flush_lsn()")
	c.waitFor(60*time.Second, fmt.Sprintf("every safekeeper's commit_lsn ≥ the primary's final flush %s", final), func() bool {
		c.prop.CheckRunning()
		return c.allCommitted(final)
	})
	t.Logf("WAL %s..%s (%.1f MB) committed on all three at %v", walStart, final, float64(final-walStart)/1e6, time.Since(c.start).Round(time.Millisecond))

	// The primary's slot follows truncate_lsn, the lowest flush_lsn of all
	// safekeepers: it has left the start of WAL behind, and never passes
	// what the slowest safekeeper holds.
	c.waitFor(30*time.Second, "the slot's restart_lsn to advance to the safekeepers' common flush_lsn", func() bool {
		restart := c.lsn("SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 'proposer'")
		// Not capped at final: the primary goes on writing (running_xacts,
		// checkpoints), so WAL past final is flushed everywhere and the slot
		// may follow it.
		lowest := proto.LSN(math.MaxUint64)
		for _, sk := range c.sks {
			info, err := c.info(sk)
			if err != nil {
				return false
			}
			lowest = min(lowest, info.FlushLSN)
		}
		if restart > lowest {
			t.Fatalf("slot restart_lsn %s is past the lowest safekeeper flush_lsn %s", restart, lowest)
		}
		return restart >= lowest.SegmentStart(16<<20) && restart > walStart
	})

	// Byte-identical WAL: export every safekeeper offline and compare every
	// complete segment with the primary's pg_wal.
	if err := c.prop.Stop(20 * time.Second); err != nil {
		t.Errorf("proposer exit: %v", err)
	}
	c.checkSync(final)
	c.checkExportRefusedWhileRunning()

	segSize := c.pg.WALSegSize
	for _, sk := range c.sks {
		if err := sk.Stop(20 * time.Second); err != nil {
			t.Fatalf("stop safekeeper %d: %v", sk.ID, err)
		}
		out := t.TempDir()
		cmd := exec.CommandContext(harness.Context(t, 2*time.Minute), harness.Binary(t), "wal", "export", "--data-dir", sk.DataDir,
			"--tenant-id", tenantID.String(), "--timeline-id", timelineID.String(), "--output", out)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("wal export of safekeeper %d: %v\n%s", sk.ID, err, b)
		}
		compared, missing := 0, 0
		for seg := walStart.SegmentStart(segSize); seg+proto.LSN(segSize) <= final; seg += proto.LSN(segSize) {
			name := proto.SegmentFileName(1, seg, segSize)
			mine, err := os.ReadFile(filepath.Join(out, name))
			if err != nil {
				t.Errorf("safekeeper %d: segment %s not exported: %v", sk.ID, name, err)
				continue
			}
			theirs, err := os.ReadFile(filepath.Join(c.pg.WALDir(), name))
			if os.IsNotExist(err) {
				missing++ // recycled by a checkpoint on the primary
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(mine, theirs) {
				t.Errorf("safekeeper %d: segment %s differs from the primary's (first difference at byte %d)", sk.ID, name, firstDiff(mine, theirs))
			}
			compared++
		}
		if compared == 0 || compared < missing {
			t.Errorf("safekeeper %d: compared %d segments, %d missing on the primary", sk.ID, compared, missing)
		}
		t.Logf("safekeeper %d: %d complete segments byte-identical to the primary's pg_wal (%d recycled there)", sk.ID, compared, missing)
	}
}

func (c *cluster) allCommitted(l proto.LSN) bool {
	for _, sk := range c.sks {
		info, err := c.info(sk)
		if err != nil || info.CommitLSN < l {
			return false
		}
	}
	return true
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// checkSync runs `safekeeper sync` with the proposer stopped: a new term on
// the safekeepers that all hold the donor's WAL; it must print an LSN at or
// past the primary's final flush and leave it committed on a quorum.
func (c *cluster) checkSync(final proto.LSN) {
	t := c.t
	var addrs []string
	for _, sk := range c.sks {
		addrs = append(addrs, sk.Addr)
	}
	cmd := exec.CommandContext(harness.Context(t, 2*time.Minute), harness.Binary(t), "sync", "--safekeepers", strings.Join(addrs, ","),
		"--tenant-id", tenantID.String(), "--timeline-id", timelineID.String(),
		"--system-id", strconv.FormatUint(c.si.SystemID, 10), "--pg-version", strconv.Itoa(int(c.si.PgVersion)),
		"--wal-seg-size", strconv.Itoa(int(c.si.WalSegSize)), "--timeout", "30s")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("safekeeper sync: %v\n%s", err, stderr.String())
	}
	lsn, err := proto.ParseLSN(strings.TrimSpace(stdout.String()))
	if err != nil || lsn < final {
		t.Fatalf("safekeeper sync printed %q (%v), want an LSN ≥ %s", stdout.String(), err, final)
	}
	n := 0
	for _, sk := range c.sks {
		if info, err := c.info(sk); err == nil && info.CommitLSN >= lsn {
			n++
		}
	}
	if n < 2 {
		t.Fatalf("after sync to %s only %d safekeepers have it committed", lsn, n)
	}
	t.Logf("safekeeper sync: %s committed on %d of 3", lsn, n)
}

// checkExportRefusedWhileRunning: `wal export` must refuse a data directory
// a running safekeeper holds, clearly and with a non-zero exit.
func (c *cluster) checkExportRefusedWhileRunning() {
	t := c.t
	sk := c.sks[0]
	out, err := exec.CommandContext(harness.Context(t, 2*time.Minute), harness.Binary(t), "wal", "export", "--data-dir", sk.DataDir,
		"--tenant-id", tenantID.String(), "--timeline-id", timelineID.String(), "--output", t.TempDir()).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 || !strings.Contains(string(out), "in use") {
		t.Fatalf("wal export while safekeeper %d runs: %v\n%s", sk.ID, err, out)
	}
}

func TestMain(m *testing.M) { harness.Main(m) }
