package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

func walCommand() *cli.Command {
	return &cli.Command{
		Name:         "wal",
		Usage:        "offline tools for a safekeeper's stored WAL",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Subcommands:  []*cli.Command{walExportCommand()},
		Action: func(c *cli.Context) error {
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
			"(TTTTTTTTXXXXXXXXYYYYYYYY); the unfinished last segment is written as NAME.partial, full\n" +
			"size and zero-padded, as pg_receivewal does. Only segments the timeline holds from their\n" +
			"first byte are written: bytes before timeline_start_lsn (or removed by retention) are\n" +
			"unknown, so a timeline that does not start at a segment boundary skips its first segment.\n" +
			"Writing NAME removes a NAME.partial left in --output by an earlier export, and writing\n" +
			"NAME.partial removes NAME, so a restore_command never finds a stale form (each is reported).\n" +
			"Refuses to run while a safekeeper holds the data directory.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "data-dir", Required: true, Usage: "the safekeeper's data directory (holding safekeeper.db)"},
			&cli.StringFlag{Name: "tenant-id", Required: true, Usage: "tenant id, 32 hex digits"},
			&cli.StringFlag{Name: "timeline-id", Required: true, Usage: "timeline id, 32 hex digits"},
			&cli.StringFlag{Name: "output", Required: true, Usage: "directory to write the segment files to (created if missing)"},
			&cli.StringFlag{Name: "upto", Usage: "export only up to this LSN (X/X), above the timeline's start and at most its commit_lsn"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("wal export takes no arguments, got %q", c.Args().Slice())
			}
			tenant, timeline, err := parseIDs(c)
			if err != nil {
				return err
			}
			var upto *proto.LSN // nil: up to commit_lsn
			if c.IsSet("upto") {
				l, err := proto.ParseLSN(c.String("upto"))
				if err != nil {
					return usagef("--upto: %v", err)
				}
				upto = &l
			}
			return exportWAL(c.App.Writer, c.String("data-dir"), tenant, timeline, c.String("output"), upto)
		},
	}
}

// exportWAL writes the timeline's WAL up to *upto (nil: commit_lsn) to
// outDir; see walExportCommand.
func exportWAL(w io.Writer, dataDir string, tenant, timeline proto.ID, outDir string, uptoFlag *proto.LSN) error {
	path := filepath.Join(dataDir, "safekeeper.db")
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("wal export: %w", err)
	}
	db, err := storage.Open(path, storage.Options{ReadOnly: true, Timeout: 200 * time.Millisecond})
	if errors.Is(err, storage.ErrLocked) {
		return fmt.Errorf("wal export: %s is in use (a safekeeper is running on it?); stop it or export from a copy: %w", dataDir, err)
	}
	if err != nil {
		return fmt.Errorf("wal export: %w", err)
	}
	defer db.Close()
	tl, st, err := db.OpenTimeline(tenant, timeline)
	if err != nil {
		return fmt.Errorf("wal export: %w", err)
	}
	upto := st.CommitLSN
	if uptoFlag != nil {
		upto = *uptoFlag
		if upto > st.CommitLSN {
			return usagef("--upto %s is above the timeline's commit_lsn %s", upto, st.CommitLSN)
		}
		if st.TimelineStartLSN == 0 || upto <= st.TimelineStartLSN {
			return usagef("--upto %s is not above the timeline's start %s: there is no WAL to export below it", upto, st.TimelineStartLSN)
		}
	}
	segSize := uint64(st.WalSegSize)
	if st.TimelineStartLSN == 0 || upto == 0 {
		fmt.Fprintf(w, "timeline has no committed WAL; nothing written\n")
		return nil
	}
	from := max(st.TimelineStartLSN, st.RemovedUpTo, tl.RemovedUpTo())
	if off := from.SegmentOffset(segSize); off != 0 {
		fmt.Fprintf(w, "skipping segment %s: the timeline holds it only from %s\n", proto.SegmentFileName(st.PgTimeline, from, segSize), from)
		from = from.SegmentStart(segSize) + proto.LSN(segSize)
	}
	if uptoFlag != nil && upto <= from {
		return fmt.Errorf("wal export: --upto %s: this safekeeper holds whole segments only from %s (timeline start %s, removed up to %s); nothing to export below it",
			upto, from, st.TimelineStartLSN, max(st.RemovedUpTo, tl.RemovedUpTo()))
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return fmt.Errorf("wal export: %w", err)
	}
	buf := make([]byte, segSize)
	full, partial := 0, 0
	for seg := from; seg < upto; seg += proto.LSN(segSize) {
		want := min(uint64(upto-seg), segSize)
		clear(buf)
		for n := uint64(0); n < want; {
			m, err := tl.ReadWAL(seg+proto.LSN(n), buf[n:want])
			if err != nil {
				return fmt.Errorf("wal export: %w", err)
			}
			if m == 0 {
				return fmt.Errorf("wal export: WAL ends at %s, below commit_lsn %s", seg+proto.LSN(n), upto)
			}
			n += uint64(m)
		}
		name := proto.SegmentFileName(st.PgTimeline, seg, segSize)
		other := name + ".partial" // the other form of the segment's file, stale now
		if want < segSize {
			name, other = other, name
			partial++
		} else {
			full++
		}
		// Remove the stale form first: a crash then leaves neither, never
		// both, so a restore_command cannot pick the stale one.
		if err := os.Remove(filepath.Join(outDir, other)); err == nil {
			fmt.Fprintf(w, "removed %s: replaced by %s\n", other, name)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("wal export: %w", err)
		}
		if err := writeFileDurably(filepath.Join(outDir, name), buf); err != nil {
			return fmt.Errorf("wal export: %w", err)
		}
	}
	fmt.Fprintf(w, "exported %s..%s: %d complete segment(s), %d partial\n", from, upto, full, partial)
	return nil
}

// writeFileDurably writes data to a temporary file, fsyncs it, renames it
// into place and fsyncs the directory.
func writeFileDurably(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
