package main

import (
	"errors"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/timeline"
)

func walCommand() *cli.Command {
	return &cli.Command{
		Name:         "wal",
		Usage:        "offline tools for a safekeeper's stored WAL",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Subcommands:  []*cli.Command{walExportCommand(), walFetchCommand(), walDumpCommand()},
		// No "wal help" subcommand of urfave/cli's: it answers an unknown
		// name with an error that cannot be told from a failure.
		HideHelpCommand: true,
		Action: func(c *cli.Context) error {
			if c.Args().First() == "help" {
				// `safekeeper wal help [SUB]`, as `safekeeper help wal [SUB]`.
				return c.App.RunContext(c.Context, append([]string{c.App.Name, "help", "wal"}, c.Args().Tail()...))
			}
			if c.NArg() > 0 {
				return usagef("unknown command \"wal %s\"; 'safekeeper help wal' lists its subcommands", c.Args().First())
			}
			return cli.ShowSubcommandHelp(c)
		},
	}
}

func walExportCommand() *cli.Command {
	return &cli.Command{
		Name:      "export",
		Usage:     "write a timeline's committed WAL as pg_wal segment files (server must be stopped)",
		UsageText: "safekeeper wal export --data-dir DIR --tenant-id HEX --timeline-id HEX --output DIR [--upto LSN]",
		Description: "Reads the data directory offline and writes the timeline's WAL up to commit_lsn (or\n" +
			"--upto, which may not be above commit_lsn) as segment files named like pg_wal's\n" +
			"(TTTTTTTTXXXXXXXXYYYYYYYY). The unfinished last segment gets its own name too, full size and\n" +
			"zero-padded: a restore_command is only ever asked for that name, never for NAME.partial, so\n" +
			"`cp %f %p` over this directory replays every exported commit and then finds the end of WAL\n" +
			"(a NAME.partial left in --output is removed). Only segments the timeline holds from their\n" +
			"first byte are written: bytes before timeline_start_lsn (or removed by retention) are\n" +
			"unknown, so a timeline that does not start at a segment boundary skips its first segment.\n" +
			"After a promotion (the timeline is on a PostgreSQL timeline above 1) the history files of that\n" +
			"timeline and its ancestors (TTTTTTTT.history, as PostgreSQL wrote them) are written too:\n" +
			"recovery needs them to follow the promotion rather than end at the first timeline's end.\n" +
			"For a restore while the safekeepers run, use `safekeeper wal fetch` as restore_command.\n" +
			"Refuses to run while a safekeeper holds the data directory.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "data-dir", "tenant-id", "timeline-id", "output") },
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "data-dir", Usage: "the safekeeper's data directory (holding safekeeper.db) (required)"},
			&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)"},
			&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)"},
			&cli.StringFlag{Name: "output", Usage: "directory to write the segment files to (created if missing) (required)"},
			&cli.StringFlag{Name: "upto", Usage: "export only up to this LSN (X/X), above the timeline's start and at most its commit_lsn"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("wal export takes no arguments, got %q", c.Args().Slice())
			}
			tenant, timelineID, err := parseIDs(c)
			if err != nil {
				return err
			}
			if err := checkDataDir(c); err != nil {
				return err
			}
			var upto *proto.LSN // nil: up to commit_lsn
			if c.IsSet("upto") {
				l, err := proto.ParseLSN(c.String("upto"))
				if err != nil {
					return usagef("--upto: %w", err)
				}
				upto = &l
			}
			prog := newProgress(c.App.ErrWriter, 0)
			err = timeline.Export(c.String("data-dir"), proto.TimelineKey{TenantID: tenant, TimelineID: timelineID},
				c.String("output"), upto, prog.above(c.App.Writer), func(done, total int64) {
					prog.total = total
					prog.set(done)
				})
			prog.finish()
			if errors.Is(err, timeline.ErrExportRange) {
				return usageError{err} // --upto outside what the timeline holds
			}
			return err
		},
	}
}
