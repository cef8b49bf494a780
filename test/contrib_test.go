package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v2"

	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// TestContribFilesAgainstRealProcesses keeps contrib/ true (docs/operations.md
// tells operators to install these files as they are):
//
//   - every contrib/systemd unit's ExecStart, expanded as systemd expands it
//     (specifiers, Environment=, the shipped example EnvironmentFile, then
//     the values a site sets: ports, the primary, the timeline ids), is
//     run: three safekeeper@N units come up on the real binary (/readyz
//     200), the proposer unit connects to a real PostgreSQL 15 primary and
//     streams to them as the synchronous standby named by the unit, and a
//     commit returns once the safekeepers hold it; SIGTERM (the units'
//     KillSignal) stops each with exit 0. So every subcommand, flag and
//     value the units and example files use is accepted and works;
//   - every metric the Grafana dashboards (contrib/grafana/*.json: panel
//     and template-variable queries) and the Prometheus rules
//     (contrib/prometheus/*-alerts.yml) reference is exported by those
//     running safekeepers' /metrics, with a timeline in place, or by the
//     proposer unit's (its --listen-http, which the unit sets); histogram
//     series (_bucket, _sum, _count) need a histogram of that name. Names
//     from elsewhere (Prometheus' up, node_exporter's) must be listed in
//     externalMetrics.
func TestContribFilesAgainstRealProcesses(t *testing.T) {
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	sysd := filepath.Join(root, "contrib", "systemd")
	pg := pgtest.Start(t, pgtest.Options{WALSegSizeMB: 1})

	// The safekeepers: safekeeper@1..3, each with its own ports set in
	// /etc/safekeeper/N.env, as a second and third safekeeper on one host
	// have them; here port 0, and the addresses bound are read from each
	// one's "safekeeper listening" line.
	var sks []*harness.Process
	var pgAddrs, httpAddrs []string
	archiveDir := filepath.Join(t.TempDir(), "archive")
	for i := 1; i <= 3; i++ {
		args := unitCommand(t, filepath.Join(sysd, "safekeeper@.service"), strconv.Itoa(i),
			map[string]string{"LISTEN_PG": "127.0.0.1:0", "LISTEN_HTTP": "127.0.0.1:0",
				// With the archive on, so that its metrics (and the alerts
				// on them) are checked too.
				"EXTRA_ARGS": "--remote-storage file://" + archiveDir})
		replaceStateDir(t, args, filepath.Join(t.TempDir(), "data"))
		if args[0] != "run" {
			t.Fatalf("safekeeper@.service runs %q, want run", args[0])
		}
		sk := harness.StartProcess(t, fmt.Sprintf("safekeeper-%d", i), args...)
		var pgAddr, httpAddr string
		harness.WaitFor(t, 15*time.Second, "safekeeper@"+strconv.Itoa(i)+" listening", func() bool {
			if exited, code := sk.Exited(); exited {
				t.Fatalf("safekeeper@%d exited %d at start: %v\n%s", i, code, args, sk.Log())
			}
			var ok bool
			pgAddr, httpAddr, ok = harness.ListenAddrs(sk.Log())
			return ok
		})
		harness.WaitFor(t, 15*time.Second, "safekeeper@"+strconv.Itoa(i)+" ready on "+httpAddr, func() bool {
			if exited, code := sk.Exited(); exited {
				t.Fatalf("safekeeper@%d exited %d at start: %v", i, code, args)
			}
			resp, err := http.Get("http://" + httpAddr + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
		sks, pgAddrs, httpAddrs = append(sks, sk), append(pgAddrs, pgAddr), append(httpAddrs, httpAddr)
	}

	// The proposer, with /etc/safekeeper/proposer.env filled in, after the
	// timeline was created as docs/operations.md says.
	site := map[string]string{
		"UPSTREAM":    pg.ConnString(),
		"SAFEKEEPERS": strings.Join(pgAddrs, ","),
		"TENANT_ID":   "c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c1",
		"TIMELINE_ID": "c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c2",
		"LISTEN_HTTP": "127.0.0.1:0", // the address it got is in its log
	}
	args := unitCommand(t, filepath.Join(sysd, "safekeeper-proposer.service"), "", site)
	if args[0] != "propose" {
		t.Fatalf("safekeeper-proposer.service runs %q, want propose", args[0])
	}
	harness.CreateTimeline(t, site["UPSTREAM"], pgAddrs, site["TENANT_ID"], site["TIMELINE_ID"])
	appName := "proposer_" + site["TIMELINE_ID"] // the default
	prop := harness.StartProcess(t, "proposer", args...)
	propHTTP := listeningHTTP(t, prop)
	harness.WaitFor(t, 20*time.Second, "the proposer unit to stream to the primary as "+appName, func() bool {
		if exited, code := prop.Exited(); exited {
			t.Fatalf("the proposer unit exited %d: %v", code, args)
		}
		out, err := pg.Query(t.Context(), "select state from pg_stat_replication where application_name = '"+appName+"'")
		return err == nil && out == "streaming"
	})
	pg.Exec(t, "alter system set synchronous_standby_names = '"+appName+"'; select pg_reload_conf();")
	harness.WaitFor(t, 15*time.Second, "the proposer to be the synchronous standby", func() bool {
		out, err := pg.Query(t.Context(), "select sync_state from pg_stat_replication where application_name = '"+appName+"'")
		return err == nil && out == "sync"
	})
	lsn := pg.Exec(t, "set statement_timeout = '15s'; create table contrib(x int); insert into contrib values (1); select pg_current_wal_flush_lsn() - '0/0'::pg_lsn;")
	committed, err := strconv.ParseFloat(lsn, 64)
	if err != nil {
		t.Fatalf("flush lsn %q: %v", lsn, err)
	}

	// Every safekeeper's /metrics, once the commit is on all three.
	var families []map[string]*dto.MetricFamily
	for _, a := range httpAddrs {
		var mf map[string]*dto.MetricFamily
		harness.WaitFor(t, 15*time.Second, "safekeeper_commit_lsn on "+a+" to reach the commit", func() bool {
			mf = scrape(t, a)
			c := mf["safekeeper_commit_lsn"]
			return c != nil && len(c.Metric) == 1 && c.Metric[0].GetGauge().GetValue() >= committed
		})
		families = append(families, mf)
	}
	// And the proposer's, once it reported the commit to the primary.
	harness.WaitFor(t, 15*time.Second, "safekeeper_proposer_flush_lsn of the proposer unit to reach the commit", func() bool {
		c := scrape(t, propHTTP)["safekeeper_proposer_flush_lsn"]
		return c != nil && len(c.Metric) == 1 && c.Metric[0].GetGauge().GetValue() >= committed
	})
	exported := families[0]
	for name, f := range scrape(t, propHTTP) {
		if g, ok := exported[name]; ok && g.GetType() != f.GetType() {
			t.Fatalf("%s is a %v on the safekeepers, a %v on the proposer", name, g.GetType(), f.GetType())
		}
		if _, ok := exported[name]; !ok {
			exported[name] = f
		}
	}

	t.Run("grafana", func(t *testing.T) {
		files, _ := filepath.Glob(filepath.Join(root, "contrib", "grafana", "*.json"))
		if len(files) == 0 {
			t.Fatal("no contrib/grafana/*.json")
		}
		for _, f := range files {
			exprs, vars := dashboardQueries(t, f)
			if len(exprs) < 10 {
				t.Errorf("%s: only %d PromQL expressions found", f, len(exprs))
			}
			used := map[string]bool{}
			for _, e := range exprs {
				for _, m := range checkExpr(t, f, e, exported) {
					used[m] = true
				}
			}
			for _, v := range vars {
				checkLabelValues(t, f, v, exported)
			}
			for name := range exported {
				if strings.HasPrefix(name, "safekeeper_") && !used[name] {
					t.Logf("%s does not show %s", filepath.Base(f), name)
				}
			}
		}
	})
	t.Run("alerts", func(t *testing.T) {
		files, _ := filepath.Glob(filepath.Join(root, "contrib", "prometheus", "*-alerts.yml"))
		if len(files) == 0 {
			t.Fatal("no contrib/prometheus/*-alerts.yml")
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var rules ruleFile
			if err := yaml.UnmarshalStrict(b, &rules); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			n := 0
			for _, g := range rules.Groups {
				for _, r := range g.Rules {
					n++
					if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
						t.Errorf("%s: rule %q: want alert, expr, labels.severity and annotations.summary", f, r.Alert)
					}
					if r.For != "" {
						if _, err := model.ParseDuration(r.For); err != nil {
							t.Errorf("%s: %s: for: %v", f, r.Alert, err)
						}
					}
					checkExpr(t, f+": "+r.Alert, r.Expr, exported)
				}
			}
			if n < 5 {
				t.Errorf("%s: only %d rules", f, n)
			}
		}
	})

	t.Run("systemd-analyze", func(t *testing.T) { verifyUnits(t, sysd) })

	// SIGTERM, as systemctl stop sends it: each exits 0.
	if err := prop.Stop(15 * time.Second); err != nil {
		t.Errorf("proposer unit after SIGTERM: %v", err)
	}
	for i, sk := range sks {
		if err := sk.Stop(15 * time.Second); err != nil {
			t.Errorf("safekeeper@%d after SIGTERM: %v", i+1, err)
		}
	}
}

// TestAlertRulesWithPromtool checks contrib/prometheus/*-alerts.yml with
// Prometheus' own tool: promtool check rules (syntax, templates) and
// promtool test rules on *-alerts.test.yml, the unit tests of the rules.
// Every alert must have a case in the test file where it fires and one
// where it does not (checked without promtool). Where promtool is not on
// PATH those two subtests skip, saying why (.ci/run installs it and puts
// the reason it could not in SAFEKEEPER_PROMTOOL_MISSING).
func TestAlertRulesWithPromtool(t *testing.T) {
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "contrib", "prometheus", "*-alerts.yml"))
	if len(files) == 0 {
		t.Fatal("no contrib/prometheus/*-alerts.yml")
	}
	for _, f := range files {
		testFile := strings.TrimSuffix(f, ".yml") + ".test.yml"
		t.Run(filepath.Base(f)+"/every alert tested", func(t *testing.T) { checkAlertTestsCover(t, f, testFile) })
		t.Run(filepath.Base(f)+"/promtool", func(t *testing.T) {
			tool, err := exec.LookPath("promtool")
			if err != nil {
				why := "promtool is not on PATH (Debian: apt-get install prometheus, or unpack its promtool as .ci/run does)"
				if m := os.Getenv("SAFEKEEPER_PROMTOOL_MISSING"); m != "" {
					why += ": " + m
				}
				t.Skip(why)
			}
			if out, err := exec.Command(tool, "check", "rules", f).CombinedOutput(); err != nil {
				t.Errorf("promtool check rules %s: %v\n%s", f, err, out)
			}
			cmd := exec.Command(tool, "test", "rules", filepath.Base(testFile))
			cmd.Dir = filepath.Dir(testFile) // rule_files are relative to it
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("promtool test rules %s: %v\n%s", testFile, err, out)
			}
		})
	}
}

// checkAlertTestsCover fails t unless testFile (promtool's unit-test
// format) loads rules and has, for every alert of rules, an
// alert_rule_test expecting it to fire and one expecting it not to.
func checkAlertTestsCover(t *testing.T, rules, testFile string) {
	b, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(b, &rf); err != nil {
		t.Fatalf("%s: %v", rules, err)
	}
	b, err = os.ReadFile(testFile)
	if err != nil {
		t.Fatalf("the rules have no unit tests: %v", err)
	}
	var tf struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			AlertRuleTests []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(b, &tf); err != nil {
		t.Fatalf("%s: %v", testFile, err)
	}
	if !slices.Contains(tf.RuleFiles, filepath.Base(rules)) {
		t.Errorf("%s: rule_files %q does not load %s", testFile, tf.RuleFiles, filepath.Base(rules))
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tf.Tests {
		for _, a := range tc.AlertRuleTests {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if !fires[r.Alert] {
				t.Errorf("%s: no case where %s fires", testFile, r.Alert)
			}
			if !quiet[r.Alert] {
				t.Errorf("%s: no case where %s does not fire", testFile, r.Alert)
			}
		}
	}
}

// verifyUnits runs systemd-analyze verify, where it is installed, on every
// unit (a template as instance 1): unknown keys, bad values and sections
// are reported there. That the binary is not installed at
// /usr/local/bin/safekeeper on the test machine is the one complaint let
// through.
func verifyUnits(t *testing.T, dir string) {
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	units, _ := filepath.Glob(filepath.Join(dir, "*.service"))
	tmp := t.TempDir()
	var args []string
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(u)
		if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, filepath.Join(tmp, strings.Replace(name, "@.", "@1.", 1)))
	}
	out, err := exec.Command(tool, append([]string{"verify"}, args...)...).CombinedOutput()
	var complaints []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line != "" && !strings.Contains(line, "Command /usr/local/bin/safekeeper is not executable") {
			complaints = append(complaints, line)
		}
	}
	if len(complaints) > 0 {
		t.Errorf("systemd-analyze verify (%v):\n%s", err, strings.Join(complaints, "\n"))
	}
}

// externalMetrics are referenced by contrib/ but exported by others.
var externalMetrics = map[string]string{
	"up":                          "Prometheus, per scrape target",
	"node_filesystem_avail_bytes": "node_exporter",
	"node_filesystem_size_bytes":  "node_exporter",
}

// exampleEnvFiles maps the EnvironmentFile= paths of the units to the
// example files shipped next to them.
var exampleEnvFiles = map[string]string{
	"/etc/safekeeper/%i.env":       "safekeeper.env",
	"/etc/safekeeper/proposer.env": "proposer.env",
}

// unitCommand returns the arguments after the binary of a unit's
// ExecStart, expanded as systemd does for instance (the %i of a template):
// specifiers; the variables of Environment=, then of each EnvironmentFile=
// (its example in contrib/systemd), then site — what an operator sets in
// that file — each overriding the one before. ${NAME} is replaced by the
// value as one word, a word that is just $NAME by the value split at
// whitespace. An unknown specifier, an undefined variable, or a site key
// that neither the unit nor its example file defines fails t.
func unitCommand(t *testing.T, path, instance string, site map[string]string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	var execStart []string
	section := ""
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			section = line
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: not key=value: %q", path, line)
		}
		if section != "[Service]" {
			continue
		}
		switch k {
		case "Environment":
			for _, a := range splitWords(t, path, v) {
				name, val, ok := strings.Cut(a, "=")
				if !ok {
					t.Fatalf("%s: Environment=%s: %q is not NAME=VALUE", path, v, a)
				}
				keys[name] = val
			}
		case "EnvironmentFile":
			file := strings.TrimPrefix(v, "-")
			ex, ok := exampleEnvFiles[file]
			if !ok {
				t.Fatalf("%s: EnvironmentFile=%s has no example in exampleEnvFiles", path, file)
			}
			for name, val := range readEnvFile(t, filepath.Join(filepath.Dir(path), ex)) {
				keys[name] = val
			}
		case "ExecStart":
			if execStart != nil {
				t.Fatalf("%s: more than one ExecStart", path)
			}
			execStart = splitWords(t, path, v)
		}
	}
	if len(execStart) < 2 {
		t.Fatalf("%s: no ExecStart with a subcommand", path)
	}
	for k, v := range site {
		if _, ok := keys[k]; !ok {
			t.Fatalf("%s: the test sets %s, which neither the unit nor its example env file defines", path, k)
		}
		keys[k] = v
	}
	var args []string
	for _, w := range execStart {
		w = expandSpecifiers(t, path, w, instance)
		if name, ok := strings.CutPrefix(w, "$"); ok && regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`).MatchString(name) {
			v, ok := keys[name]
			if !ok {
				t.Fatalf("%s: ExecStart uses $%s, defined nowhere", path, name)
			}
			args = append(args, strings.Fields(v)...)
			continue
		}
		w = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`).ReplaceAllStringFunc(w, func(m string) string {
			name := m[2 : len(m)-1]
			v, ok := keys[name]
			if !ok {
				t.Fatalf("%s: ExecStart uses ${%s}, defined nowhere", path, name)
			}
			return v
		})
		args = append(args, w)
	}
	if args[0] != "/usr/local/bin/safekeeper" {
		t.Fatalf("%s: ExecStart runs %q, want /usr/local/bin/safekeeper (docs/operations.md installs it there)", path, args[0])
	}
	// A unit's StateDirectory= is where its --data-dir must be.
	if m := regexp.MustCompile(`(?m)^StateDirectory=(\S+)`).FindStringSubmatch(string(b)); m != nil {
		want := "/var/lib/" + expandSpecifiers(t, path, m[1], instance)
		if got := flagValue(t, args[1:], "--data-dir"); got != want {
			t.Errorf("%s: --data-dir %s, but StateDirectory= creates %s", path, got, want)
		}
	}
	return args[1:]
}

func expandSpecifiers(t *testing.T, path, w, instance string) string {
	var sb strings.Builder
	for i := 0; i < len(w); i++ {
		if w[i] != '%' {
			sb.WriteByte(w[i])
			continue
		}
		i++
		switch {
		case i < len(w) && w[i] == 'i' && instance != "":
			sb.WriteString(instance)
		case i < len(w) && w[i] == '%':
			sb.WriteByte('%')
		default:
			t.Fatalf("%s: specifier in %q not handled by the test (only %%i in a template, %%%%)", path, w)
		}
	}
	return sb.String()
}

// splitWords splits a unit's value into words as systemd does: at
// whitespace, with "double" and 'single' quoted words.
func splitWords(t *testing.T, path, s string) []string {
	var words []string
	var cur strings.Builder
	in := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\'':
			end := strings.IndexByte(s[i+1:], c)
			if end < 0 {
				t.Fatalf("%s: unterminated quote in %q", path, s)
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
			in = true
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			in = true
		case unicode.IsSpace(rune(c)):
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

// readEnvFile reads a systemd EnvironmentFile: NAME=VALUE lines (the
// value is the rest of the line, optionally quoted), # and ; comments.
func readEnvFile(t *testing.T, path string) map[string]string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`).MatchString(k) {
			t.Fatalf("%s: not NAME=VALUE: %q", path, line)
		}
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		env[k] = v
	}
	return env
}

func flagValue(t *testing.T, args []string, flag string) string {
	t.Helper()
	i := slices.Index(args, flag)
	if i < 0 || i+1 >= len(args) {
		t.Fatalf("%s not in %q", flag, args)
	}
	return args[i+1]
}

// replaceStateDir points --data-dir at dir: the unit's is a system path.
func replaceStateDir(t *testing.T, args []string, dir string) {
	t.Helper()
	flagValue(t, args, "--data-dir")
	args[slices.Index(args, "--data-dir")+1] = dir
}

func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s/metrics: %v", addr, err)
	}
	return mf
}

type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// dashboardQueries returns every "expr" of a Grafana dashboard (panel
// targets, at any depth) and every label_values(...) template query.
func dashboardQueries(t *testing.T, path string) (exprs, vars []string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "expr" {
					exprs = append(exprs, s)
				} else if s, ok := x.(string); ok && (k == "query" || k == "definition") && strings.HasPrefix(s, "label_values(") {
					vars = append(vars, s)
				} else {
					walk(x)
				}
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(d)
	return exprs, vars
}

// checkExpr fails t for every metric expr names that the server does not
// export (and externalMetrics does not list); it returns the exported
// families used.
func checkExpr(t *testing.T, where, expr string, exported map[string]*dto.MetricFamily) []string {
	t.Helper()
	names, err := promqlMetricNames(expr)
	if err != nil {
		t.Errorf("%s: %v in %q", where, err, expr)
		return nil
	}
	if len(names) == 0 {
		t.Errorf("%s: no metric in %q", where, expr)
	}
	var used []string
	for _, n := range names {
		if _, ok := externalMetrics[n]; ok {
			continue
		}
		fam, ok := family(n, exported)
		if !ok {
			t.Errorf("%s: metric %s is not exported by safekeeper run or propose (%q)", where, n, expr)
			continue
		}
		used = append(used, fam)
	}
	return used
}

// family is the exported family a series name belongs to: the name itself,
// or a histogram's (summary's) _bucket, _sum, _count.
func family(name string, exported map[string]*dto.MetricFamily) (string, bool) {
	if _, ok := exported[name]; ok {
		return name, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suf)
		if !ok {
			continue
		}
		if f := exported[base]; f != nil && (f.GetType() == dto.MetricType_HISTOGRAM || (f.GetType() == dto.MetricType_SUMMARY && suf != "_bucket")) {
			return base, true
		}
	}
	return "", false
}

// checkLabelValues checks a Grafana label_values(selector, label) query:
// the selector's metric is exported and its series carry label (job and
// instance come from Prometheus).
func checkLabelValues(t *testing.T, where, q string, exported map[string]*dto.MetricFamily) {
	t.Helper()
	inner := strings.TrimSuffix(strings.TrimPrefix(q, "label_values("), ")")
	i := strings.LastIndex(inner, ",")
	if i < 0 {
		t.Errorf("%s: %q: want label_values(selector, label)", where, q)
		return
	}
	sel, label := strings.TrimSpace(inner[:i]), strings.TrimSpace(inner[i+1:])
	used := checkExpr(t, where, sel, exported)
	if label == "job" || label == "instance" {
		return
	}
	for _, fam := range used {
		for _, m := range exported[fam].Metric {
			if !slices.ContainsFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == label }) {
				t.Errorf("%s: %q: %s has no label %s", where, q, fam, label)
			}
		}
	}
}

// promqlKeywords are PromQL words that are not metric names even when no
// parenthesis follows them.
var promqlKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "offset": true, "atan2": true, "inf": true, "nan": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
}

// promqlMetricNames returns the metric names a PromQL expression selects:
// the identifiers that are not functions, keywords, label names (inside
// {...} or by/on/... (...)), numbers, strings, ranges ([...]) or Grafana
// $variables.
func promqlMetricNames(expr string) ([]string, error) {
	var names []string
	isIdent := func(c byte, first bool) bool {
		return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') || (!first && c >= '0' && c <= '9')
	}
	skipSpace := func(i int) int {
		for i < len(expr) && unicode.IsSpace(rune(expr[i])) {
			i++
		}
		return i
	}
	// skipTo returns the index after the close matching the open at i,
	// stepping over strings.
	skipTo := func(i int, open, close byte) (int, error) {
		depth := 0
		for ; i < len(expr); i++ {
			switch c := expr[i]; {
			case c == '"' || c == '\'' || c == '`':
				for i++; i < len(expr) && expr[i] != c; i++ {
					if expr[i] == '\\' && c != '`' {
						i++
					}
				}
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("unbalanced %c", open)
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '{':
			j, err := skipTo(i, '{', '}')
			if err != nil {
				return nil, err
			}
			i = j
		case c == '[':
			j, err := skipTo(i, '[', ']')
			if err != nil {
				return nil, err
			}
			i = j
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("unterminated string")
			}
			i = j + 1
		case c == '$':
			for i++; i < len(expr) && isIdent(expr[i], false); i++ {
			}
		case c >= '0' && c <= '9' || c == '.':
			for i++; i < len(expr) && (isIdent(expr[i], false) || expr[i] == '.'); i++ {
			}
		case isIdent(c, true):
			j := i
			for j < len(expr) && isIdent(expr[j], false) {
				j++
			}
			word := expr[i:j]
			next := skipSpace(j)
			switch {
			case word == "by" || word == "without" || word == "on" || word == "ignoring" || word == "group_left" || word == "group_right":
				if next < len(expr) && expr[next] == '(' {
					k, err := skipTo(next, '(', ')') // a label list
					if err != nil {
						return nil, err
					}
					j = k
				}
			case promqlKeywords[word]:
			case next < len(expr) && expr[next] == '(':
				// a function call
			default:
				if !slices.Contains(names, word) {
					names = append(names, word)
				}
			}
			i = j
		default:
			i++
		}
	}
	return names, nil
}

// TestPromQLMetricNames: the extraction TestContribFilesAgainstRealProcesses
// relies on finds the metrics and nothing else (functions, aggregations,
// label names, Grafana variables, strings, numbers, durations).
func TestPromQLMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`up{job="safekeeper"} == 0`: {"up"},
		`histogram_quantile(0.99, sum by (instance, le) (rate(safekeeper_flush_wal_seconds_bucket{job=~"$job", le!="x}"}[$__rate_interval])))`: {"safekeeper_flush_wal_seconds_bucket"},
		`max by (tenant_id, timeline_id) (a_lsn{x="y"}) - on (tenant_id, timeline_id) group_right() a_lsn > 64 * 1024`:                         {"a_lsn"},
		`sum(up) * 2 <= count(up{job="s"})`:                      {"up"},
		`predict_linear(d[1h], 6 * 3600) > 1.25 * d and d > 4e9`: {"d"},
		`changes(t[15m]) > 3 unless on(instance) b offset 5m`:    {"t", "b"},
		`x{a='it''s'} / ignoring(le) y`:                          {"x", "y"},
	} {
		got, err := promqlMetricNames(expr)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("promqlMetricNames(%q) = %q, %v; want %q", expr, got, err, want)
		}
	}
	if _, err := promqlMetricNames(`a{b="c"`); err == nil {
		t.Error("unbalanced { accepted")
	}
}
