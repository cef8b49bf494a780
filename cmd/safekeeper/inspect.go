package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/server/timeline"
)

func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:      "inspect",
		Usage:     "show what a data directory holds, offline and read-only (server stopped)",
		UsageText: "safekeeper inspect --data-dir DIR [--tenant-id HEX] [--timeline-id HEX] [--json]",
		Description: "Opens DIR/safekeeper.db read-only and prints the node id and, for every timeline (or those\n" +
			"matching --tenant-id/--timeline-id), its durable control state: term, vote, term history,\n" +
			"timeline start, flush/commit/truncate LSNs, the WAL range and bytes held, the PostgreSQL\n" +
			"version, system id, timeline and history, and the persistent slots. It never writes. A\n" +
			"data directory held by a running safekeeper is refused at once: ask that server with\n" +
			"`safekeeper status` and `safekeeper timeline show` instead.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "data-dir") },
		Flags: []cli.Flag{jsonFlag(),
			&cli.StringFlag{Name: "data-dir", Usage: "the safekeeper's data directory (holding safekeeper.db) (required)"},
			&cli.StringFlag{Name: "tenant-id", Usage: "only this tenant's timelines (32 hex digits)"},
			&cli.StringFlag{Name: "timeline-id", Usage: "only this timeline (32 hex digits)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("inspect takes no arguments, got %q", c.Args().Slice())
			}
			var tenant, timeline *proto.ID
			for _, f := range []struct {
				name string
				dst  **proto.ID
			}{{"tenant-id", &tenant}, {"timeline-id", &timeline}} {
				if c.IsSet(f.name) {
					id, err := proto.ParseID(c.String(f.name))
					if err != nil {
						return usagef("--%s: %w", f.name, err)
					}
					*f.dst = &id
				}
			}
			if err := checkDataDir(c); err != nil {
				return err
			}
			out, err := inspect(c.String("data-dir"), tenant, timeline)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return writeJSONLine(c, out)
			}
			printInspect(c, out)
			return nil
		},
	}
}

// inspect reads dir's database read-only (timeline.Inspect), the
// timelines of tenant and timeline when given.
func inspect(dir string, tenant, timelineID *proto.ID) (*httpapi.Inspection, error) {
	fi, err := os.Stat(filepath.Join(dir, timeline.DatabaseFile))
	if err != nil {
		return nil, fmt.Errorf("inspect: %w (is %s a safekeeper's data directory?)", err, dir)
	}
	in, err := timeline.Inspect(dir, func(k proto.TimelineKey) bool {
		return (tenant == nil || k.TenantID == *tenant) && (timelineID == nil || k.TimelineID == *timelineID)
	})
	if errors.Is(err, timeline.ErrInUse) {
		return nil, fmt.Errorf("inspect: %s is held by a running safekeeper; ask it instead: `safekeeper status --http HOST:PORT`, "+
			"`safekeeper timeline list` and `safekeeper timeline show` (its --listen-http)", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: %w", err)
	}
	if (tenant != nil || timelineID != nil) && len(in.Timelines) == 0 {
		return nil, fmt.Errorf("inspect: no timeline in %s matches --tenant-id/--timeline-id (%d stored)", dir, in.StoredCount)
	}
	return httpapi.NewInspection(dir, fi.Size(), in), nil
}

func printInspect(c *cli.Context, out *httpapi.Inspection) {
	w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "data dir\t%s\n", out.DataDir)
	if out.NodeID != nil {
		fmt.Fprintf(w, "node id\t%d\n", *out.NodeID)
	} else {
		fmt.Fprintln(w, "node id\tnone recorded")
	}
	fmt.Fprintf(w, "database\t%d bytes\n", out.FileBytes)
	fmt.Fprintf(w, "timelines\t%d\n", len(out.Timelines))
	w.Flush()
	for _, t := range out.Timelines {
		fmt.Fprintf(c.App.Writer, "\ntimeline %s/%s\n", t.TenantID, t.TimelineID)
		w = tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
		var hist []string
		for _, e := range t.TermHistory {
			hist = append(hist, fmt.Sprintf("%d@%s", e.Term, e.StartLSN))
		}
		rows := [][2]any{
			{"term", t.Term}, {"voted for", t.VotedFor}, {"last log term", t.LastLogTerm}, {"term history", strings.Join(hist, " ")},
			{"timeline start lsn", t.TimelineStartLSN}, {"flush lsn", t.FlushLSN}, {"commit lsn", t.CommitLSN}, {"truncate lsn", t.TruncateLSN},
			{"removed up to", t.RemovedUpTo}, {"wal", fmt.Sprintf("%s..%s, %d bytes", t.WALStartLSN, t.WALEndLSN, t.WALBytes)},
			{"pg version", t.PgVersion}, {"system id", t.SystemID}, {"pg timeline", t.PgTimeline}, {"wal seg size", t.WalSegSize},
		}
		for _, r := range rows {
			fmt.Fprintf(w, "  %s\t%v\n", r[0], r[1])
		}
		if t.PgHistory != "" {
			fmt.Fprintf(w, "  pg history\t%s\n", strings.ReplaceAll(strings.TrimSpace(t.PgHistory), "\n", "; "))
		}
		if len(t.Slots) == 0 {
			fmt.Fprintln(w, "  slots\tnone")
		}
		for _, s := range t.Slots {
			fmt.Fprintf(w, "  slot %s\trestart_lsn %s on timeline %d\n", s.Name, s.RestartLSN, s.RestartTLI)
		}
		w.Flush()
	}
}
