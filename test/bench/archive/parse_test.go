package archive

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
)

// pgbenchSummary is what pgbench prints at the end of a run.
type pgbenchSummary struct {
	txns int64
	tps  float64
}

var (
	processedRe = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)`)
	failedRe    = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	tpsRe       = regexp.MustCompile(`(?m)^tps = ([0-9]+(?:\.[0-9]+)?) \(without initial connection time\)`)
)

// parsePgbench reads pgbench's summary. A missing figure, or a failed
// transaction, is an error.
func parsePgbench(out string) (pgbenchSummary, error) {
	var s pgbenchSummary
	m := processedRe.FindStringSubmatch(out)
	if m == nil {
		return s, errors.New("no 'number of transactions actually processed' line")
	}
	s.txns, _ = strconv.ParseInt(m[1], 10, 64)
	if m := failedRe.FindStringSubmatch(out); m != nil && m[1] != "0" {
		return s, fmt.Errorf("%s failed transactions", m[1])
	}
	m = tpsRe.FindStringSubmatch(out)
	if m == nil {
		return s, errors.New("no 'tps = N (without initial connection time)' line")
	}
	var err error
	if s.tps, err = strconv.ParseFloat(m[1], 64); err != nil {
		return s, fmt.Errorf("tps %q: %v", m[1], err)
	}
	if s.txns <= 0 || s.tps <= 0 {
		return s, fmt.Errorf("%d transactions at %g tps: pgbench did no work", s.txns, s.tps)
	}
	return s, nil
}

var walFileRe = regexp.MustCompile(`^([0-9A-F]{8})([0-9A-F]{8})([0-9A-F]{8})$`)

// segmentEnd is the LSN where WAL segment file name (as
// pg_stat_archiver.last_archived_wal names it) ends, for segments of
// segSize bytes.
func segmentEnd(name string, segSize uint64) (proto.LSN, error) {
	m := walFileRe.FindStringSubmatch(name)
	if m == nil {
		return 0, fmt.Errorf("%q is not a WAL segment file name", name)
	}
	hi, _ := strconv.ParseUint(m[2], 16, 32)
	lo, _ := strconv.ParseUint(m[3], 16, 32)
	perID := uint64(1<<32) / segSize
	if lo >= perID {
		return 0, fmt.Errorf("%q: segment %d of %d per 4 GiB", name, lo, perID)
	}
	return proto.LSN((hi*perID + lo + 1) * segSize), nil
}

// percentile is the nearest-rank p-quantile (0 < p ≤ 1) of sorted xs; NaN
// if xs is empty.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	k := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}

// median of the numbers in xs that are not NaN; NaN if there are none.
func median(xs []float64) float64 {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	if n := len(v); n%2 == 1 {
		return v[n/2]
	}
	n := len(v)
	return (v[n/2-1] + v[n/2]) / 2
}

func TestSegmentEnd(t *testing.T) {
	for _, c := range []struct {
		name string
		seg  uint64
		want proto.LSN
	}{
		{"000000010000000000000001", 16 << 20, 0x2000000},
		{"0000000100000000000000FF", 16 << 20, 0x100000000},
		{"000000020000000300000004", 16 << 20, 0x305000000},
		{"000000010000000000000FFF", 1 << 20, 0x100000000},
	} {
		got, err := segmentEnd(c.name, c.seg)
		if err != nil || got != c.want {
			t.Errorf("segmentEnd(%s, %d) = %s, %v; want %s", c.name, c.seg, got, err, c.want)
		}
		// The segment's own name comes back from its start.
		if name := proto.SegmentFileName(1, got-1, c.seg); name[8:] != c.name[8:] {
			t.Errorf("%s ends at %s, which is in %s", c.name, got, name)
		}
	}
	for _, bad := range []string{"", "00000001000000000000001", "000000010000000000000100", "00000001000000000000000g", "000000010000000000000001.partial"} {
		if _, err := segmentEnd(bad, 16<<20); err == nil {
			t.Errorf("segmentEnd(%q) took it", bad)
		}
	}
}

func TestParsePgbench(t *testing.T) {
	out := "transaction type: <builtin: TPC-B (sort of)>\nnumber of transactions actually processed: 1234\nnumber of failed transactions: 0 (0.000%)\n" +
		"latency average = 6.5 ms\ntps = 411.337 (without initial connection time)\n"
	s, err := parsePgbench(out)
	if err != nil || s.txns != 1234 || s.tps != 411.337 {
		t.Fatalf("parsePgbench = %+v, %v", s, err)
	}
	for _, bad := range []string{
		"",
		"number of transactions actually processed: 12\n",
		"number of transactions actually processed: 12\nnumber of failed transactions: 3 (1%)\ntps = 4.0 (without initial connection time)\n",
		"number of transactions actually processed: 0\ntps = 0.0 (without initial connection time)\n",
	} {
		if _, err := parsePgbench(bad); err == nil {
			t.Errorf("parsePgbench(%q) took it", bad)
		}
	}
}

func TestMedianPercentile(t *testing.T) {
	if m := median([]float64{3, math.NaN(), 1, 2}); m != 2 {
		t.Errorf("median = %v, want 2", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median = %v, want 2.5", m)
	}
	if !math.IsNaN(median(nil)) || !math.IsNaN(percentile(nil, 0.5)) {
		t.Error("empty input: want NaN")
	}
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{0.5, 5}, {0.99, 10}, {0.1, 1}, {1, 10}} {
		if got := percentile(xs, c.p); got != c.want {
			t.Errorf("percentile(%v) = %v, want %v", c.p, got, c.want)
		}
	}
}

func TestCycleOrder(t *testing.T) {
	for n, want := range map[int][]string{
		1: {cfgNone, cfgSK, cfgPB}, 2: {cfgSK, cfgPB, cfgNone}, 3: {cfgPB, cfgNone, cfgSK}, 4: {cfgNone, cfgSK, cfgPB},
	} {
		if got := cycleOrder(n); !slices.Equal(got, want) {
			t.Errorf("cycleOrder(%d) = %v, want %v", n, got, want)
		}
	}
	if !slices.Equal(loadConfigs, []string{cfgNone, cfgSK, cfgPB}) {
		t.Errorf("cycleOrder changed loadConfigs: %v", loadConfigs)
	}
}

func TestArchivedTimes(t *testing.T) {
	log := `time=2026-12-02T11:18:01.849Z level=DEBUG msg="archived segment" tenant_id=a segment=00000001000000000000000C bytes=1355530
time=2026-12-02T11:18:01.900Z level=INFO msg="other"
time=2026-12-02T11:18:02.228Z level=DEBUG msg="archived segment" tenant_id=a segment=00000001000000000000000D bytes=1273481
`
	got := archivedTimes(log)
	if len(got) != 2 || got[1].Sub(got[0]) != 379*time.Millisecond {
		t.Fatalf("archivedTimes = %v", got)
	}
}
