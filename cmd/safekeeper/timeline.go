package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

func timelineCommand() *cli.Command {
	return &cli.Command{
		Name:            "timeline",
		Usage:           "manage a safekeeper's timelines",
		OnUsageError:    func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Subcommands:     []*cli.Command{timelineCreateCommand(), timelineListCommand(), timelineShowCommand(), timelineDeleteCommand(), timelinePullCommand()},
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

// pullCommitBytes is how much copied WAL one pull transaction holds.
const pullCommitBytes = 64 << 20

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
			return pullTimeline(ctx, c, c.String("from"), filepath.Join(c.String("data-dir"), "safekeeper.db"), tenant, timeline)
		},
	}
}

func pullTimeline(ctx context.Context, c *cli.Context, from, path string, tenant, timeline proto.ID) error {
	sec, err := securityFrom(c)
	if err != nil {
		return err
	}
	// A data directory that does not exist yet (a replaced disk) is
	// created, but only once the peer has answered: a pull that cannot
	// start leaves nothing behind.
	var peer client.PeerTimeline
	fresh := false
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		fresh = true
		if peer, err = client.PeerState(ctx, from, tenant, timeline, 0, sec); err != nil {
			return fmt.Errorf("timeline pull: %w", err)
		}
		if first, end := peer.FirstHeld(), peer.Info.FlushLSN; end > first {
			if err := checkPullSpace(existingAncestor(filepath.Dir(path)), nil, uint64(end-first)); err != nil {
				return fmt.Errorf("timeline pull: %w; nothing copied", err)
			}
		}
		if err := storage.MkdirAllDurable(filepath.Dir(path), 0o700); err != nil {
			return fmt.Errorf("timeline pull: %w", err)
		}
	}
	db, err := storage.Open(path, storage.Options{Timeout: 200 * time.Millisecond})
	if errors.Is(err, storage.ErrLocked) {
		return fmt.Errorf("timeline pull: %s is in use (a safekeeper is running on it?); stop it first: %w", filepath.Dir(path), err)
	}
	if err != nil {
		return fmt.Errorf("timeline pull: %w", err)
	}
	defer db.Close()
	tl, local, err := db.OpenTimeline(tenant, timeline)
	switch {
	case errors.Is(err, storage.ErrNoTimeline):
		tl = nil
	case err != nil:
		return fmt.Errorf("timeline pull: %w", err)
	case local.TimelineStartLSN != 0 && local.FlushLSN > local.TimelineStartLSN:
		return fmt.Errorf("timeline pull: %s already holds timeline %s/%s (WAL up to %s); nothing copied", filepath.Dir(path), tenant, timeline, local.FlushLSN)
	}
	if !fresh {
		if peer, err = client.PeerState(ctx, from, tenant, timeline, 0, sec); err != nil {
			return fmt.Errorf("timeline pull: %w", err)
		}
	}
	first, end := peer.FirstHeld(), peer.Info.FlushLSN
	if peer.Info.TimelineStartLSN == 0 || first >= end {
		return fmt.Errorf("timeline pull: %s holds no whole segment of WAL of the timeline (start %s, removed up to %s, flush_lsn %s)",
			from, peer.Info.TimelineStartLSN, peer.RemovedUpTo, end)
	}
	if err := checkPullSpace(filepath.Dir(path), db, uint64(end-first)); err != nil {
		return fmt.Errorf("timeline pull: %w; nothing copied", err)
	}
	// The state of every transaction but the last: no WAL yet (a crash
	// here leaves an empty timeline: acceptor.New discards WAL above
	// flush_lsn 0), the horizon at the first byte copied.
	empty := acceptor.State{TenantID: tenant, TimelineID: timeline, SystemID: peer.SystemID, PgVersion: peer.PgVersion,
		WalSegSize: peer.WalSegSize, PgTimeline: peer.PgTimeline}
	if tl == nil {
		if tl, err = db.CreateTimeline(empty); err != nil {
			return fmt.Errorf("timeline pull: %w", err)
		}
	} else if local.SystemID != peer.SystemID || local.WalSegSize != peer.WalSegSize || local.PgTimeline != peer.PgTimeline {
		return fmt.Errorf("timeline pull: the empty timeline here describes another cluster (system_id %d, segment size %d, TLI %d) than %s's (%d, %d, %d)",
			local.SystemID, local.WalSegSize, local.PgTimeline, from, peer.SystemID, peer.WalSegSize, peer.PgTimeline)
	}
	if first > peer.Info.TimelineStartLSN {
		empty.RemovedUpTo = first // storage takes it: the timeline holds no WAL yet
	}
	if err := tl.TruncateWAL(0); err != nil {
		return fmt.Errorf("timeline pull: %w", err)
	}
	staged := 0
	err = client.CopyWAL(ctx, &peer, tenant, timeline, first, end, 0, func(at proto.LSN, wal []byte) error {
		if err := tl.WriteWAL(at, wal); err != nil {
			return err
		}
		if staged += len(wal); staged >= pullCommitBytes {
			staged = 0
			return tl.Commit(empty)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("timeline pull: copying %s..%s from %s: %w (the timeline here is left empty)", first, end, from, err)
	}
	st := empty
	st.VotedFor = peer.Info.VotedFor
	st.History = peer.Info.History.Upto(end).Clone()
	st.TimelineStartLSN = peer.Info.TimelineStartLSN
	st.FlushLSN = end
	st.CommitLSN = min(peer.Info.CommitLSN, end)
	st.TruncateLSN = min(peer.Info.TruncateLSN, st.CommitLSN)
	// The promoted primary's history file goes in with the state, as the
	// acceptor records it at a timeline switch.
	st.PgHistory = peer.PgHistory
	if err := tl.Commit(st); err != nil {
		return fmt.Errorf("timeline pull: %w (the timeline here is left empty)", err)
	}
	// The peer's persistent replication slots, and the tombstones of those
	// dropped, so a slot survives the loss of this safekeeper's disk.
	var slots storage.SlotUpdate
	for _, e := range peer.Slots {
		if e.Dropped {
			slots.PutTombstones = append(slots.PutTombstones, storage.SlotTombstone{Name: e.Name, Incarnation: e.Incarnation, DroppedAt: time.Now()})
		} else {
			slots.Put = append(slots.Put, storage.Slot{Name: e.Name, Incarnation: e.Incarnation, RestartLSN: e.RestartLSN, RestartTLI: e.RestartTLI})
		}
	}
	if err := tl.UpdateSlots(slots); err != nil {
		return fmt.Errorf("timeline pull: the WAL and state are in; storing the replication slots failed (the proposer copies them once it streams): %w", err)
	}
	if c.Bool("json") {
		return writeJSONLine(c, map[string]any{"tenant_id": tenant.String(), "timeline_id": timeline.String(), "from": from,
			"wal_start_lsn": first, "flush_lsn": end, "wal_bytes": uint64(end - first), "term": st.VotedFor.Term, "commit_lsn": st.CommitLSN,
			"pg_timeline": st.PgTimeline, "pg_history_bytes": len(st.PgHistory), "slots": len(slots.Put)})
	}
	hist := ""
	if len(st.PgHistory) > 0 {
		hist = fmt.Sprintf(" and its history file (%d bytes)", len(st.PgHistory))
	}
	nslots := fmt.Sprintf("%d replication slots", len(slots.Put))
	if len(slots.Put) == 1 {
		nslots = "1 replication slot"
	}
	fmt.Fprintf(c.App.Writer, "pulled timeline %s/%s from %s: WAL %s..%s (%d bytes), term %d, commit_lsn %s, PostgreSQL timeline %d%s, %s\n",
		tenant, timeline, from, first, end, uint64(end-first), st.VotedFor.Term, st.CommitLSN, st.PgTimeline, hist, nslots)
	return nil
}

// checkPullSpace refuses a pull of walBytes whose WAL would not fit: the
// file system's free space and the pages free inside the database file (db,
// nil before it exists)
// must hold it with bbolt's overhead (pages, branches: about 6%, so 1/8
// is allowed) and 16 MiB to spare. A pull that fails on ENOSPC would leave
// the disk full and the next one failing the same way.
func checkPullSpace(dir string, db *storage.DB, walBytes uint64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	free := st.Bavail * uint64(st.Bsize)
	if db != nil {
		free += uint64(max(db.ReusableBytes(), 0))
	}
	need := walBytes + walBytes/8 + 16<<20
	if free < need {
		return fmt.Errorf("%s has %d MiB free (file system and free pages of the database), the %d MiB of WAL to copy need about %d MiB",
			dir, free>>20, walBytes>>20, need>>20)
	}
	return nil
}

// existingAncestor is dir or its nearest ancestor that exists: where the
// file system of a directory still to be made can be asked.
func existingAncestor(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil || filepath.Dir(dir) == dir {
			return dir
		}
		dir = filepath.Dir(dir)
	}
}
