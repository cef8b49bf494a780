package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/httpapi"
)

// The commands that read a running safekeeper's HTTP API (docs/http.md).

func httpFlag() cli.Flag {
	return &cli.StringFlag{Name: "http", Value: "127.0.0.1:7676", Usage: "host:port of the safekeeper's HTTP API (run --listen-http); https://host:port when it has a certificate", EnvVars: []string{"SAFEKEEPER_HTTP"}}
}

// httpClientFlags are the HTTPS and token flags of the commands that call
// the HTTP API.
func httpClientFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "http-cacert", Usage: "CA certificate file to verify an https:// --http against (default: the system's)"},
		tokenFileFlag(),
		&cli.Uint64Flag{Name: "node-id", Usage: "with --etcd-endpoints instead of --http: the safekeeper to ask, by node id (its registered HTTP address)"},
	}, etcdFlags()...)
}

// apiAddr is the HTTP API to call: --http, or with --etcd-endpoints the
// HTTP address --node-id registered.
func apiAddr(c *cli.Context) (string, error) {
	ec, err := etcdClient(c)
	if err != nil {
		return "", err
	}
	if ec == nil {
		if c.IsSet("node-id") {
			return "", usagef("--node-id goes with --etcd-endpoints")
		}
		return c.String("http"), nil
	}
	defer ec.Close()
	switch {
	case c.IsSet("http"):
		return "", usagef("--http and --etcd-endpoints exclude each other: the address comes from one or the other")
	case c.Uint64("node-id") == 0:
		return "", usagef("--etcd-endpoints needs --node-id: which safekeeper to ask")
	}
	id := c.Uint64("node-id")
	ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
	defer cancel()
	nodes, _, _, err := ec.Nodes(ctx)
	if err != nil {
		return "", err
	}
	for _, n := range nodes {
		if n.ID != id {
			continue
		}
		if n.HTTP == "" {
			return "", fmt.Errorf("node %d registered no HTTP address (its run has no --listen-http)", id)
		}
		return n.HTTP, nil
	}
	return "", fmt.Errorf("node %d is not registered in etcd (%s, prefix %s)", id, ec.Endpoints(), ec.Prefix())
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

// apiClient is the client of the HTTP API at --http: verifying an
// https:// API against --http-cacert, presenting the token.
func apiClient(c *cli.Context) (*httpapi.Client, error) {
	addr, err := apiAddr(c)
	if err != nil {
		return nil, err
	}
	_, hostPort := httpapi.SplitAddr(addr)
	if err := checkDialAddr(hostPort); err != nil {
		return nil, usagef("--http %q: %w", addr, err)
	}
	var pool *x509.CertPool
	if f := c.String("http-cacert"); f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, usagef("--http-cacert: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("--http-cacert %s: no PEM certificate in it", f)
		}
	}
	tok, err := token(c)
	if err != nil {
		return nil, err
	}
	return httpapi.NewClient(addr, pool, tok), nil
}

// apiCall runs one call of the HTTP API at --http, bounded to 10 s, and
// returns its answer and raw body. An error answer is one line naming its
// status.
func apiCall[T any](c *cli.Context, call func(*httpapi.Client, context.Context) (T, []byte, error)) (T, []byte, error) {
	var zero T
	api, err := apiClient(c)
	if err != nil {
		return zero, nil, err
	}
	ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
	defer cancel()
	v, body, err := call(api, ctx)
	if err != nil {
		return zero, nil, apiError(err)
	}
	return v, body, nil
}

// apiError is an error of the HTTP API client as a command reports it: a
// plain request to the API's HTTPS port is a usage error naming --http.
func apiError(err error) error {
	var he *httpapi.HTTPSError
	if errors.As(err, &he) {
		return usagef("--http %s: the safekeeper's HTTP API serves HTTPS there: use --http https://%s, with --http-cacert CA.pem unless the system trusts its certificate", he.Addr, he.Host)
	}
	return err
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
			st, body, err := apiCall(c, (*httpapi.Client).Status)
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
			list, body, err := apiCall(c, (*httpapi.Client).Timelines)
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
				fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", t.TenantID, t.TimelineID, t.Term, t.PgTimeline, t.FlushLSN, t.CommitLSN, t.RemovedUpTo)
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
			key := proto.TimelineKey{TenantID: tenant, TimelineID: timeline}
			tl, body, err := apiCall(c, func(api *httpapi.Client, ctx context.Context) (*httpapi.Timeline, []byte, error) {
				return api.Timeline(ctx, key)
			})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				_, err := c.App.Writer.Write(body)
				return err
			}
			printTimeline(c.App.Writer, tl)
			return nil
		},
	}
}

func timelineDeleteCommand() *cli.Command {
	return &cli.Command{
		Name:      "delete",
		Usage:     "delete a timeline from a running safekeeper, durably",
		UsageText: "safekeeper timeline delete --tenant-id HEX --timeline-id HEX [--force] [--archive] [--http HOST:PORT] [--json]",
		Description: "Removes the timeline's state, WAL and slots in one transaction (a crash leaves it whole or\n" +
			"gone). Refused while a proposer or reader is connected to it, unless --force, which ends\n" +
			"those connections first (FATAL 57P01). It is for retired timelines: stop the proposer first.\n" +
			"Deleted on every safekeeper while its proposer runs, the WAL the proposer and its standbys need\n" +
			"is gone and the proposer cannot go on (docs/http.md); deleted on one, the proposer fills it\n" +
			"again from the primary or a peer. With auth on it needs a safekeeperdata token (--token-file).\n" +
			"The timeline's WAL archive (--remote-storage) stays, the backup of last resort, unless\n" +
			"--archive: then the safekeeper deletes it too, every object, after the local delete.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "tenant-id", "timeline-id") },
		Flags: append([]cli.Flag{httpFlag(), jsonFlag(),
			&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)", EnvVars: []string{"SAFEKEEPER_TENANT_ID"}},
			&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)", EnvVars: []string{"SAFEKEEPER_TIMELINE_ID"}},
			&cli.BoolFlag{Name: "force", Usage: "end the timeline's connections (proposer, readers) and delete it", EnvVars: []string{"SAFEKEEPER_FORCE"}},
			&cli.BoolFlag{Name: "archive", Usage: "delete the timeline's WAL archive too (kept otherwise)"},
		}, httpClientFlags()...),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("timeline delete takes no arguments, got %q", c.Args().Slice())
			}
			tenant, timeline, err := parseIDs(c)
			if err != nil {
				return err
			}
			key := proto.TimelineKey{TenantID: tenant, TimelineID: timeline}
			res, body, err := apiCall(c, func(api *httpapi.Client, ctx context.Context) (*httpapi.DeleteResult, []byte, error) {
				return api.DeleteTimeline(ctx, key, c.Bool("force"), c.Bool("archive"))
			})
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
			if res.ArchiveObjectsDeleted != nil {
				fmt.Fprintf(c.App.Writer, "deleted its archive: %d objects\n", *res.ArchiveObjectsDeleted)
			}
			return nil
		},
	}
}

// printTimeline prints timeline show's tables.
func printTimeline(out io.Writer, tl *httpapi.Timeline) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "timeline\t%s/%s\n", tl.TenantID, tl.TimelineID)
	for _, r := range []struct {
		name string
		v    any
	}{{"term", tl.Term}, {"voted_for", tl.VotedFor}, {"last_log_term", tl.LastLogTerm}, {"pg_timeline", tl.PgTimeline},
		{"timeline_start_lsn", tl.TimelineStartLSN}, {"flush_lsn", tl.FlushLSN}, {"commit_lsn", tl.CommitLSN},
		{"truncate_lsn", tl.TruncateLSN}, {"removed_up_to", tl.RemovedUpTo}, {"wal_start_lsn", tl.WALStartLSN}, {"wal_bytes", tl.WALBytes},
		{"remote_consistent_lsn", tl.RemoteConsistentLSN}, {"retention_horizon", tl.RetentionHorizon}, {"retention_reason", tl.RetentionReason},
		{"system_id", tl.SystemID}, {"wal_seg_size", tl.WalSegSize}, {"pg_version", tl.PgVersion}} {
		fmt.Fprintf(w, "%s\t%v\n", strings.ReplaceAll(r.name, "_", " "), r.v)
	}
	if tl.BackupLagBytes != nil && tl.BackupLagSeconds != nil {
		fmt.Fprintf(w, "backup lsn\t%s (archive behind commit_lsn by %d bytes, for %.1fs)\n", tl.BackupLSN, *tl.BackupLagBytes, *tl.BackupLagSeconds)
	} else {
		fmt.Fprintf(w, "backup lsn\t%s (no archive)\n", tl.BackupLSN)
	}
	if p := tl.Proposer; p != nil {
		fmt.Fprintf(w, "proposer\t%s, term %d, since %s, sent up to %s, commit_lsn %s, last streamed %.1fs ago\n",
			p.Address, p.Term, p.Since.Format(time.RFC3339Nano), p.WriteLSN, p.CommitLSN, p.LastPushAge)
	} else {
		fmt.Fprintln(w, "proposer\tnone connected")
	}
	w.Flush()
	fmt.Fprintf(out, "\nreaders: %d\n", len(tl.Readers))
	if len(tl.Readers) > 0 {
		w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, readersHeader)
		for _, r := range tl.Readers {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.Kind, r.Address, r.ApplicationName, orDash(r.Slot),
				r.SentLSN, r.WriteLSN, r.FlushLSN, r.ApplyLSN, r.LagBytes, lagText(r.WriteLag), lagText(r.FlushLag), lagText(r.ReplayLag))
		}
		w.Flush()
	}
	fmt.Fprintf(out, "\nslots: %d\n", len(tl.Slots))
	if len(tl.Slots) > 0 {
		w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, slotsHeader)
		for _, s := range tl.Slots {
			fmt.Fprintf(w, "%s\t%t\t%t\t%s\n", s.Name, s.Temporary, s.Active, s.RestartLSN)
		}
		w.Flush()
	}
}

// orDash is s, or "-" when the API left it out.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// lagText prints a lag in seconds as psql shows pg_stat_replication's
// intervals, or "-" for none (NULL there).
func lagText(secs *float64) string {
	if secs == nil {
		return "-"
	}
	d := time.Duration(*secs * float64(time.Second))
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
