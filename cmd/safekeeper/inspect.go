package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/storage"
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

// inspect reads dir's database read-only.
func inspect(dir string, tenant, timeline *proto.ID) (*httpapi.Inspection, error) {
	path := filepath.Join(dir, "safekeeper.db")
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("inspect: %w (is %s a safekeeper's data directory?)", err, dir)
	}
	db, err := storage.Open(path, storage.Options{ReadOnly: true, Timeout: 200 * time.Millisecond})
	if errors.Is(err, storage.ErrLocked) {
		return nil, fmt.Errorf("inspect: %s is held by a running safekeeper; ask it instead: `safekeeper status --http HOST:PORT`, "+
			"`safekeeper timeline list` and `safekeeper timeline show` (its --listen-http)", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: %w", err)
	}
	defer db.Close()
	out := &httpapi.Inspection{DataDir: dir, FileBytes: fi.Size(), Timelines: []httpapi.StoredTimeline{}}
	if id, ok, err := db.NodeID(); err != nil {
		return nil, fmt.Errorf("inspect: %w", err)
	} else if ok {
		out.NodeID = &id
	}
	keys, err := db.Timelines()
	if err != nil {
		return nil, fmt.Errorf("inspect: %w", err)
	}
	for _, k := range keys {
		if (tenant != nil && k.TenantID != *tenant) || (timeline != nil && k.TimelineID != *timeline) {
			continue
		}
		tl, st, err := db.OpenTimeline(k.TenantID, k.TimelineID)
		if err != nil {
			return nil, fmt.Errorf("inspect: timeline %s: %w", k, err)
		}
		j := httpapi.StoredTimeline{
			TimelineState: httpapi.TimelineState{
				TenantID: k.TenantID.String(), TimelineID: k.TimelineID.String(), Term: st.VotedFor.Term, VotedFor: st.VotedFor.String(),
				LastLogTerm: st.LastLogTerm(), TermHistory: []httpapi.TermSwitch{}, TimelineStartLSN: st.TimelineStartLSN, FlushLSN: st.FlushLSN,
				CommitLSN: st.CommitLSN, TruncateLSN: st.TruncateLSN, RemovedUpTo: max(st.RemovedUpTo, tl.RemovedUpTo()),
			},
			WALEndLSN: tl.EndLSN(), PgVersion: st.PgVersion, PgTimeline: st.PgTimeline, PgHistory: string(st.PgHistory), SystemID: st.SystemID,
			WalSegSize: st.WalSegSize, Slots: []httpapi.StoredSlot{},
		}
		for _, e := range st.History {
			j.TermHistory = append(j.TermHistory, httpapi.TermSwitch{Term: e.Term, StartLSN: e.StartLSN})
		}
		if st.TimelineStartLSN != 0 {
			j.WALStartLSN = max(j.RemovedUpTo, st.TimelineStartLSN)
			if j.WALEndLSN > j.WALStartLSN {
				j.WALBytes = uint64(j.WALEndLSN - j.WALStartLSN)
			}
		}
		slots, err := tl.Slots()
		if err != nil {
			return nil, fmt.Errorf("inspect: timeline %s: %w", k, err)
		}
		for _, s := range slots {
			j.Slots = append(j.Slots, httpapi.StoredSlot{Name: s.Name, RestartLSN: s.RestartLSN, RestartTLI: s.RestartTLI})
		}
		out.Timelines = append(out.Timelines, j)
	}
	if (tenant != nil || timeline != nil) && len(out.Timelines) == 0 {
		return nil, fmt.Errorf("inspect: no timeline in %s matches --tenant-id/--timeline-id (%d stored)", dir, len(keys))
	}
	return out, nil
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
