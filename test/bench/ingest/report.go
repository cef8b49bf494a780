package ingest

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Median returns the median of xs (the mean of the middle two for an even
// count); NaN-free input assumed. 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Spread formats the median of xs with its min–max, e.g. "512 (498–530)".
func Spread(xs []float64, prec int) string {
	if len(xs) == 0 {
		return "–"
	}
	if len(xs) == 1 {
		return strconv.FormatFloat(xs[0], 'f', prec, 64)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, Median(xs), prec, slices.Min(xs), prec, slices.Max(xs))
}

// Verdict says whether got meets a target: "PASS" or "MISS".
func Verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// Table is a Markdown table: readable in a terminal and in docs.
type Table struct {
	Header []string
	Rows   [][]string
}

// Add appends a row.
func (t *Table) Add(cells ...string) { t.Rows = append(t.Rows, cells) }

// String renders the table with aligned columns.
func (t *Table) String() string {
	w := make([]int, len(t.Header))
	all := append([][]string{t.Header}, t.Rows...)
	for _, r := range all {
		for i, c := range r {
			if i < len(w) {
				w[i] = max(w[i], len([]rune(c)))
			}
		}
	}
	var b strings.Builder
	line := func(r []string) {
		b.WriteString("|")
		for i := range w {
			c := ""
			if i < len(r) {
				c = r[i]
			}
			fmt.Fprintf(&b, " %s%s |", c, strings.Repeat(" ", w[i]-len([]rune(c))))
		}
		b.WriteString("\n")
	}
	line(t.Header)
	b.WriteString("|")
	for i := range w {
		b.WriteString(strings.Repeat("-", w[i]+2) + "|")
	}
	b.WriteString("\n")
	for _, r := range t.Rows {
		line(r)
	}
	return b.String()
}

// ParseSize parses a byte count: a number with an optional K, M, G or KiB,
// MiB, GiB suffix (powers of 1024 either way), e.g. "1GiB", "512M", "65536".
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	u := strings.ToUpper(t)
	mult := int64(1)
	for _, suf := range []struct {
		s string
		m int64
	}{{"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(u, suf.s) {
			mult, u = suf.m, strings.TrimSpace(strings.TrimSuffix(u, suf.s))
			break
		}
	}
	n, err := strconv.ParseInt(u, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want a positive number with an optional K/M/G suffix", s)
	}
	return n * mult, nil
}

// EnvSize returns the size in env var name, or def when unset.
func EnvSize(name string, def int64) (int64, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := ParseSize(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return n, nil
}

// EnvInt returns the positive integer in env var name, or def when unset.
func EnvInt(name string, def int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive integer", name, v)
	}
	return n, nil
}

// EnvDuration returns the duration (time.ParseDuration, ≥ 0) in env var
// name, or def when unset.
func EnvDuration(name string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s=%q: want a duration like 150s (0 disables)", name, v)
	}
	return d, nil
}

// HumanSize formats n bytes in binary units: exact multiples as integers
// ("1 GiB", "128 KiB"), others with two decimals ("1.00 MiB" for a little
// under one).
func HumanSize(n int64) string {
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d %s", n/u.size, u.name)
		}
		if n >= u.size*1000/1024 {
			return fmt.Sprintf("%.2f %s", float64(n)/float64(u.size), u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// plural formats n things, e.g. "1 round", "3 rounds".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// MB formats bytes as MB (10^6), the unit of every rate and RSS here.
func MB(n uint64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// String renders m for the report.
func (m Machine) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "- date: %s; load average at start: %s (the machine is shared: figures are noisy)\n", m.Date, m.LoadAvg)
	fmt.Fprintf(&b, "- CPU: %d × %s; memory %.1f GB; kernel %s\n", m.CPUs, m.CPUModel, float64(m.MemTotal)/1e9, m.Kernel)
	fmt.Fprintf(&b, "- temporary directory (data directories and dd's file): %s\n", m.TempFS)
	fmt.Fprintf(&b, "- %s; tree: %s\n", m.Go, m.Describe)
	return b.String()
}
