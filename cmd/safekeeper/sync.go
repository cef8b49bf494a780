package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
)

func syncCommand() *cli.Command {
	return &cli.Command{
		Name:      "sync",
		Usage:     "elect without generating WAL and bring a quorum to the end of WAL, committed; print that LSN",
		UsageText: "safekeeper sync (--safekeepers H:P,H:P,H:P | --etcd-endpoints URLS) --tenant-id HEX --timeline-id HEX [--timeout 30s] [--system-id N [--create] ...]",
		Description: "The disaster-recovery step after the primary is lost. Runs an election with a new term on the\n" +
			"safekeepers, picks the donor's end of WAL, copies what each reachable safekeeper lacks from the\n" +
			"donor, waits until every reachable safekeeper (and at least a quorum) has commit_lsn at that point,\n" +
			"then prints it as X/X. Afterwards a standby reading from any safekeeper gets all acknowledged WAL.\n" +
			"The timeline's system id, version, segment size and TLI are read from the safekeepers\n" +
			"(TIMELINE_STATUS) unless --system-id is given.\n" +
			"Sync never creates a timeline by accident: when no safekeeper holds it (a quorum answered\n" +
			"that they do not), it fails (exit 4) and changes nothing. --create (with --system-id)\n" +
			"initialises a brand-new timeline instead, as a compute does when it starts one; it prints 0/0.\n" +
			"Sync refuses (exit 1, naming it) while a proposer streams to the timeline: it would depose it\n" +
			"and the primary's commits would wait; --force runs it anyway.\n" +
			"Exit codes: 0 success, 1 no quorum within --timeout, a live proposer or another error, 2 usage,\n" +
			"3 deposed, 4 refused for good: no such timeline, or the safekeepers refuse the timeline's\n" +
			"description (--system-id, --pg-version, --wal-seg-size or --pg-timeline do not match theirs;\n" +
			"a restart cannot fix it).",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       requireTimelineFlags(),
		Flags: slices.Concat([]cli.Flag{jsonFlag()}, safekeeperFlags(), etcdFlags(),
			timelineDescFlags("the primary's database system identifier (default: read from the safekeepers, with the three flags below)"),
			[]cli.Flag{
				&cli.BoolFlag{Name: "create", Usage: "with --system-id: create the timeline on the safekeepers if none holds it (initialising a brand-new timeline); without it sync fails when no safekeeper holds the timeline"},
				&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "give up (exit 1) if no quorum is synced within this time"},
				&cli.BoolFlag{Name: "force", Usage: "run even while a proposer streams to the timeline (it is deposed)"},
			}, securityFlags()),
		Action: func(c *cli.Context) error {
			log, tl, err := timelineArgs(c)
			if err != nil {
				return err
			}
			if tl.etcd != nil {
				defer tl.etcd.Close()
			}
			sks, tenant, timeline := tl.safekeepers, tl.tenant, tl.timeline
			if c.Duration("timeout") <= 0 {
				return usagef("--timeout must be positive")
			}
			if err := checkTimelineFlags(c); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			defer ignoreSIGHUP(log)()
			ctx, cancel := context.WithTimeout(ctx, c.Duration("timeout"))
			defer cancel()
			sec, err := securityFrom(c)
			if err != nil {
				return err
			}
			lsn, err := proposer.Sync(ctx, proposer.SyncConfig{Security: sec,
				Safekeepers: sks, TenantID: tenant, TimelineID: timeline, SystemID: c.Uint64("system-id"),
				PgVersion: uint32(c.Uint("pg-version")), WalSegSize: uint32(c.Uint("wal-seg-size")),
				PgTimeline: uint32(c.Uint("pg-timeline")), Create: c.Bool("create"), Logger: log, Force: c.Bool("force"),
				Configuration: tl.resolved.Config, SafekeeperIDs: resolvedIDs(tl),
			})
			switch {
			case errors.Is(err, proposer.ErrNoTimeline):
				return cli.Exit(fmt.Sprintf("%v; nothing was created: check --tenant-id and --timeline-id, or pass --create (with --system-id) to initialise a new timeline", err), exitPermanent)
			case errors.Is(err, proposer.ErrNoWAL):
				log.Info("the timeline has no WAL on a quorum")
			case errors.Is(err, proposer.ErrDeposed):
				return deposedExit(err)
			case errors.Is(err, proposer.ErrIncompatible):
				return permanentError{err}
			case err != nil:
				return err
			}
			if c.Bool("json") {
				return writeJSONLine(c, map[string]any{"tenant_id": tenant.String(), "timeline_id": timeline.String(), "commit_lsn": lsn})
			}
			fmt.Fprintln(c.App.Writer, lsn)
			return nil
		},
	}
}

// checkTimelineFlags validates --system-id, --pg-version, --wal-seg-size,
// --pg-timeline and --create up front, so that a bad value is named as the
// flag it came from rather than refused later by the safekeepers' protocol.
func checkTimelineFlags(c *cli.Context) error {
	if v := c.Uint("pg-version"); v < 150000 || v >= 160000 {
		return usagef("--pg-version %d: want PostgreSQL 15's PG_VERSION_NUM, 150000 to 159999 (only PostgreSQL 15 is supported)", v)
	}
	if v := c.Uint("wal-seg-size"); v > math.MaxUint32 || !proto.ValidSegSize(uint32(v)) {
		return usagef("--wal-seg-size %d: want a power of two from 1 MiB (1048576) to 1 GiB (1073741824) bytes, as PostgreSQL's wal_segment_size", v)
	}
	if v := c.Uint("pg-timeline"); v == 0 || v > math.MaxUint32 {
		return usagef("--pg-timeline %d: want a PostgreSQL timeline id (TLI) from 1 to %d", v, uint32(math.MaxUint32))
	}
	if c.Bool("create") && c.Uint64("system-id") == 0 {
		return usagef("--create needs --system-id (and --pg-version, --wal-seg-size, --pg-timeline unless the defaults fit): a new timeline cannot be read from the safekeepers")
	}
	return nil
}
