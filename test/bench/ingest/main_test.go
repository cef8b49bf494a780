package ingest

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
)

var (
	benchIngest = flag.Bool("bench.ingest", false, "run TestBenchIngest (make bench-ingest); without it the test is skipped")
	benchScale  = flag.Bool("bench.scale", false, "run TestBenchScale (make bench-scale); without it the test is skipped")
	benchWindow = flag.Int("bench.window", 256, "SafeKeeperRequests in flight per push connection (walproposer's MaxInFlight default is 256)")
	benchTracer = flag.String("bench.tracer", "auto", "syscall counter of the traced passes: perf, strace, none or auto (perf if it works, else strace)")
)

func TestMain(m *testing.M) { harness.Main(m) }

// tenantID is the tenant of every benchmark timeline.
var tenantID = proto.ID{0xbe, 0x9c, 0x00, 0x09}

// timelineInfo is the greeting of benchmark timeline n.
func timelineInfo(n int) proto.ServerInfo {
	tl := proto.ID{0x71, 0x9e}
	binary.BigEndian.PutUint32(tl[12:], uint32(n))
	return proto.ServerInfo{
		ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: SystemID,
		TenantID: tenantID, TimelineID: tl, PgTimeline: 1, WalSegSize: SegSize,
		ProposerUUID: proto.ID{0xb0, 0x55}, WalEnd: TLStart,
	}
}

func timelineKey(n int) proto.TimelineKey {
	i := timelineInfo(n)
	return proto.TimelineKey{TenantID: i.TenantID, TimelineID: i.TimelineID}
}

// node is one fresh safekeeper process for one pass: default options (fsync
// on) but for --max-connections, which the 1,000-timeline passes would
// reach with their readers; its data directory under the test's temporary
// directory.
type node struct {
	t  *testing.T
	sk *harness.Safekeeper
}

func startNode(t *testing.T) *node {
	t.Helper()
	return &node{t: t, sk: harness.StartSafekeeper(t, 1, "--max-connections", "20000")}
}

// startNodeEnv starts a node with key=value in its environment only.
func startNodeEnv(t *testing.T, key, value string) *node {
	t.Helper()
	old, had := os.LookupEnv(key)
	os.Setenv(key, value) // the process inherits the environment at its start
	defer func() {
		if had {
			os.Setenv(key, old)
		} else {
			os.Unsetenv(key)
		}
	}()
	return startNode(t)
}

func (n *node) pid() int { return n.sk.PID() }

// drop kills the process and removes its data directory at once (a pass
// writes up to gigabytes; t.TempDir would keep them to the end).
func (n *node) drop() {
	n.sk.Kill()
	os.RemoveAll(n.sk.DataDir)
}

// dataBytes is the size of the files in the data directory.
func (n *node) dataBytes() int64 {
	var sum int64
	filepath.Walk(n.sk.DataDir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			sum += fi.Size()
		}
		return nil
	})
	return sum
}

func (n *node) logBytes() int64 {
	fi, err := os.Stat(n.sk.LogPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// counters is what a pass reads of the process before and after.
type counters struct {
	io  ProcIO
	cpu time.Duration
	log int64
}

func (n *node) counters() counters {
	n.t.Helper()
	io, err := ReadProcIO(n.pid())
	if err != nil {
		n.t.Fatal(err)
	}
	cpu, err := harness.CPUTime(n.pid())
	if err != nil {
		n.t.Fatal(err)
	}
	return counters{io: io, cpu: cpu, log: n.logBytes()}
}

// campaign dials timeline tl on n and runs greet, vote and ProposerElected.
func (n *node) campaign(ctx context.Context, tl int) (*Client, proto.LSN, error) {
	c, err := Dial(ctx, n.sk.Addr, timelineInfo(tl))
	if err != nil {
		return nil, 0, err
	}
	start, err := c.Campaign(ctx, 1, TLStart)
	if err != nil {
		c.Close()
		return nil, 0, err
	}
	return c, start, nil
}

// walCache generates each size of WAL once per test process.
var walCache struct {
	sync.Mutex
	w *WAL
}

// walOf returns generated WAL of at least size bytes.
func walOf(t *testing.T, size int64) *WAL {
	walCache.Lock()
	defer walCache.Unlock()
	if walCache.w == nil || int64(len(walCache.w.Data)) < size {
		t0 := time.Now()
		walCache.w = GenerateWAL(size)
		t.Logf("generated %s of WAL in %v", HumanSize(int64(len(walCache.w.Data))), time.Since(t0).Round(time.Millisecond))
	}
	return walCache.w
}

// commandLine is how this test binary was run, for the report.
func commandLine(target string, envs []string) string {
	var set []string
	for _, e := range envs {
		if v, ok := os.LookupEnv(e); ok {
			set = append(set, e+"="+v)
		}
	}
	var flags []string
	flag.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "bench.") {
			flags = append(flags, "-"+f.Name+"="+f.Value.String())
		}
	})
	s := "make " + target
	if len(set) > 0 {
		s = strings.Join(set, " ") + " " + s
	}
	return fmt.Sprintf("`%s` (runs `go test ./test/bench/ingest -run '^Test%s$' -count=1 -timeout 0 -v -args %s`)",
		s, map[string]string{"bench-ingest": "BenchIngest", "bench-scale": "BenchScale"}[target], strings.Join(flags, " "))
}

// emit prints a report to stdout and writes it into docs/performance.md.
func emit(t *testing.T, section, report string) {
	fmt.Println()
	fmt.Println(report)
	if os.Getenv("BENCH_WRITE_DOC") == "0" {
		t.Logf("BENCH_WRITE_DOC=0: %s not written", section)
		return
	}
	path, err := harness.WriteDocSection("docs/performance.md", section, report)
	if err != nil {
		t.Errorf("writing the report into docs/performance.md: %v", err)
		return
	}
	t.Logf("report written into %s (section %s)", path, section)
}
