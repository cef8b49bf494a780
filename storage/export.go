package storage

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/safekeeper/safekeeper/proto"
)

// ErrExportRange: Export was asked to stop at an LSN outside the WAL the
// timeline can export (above commit_lsn, or not above its start).
var ErrExportRange = errors.New("storage: export range outside the timeline's WAL")

// Export writes a timeline's committed WAL, read from the database file at
// path (opened read-only: it fails with ErrLocked while a safekeeper holds
// it), as PostgreSQL segment files in outDir (created if missing), up to
// *upto (nil: commit_lsn). Segments are named like pg_wal's
// (TTTTTTTTXXXXXXXXYYYYYYYY), the unfinished last one too: full size,
// zero-padded after the WAL. PostgreSQL's restore_command is only ever asked
// for NAME, never NAME.partial (pg_receivewal's form), so a last segment
// written as NAME.partial is silently missed by `cp %f %p`: recovery ends one
// segment early and promotes without its commits. Zero-padded, it replays to
// the end of the exported WAL and stops there, as at any end of WAL. A
// NAME.partial left in outDir (by pg_receivewal or an older build) is
// removed. Only segments the timeline holds from their first byte are
// written: bytes before timeline_start_lsn (or removed by retention) are
// unknown. Each file is written durably (temporary file, fsync, rename,
// fsync of the directory). After a promotion (the timeline is on a
// PostgreSQL timeline above 1) the history files of that timeline and of
// its ancestors are written too (TTTTTTTT.history, byte for byte as
// PostgreSQL wrote them): recovery needs them to follow the promotion
// instead of ending at the first timeline's end. Progress lines go to w.
func Export(path string, key proto.TimelineKey, outDir string, uptoArg *proto.LSN, w io.Writer) error {
	return ExportWithProgress(path, key, outDir, uptoArg, w, nil)
}

// ExportWithProgress is Export, calling progress (unless nil) as the WAL is
// read and written: the bytes done so far of the total to export.
func ExportWithProgress(path string, key proto.TimelineKey, outDir string, uptoArg *proto.LSN, w io.Writer, progress func(done, total int64)) error {
	if progress == nil {
		progress = func(int64, int64) {}
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("wal export: %w", err)
	}
	db, err := Open(path, Options{ReadOnly: true, Timeout: 200 * time.Millisecond})
	if errors.Is(err, ErrLocked) {
		return fmt.Errorf("wal export: %s is in use (a safekeeper is running on it?); stop it or export from a copy: %w", filepath.Dir(path), err)
	}
	if err != nil {
		return fmt.Errorf("wal export: %w", err)
	}
	defer db.Close()
	tl, st, err := db.OpenTimeline(key.TenantID, key.TimelineID)
	if err != nil {
		return fmt.Errorf("wal export: %w", err)
	}
	upto := st.CommitLSN
	if uptoArg != nil {
		upto = *uptoArg
		if upto > st.CommitLSN {
			return fmt.Errorf("%w: --upto %s is above the timeline's commit_lsn %s", ErrExportRange, upto, st.CommitLSN)
		}
		if st.TimelineStartLSN == 0 || upto <= st.TimelineStartLSN {
			return fmt.Errorf("%w: --upto %s is not above the timeline's start %s: there is no WAL to export below it", ErrExportRange, upto, st.TimelineStartLSN)
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
	if uptoArg != nil && upto <= from {
		return fmt.Errorf("wal export: --upto %s: this safekeeper holds whole segments only from %s (timeline start %s, removed up to %s); nothing to export below it",
			upto, from, st.TimelineStartLSN, max(st.RemovedUpTo, tl.RemovedUpTo()))
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return fmt.Errorf("wal export: %w", err)
	}
	// Segments are named by the PostgreSQL timeline they belong to, as in
	// PostgreSQL's own pg_wal and archive: an ancestor's up to the segment
	// holding its end, where the next one's begin.
	var ends []proto.PgTimelineEnd // none before a switch
	if len(st.PgHistory) > 0 {
		var err error
		if ends, err = proto.ParsePgHistory(st.PgTimeline, st.PgHistory); err != nil {
			// Without it the segments of the ancestors would be named by
			// the current timeline, which no restore asks for.
			return fmt.Errorf("wal export: the stored history of PostgreSQL timeline %d does not parse: %w", st.PgTimeline, err)
		}
	}
	if err := exportHistoryFiles(outDir, st.PgTimeline, st.PgHistory, ends, w); err != nil {
		return fmt.Errorf("wal export: %w", err)
	}
	tliOf := func(seg proto.LSN) uint32 { return proto.PgSegmentTimeline(ends, st.PgTimeline, seg, segSize) }
	buf := make([]byte, segSize)
	full, partial := 0, 0
	total := int64(upto - from)
	for seg := from; seg < upto; seg += proto.LSN(segSize) {
		want := min(uint64(upto-seg), segSize)
		clear(buf)
		for n := uint64(0); n < want; {
			m, err := tl.ReadWAL(seg+proto.LSN(n), buf[n:min(want, n+exportReadChunk)])
			if err != nil {
				return fmt.Errorf("wal export: %w", err)
			}
			if m == 0 {
				return fmt.Errorf("wal export: WAL ends at %s, below commit_lsn %s", seg+proto.LSN(n), upto)
			}
			n += uint64(m)
			progress(int64(seg-from)+int64(n), total)
		}
		name := proto.SegmentFileName(tliOf(seg), seg, segSize)
		stale := name + ".partial" // never asked for by a restore_command
		// Remove the stale form first: a crash then leaves neither, never
		// both.
		if err := os.Remove(filepath.Join(outDir, stale)); err == nil {
			fmt.Fprintf(w, "removed %s: replaced by %s\n", stale, name)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("wal export: %w", err)
		}
		if err := writeFileDurably(filepath.Join(outDir, name), buf); err != nil {
			return fmt.Errorf("wal export: %w", err)
		}
		if want < segSize {
			partial++
			fmt.Fprintf(w, "wrote %s: unfinished, WAL up to %s, zero-padded\n", name, upto)
		} else {
			full++
		}
	}
	fmt.Fprintf(w, "exported %s..%s: %d complete segment(s), %d unfinished\n", from, upto, full, partial)
	return nil
}

// exportHistoryFiles writes the history file of PostgreSQL timeline tli
// (content, as the promoted primary wrote it) and of each ancestor that has
// one (all but timeline 1), named as in pg_wal (TTTTTTTT.history), each
// durably. Without them a restore_command recovery replays the first
// timeline to its end, finds no later timeline and promotes there, without
// the WAL written after the promotion. A timeline never switched (tli 1, or
// no history recorded) has none.
func exportHistoryFiles(outDir string, tli uint32, content []byte, ends []proto.PgTimelineEnd, w io.Writer) error {
	if tli < 2 || len(content) == 0 {
		return nil
	}
	write := func(n uint32, b []byte) error {
		name := fmt.Sprintf("%08X.history", n)
		if err := writeFileDurably(filepath.Join(outDir, name), b); err != nil {
			return err
		}
		fmt.Fprintf(w, "wrote %s: the history of PostgreSQL timeline %d\n", name, n)
		return nil
	}
	for _, e := range ends {
		if e.TLI < 2 {
			continue
		}
		b, ok := proto.PgHistoryPrefix(content, e.TLI)
		if !ok {
			return fmt.Errorf("the history of PostgreSQL timeline %d has no line for its ancestor %d", tli, e.TLI)
		}
		if err := write(e.TLI, b); err != nil {
			return err
		}
	}
	return write(tli, content)
}

// exportReadChunk is the most one ReadWAL of Export reads (so progress
// moves within a segment).
const exportReadChunk = 1 << 20

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
	return SyncDir(filepath.Dir(path))
}
