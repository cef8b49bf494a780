package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
)

// exitDeposed is the exit code of `propose` when another proposer took over
// the timeline with a higher term (docs/proposer.md).
const exitDeposed = 3

func proposeCommand() *cli.Command {
	return &cli.Command{
		Name:      "propose",
		Usage:     "stream a PostgreSQL primary's WAL to a quorum of safekeepers (the walproposer)",
		UsageText: "safekeeper propose --upstream 'host=... port=... user=...' --safekeepers H:P,H:P,H:P --tenant-id HEX --timeline-id HEX [--slot NAME] [--application-name NAME] [--buffer-size 64MiB]",
		Description: "Connects to the primary as a physical replication client (creating or reusing a\n" +
			"physical slot), wins an election on the safekeepers, and streams WAL to all of them.\n" +
			"It reports flush = the quorum commit_lsn, so with synchronous_standby_names naming\n" +
			"--application-name every commit waits until a quorum of safekeepers has it durable.\n" +
			"Reconnects with backoff. Exit codes: 0 after SIGTERM/SIGINT, 2 usage error,\n" +
			"3 deposed (a higher term appeared on a safekeeper), 1 any other error.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "upstream", Required: true, Usage: "libpq connection string of the primary, e.g. 'host=127.0.0.1 port=5432 user=postgres'"},
			&cli.StringFlag{Name: "safekeepers", Required: true, Usage: "comma-separated host:port list of every safekeeper of the timeline"},
			&cli.StringFlag{Name: "tenant-id", Required: true, Usage: "tenant id, 32 hex digits"},
			&cli.StringFlag{Name: "timeline-id", Required: true, Usage: "timeline id, 32 hex digits"},
			&cli.StringFlag{Name: "slot", Value: "proposer", Usage: "physical replication slot on the primary (created with RESERVE_WAL if missing)"},
			&cli.StringFlag{Name: "application-name", Value: "proposer", Usage: "application_name on the primary; name it in synchronous_standby_names"},
			&cli.StringFlag{Name: "buffer-size", Value: "64MiB", Usage: "in-memory WAL kept for lagging safekeepers (e.g. 64MiB); older WAL is re-read from the primary"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("propose takes no arguments, got %q", c.Args().Slice())
			}
			log, err := logger(c)
			if err != nil {
				return err
			}
			sks, err := parseSafekeepers(c.String("safekeepers"))
			if err != nil {
				return err
			}
			tenant, timeline, err := parseIDs(c)
			if err != nil {
				return err
			}
			bufSize, err := parseByteSize(c.String("buffer-size"))
			if err != nil {
				return usagef("--buffer-size: %v", err)
			}
			if _, err := pgconn.ParseConfig(c.String("upstream")); err != nil {
				return usagef("--upstream: %v", err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			err = proposer.Run(ctx, proposer.Config{
				Upstream: c.String("upstream"), Safekeepers: sks, TenantID: tenant, TimelineID: timeline,
				SlotName: c.String("slot"), ApplicationName: c.String("application-name"), Logger: log,
				BufferSize: bufSize,
			})
			if errors.Is(err, proposer.ErrDeposed) {
				return cli.Exit("deposed: "+err.Error()+"; another proposer owns the timeline now", exitDeposed)
			}
			if err == nil {
				log.Info("stopped")
			}
			return err
		},
	}
}

// parseSafekeepers parses the --safekeepers list. An address given twice is
// refused: it would count one safekeeper twice toward the quorum. (Two
// spellings of one server are caught later, by safekeeper_id.)
func parseSafekeepers(s string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" {
			return nil, usagef("--safekeepers: %q is not host:port", a)
		}
		key := strings.ToLower(net.JoinHostPort(host, port))
		if seen[key] {
			return nil, usagef("--safekeepers: %s is listed twice; one safekeeper must not count twice toward the quorum", a)
		}
		seen[key] = true
		out = append(out, a)
	}
	return out, nil
}

func parseIDs(c *cli.Context) (tenant, timeline proto.ID, err error) {
	if tenant, err = proto.ParseID(c.String("tenant-id")); err != nil {
		return tenant, timeline, usagef("--tenant-id: %v", err)
	}
	if timeline, err = proto.ParseID(c.String("timeline-id")); err != nil {
		return tenant, timeline, usagef("--timeline-id: %v", err)
	}
	return tenant, timeline, nil
}

// parseByteSize parses "1048576", "512KiB", "64MiB" or "1GiB".
func parseByteSize(s string) (int, error) {
	mult := 1
	for _, u := range []struct {
		suf string
		m   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSuffix(s, u.suf), u.m
			break
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("%q is not a size like 64MiB", s)
	}
	return n * mult, nil
}
