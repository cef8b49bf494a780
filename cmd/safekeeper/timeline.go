package main

import (
	"context"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/timeline"
)

func timelineCommand() *cli.Command {
	return &cli.Command{
		Name:            "timeline",
		Usage:           "manage a safekeeper's timelines",
		OnUsageError:    func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Subcommands:     []*cli.Command{timelineCreateCommand(), timelineMembersCommand(), timelineListCommand(), timelineShowCommand(), timelineDeleteCommand(), timelinePullCommand()},
		HideHelpCommand: true,
		Action: func(c *cli.Context) error {
			if c.Args().First() == "help" {
				return c.App.RunContext(c.Context, append([]string{c.App.Name, "help", "timeline"}, c.Args().Tail()...))
			}
			if c.NArg() > 0 {
				return usagef("unknown command \"timeline %s\"; 'safekeeper help timeline' lists its subcommands", c.Args().First())
			}
			return cli.ShowSubcommandHelp(c)
		},
	}
}

func timelinePullCommand() *cli.Command {
	return &cli.Command{
		Name:      "pull",
		Usage:     "copy a whole timeline from a peer safekeeper into this one's data directory (server must be stopped)",
		UsageText: "safekeeper timeline pull --from HOST:PORT --data-dir DIR --tenant-id HEX --timeline-id HEX",
		Description: "For a safekeeper that lacks a timeline its peers hold (a replaced disk, a peer that was away\n" +
			"longer than their --max-peer-wal-keep-size): copies the peer's control state (vote, term\n" +
			"history, flush_lsn, commit_lsn; after a promotion, the PostgreSQL timeline's history file) and\n" +
			"its WAL, from the timeline start if the peer still holds it,\n" +
			"else from the first whole segment it holds, up to its flush_lsn (read as a term reader of its\n" +
			"term). Atomic: the WAL goes in in transactions that leave the timeline empty until the last one,\n" +
			"which writes the state; a crash or failure mid-pull leaves an empty timeline that a new pull (or\n" +
			"the proposer) fills. Refuses a timeline the data directory already holds WAL of, and a data\n" +
			"directory a running safekeeper holds. Start the safekeeper afterwards; the proposer streams it the\n" +
			"rest.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "from", "data-dir", "tenant-id", "timeline-id") },
		Flags: append([]cli.Flag{jsonFlag(),
			&cli.StringFlag{Name: "from", Usage: "host:port of the peer safekeeper to copy from (required)"},
			&cli.StringFlag{Name: "data-dir", Usage: "this safekeeper's data directory (required)"},
			&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)"},
			&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)"},
			&cli.DurationFlag{Name: "timeout", Value: 30 * time.Minute, Usage: "give up (exit 1) after this long"},
		}, securityFlags()...),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("timeline pull takes no arguments, got %q", c.Args().Slice())
			}
			if err := checkDialAddr(c.String("from")); err != nil {
				return usagef("--from %q: %w", c.String("from"), err)
			}
			tenant, timeline, err := parseIDs(c)
			if err != nil {
				return err
			}
			if err := checkDataDir(c); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			return pullTimeline(ctx, c, proto.TimelineKey{TenantID: tenant, TimelineID: timeline})
		},
	}
}

func pullTimeline(ctx context.Context, c *cli.Context, key proto.TimelineKey) error {
	sec, err := securityFrom(c)
	if err != nil {
		return err
	}
	from := c.String("from")
	res, err := timeline.Pull(ctx, timeline.PullConfig{DataDir: c.String("data-dir"), Key: key, From: from, Security: sec})
	if err != nil {
		return fmt.Errorf("timeline pull: %w", err)
	}
	if c.Bool("json") {
		return writeJSONLine(c, map[string]any{"tenant_id": key.TenantID.String(), "timeline_id": key.TimelineID.String(), "from": from,
			"wal_start_lsn": res.WALStart, "flush_lsn": res.FlushLSN, "wal_bytes": uint64(res.FlushLSN - res.WALStart), "term": res.Term,
			"commit_lsn": res.CommitLSN, "pg_timeline": res.PgTimeline, "pg_history_bytes": res.PgHistoryBytes, "slots": res.Slots})
	}
	hist := ""
	if res.PgHistoryBytes > 0 {
		hist = fmt.Sprintf(" and its history file (%d bytes)", res.PgHistoryBytes)
	}
	nslots := fmt.Sprintf("%d replication slots", res.Slots)
	if res.Slots == 1 {
		nslots = "1 replication slot"
	}
	fmt.Fprintf(c.App.Writer, "pulled timeline %s/%s from %s: WAL %s..%s (%d bytes), term %d, commit_lsn %s, PostgreSQL timeline %d%s, %s\n",
		key.TenantID, key.TimelineID, from, res.WALStart, res.FlushLSN, uint64(res.FlushLSN-res.WALStart), res.Term, res.CommitLSN, res.PgTimeline, hist, nslots)
	return nil
}
