package chaos

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

var (
	chaosDuration = flag.Duration("chaos.duration", 0, "run TestChaos's crash loop this long (0: TestChaos is skipped)")
	chaosSeed     = flag.Uint64("chaos.seed", 0, "seed of the fault schedule (0: from the clock; the seed is logged)")
)

var (
	tenantID   = proto.ID{0xc4, 0xa0, 1}
	timelineID = proto.ID{0xc4, 0xa0, 2}
)

// segMB is the primary's WAL segment size: small, so that complete
// segments (what is compared byte for byte) come quickly.
const segMB = 1

// newRand returns the test's PRNG and logs its seed.
func newRand(t *testing.T) *rand.Rand {
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay the fault schedule with -chaos.seed=%d)", seed, seed)
	return rand.New(rand.NewPCG(seed, seed^0x5afe))
}

// options shapes a cluster.
type options struct {
	// proxies puts a harness.Proxy between the proposer and every
	// safekeeper (the proposer's --safekeepers lists the proxies).
	proxies bool
	// conf is appended to the primary's postgresql.conf.
	conf []string
	// noProposer leaves the proposer to the test.
	noProposer bool
	// sk3 adjusts safekeeper 3 before the proposer starts (e.g. moves its
	// data directory); it must leave it running.
	sk3 func(sk *harness.Safekeeper)
	// skArgs are extra flags of every `safekeeper run`.
	skArgs []string
}

// cluster is the pipeline under test.
type cluster struct {
	t *testing.T
	// pg is the current primary; after a promotion (promote) the promoted
	// standby.
	pg      *pgtest.Cluster
	sks     []*harness.Safekeeper
	proxies []*harness.Proxy // nil without options.proxies
	prop    *harness.Process
	started time.Time
	// standby is the hot standby fed by safekeeper 1, bank the workload,
	// promoted whether the primary was lost and the standby promoted
	// (crashLoop's promote).
	standby  *pgtest.Cluster
	bank     *bank
	promoted bool
	// created: the timelines created on the safekeepers (startProposerOn).
	created map[proto.ID]bool
}

func startCluster(t *testing.T, o options) *cluster {
	t.Helper()
	c := &cluster{t: t, started: time.Now()}
	hc := harness.StartCluster(t, harness.ClusterOptions{NoProposer: true, SafekeeperArgs: o.skArgs,
		PG: pgtest.Options{WALSegSizeMB: segMB, Conf: append([]string{
			// The primary keeps its WAL, so a safekeeper that was down or
			// cut off catches up from it (docs/proposer.md, known limits).
			"wal_keep_size = '1GB'",
			"max_wal_size = '1GB'",
			"checkpoint_timeout = '1h'",
		}, o.conf...)}})
	c.pg, c.sks = hc.PG, hc.Safekeepers
	if o.sk3 != nil {
		o.sk3(c.sks[2])
	}
	if o.proxies {
		for _, sk := range c.sks {
			c.proxies = append(c.proxies, harness.StartProxy(t, sk.Addr))
		}
	}
	if !o.noProposer {
		c.prop = c.startProposer("proposer", "proposer")
		c.waitSyncStandby("proposer")
	}
	return c
}

// proposerAddrs is what the proposer's --safekeepers lists.
func (c *cluster) proposerAddrs() string {
	var addrs []string
	for i, sk := range c.sks {
		if c.proxies != nil {
			addrs = append(addrs, c.proxies[i].Addr)
		} else {
			addrs = append(addrs, sk.Addr)
		}
	}
	return strings.Join(addrs, ",")
}

func (c *cluster) startProposer(name, slot string, extra ...string) *harness.Process {
	c.t.Helper()
	return c.startProposerOn(timelineID, name, slot, extra...)
}

// startProposerOn starts a proposer for timeline (of tenantID), with extra
// flags of `propose`.
// The first start on a timeline creates it first (safekeeper timeline
// create), as an operator does; the proposers never get --create.
func (c *cluster) startProposerOn(timeline proto.ID, name, slot string, extra ...string) *harness.Process {
	c.t.Helper()
	upstream := c.pg.ConnString()
	if !c.created[timeline] {
		harness.CreateTimeline(c.t, upstream, strings.Split(c.proposerAddrs(), ","), tenantID.String(), timeline.String())
		if c.created == nil {
			c.created = map[proto.ID]bool{}
		}
		c.created[timeline] = true
	}
	return harness.StartProposer(c.t, harness.ProposerOptions{Name: name, Upstream: upstream, Safekeepers: strings.Split(c.proposerAddrs(), ","),
		Tenant: tenantID.String(), Timeline: timeline.String(), Slot: slot, ApplicationName: name, Debug: true,
		Args: append([]string{"--buffer-size", "1MiB"}, extra...)})
}

// waitSyncStandby waits until the proposer named app streams as the
// primary's synchronous standby (sync_state quorum with ANY n (...)).
func (c *cluster) waitSyncStandby(app string) {
	c.t.Helper()
	harness.WaitSyncStandby(c.t, c.pg, c.prop, app, 90*time.Second)
}

func (c *cluster) checkProposerAlive() {
	if c.prop != nil {
		c.prop.CheckRunning()
	}
}

// lsn runs sql on the primary and parses its one LSN.
func (c *cluster) lsn(sql string) proto.LSN {
	c.t.Helper()
	l, err := proto.ParseLSN(c.pg.Exec(c.t, sql))
	if err != nil {
		c.t.Fatal(err)
	}
	return l
}

func (c *cluster) flushLSN() proto.LSN { return c.lsn("SELECT pg_current_wal_flush_lsn()") }

// status is a safekeeper's TIMELINE_STATUS row.
type status struct {
	Term, LastLogTerm                               uint64
	FlushLSN, CommitLSN, TruncateLSN, TimelineStart proto.LSN
}

// timelineStatus reads TIMELINE_STATUS over a replication connection.
func timelineStatus(addr string) (status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	host, port, _ := strings.Cut(addr, ":")
	conn, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=postgres sslmode=disable replication=true connect_timeout=5 options='-c tenant_id=%s -c timeline_id=%s'",
		host, port, tenantID, timelineID))
	if err != nil {
		return status{}, err
	}
	defer conn.Close(context.Background())
	res, err := conn.Exec(ctx, "TIMELINE_STATUS").ReadAll()
	if err != nil {
		return status{}, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return status{}, fmt.Errorf("TIMELINE_STATUS: %d results", len(res))
	}
	var st status
	for i, fd := range res[0].FieldDescriptions {
		v := string(res[0].Rows[0][i])
		switch fd.Name {
		case "term":
			st.Term, err = strconv.ParseUint(v, 10, 64)
		case "last_log_term":
			st.LastLogTerm, err = strconv.ParseUint(v, 10, 64)
		case "flush_lsn":
			st.FlushLSN, err = proto.ParseLSN(v)
		case "commit_lsn":
			st.CommitLSN, err = proto.ParseLSN(v)
		case "truncate_lsn":
			st.TruncateLSN, err = proto.ParseLSN(v)
		case "timeline_start_lsn":
			st.TimelineStart, err = proto.ParseLSN(v)
		}
		if err != nil {
			return status{}, fmt.Errorf("TIMELINE_STATUS %s = %q: %v", fd.Name, v, err)
		}
	}
	return st, nil
}

// statuses reads every safekeeper's status; a safekeeper that does not
// answer gets ok = false.
func (c *cluster) statuses() ([]status, []bool) {
	sts, oks := make([]status, len(c.sks)), make([]bool, len(c.sks))
	for i, sk := range c.sks {
		st, err := timelineStatus(sk.Addr)
		sts[i], oks[i] = st, err == nil
	}
	return sts, oks
}

// waitCommitted waits until every safekeeper's commit_lsn is ≥ l.
func (c *cluster) waitCommitted(l proto.LSN, d time.Duration) {
	c.t.Helper()
	harness.WaitFor(c.t, d, fmt.Sprintf("commit_lsn ≥ %s on every safekeeper", l), func() bool {
		c.checkProposerAlive()
		sts, oks := c.statuses()
		for i := range sts {
			if !oks[i] || sts[i].CommitLSN < l {
				return false
			}
		}
		return true
	})
}

// quorumTerm returns the term a quorum (2 of 3) has voted for at least.
func (c *cluster) quorumTerm() uint64 {
	sts, oks := c.statuses()
	var terms []uint64
	for i := range sts {
		if oks[i] {
			terms = append(terms, sts[i].Term)
		}
	}
	if len(terms) < 2 {
		return 0
	}
	// the 2nd highest
	hi, second := uint64(0), uint64(0)
	for _, x := range terms {
		if x > hi {
			hi, second = x, hi
		} else if x > second {
			second = x
		}
	}
	return second
}

// finish ends a run: a last commit, a segment switch so that the last
// segment holding the run's WAL is complete, and every safekeeper's
// commit_lsn at the primary's flush position. It returns that position.
func (c *cluster) finish() proto.LSN {
	c.t.Helper()
	c.pg.Exec(c.t, "CREATE TABLE IF NOT EXISTS chaos_end(x int); INSERT INTO chaos_end VALUES (1)")
	c.pg.Exec(c.t, "SELECT pg_switch_wal()")
	c.pg.Exec(c.t, "INSERT INTO chaos_end VALUES (2)") // waits for the quorum
	final := c.flushLSN()
	c.waitCommitted(final, 90*time.Second)
	return final
}

// checkSegments stops the proposer and the safekeepers (SIGTERM), exports
// each safekeeper's WAL and compares every complete segment from the
// timeline's start up to final with the primary's pg_wal. The primary keeps
// 1 GB of WAL (wal_keep_size); only in a long run may its oldest segments be
// recycled, and those are skipped.
func (c *cluster) checkSegments(final proto.LSN) {
	t := c.t
	t.Helper()
	sts, oks := c.statuses()
	if !oks[0] {
		t.Fatal("safekeeper 1 does not answer TIMELINE_STATUS")
	}
	start := sts[0].TimelineStart
	if c.prop != nil {
		if err := c.prop.Stop(30 * time.Second); err != nil {
			t.Errorf("proposer exit: %v", err)
		}
	}
	seg := proto.LSN(c.pg.WALSegSize)
	for _, sk := range c.sks {
		if err := sk.Stop(30 * time.Second); err != nil {
			t.Fatalf("stop safekeeper %d: %v", sk.ID, err)
		}
		out := c.export(sk)
		compared, recycled := 0, 0
		for s := start.SegmentStart(uint64(seg)); s+seg <= final; s += seg {
			name := exportedName(out, s, uint64(seg)) // named by its PostgreSQL timeline
			mine, err := os.ReadFile(filepath.Join(out, name))
			if err != nil {
				t.Errorf("safekeeper %d: segment %s not exported: %v", sk.ID, name, err)
				continue
			}
			theirs, err := os.ReadFile(filepath.Join(c.pg.WALDir(), name))
			if os.IsNotExist(err) && compared == 0 {
				recycled++ // a long run passed max_wal_size: the oldest are gone
				continue
			}
			if err != nil {
				t.Errorf("primary's segment %s: %v", name, err)
				continue
			}
			if !bytes.Equal(mine, theirs) {
				at := s + proto.LSN(firstDiff(mine, theirs))
				t.Errorf("safekeeper %d: segment %s differs from the primary's at %s\n%s", sk.ID, name, at, c.waldump(at))
			}
			compared++
		}
		if compared < 2 {
			t.Errorf("safekeeper %d: only %d complete segments compared (%s..%s)", sk.ID, compared, start, final)
		}
		t.Logf("safekeeper %d: %d complete segments %s..%s byte-identical to the primary's pg_wal (%d older ones recycled there)", sk.ID, compared, start, final, recycled)
	}
}

// exportedName is the name wal export gave the segment at s in dir: the
// segment's name on the newest PostgreSQL timeline that has one there
// (timeline 1's if none).
func exportedName(dir string, s proto.LSN, segSize uint64) string {
	for tli := uint32(9); tli > 1; tli-- {
		name := proto.SegmentFileName(tli, s, segSize)
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return name
		}
	}
	return proto.SegmentFileName(1, s, segSize)
}

// export runs `safekeeper wal export` on a stopped safekeeper.
func (c *cluster) export(sk *harness.Safekeeper) string {
	c.t.Helper()
	out := c.t.TempDir()
	cmd := exec.Command(harness.Binary(c.t), "wal", "export", "--data-dir", sk.DataDir,
		"--tenant-id", tenantID.String(), "--timeline-id", timelineID.String(), "--output", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("wal export of safekeeper %d: %v\n%s", sk.ID, err, b)
	}
	return out
}

// waldump shows the primary's records around at (for failure reports).
func (c *cluster) waldump(at proto.LSN) string {
	from := at - min(at, 256<<10)
	out, _ := c.pg.Cmd(context.Background(), "pg_waldump", "-p", c.pg.WALDir(), "-s", from.String(), "-e", (at + 64<<10).String()).CombinedOutput()
	return harness.Tail(string(out), 20)
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// replayTimeout bounds a standby's wait to replay what the primary wrote.
const replayTimeout = 120 * time.Second

// startStandby starts a hot standby, a base backup of the primary, that
// streams from sk as application_name standby1.
func (c *cluster) startStandby(sk *harness.Safekeeper) *pgtest.Cluster {
	c.t.Helper()
	return harness.StartStandby(c.t, c.pg, sk, harness.StandbyOptions{Tenant: tenantID.String(), Timeline: timelineID.String(),
		Conf: []string{"wal_retrieve_retry_interval = 1s"}})
}

func TestMain(m *testing.M) { harness.Main(m) }

// fleetArgs are the flags that register a safekeeper in etcd (a fleet:
// docs/operations.md), every one in one zone.
func fleetArgs(etcd []string) []string {
	return []string{"--etcd-endpoints", strings.Join(etcd, ","), "--zone", "z1"}
}

// adoptInto records the cluster's timeline in etcd on its three
// safekeepers (timeline create --members), so that commands can find them
// with --etcd-endpoints alone.
func (c *cluster) adoptInto(etcd []string) {
	c.t.Helper()
	code, out, stderr := harness.Run(c.t, "timeline", "create", "--etcd-endpoints", strings.Join(etcd, ","), "--members", "1,2,3",
		"--upstream", c.pg.ConnString(), "--tenant-id", tenantID.String(), "--timeline-id", timelineID.String())
	if code != 0 {
		c.t.Fatalf("timeline create --members 1,2,3: exit %d\n%s%s", code, out, stderr)
	}
}
