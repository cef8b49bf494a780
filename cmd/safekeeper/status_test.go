package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server"
	"github.com/safekeeper/safekeeper/test/harness"
)

// TestStatusAndTimelineCommands: `status`, `timeline list` and `timeline
// show` read a running safekeeper's HTTP API, as tables or (--json) as the
// API's JSON; an unknown timeline is one line naming the 404 and exit 1; an
// unreachable API is one line and exit 1.
func TestStatusAndTimelineCommands(t *testing.T) {
	srv, err := server.New(server.Config{NodeID: 5, ListenPG: "127.0.0.1:0", ListenHTTP: "127.0.0.1:0", DataDir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-served
	})
	httpAddr := srv.HTTPAddr().String()
	// A timeline: a greeting creates it.
	tenant, timeline := proto.ID{0xa1}, proto.ID{0xb2}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := proposer.Dial(ctx, proposer.DialConfig{AllowTimelineCreation: true, Addr: srv.Addr().String(), TenantID: tenant, TimelineID: timeline})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if err := pc.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: 424242, TenantID: tenant,
		TimelineID: timeline, PgTimeline: 1, WalSegSize: 16 << 20, ProposerUUID: proto.ID{1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(append([]string{"safekeeper"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, stderr := cli("status", "--http", httpAddr)
	if code != 0 || !strings.Contains(out, "node id") || !strings.Contains(out, "5") || !strings.Contains(out, "timelines") ||
		!regexp.MustCompile(`(?m)^WAL +taken$`).MatchString(out) {
		t.Fatalf("status: exit %d\n%s%s", code, out, stderr)
	}
	code, out, _ = cli("status", "--http", httpAddr, "--json")
	var st map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st["id"] != 5.0 || st["timelines"] != 1.0 {
		t.Fatalf("status --json: exit %d %q", code, out)
	}
	code, out, _ = cli("timeline", "list", "--http", httpAddr)
	if code != 0 || !strings.Contains(out, "TENANT") || !strings.Contains(out, tenant.String()) || !strings.Contains(out, timeline.String()) {
		t.Fatalf("timeline list: exit %d\n%s", code, out)
	}
	code, out, stderr = cli("timeline", "show", "--http", httpAddr, "--tenant-id", tenant.String(), "--timeline-id", timeline.String())
	if code != 0 || !strings.Contains(out, "system id") || !strings.Contains(out, "424242") || !strings.Contains(out, "16777216") ||
		!strings.Contains(out, "proposer") || !strings.Contains(out, "readers: 0") {
		t.Fatalf("timeline show: exit %d\n%s%s", code, out, stderr)
	}
	code, _, stderr = cli("timeline", "show", "--http", httpAddr, "--tenant-id", tenant.String(), "--timeline-id", proto.ID{9}.String())
	if code != 1 || !strings.Contains(stderr, "HTTP 404 not_found") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Fatalf("timeline show of an unknown timeline: exit %d %q", code, stderr)
	}
	dead := harness.RefusedAddr(t) // nothing listens there
	code, _, stderr = cli("status", "--http", dead)
	if code != 1 || !strings.Contains(stderr, "cannot reach the safekeeper's HTTP API at "+dead) {
		t.Fatalf("status of nothing: exit %d %q", code, stderr)
	}
	if code, _, _ := cli("timeline", "show", "--http", httpAddr); code != exitUsage {
		t.Fatalf("timeline show without ids: exit %d, want %d", code, exitUsage)
	}

	// timeline delete: refused while the proposer's connection is open,
	// then done with --force.
	ids := []string{"--http", httpAddr, "--tenant-id", tenant.String(), "--timeline-id", timeline.String()}
	code, _, stderr = cli(append([]string{"timeline", "delete"}, ids...)...)
	if code != 1 || !strings.Contains(stderr, "HTTP 409 busy") {
		t.Fatalf("timeline delete with a proposer connected: exit %d %q", code, stderr)
	}
	code, out, stderr = cli(append([]string{"timeline", "delete", "--force"}, ids...)...)
	if code != 0 || !strings.Contains(out, "deleted timeline "+tenant.String()+"/"+timeline.String()+" (its connections were ended)") {
		t.Fatalf("timeline delete --force: exit %d\n%s%s", code, out, stderr)
	}
	if _, err := pc.Recv(ctx); err == nil || !strings.Contains(err.Error(), "57P01") {
		t.Fatalf("the proposer's connection after the delete: %v, want FATAL 57P01", err)
	}
	code, out, _ = cli("timeline", "list", "--http", httpAddr)
	if code != 0 || strings.Contains(out, timeline.String()) {
		t.Fatalf("timeline list after the delete: exit %d\n%s", code, out)
	}
	code, _, stderr = cli(append([]string{"timeline", "delete"}, ids...)...)
	if code != 1 || !strings.Contains(stderr, "HTTP 404 not_found") {
		t.Fatalf("second timeline delete: exit %d %q", code, stderr)
	}
}

// TestAPIErrorAnswerNotJSON: an error answer whose body is not the API's
// {"error","code"} (a proxy's page) is one line with the status and the
// start of the body, for every command over the HTTP API; a plain http://
// request to the API's HTTPS port says to use https:// and --http-cacert.
func TestAPIErrorAnswerNotJSON(t *testing.T) {
	page := "<html>\n<body>\n\tbad gateway: upstream safekeeper down\n" + strings.Repeat("x", 500) + "\n</body></html>\n"
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, page)
	}))
	defer proxy.Close()
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a plain request reached the handler: %s %s", r.Method, r.URL)
	}))
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0)
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	ids := []string{"--tenant-id", strings.Repeat("a", 32), "--timeline-id", strings.Repeat("b", 32)}
	commands := [][]string{{"status"}, {"timeline", "list"}, append([]string{"timeline", "show"}, ids...),
		append([]string{"timeline", "delete"}, ids...), append([]string{"wal", "dump"}, ids...)}
	for _, cmd := range commands {
		var out, errb bytes.Buffer
		code := run(append(append([]string{"safekeeper"}, cmd...), "--http", proxy.Listener.Addr().String()), &out, &errb)
		msg := errb.String()
		if code != 1 || !strings.Contains(msg, "HTTP 502 Bad Gateway: <html> <body> bad gateway: upstream safekeeper down xxx") ||
			strings.Count(msg, "\n") != 1 || len(msg) > 400 || !strings.Contains(msg, "...") {
			t.Errorf("%q against a proxy's 502 page: exit %d, stderr %q; want exit 1 and one bounded line with the status and the body", cmd, code, msg)
		}
		out.Reset()
		errb.Reset()
		addr := tlsSrv.Listener.Addr().String()
		code = run(append(append([]string{"safekeeper"}, cmd...), "--http", addr), &out, &errb)
		msg = errb.String()
		// Go's server answers a plain GET with its 400 (a usage error);
		// it closes a plain DELETE without an answer (then a hint).
		want := exitUsage
		if len(cmd) > 1 && cmd[1] == "delete" {
			want = 1
		}
		if code != want || !strings.Contains(msg, "use --http https://"+addr) || !strings.Contains(msg, "--http-cacert") || strings.Count(msg, "\n") != 1 {
			t.Errorf("%q with http:// against an HTTPS port: exit %d, stderr %q; want exit %d saying to use https:// and --http-cacert", cmd, code, msg, want)
		}
		// And the other way: https:// against a plain HTTP port.
		out.Reset()
		errb.Reset()
		plain := proxy.Listener.Addr().String()
		code = run(append(append([]string{"safekeeper"}, cmd...), "--http", "https://"+plain), &out, &errb)
		msg = errb.String()
		if code != 1 || !strings.Contains(msg, "serves plain HTTP there") || !strings.Contains(msg, "use --http "+plain) || strings.Count(msg, "\n") != 1 {
			t.Errorf("%q with https:// against a plain HTTP port: exit %d, stderr %q; want exit 1 saying to use --http %s", cmd, code, msg, plain)
		}
	}
}

// TestStatusNamesTheDiskBreaker: while the disk circuit breaker refuses
// new WAL, `status` says so on a line of its own with the rule that
// tripped it, the numbers and since when, and --json has wal_refused with
// the reason.
func TestStatusNamesTheDiskBreaker(t *testing.T) {
	// The new database file alone holds more than 1 byte: tripped at start.
	srv, err := server.New(server.Config{NodeID: 5, ListenPG: "127.0.0.1:0", ListenHTTP: "127.0.0.1:0", DataDir: t.TempDir(), UnsafeNoFsync: true,
		MaxDiskUsage: 1})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-served
	})
	var out, errb bytes.Buffer
	code := run([]string{"safekeeper", "status", "--http", srv.HTTPAddr().String()}, &out, &errb)
	line := regexp.MustCompile(`(?m)^WAL +REFUSED \(53100\) since \S+ \(\d+s ago\): --max-disk-usage reached: the database file holds \d+ bytes in use .*, at --max-disk-usage 1$`)
	if code != 0 || !line.MatchString(out.String()) {
		t.Fatalf("status with --max-disk-usage reached: exit %d, want a line matching %s\n%s%s", code, line, out.String(), errb.String())
	}
	out.Reset()
	code = run([]string{"safekeeper", "status", "--json", "--http", srv.HTTPAddr().String()}, &out, &errb)
	var st struct {
		WALRefused *struct{ Reason, Detail, Since string } `json:"wal_refused"`
	}
	if code != 0 || json.Unmarshal(out.Bytes(), &st) != nil || st.WALRefused == nil || st.WALRefused.Reason != "max_disk_usage" || st.WALRefused.Since == "" {
		t.Fatalf("status --json with --max-disk-usage reached: exit %d %s", code, out.String())
	}
}

// TestDocsShowOutputAsPrinted: the outputs the docs show are the ones the
// commands print: each table header of timeline list and timeline show as
// the command prints it, an empty column as "-" (never Go's "<nil>"), and
// psql -XA (without -t) with its header line and "(N rows)" footer.
func TestDocsShowOutputAsPrinted(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs: %v", err)
	}
	docs = append(docs, filepath.Join("..", "..", "README.md"))
	headers := map[string][]string{}
	for _, h := range []string{timelineListHeader, readersHeader, slotsHeader} {
		cols := strings.Split(h, "\t")
		headers[cols[0]+" "+cols[1]] = cols
	}
	psqlNoT := regexp.MustCompile(`psql .*-X?A[^t" ]*c "select`)
	footer := regexp.MustCompile(`^\(\d+ rows?\)$`)
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		for i, line := range lines {
			name := fmt.Sprintf("%s:%d", filepath.Base(doc), i+1)
			if strings.Contains(line, "<nil>") {
				t.Errorf("%s shows Go's <nil>: %s", name, line)
			}
			fields := strings.Fields(line)
			if len(fields) >= 2 {
				if want, ok := headers[fields[0]+" "+fields[1]]; ok {
					if got := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1); !slices.Equal(got, want) {
						t.Errorf("%s shows the header %q; the command prints %q", name, got, want)
					}
				}
			}
			if strings.HasPrefix(line, "$ ") && psqlNoT.MatchString(line) {
				ok := false
				for _, out := range lines[i+1:] {
					if strings.HasPrefix(out, "$ ") || strings.HasPrefix(out, "```") {
						break
					}
					ok = ok || footer.MatchString(out)
				}
				if !ok {
					t.Errorf("%s: psql without -t prints a header and a (N rows) footer, the output shown has none: %s", name, line)
				}
			}
		}
	}
}
