package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/proposer"
)

func timelineCreateCommand() *cli.Command {
	return &cli.Command{
		Name:      "create",
		Usage:     "create a new timeline on its safekeepers, before its proposer's first start",
		UsageText: "safekeeper timeline create (--safekeepers H:P,H:P,H:P | --etcd-endpoints URLS [--replicas 3]) --tenant-id HEX --timeline-id HEX (--upstream 'host=... user=...' | --system-id N [--pg-version N] [--wal-seg-size N] [--pg-timeline N])",
		Description: "`propose` never creates a timeline unless told to (its --create), so that one mistyped id\n" +
			"cannot start a new timeline and fork the WAL. This is the step that creates it, once: it greets\n" +
			"every safekeeper with a greeting allowed to create the timeline, and each one creates it\n" +
			"durably before it answers. The primary's system id, version, segment size and PostgreSQL\n" +
			"timeline are read from --upstream (a replication connection), or given by --system-id and its\n" +
			"companions. A safekeeper that holds the timeline already answers its state (creating twice is\n" +
			"harmless); one holding it for another cluster refuses (22023).\n" +
			"With --etcd-endpoints the members are chosen first: --replicas live safekeepers registered in\n" +
			"etcd, in distinct zones while there are, the least loaded first; the configuration\n" +
			"(generation 1, the member ids) is written to etcd once, and a timeline placed before keeps its\n" +
			"members. --members 1,2,3 records those node ids instead (each must have registered): the way\n" +
			"to bring a timeline created with --safekeepers into the fleet. Then the members are greeted as\n" +
			"above.\n" +
			"Prints one line per safekeeper. Exit codes: 0 when a quorum holds the timeline (the others get\n" +
			"it at the proposer's first greeting), 1 otherwise (nothing to undo: start it again once they are\n" +
			"up), 2 usage, 4 a safekeeper holds the timeline for another cluster.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       requireTimelineFlags(),
		Flags: slices.Concat([]cli.Flag{jsonFlag()}, safekeeperFlags(), etcdFlags(),
			[]cli.Flag{&cli.StringFlag{Name: "upstream", Usage: "libpq connection string of the primary, to read its system id, version, segment size and timeline from (or --system-id)"}},
			timelineDescFlags("the primary's database system identifier (SELECT system_identifier FROM pg_control_system()), instead of --upstream"),
			[]cli.Flag{&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "give up on a safekeeper that has not answered within this time"},
				&cli.IntFlag{Name: "replicas", Value: fleet.DefaultReplicas, Usage: "with --etcd-endpoints: how many safekeepers the timeline is placed on, in distinct zones while there are"},
				&cli.StringFlag{Name: "members", Usage: "with --etcd-endpoints: the members' node ids (e.g. 1,2,3) instead of a placement: a timeline the static setup created, brought into the fleet on the safekeepers holding it"}},
			securityFlags()),
		Action: func(c *cli.Context) error {
			log, tl, err := timelineArgsFor(c, false)
			if err != nil {
				return err
			}
			if tl.etcd != nil {
				defer tl.etcd.Close()
			} else if c.IsSet("replicas") || c.IsSet("members") {
				return usagef("--replicas and --members go with --etcd-endpoints: with --safekeepers the list is the members")
			}
			var members []uint64
			if c.IsSet("members") {
				if c.IsSet("replicas") {
					return usagef("--members and --replicas exclude each other: the members given are the replicas")
				}
				if members, err = parseIDList("members", c.String("members")); err != nil {
					return err
				}
			}
			if err := checkTimelineFlags(c); err != nil {
				return err
			}
			if c.Int("replicas") < 1 {
				return usagef("--replicas %d: want at least 1", c.Int("replicas"))
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
			var placed *fleet.Placement
			if tl.etcd != nil {
				var p fleet.Placement
				if members != nil {
					p, err = tl.etcd.Assign(ctx, tl.tenant, tl.timeline, members)
				} else {
					p, err = tl.etcd.Place(ctx, tl.tenant, tl.timeline, c.Int("replicas"))
				}
				if err != nil {
					return placementExit(err)
				}
				placed = &p
				for _, e := range p.Skipped {
					log.Warn("placement skipped a key that does not parse", "err", e)
				}
				if p.Spread != "" {
					log.Warn("timeline placed over fewer zones than replicas", "why", p.Spread)
				}
				if cfg.Safekeepers, err = (fleet.Resolved{Config: p.Config, Members: p.Members}).Addrs(); err != nil {
					return err
				}
				// The members store the configuration with the timeline
				// (README_PROTO.md, rule 9): a proposer of another
				// generation, or of none, is refused by them.
				cfg.Configuration = p.Config
			}
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
				out := map[string]any{"tenant_id": tl.tenant.String(), "timeline_id": tl.timeline.String(), "safekeepers": lines}
				if placed != nil {
					out["generation"], out["members"], out["placed"] = placed.Config.Generation, placed.Config.Members, placed.Created
					if len(placed.Config.NewMembers) > 0 {
						out["new_members"] = placed.Config.NewMembers
					}
				}
				if err := writeJSONLine(c, out); err != nil {
					return err
				}
			} else {
				if placed != nil {
					verb := "placed on"
					if !placed.Created {
						verb = "already placed on"
					}
					fmt.Fprintf(c.App.Writer, "timeline %s/%s %s %s\n", tl.tenant, tl.timeline, verb, describeMembers(placed.Config, placed.Members))
				}
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
