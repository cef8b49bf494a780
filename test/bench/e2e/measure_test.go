package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// pgbenchSummary is what pgbench prints at the end of a run.
type pgbenchSummary struct {
	txns   int64   // number of transactions actually processed
	failed int64   // number of failed transactions
	tps    float64 // without initial connection time
}

var (
	processedRe = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)`)
	failedRe    = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	tpsRe       = regexp.MustCompile(`(?m)^tps = ([0-9]+(?:\.[0-9]+)?) \(without initial connection time\)`)
)

// parsePgbench reads pgbench's summary. A missing figure is an error.
func parsePgbench(out string) (pgbenchSummary, error) {
	var s pgbenchSummary
	m := processedRe.FindStringSubmatch(out)
	if m == nil {
		return s, errors.New("no 'number of transactions actually processed' line")
	}
	s.txns, _ = strconv.ParseInt(m[1], 10, 64)
	if m := failedRe.FindStringSubmatch(out); m != nil {
		s.failed, _ = strconv.ParseInt(m[1], 10, 64)
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

// readLatencies reads the latencies (µs, the third column) of pgbench's
// per-transaction logs (-l: "client_id transaction_no time script_no
// time_epoch time_us"). Lines whose time is not a number ("failed",
// "skipped") are counted in other, malformed lines are an error.
func readLatencies(files []string) (lat []float64, other int, err error) {
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, 0, err
		}
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			fields := strings.Fields(sc.Text())
			if len(fields) == 0 {
				continue
			}
			if len(fields) < 6 {
				f.Close()
				return nil, 0, fmt.Errorf("%s:%d: %d columns, want at least 6: %q", filepath.Base(name), n, len(fields), sc.Text())
			}
			us, err := strconv.ParseFloat(fields[2], 64)
			if err != nil {
				other++
				continue
			}
			lat = append(lat, us)
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %v", name, err)
		}
	}
	return lat, other, nil
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
	} else {
		return (v[n/2-1] + v[n/2]) / 2
	}
}

// linkStat is one "safekeeper link stats" line of the proposer's log.
type linkStat struct {
	safekeeper string
	responses  int64
	maxGap     time.Duration
	late       int64
}

var linkStatRe = regexp.MustCompile(`msg="safekeeper link stats" (?:\S+ )*?safekeeper=(\S+) responses=(\d+) max_response_gap=(\S+) late_responses=(\d+)`)

// parseLinkStats finds the proposer's link stats lines in log.
func parseLinkStats(log string) ([]linkStat, error) {
	var out []linkStat
	for _, m := range linkStatRe.FindAllStringSubmatch(log, -1) {
		d, err := time.ParseDuration(m[3])
		if err != nil {
			return nil, fmt.Errorf("max_response_gap=%s: %v", m[3], err)
		}
		n, _ := strconv.ParseInt(m[2], 10, 64)
		late, _ := strconv.ParseInt(m[4], 10, 64)
		out = append(out, linkStat{safekeeper: m[1], responses: n, maxGap: d, late: late})
	}
	return out, nil
}
