package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proposer"
)

func timelineCreateCommand() *cli.Command {
	return &cli.Command{
		Name:      "create",
		Usage:     "create a new timeline on its safekeepers, before its proposer's first start",
		UsageText: "safekeeper timeline create --safekeepers H:P,H:P,H:P --tenant-id HEX --timeline-id HEX (--upstream 'host=... user=...' | --system-id N [--pg-version N] [--wal-seg-size N] [--pg-timeline N])",
		Description: "`propose` never creates a timeline unless told to (its --create), so that one mistyped id\n" +
			"cannot start a new timeline and fork the WAL. This is the step that creates it, once: it greets\n" +
			"every safekeeper with a greeting allowed to create the timeline, and each one creates it\n" +
			"durably before it answers. The primary's system id, version, segment size and PostgreSQL\n" +
			"timeline are read from --upstream (a replication connection), or given by --system-id and its\n" +
			"companions. A safekeeper that holds the timeline already answers its state (creating twice is\n" +
			"harmless); one holding it for another cluster refuses (22023).\n" +
			"Prints one line per safekeeper. Exit codes: 0 when a quorum holds the timeline (the others get\n" +
			"it at the proposer's first greeting), 1 otherwise (nothing to undo: start it again once they are\n" +
			"up), 2 usage, 4 a safekeeper holds the timeline for another cluster.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "safekeepers", "tenant-id", "timeline-id") },
		Flags: slices.Concat([]cli.Flag{jsonFlag()}, safekeeperFlags(),
			[]cli.Flag{&cli.StringFlag{Name: "upstream", Usage: "libpq connection string of the primary, to read its system id, version, segment size and timeline from (or --system-id)"}},
			timelineDescFlags("the primary's database system identifier (SELECT system_identifier FROM pg_control_system()), instead of --upstream"),
			[]cli.Flag{&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "give up on a safekeeper that has not answered within this time"}},
			securityFlags()),
		Action: func(c *cli.Context) error {
			_, tl, err := timelineArgs(c)
			if err != nil {
				return err
			}
			if err := checkTimelineFlags(c); err != nil {
				return err
			}
			cfg := proposer.CreateConfig{Safekeepers: tl.safekeepers, TenantID: tl.tenant, TimelineID: tl.timeline}
			switch up := c.String("upstream"); {
			case up != "" && c.IsSet("system-id"):
				return usagef("--upstream and --system-id exclude each other: the primary's own identity is read from --upstream")
			case c.IsSet("upstream"):
				if err := checkUpstream(up); err != nil {
					return err
				}
				for _, f := range []string{"pg-version", "wal-seg-size", "pg-timeline"} {
					if c.IsSet(f) {
						return usagef("--%s goes with --system-id; with --upstream it is read from the primary", f)
					}
				}
				cfg.Upstream = up
			case c.Uint64("system-id") == 0:
				return usagef("--upstream or --system-id is required: the new timeline records the primary's system id")
			default:
				cfg.SystemID, cfg.PgVersion = c.Uint64("system-id"), uint32(c.Uint("pg-version"))
				cfg.WalSegSize, cfg.PgTimeline = uint32(c.Uint("wal-seg-size")), uint32(c.Uint("pg-timeline"))
			}
			if c.Duration("timeout") <= 0 {
				return usagef("--timeout must be positive")
			}
			if cfg.Security, err = securityFrom(c); err != nil {
				return err
			}
			cfg.ConnectTimeout = c.Duration("timeout")
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			res, err := proposer.CreateTimeline(ctx, cfg)
			if res == nil && err != nil {
				return err
			}
			incompatible := false
			type line struct {
				Safekeeper string `json:"safekeeper"`
				Holds      bool   `json:"holds"`
				Term       uint64 `json:"term"`
				FlushLSN   string `json:"flush_lsn,omitempty"`
				Error      string `json:"error,omitempty"`
			}
			var lines []line
			for _, r := range res {
				var pe *pgconn.PgError
				if errors.As(r.Err, &pe) && pe.Code == "22023" {
					incompatible = true
				}
				l := line{Safekeeper: r.Addr, Holds: r.Err == nil}
				if r.Err != nil {
					l.Error = r.Err.Error()
				} else {
					l.Term, l.FlushLSN = r.Info.VotedFor.Term, r.Info.FlushLSN.String()
				}
				lines = append(lines, l)
			}
			if c.Bool("json") {
				if err := writeJSONLine(c, map[string]any{"tenant_id": tl.tenant.String(), "timeline_id": tl.timeline.String(), "safekeepers": lines}); err != nil {
					return err
				}
			} else {
				for _, l := range lines {
					if l.Holds {
						fmt.Fprintf(c.App.Writer, "%s: holds timeline %s/%s (term %d, flush_lsn %s)\n", l.Safekeeper, tl.tenant, tl.timeline, l.Term, l.FlushLSN)
					} else {
						fmt.Fprintf(c.App.Writer, "%s: %s\n", l.Safekeeper, l.Error)
					}
				}
			}
			switch {
			case incompatible:
				return cli.Exit(fmt.Sprintf("a safekeeper refuses the description of timeline %s/%s it holds (22023: another cluster, major version, segment size, or an older PostgreSQL timeline; its line above says which): check the ids and --upstream", tl.tenant, tl.timeline), exitPermanent)
			case err != nil:
				return err
			}
			return nil
		},
	}
}
