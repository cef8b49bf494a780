package main

import (
	"context"
	"errors"
	"fmt"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proposer"
)

func syncCommand() *cli.Command {
	return &cli.Command{
		Name:      "sync",
		Usage:     "elect without generating WAL and bring a quorum to the end of WAL, committed; print that LSN",
		UsageText: "safekeeper sync --safekeepers H:P,H:P,H:P --tenant-id HEX --timeline-id HEX [--timeout 30s]",
		Description: "The disaster-recovery step after the primary is lost. Runs an election with a new term on the\n" +
			"safekeepers, picks the donor's end of WAL, copies what each reachable safekeeper lacks from the\n" +
			"donor, waits until every reachable safekeeper (and at least a quorum) has commit_lsn at that point,\n" +
			"then prints it as X/X. Afterwards a standby reading from any safekeeper gets all acknowledged WAL.\n" +
			"The timeline's system id, version, segment size and TLI are read from the safekeepers\n" +
			"(TIMELINE_STATUS) unless --system-id is given.\n" +
			"Exit codes: 0 success, 1 no quorum within --timeout or another error, 2 usage, 3 deposed.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "safekeepers", Required: true, Usage: "comma-separated host:port list of every safekeeper of the timeline"},
			&cli.StringFlag{Name: "tenant-id", Required: true, Usage: "tenant id, 32 hex digits"},
			&cli.StringFlag{Name: "timeline-id", Required: true, Usage: "timeline id, 32 hex digits"},
			&cli.Uint64Flag{Name: "system-id", Usage: "the primary's database system identifier (default: read from the safekeepers, with the three flags below)"},
			&cli.UintFlag{Name: "pg-version", Value: 150000, Usage: "with --system-id: PG_VERSION_NUM of the primary (only the major version must match)"},
			&cli.UintFlag{Name: "wal-seg-size", Value: 16 << 20, Usage: "with --system-id: WAL segment size in bytes (must match the timeline's)"},
			&cli.UintFlag{Name: "pg-timeline", Value: 1, Usage: "with --system-id: PostgreSQL timeline id (TLI) of the timeline"},
			&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "give up (exit 1) if no quorum is synced within this time"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("sync takes no arguments, got %q", c.Args().Slice())
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
			if c.Duration("timeout") <= 0 {
				return usagef("--timeout must be positive")
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, c.Duration("timeout"))
			defer cancel()
			lsn, err := proposer.Sync(ctx, proposer.SyncConfig{
				Safekeepers: sks, TenantID: tenant, TimelineID: timeline, SystemID: c.Uint64("system-id"),
				PgVersion: uint32(c.Uint("pg-version")), WalSegSize: uint32(c.Uint("wal-seg-size")),
				PgTimeline: uint32(c.Uint("pg-timeline")), Logger: log,
			})
			switch {
			case errors.Is(err, proposer.ErrNoWAL):
				log.Info("the timeline has no WAL on a quorum")
			case errors.Is(err, proposer.ErrDeposed):
				return cli.Exit("deposed: "+err.Error(), exitDeposed)
			case err != nil:
				return err
			}
			fmt.Fprintln(c.App.Writer, lsn)
			return nil
		},
	}
}
