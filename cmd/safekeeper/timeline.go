package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/timeline"
)

func timelineCommand() *cli.Command {
	return &cli.Command{
		Name:            "timeline",
		Usage:           "manage a safekeeper's timelines",
		OnUsageError:    func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Subcommands:     []*cli.Command{timelineCreateCommand(), timelineMembersCommand(), timelineMigrateCommand(), timelineListCommand(), timelineShowCommand(), timelineDeleteCommand(), timelinePullCommand()},
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
		UsageText: "safekeeper timeline pull (--from HOST:PORT | --etcd-endpoints URLS) --data-dir DIR --tenant-id HEX --timeline-id HEX",
		Description: "For a safekeeper that lacks a timeline its peers hold (a replaced disk, a peer that was away\n" +
			"longer than their --max-peer-wal-keep-size): copies the peer's control state (vote, term\n" +
			"history, flush_lsn, commit_lsn; after a promotion, the PostgreSQL timeline's history file) and\n" +
			"its WAL, from the timeline start if the peer still holds it,\n" +
			"else from the first whole segment it holds, up to its flush_lsn (read as a term reader of its\n" +
			"term). Atomic: the WAL goes in in transactions that leave the timeline empty until the last one,\n" +
			"which writes the state; a crash or failure mid-pull leaves an empty timeline that a new pull (or\n" +
			"the proposer) fills. Refuses a timeline the data directory already holds WAL of, and a data\n" +
			"directory a running safekeeper holds. Start the safekeeper afterwards; the proposer streams it the\n" +
			"rest.\n" +
			"With --etcd-endpoints instead of --from, the peer is a member of the timeline's configuration in\n" +
			"etcd other than this data directory's node: the live ones first, each tried in turn until one\n" +
			"serves the pull.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before: func(c *cli.Context) error {
			if !c.IsSet("from") && !c.IsSet("etcd-endpoints") {
				return usagef("give --from (the peer's address) or --etcd-endpoints (the timeline's members in etcd)")
			}
			return requireFlags(c, "data-dir", "tenant-id", "timeline-id")
		},
		Flags: append([]cli.Flag{jsonFlag(),
			&cli.StringFlag{Name: "from", Usage: "host:port of the peer safekeeper to copy from (or --etcd-endpoints)"},
			&cli.StringFlag{Name: "data-dir", Usage: "this safekeeper's data directory (required)"},
			&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)"},
			&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)"},
			&cli.DurationFlag{Name: "timeout", Value: 30 * time.Minute, Usage: "give up (exit 1) after this long"},
		}, append(securityFlags(), etcdFlags()...)...),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("timeline pull takes no arguments, got %q", c.Args().Slice())
			}
			if c.IsSet("from") && c.IsSet("etcd-endpoints") {
				return usagef("--from and --etcd-endpoints exclude each other: the peer comes from one or the other")
			}
			tenant, tlID, err := parseIDs(c)
			if err != nil {
				return err
			}
			if err := checkDataDir(c); err != nil {
				return err
			}
			ec, err := etcdClient(c)
			if err != nil {
				return err
			}
			if ec == nil {
				if err := checkDialAddr(c.String("from")); err != nil {
					return usagef("--from %q: %w", c.String("from"), err)
				}
			} else {
				defer ec.Close()
			}
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			key := proto.TimelineKey{TenantID: tenant, TimelineID: tlID}
			if ec == nil {
				return pullTimeline(ctx, c, key, c.String("from"))
			}
			peers, err := pullPeers(ctx, ec, c.String("data-dir"), key)
			if err != nil {
				return err
			}
			var errs []string
			for _, p := range peers {
				err := pullTimeline(ctx, c, key, p)
				if err == nil {
					return nil
				}
				if errors.Is(err, timeline.ErrInUse) || ctx.Err() != nil {
					return err
				}
				errs = append(errs, err.Error())
			}
			return fmt.Errorf("timeline pull: no member served it: %s", strings.Join(errs, "; "))
		},
	}
}

// pullPeers is the members of a timeline's configuration in etcd to pull
// from: not this data directory's node, the live ones first.
func pullPeers(ctx context.Context, ec *fleet.Client, dataDir string, key proto.TimelineKey) ([]string, error) {
	r, addrs, err := resolveTimeline(ctx, ec, key.TenantID, key.TimelineID)
	if err != nil {
		return nil, err
	}
	var self uint64
	if in, err := timeline.Inspect(dataDir, func(proto.TimelineKey) bool { return false }); err == nil && in.NodeID != nil {
		self = *in.NodeID
	}
	var live, down []string
	for i, m := range r.Members {
		if m.ID == self || i >= len(addrs) {
			continue
		}
		if m.Live() {
			live = append(live, addrs[i])
		} else {
			down = append(down, addrs[i])
		}
	}
	if len(live)+len(down) == 0 {
		return nil, fmt.Errorf("timeline pull: the timeline's members (%s) have no peer of node %d", r.Config, self)
	}
	return append(live, down...), nil
}

func pullTimeline(ctx context.Context, c *cli.Context, key proto.TimelineKey, from string) error {
	sec, err := securityFrom(c)
	if err != nil {
		return err
	}
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
