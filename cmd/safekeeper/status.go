package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proposer"
)

// The commands that read a running safekeeper's HTTP API (docs/http.md).

func httpFlag() cli.Flag {
	return &cli.StringFlag{Name: "http", Value: "127.0.0.1:7676", Usage: "host:port of the safekeeper's HTTP API (run --listen-http); https://host:port when it has a certificate", EnvVars: []string{"SAFEKEEPER_HTTP"}}
}

// httpClientFlags are the HTTPS and token flags of the commands that call
// the HTTP API.
func httpClientFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "http-cacert", Usage: "CA certificate file to verify an https:// --http against (default: the system's)"},
		tokenFileFlag(),
	}
}

func tokenFileFlag() cli.Flag {
	return &cli.StringFlag{Name: "token-file", Usage: "file holding the token (safekeeper token issue) to present; propose, sync, wal fetch and timeline pull read it again at every connection to a safekeeper; default: $SAFEKEEPER_TOKEN (fixed at start)"}
}

// token is the token to present: --token-file, else $SAFEKEEPER_TOKEN, else
// none.
func token(c *cli.Context) (string, error) {
	if f := c.String("token-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", usagef("--token-file: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return strings.TrimSpace(os.Getenv("SAFEKEEPER_TOKEN")), nil
}

func jsonFlag() cli.Flag {
	return &cli.BoolFlag{Name: "json", Usage: "print JSON instead of text (LSNs as \"X/X\")"}
}

// writeJSONLine prints v as one line of JSON.
func writeJSONLine(c *cli.Context, v any) error {
	return json.NewEncoder(c.App.Writer).Encode(v)
}

// apiGet fetches path from the HTTP API at c's --http into v, and returns
// the raw body too. An error answer becomes one line naming its status.
func apiGet(c *cli.Context, path string, v any) ([]byte, error) {
	return apiDo(c, http.MethodGet, path, v)
}

// apiClient is how a command reaches the HTTP API at --http: the client
// (verifying an https:// API against --http-cacert), the base URL and the
// token to present (empty: none).
type apiClient struct {
	client *http.Client
	base   string
	addr   string // as given, for messages
	token  string
}

func newAPIClient(c *cli.Context) (*apiClient, error) {
	scheme, hostPort := "http", c.String("http")
	if rest, ok := strings.CutPrefix(hostPort, "https://"); ok {
		scheme, hostPort = "https", rest
	} else {
		hostPort = strings.TrimPrefix(hostPort, "http://")
	}
	if err := checkDialAddr(hostPort); err != nil {
		return nil, usagef("--http %q: %w", c.String("http"), err)
	}
	a := &apiClient{client: http.DefaultClient, base: scheme + "://" + hostPort, addr: c.String("http")}
	if f := c.String("http-cacert"); f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, usagef("--http-cacert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("--http-cacert %s: no PEM certificate in it", f)
		}
		a.client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	}
	var err error
	if a.token, err = token(c); err != nil {
		return nil, err
	}
	return a, nil
}

// request is a request to path with the token.
func (a *apiClient) request(ctx context.Context, method, path string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, nil)
	if err != nil {
		return nil, err
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	return req, nil
}

// apiDo is apiGet with another method.
func apiDo(c *cli.Context, method, path string, v any) ([]byte, error) {
	a, err := newAPIClient(c)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
	defer cancel()
	req, err := a.request(ctx, method, path)
	if err != nil {
		return nil, err
	}
	url := req.URL.String()
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, a.unreachable(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, a.errorAnswer(method, url, resp, body)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // ids and sizes print as written, not as floats
	if err := dec.Decode(v); err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, url, err)
	}
	return body, nil
}

// unreachable is the error for a request that got no answer. A plain
// request that the server closed without one may have gone to an HTTPS
// port (Go's server answers only requests that start with GET, HEAD, POST,
// PUT or OPTIONS with a 400 that says so): the error says what to try.
func (a *apiClient) unreachable(err error) error {
	err = fmt.Errorf("cannot reach the safekeeper's HTTP API at %s: %w", a.addr, err)
	if strings.HasPrefix(a.base, "http://") && errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w; if it serves HTTPS, use --http https://%s (with --http-cacert CA.pem unless the system trusts its certificate)", err, strings.TrimPrefix(a.base, "http://"))
	}
	// net/http says so only in words (transport.go, a TLS record header
	// that reads as HTTP).
	if host, ok := strings.CutPrefix(a.base, "https://"); ok && strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		err = fmt.Errorf("%w; it serves plain HTTP there (no --tls-cert): use --http %s", err, host)
	}
	return err
}

// maxErrorBody is how much of an error answer's body that is not the API's
// JSON a command shows.
const maxErrorBody = 200

// errorAnswer is the one-line error for an HTTP answer other than 200: the
// API's own {"error","code"}, else the status and the start of the body
// (a proxy's page, another server); a plain HTTP request to the API's
// HTTPS port says to use https://.
func (a *apiClient) errorAnswer(method, url string, resp *http.Response, body []byte) error {
	var e struct{ Error, Code string }
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return fmt.Errorf("%s (HTTP %d %s)", e.Error, resp.StatusCode, e.Code)
	}
	// Go's HTTPS server answers a plain request so (net/http.Server.serve).
	if resp.StatusCode == http.StatusBadRequest && strings.HasPrefix(a.base, "http://") &&
		bytes.Contains(body, []byte("Client sent an HTTP request to an HTTPS server")) {
		host := strings.TrimPrefix(a.base, "http://")
		return usagef("--http %s: the safekeeper's HTTP API serves HTTPS there: use --http https://%s, with --http-cacert CA.pem unless the system trusts its certificate", a.addr, host)
	}
	msg := fmt.Sprintf("%s %s: HTTP %s", method, url, resp.Status)
	if b := oneLine(body, maxErrorBody); b != "" {
		msg += ": " + b
	}
	return errors.New(msg)
}

// oneLine is b as one line of at most max bytes (then "..."): spaces
// trimmed, every run of control characters and blanks made one space,
// invalid UTF-8 replaced.
func oneLine(b []byte, max int) string {
	s := strings.Join(strings.FieldsFunc(strings.ToValidUTF8(string(b), "\ufffd"), func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r)
	}), " ")
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:         "status",
		Usage:        "show a running safekeeper's status (GET /v1/status)",
		UsageText:    "safekeeper status [--http HOST:PORT] [--json]",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Flags:        append([]cli.Flag{httpFlag(), jsonFlag()}, httpClientFlags()...),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("status takes no arguments, got %q", c.Args().Slice())
			}
			var st struct {
				ID             uint64  `json:"id"`
				Version        string  `json:"version"`
				UptimeSeconds  float64 `json:"uptime_seconds"`
				DataDir        string  `json:"data_dir"`
				ListenPG       string  `json:"listen_pg"`
				ListenHTTP     string  `json:"listen_http"`
				Timelines      int     `json:"timelines"`
				DiskUsageBytes int64   `json:"disk_usage_bytes"`
				DiskFreeBytes  uint64  `json:"disk_free_bytes"`
				WALRefused     *struct {
					Reason string    `json:"reason"`
					Detail string    `json:"detail"`
					Since  time.Time `json:"since"`
				} `json:"wal_refused"`
			}
			body, err := apiGet(c, "/v1/status", &st)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				_, err := c.App.Writer.Write(body)
				return err
			}
			w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "node id\t%d\n", st.ID)
			fmt.Fprintf(w, "version\t%s\n", st.Version)
			fmt.Fprintf(w, "uptime\t%s\n", (time.Duration(st.UptimeSeconds) * time.Second).String())
			fmt.Fprintf(w, "data dir\t%s\n", st.DataDir)
			fmt.Fprintf(w, "listen pg\t%s\n", st.ListenPG)
			fmt.Fprintf(w, "listen http\t%s\n", st.ListenHTTP)
			fmt.Fprintf(w, "timelines\t%d\n", st.Timelines)
			fmt.Fprintf(w, "disk\t%d MiB used, %d MiB free\n", st.DiskUsageBytes>>20, st.DiskFreeBytes>>20)
			if r := st.WALRefused; r != nil {
				fmt.Fprintf(w, "WAL\tREFUSED (53100) since %s (%s ago): %s: %s\n", r.Since.Local().Format(time.RFC3339),
					time.Since(r.Since).Round(time.Second), refusalRule(r.Reason), r.Detail)
			} else {
				fmt.Fprintln(w, "WAL\ttaken")
			}
			return w.Flush()
		},
	}
}

// refusalRule says which rule of the disk circuit breaker a
// wal_refused.reason of GET /v1/status names.
func refusalRule(reason string) string {
	switch reason {
	case "min_free_disk":
		return "free space below --min-free-disk"
	case "max_disk_usage":
		return "--max-disk-usage reached"
	}
	return reason
}

// The header lines of the tables timeline list and timeline show print
// (docs/operations.md shows them; TestDocsShowOutputAsPrinted compares).
const (
	timelineListHeader = "TENANT\tTIMELINE\tTERM\tTLI\tFLUSH\tCOMMIT\tREMOVED UP TO"
	readersHeader      = "KIND\tADDRESS\tAPPLICATION\tSLOT\tSENT\tWRITE\tFLUSH\tAPPLY\tLAG BYTES\tWRITE LAG\tFLUSH LAG\tREPLAY LAG"
	slotsHeader        = "NAME\tTEMPORARY\tACTIVE\tRESTART LSN"
)

func timelineListCommand() *cli.Command {
	return &cli.Command{
		Name:         "list",
		Usage:        "list a running safekeeper's timelines (GET /v1/tenant/timeline)",
		UsageText:    "safekeeper timeline list [--http HOST:PORT] [--json]",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Flags:        append([]cli.Flag{httpFlag(), jsonFlag()}, httpClientFlags()...),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("timeline list takes no arguments, got %q", c.Args().Slice())
			}
			var list []map[string]any
			body, err := apiGet(c, "/v1/tenant/timeline", &list)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				_, err := c.App.Writer.Write(body)
				return err
			}
			w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, timelineListHeader)
			for _, t := range list {
				fmt.Fprintf(w, "%v\t%v\t%v\t%v\t%v\t%v\t%v\n", t["tenant_id"], t["timeline_id"], t["term"], t["pg_timeline"], t["flush_lsn"], t["commit_lsn"], t["removed_up_to"])
			}
			return w.Flush()
		},
	}
}

func timelineShowCommand() *cli.Command {
	return &cli.Command{
		Name:         "show",
		Usage:        "show one timeline of a running safekeeper: state, proposer, readers, slots",
		UsageText:    "safekeeper timeline show --tenant-id HEX --timeline-id HEX [--http HOST:PORT] [--json]",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "tenant-id", "timeline-id") },
		Flags: append([]cli.Flag{httpFlag(), jsonFlag(),
			&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)", EnvVars: []string{"SAFEKEEPER_TENANT_ID"}},
			&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)", EnvVars: []string{"SAFEKEEPER_TIMELINE_ID"}},
		}, httpClientFlags()...),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("timeline show takes no arguments, got %q", c.Args().Slice())
			}
			tenant, timeline, err := parseIDs(c)
			if err != nil {
				return err
			}
			var tl map[string]any
			body, err := apiGet(c, fmt.Sprintf("/v1/tenant/%s/timeline/%s", tenant, timeline), &tl)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				_, err := c.App.Writer.Write(body)
				return err
			}
			w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "timeline\t%v/%v\n", tl["tenant_id"], tl["timeline_id"])
			for _, k := range []string{"term", "voted_for", "last_log_term", "pg_timeline", "timeline_start_lsn", "flush_lsn", "commit_lsn",
				"truncate_lsn", "removed_up_to", "wal_start_lsn", "wal_bytes", "remote_consistent_lsn", "retention_horizon", "retention_reason", "system_id", "wal_seg_size", "pg_version"} {
				fmt.Fprintf(w, "%s\t%v\n", strings.ReplaceAll(k, "_", " "), tl[k])
			}
			if p, ok := tl["proposer"].(map[string]any); ok {
				fmt.Fprintf(w, "proposer\t%v, term %v, since %v, sent up to %v, commit_lsn %v, last streamed %.1fs ago\n",
					p["address"], p["term"], p["since"], p["write_lsn"], p["commit_lsn"], number(p["last_push_age_seconds"]))
			} else {
				fmt.Fprintln(w, "proposer\tnone connected")
			}
			w.Flush()
			readers, _ := tl["readers"].([]any)
			fmt.Fprintf(c.App.Writer, "\nreaders: %d\n", len(readers))
			if len(readers) > 0 {
				w = tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, readersHeader)
				for _, r := range readers {
					m, _ := r.(map[string]any)
					fmt.Fprintf(w, "%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\t%s\t%s\t%s\n", m["kind"], m["address"], m["application_name"], orDash(m["slot"]),
						m["sent_lsn"], m["write_lsn"], m["flush_lsn"], m["apply_lsn"], m["lag_bytes"],
						lagText(m["write_lag_seconds"]), lagText(m["flush_lag_seconds"]), lagText(m["replay_lag_seconds"]))
				}
				w.Flush()
			}
			slots, _ := tl["slots"].([]any)
			fmt.Fprintf(c.App.Writer, "\nslots: %d\n", len(slots))
			if len(slots) > 0 {
				w = tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, slotsHeader)
				for _, s := range slots {
					m, _ := s.(map[string]any)
					fmt.Fprintf(w, "%v\t%v\t%v\t%v\n", m["slot_name"], m["temporary"], m["active"], m["restart_lsn"])
				}
				w.Flush()
			}
			return nil
		},
	}
}

func timelineDeleteCommand() *cli.Command {
	return &cli.Command{
		Name:      "delete",
		Usage:     "delete a timeline from a running safekeeper, durably",
		UsageText: "safekeeper timeline delete --tenant-id HEX --timeline-id HEX [--force] [--http HOST:PORT] [--json]",
		Description: "Removes the timeline's state, WAL and slots in one transaction (a crash leaves it whole or\n" +
			"gone). Refused while a proposer or reader is connected to it, unless --force, which ends\n" +
			"those connections first (FATAL 57P01). It is for retired timelines: stop the proposer first.\n" +
			"Deleted on every safekeeper while its proposer runs, the WAL the proposer and its standbys need\n" +
			"is gone and the proposer cannot go on (docs/http.md); deleted on one, the proposer fills it\n" +
			"again from the primary or a peer. With auth on it needs a safekeeperdata token (--token-file).",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "tenant-id", "timeline-id") },
		Flags: append([]cli.Flag{httpFlag(), jsonFlag(),
			&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)", EnvVars: []string{"SAFEKEEPER_TENANT_ID"}},
			&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)", EnvVars: []string{"SAFEKEEPER_TIMELINE_ID"}},
			&cli.BoolFlag{Name: "force", Usage: "end the timeline's connections (proposer, readers) and delete it", EnvVars: []string{"SAFEKEEPER_FORCE"}},
		}, httpClientFlags()...),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("timeline delete takes no arguments, got %q", c.Args().Slice())
			}
			tenant, timeline, err := parseIDs(c)
			if err != nil {
				return err
			}
			var res struct {
				DirExisted bool `json:"dir_existed"`
				WasActive  bool `json:"was_active"`
			}
			body, err := apiDo(c, http.MethodDelete, fmt.Sprintf("/v1/tenant/%s/timeline/%s?force=%t", tenant, timeline, c.Bool("force")), &res)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				_, err := c.App.Writer.Write(body)
				return err
			}
			if res.WasActive {
				fmt.Fprintf(c.App.Writer, "deleted timeline %s/%s (its connections were ended)\n", tenant, timeline)
			} else {
				fmt.Fprintf(c.App.Writer, "deleted timeline %s/%s\n", tenant, timeline)
			}
			return nil
		},
	}
}

// orDash is v, or "-" when the API left it out.
func orDash(v any) any {
	if v == nil || v == "" {
		return "-"
	}
	return v
}

// number is a JSON number apiGet decoded (json.Number), 0 if it is not.
func number(v any) float64 {
	n, _ := v.(json.Number)
	f, _ := n.Float64()
	return f
}

// lagText prints a lag in seconds as psql shows pg_stat_replication's
// intervals, or "-" for none (NULL there).
func lagText(v any) string {
	n, ok := v.(json.Number)
	if !ok {
		return "-"
	}
	f, err := n.Float64()
	if err != nil {
		return "-"
	}
	d := time.Duration(f * float64(time.Second))
	h, m, sec := int(d/time.Hour), int(d%time.Hour/time.Minute), (d % time.Minute).Seconds()
	return fmt.Sprintf("%02d:%02d:%09.6f", h, m, sec)
}

// securityFlags are how a client command connects to safekeepers.
func securityFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "safekeeper-sslmode", Value: "disable", Usage: "TLS to the safekeepers, as libpq's sslmode: disable, allow, prefer, require, verify-ca or verify-full"},
		&cli.StringFlag{Name: "safekeeper-sslrootcert", Usage: "CA certificate file that verify-ca and verify-full check the safekeepers' certificates against"},
		tokenFileFlag(),
	}
}

// securityFrom reads securityFlags. A --token-file is read now (a usage
// error if it cannot be) and again at every connection to a safekeeper
// (proposer.Security.PasswordFile), so that a token rotated in the file
// is taken without a restart; $SAFEKEEPER_TOKEN stays as it was at start.
func securityFrom(c *cli.Context) (proposer.Security, error) {
	tok, err := token(c)
	if err != nil {
		return proposer.Security{}, err
	}
	sec := proposer.Security{SSLMode: c.String("safekeeper-sslmode"), SSLRootCert: c.String("safekeeper-sslrootcert")}
	if f := c.String("token-file"); f != "" {
		if tok == "" {
			return sec, usagef("--token-file %s is empty", f)
		}
		sec.PasswordFile = f
	} else {
		sec.Password = tok
	}
	if err := proposer.CheckSSLMode(sec.SSLMode); err != nil {
		return sec, usagef("--safekeeper-sslmode: %w", err)
	}
	if (sec.SSLMode == "verify-ca" || sec.SSLMode == "verify-full") && sec.SSLRootCert == "" {
		return sec, usagef("--safekeeper-sslmode %s needs --safekeeper-sslrootcert (the CA that signed the safekeepers' certificates)", sec.SSLMode)
	}
	if sec.SSLRootCert != "" {
		if _, err := os.Stat(sec.SSLRootCert); err != nil {
			return sec, usagef("--safekeeper-sslrootcert: %w", err)
		}
	}
	return sec, nil
}
