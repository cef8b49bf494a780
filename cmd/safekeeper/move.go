package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/proto"
)

// parseIDList parses a comma-separated list of node ids (flag name for
// the message).
func parseIDList(flag, v string) ([]uint64, error) {
	var ids []uint64
	for _, f := range strings.Split(v, ",") {
		id, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil || id == 0 {
			return nil, usagef("--%s %q: want node ids such as 1,2,4", flag, v)
		}
		if slices.Contains(ids, id) {
			return nil, usagef("--%s %q: node %d twice", flag, v, id)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func timelineMigrateCommand() *cli.Command {
	return &cli.Command{
		Name:  "migrate",
		Usage: "move a timeline to other safekeepers while it commits (the leading controller carries it out)",
		UsageText: "safekeeper timeline migrate --etcd-endpoints URLS --tenant-id HEX --timeline-id HEX\n" +
			"    (--from ID --to ID | --members IDS) [--no-wait] [--timeout DURATION]",
		Description: "Writes a migration request to etcd; the leading controller (safekeeper controller) carries it\n" +
			"out: the new members copy the timeline, the joint configuration (old and new members, each\n" +
			"counted apart) is written and pushed, and once a majority of the new members has caught up the\n" +
			"final one (README_PROTO.md, \"Membership and generations\"; docs/operations.md, \"Moving timelines\").\n" +
			"The primary's commits go on throughout; its proposer takes up each configuration by itself.\n" +
			"--from/--to replaces one member; --members gives the whole new set. Without --no-wait the\n" +
			"command follows the change and returns when it is done. `timeline members` shows where it stands.\n" +
			"Exit codes: 0 moved (or asked, with --no-wait), 1 failed (rolled back) or not done within\n" +
			"--timeout, or etcd unreachable, 2 usage, 4 no configuration.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "etcd-endpoints", "tenant-id", "timeline-id") },
		Flags: slices.Concat([]cli.Flag{
			&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)"},
			&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)"},
			&cli.Uint64Flag{Name: "from", Usage: "the member to replace (with --to)"},
			&cli.Uint64Flag{Name: "to", Usage: "the node to replace it with (with --from)"},
			&cli.StringFlag{Name: "members", Usage: "the new members' node ids, e.g. 1,2,4 (instead of --from/--to)"},
			&cli.BoolFlag{Name: "no-wait", Usage: "return once the request is in etcd"},
			&cli.DurationFlag{Name: "timeout", Value: 30 * time.Minute, Usage: "give up waiting (exit 1; the move goes on) after this long"},
			&cli.BoolFlag{Name: "allow-fewer-members", Usage: "allow --members to name fewer safekeepers than the timeline has (fewer copies of its WAL)"},
		}, etcdFlags()),
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			if c.NArg() > 0 {
				return usagef("timeline migrate takes no arguments, got %q", c.Args().Slice())
			}
			tenant, timeline, err := parseIDs(c)
			if err != nil {
				return err
			}
			var members []uint64
			switch {
			case c.IsSet("members") && (c.IsSet("from") || c.IsSet("to")):
				return usagef("--members and --from/--to exclude each other")
			case c.IsSet("members"):
				if members, err = parseIDList("members", c.String("members")); err != nil {
					return err
				}
			case c.IsSet("from") != c.IsSet("to"):
				return usagef("--from and --to go together")
			case !c.IsSet("from"):
				return usagef("--from and --to, or --members, is required")
			case c.Uint64("from") == 0 || c.Uint64("to") == 0 || c.Uint64("from") == c.Uint64("to"):
				return usagef("--from %d --to %d: want two different node ids", c.Uint64("from"), c.Uint64("to"))
			}
			if c.Duration("timeout") <= 0 {
				return usagef("--timeout must be positive")
			}
			ec, err := etcdClient(c)
			if err != nil {
				return err
			}
			defer ec.Close()
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			cfg, _, err := ec.Timeline(ctx, tenant, timeline)
			switch {
			case errors.Is(err, fleet.ErrNoConfig):
				return cli.Exit(fmt.Sprintf("%v: the timeline is not in the fleet (timeline create --etcd-endpoints); nothing was asked", err), exitPermanent)
			case errors.Is(err, fleet.ErrBadConfig):
				return cli.Exit(fmt.Sprintf("%v; nothing was asked: fix the key", err), exitPermanent)
			case err != nil:
				return err
			}
			if members == nil {
				from, to := c.Uint64("from"), c.Uint64("to")
				base := cfg.Members
				if cfg.Joint() {
					base = cfg.NewMembers
				}
				i := slices.Index(base, from)
				switch {
				case i < 0:
					return usagef("--from %d: not a member of the timeline (%s)", from, cfg)
				case slices.Contains(base, to):
					return usagef("--to %d: already a member of the timeline (%s)", to, cfg)
				}
				members = slices.Clone(base)
				members[i] = to
			}
			nodes, _, _, err := ec.Nodes(ctx)
			if err != nil {
				return err
			}
			base := cfg.Members
			if cfg.Joint() {
				base = cfg.NewMembers
			}
			if len(members) < len(base) && !c.Bool("allow-fewer-members") {
				return usagef("--members %v: fewer safekeepers than the timeline's %d (%v): its WAL would have fewer copies; pass --allow-fewer-members if that is meant",
					members, len(base), base)
			}
			for _, id := range members {
				i := slices.IndexFunc(nodes, func(n fleet.NodeView) bool { return n.ID == id })
				switch {
				case i < 0:
					return usagef("node %d has never registered in etcd: no safekeeper to move the timeline to", id)
				case !nodes[i].Live() && !slices.Contains(base, id):
					return cli.Exit(fmt.Sprintf("node %d is down (no lease in etcd): it could not copy the timeline, and the move would wait --catch-up-timeout "+
						"and roll back; nothing was asked", id), 1)
				}
			}
			m := fleet.Migration{Tenant: tenant, Timeline: timeline, Members: members, From: cfg.All(), Reason: "timeline migrate"}
			if _, err := ec.RequestMigration(ctx, m); err != nil {
				return err
			}
			if leader, err := ec.Leader(ctx); err == nil && leader == "" {
				log.Warn("no controller leads: the request waits in etcd until one runs (safekeeper controller)")
			}
			log.Info("migration asked", "tenant_id", tenant, "timeline_id", timeline, "from", cfg.Members, "to", members, "generation", cfg.Generation)
			if c.Bool("no-wait") {
				fmt.Fprintf(c.App.Writer, "timeline %s/%s: asked to move from %v to %v\n", tenant, timeline, cfg.Members, members)
				return nil
			}
			return waitMigration(ctx, c, log, ec, tenant, timeline, members, cfg)
		},
	}
}

// waitMigration follows a migration until the configuration is members
// alone (0), the controller gives up (1) or ctx ends (1).
func waitMigration(ctx context.Context, c *cli.Context, log *slog.Logger, ec *fleet.Client, tenant, timeline proto.ID, members []uint64, last fleet.Config) error {
	for {
		cfg, _, err := ec.Timeline(ctx, tenant, timeline)
		if err == nil && cfg.Generation != last.Generation {
			fmt.Fprintf(c.App.Writer, "timeline %s/%s: %s\n", tenant, timeline, describeMembers(cfg, nil))
			last = cfg
		}
		m, asked, merr := ec.Migration(ctx, tenant, timeline)
		switch {
		case err != nil || merr != nil:
			if ctx.Err() == nil {
				log.Warn("reading the timeline's configuration from etcd failed; retrying", "err", cmp.Or(err, merr))
			}
		case asked && m.Error != "":
			return cli.Exit(fmt.Sprintf("timeline %s/%s: the move to %v failed: %s", tenant, timeline, m.Members, m.Error), 1)
		case !asked && !cfg.Joint() && fleet.SameMembers(cfg.Members, members):
			fmt.Fprintf(c.App.Writer, "timeline %s/%s moved: generation %d, members %v\n", tenant, timeline, cfg.Generation, cfg.Members)
			return nil
		case !asked && !cfg.Joint():
			return cli.Exit(fmt.Sprintf("timeline %s/%s: the request is gone and the members are %v: another migration replaced it", tenant, timeline, cfg.Members), 1)
		}
		select {
		case <-ctx.Done():
			return cli.Exit(fmt.Sprintf("timeline %s/%s: not moved within --timeout; the move goes on (timeline members shows where it stands): %s",
				tenant, timeline, describeMembers(last, nil)), 1)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func nodeCommand() *cli.Command {
	return &cli.Command{
		Name:            "node",
		Usage:           "operate on a safekeeper of the fleet in etcd",
		HideHelpCommand: true,
		Subcommands:     []*cli.Command{nodeDrainCommand()},
	}
}

func nodeDrainCommand() *cli.Command {
	return &cli.Command{
		Name:      "drain",
		Usage:     "move every timeline off a safekeeper, a few at a time (decommission, a full disk)",
		UsageText: "safekeeper node drain --etcd-endpoints URLS --id N [--parallel N] [--no-wait] [--timeout DURATION] [--cancel]",
		Description: "Marks the node drained in etcd: the leading controller moves each of its timelines to a live\n" +
			"node (in its zone if one has room, else in a zone the timeline is not in yet; the least loaded\n" +
			"first), --parallel at a time, each as timeline migrate does; no new timeline is placed on it.\n" +
			"The mark stays until --cancel, so a decommissioned node does not fill up again. Without\n" +
			"--no-wait the command returns once no timeline names the node.\n" +
			"Exit codes: 0 drained (or asked), 1 a move failed, not drained within --timeout, or etcd\n" +
			"unreachable, 2 usage.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "etcd-endpoints", "id") },
		Flags: slices.Concat([]cli.Flag{
			&cli.Uint64Flag{Name: "id", Usage: "the node id to drain (required)"},
			&cli.IntFlag{Name: "parallel", Value: 2, Usage: "timelines moving off the node at once"},
			&cli.BoolFlag{Name: "no-wait", Usage: "return once the drain is marked"},
			&cli.DurationFlag{Name: "timeout", Value: 2 * time.Hour, Usage: "give up waiting (exit 1; the drain goes on) after this long"},
			&cli.BoolFlag{Name: "cancel", Usage: "remove the node's drain mark (the moves made stay)"},
		}, etcdFlags()),
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			if c.NArg() > 0 {
				return usagef("node drain takes no arguments, got %q", c.Args().Slice())
			}
			id := c.Uint64("id")
			switch {
			case id == 0:
				return usagef("--id 0: want a node id")
			case c.Int("parallel") < 1:
				return usagef("--parallel %d: want at least 1", c.Int("parallel"))
			case c.Duration("timeout") <= 0:
				return usagef("--timeout must be positive")
			}
			ec, err := etcdClient(c)
			if err != nil {
				return err
			}
			defer ec.Close()
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			nodes, _, _, err := ec.Nodes(ctx)
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(nodes, func(n fleet.NodeView) bool { return n.ID == id }) {
				return usagef("node %d has never registered in etcd", id)
			}
			if c.Bool("cancel") {
				if err := ec.CancelDrain(ctx, id); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "node %d: drain mark removed\n", id)
				return nil
			}
			if err := ec.RequestDrain(ctx, id, c.Int("parallel")); err != nil {
				return err
			}
			if leader, err := ec.Leader(ctx); err == nil && leader == "" {
				log.Warn("no controller leads: the drain waits in etcd until one runs (safekeeper controller)")
			}
			log.Info("drain asked", "node", id, "parallel", c.Int("parallel"))
			if c.Bool("no-wait") {
				fmt.Fprintf(c.App.Writer, "node %d: drain asked\n", id)
				return nil
			}
			left := -1
			why := fmt.Sprintf("drain of node %d", id)
			for {
				tls, _, err := ec.Timelines(ctx, 0)
				reqs, _, merr := ec.Migrations(ctx)
				if err == nil && merr == nil {
					n := 0
					for _, e := range tls {
						if slices.Contains(e.Config.All(), id) {
							n++
						}
					}
					for _, m := range reqs {
						if m.Reason == why && m.Error != "" {
							return cli.Exit(fmt.Sprintf("node %d: moving timeline %s/%s failed: %s (the drain goes on with the others; see the controller's log)",
								id, m.Tenant, m.Timeline, m.Error), 1)
						}
					}
					if n != left {
						fmt.Fprintf(c.App.Writer, "node %d: %d timelines left\n", id, n)
						left = n
					}
					if n == 0 {
						fmt.Fprintf(c.App.Writer, "node %d drained\n", id)
						return nil
					}
				} else if ctx.Err() == nil {
					log.Warn("reading the fleet from etcd failed; retrying", "err", cmp.Or(err, merr))
				}
				select {
				case <-ctx.Done():
					return cli.Exit(fmt.Sprintf("node %d: %d timelines left after --timeout; the drain goes on", id, left), 1)
				case <-time.After(500 * time.Millisecond):
				}
			}
		},
	}
}
