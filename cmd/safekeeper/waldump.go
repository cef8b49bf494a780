package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/server/timeline"
)

func walDumpCommand() *cli.Command {
	return &cli.Command{
		Name:  "dump",
		Usage: "print a timeline's WAL records as pg_waldump does, every record's CRC checked",
		UsageText: "safekeeper wal dump (--data-dir DIR | --http HOST:PORT) --tenant-id HEX --timeline-id HEX\n" +
			"      [--start LSN] [--end LSN] [--stats] [--json]",
		Description: "Reads the timeline's WAL from a stopped safekeeper's data directory (--data-dir, read-only)\n" +
			"or from a running one's HTTP API (--http, GET .../wal) and prints one line per record as\n" +
			"PostgreSQL 15's pg_waldump does, byte for byte: resource manager, len (rec/tot) (rec =\n" +
			"xl_tot_len less the full-page images), tx, lsn and prev (as pg_waldump, 0/01000028), desc\n" +
			"(the record type and its description, in pg_waldump's words, times in the local time zone)\n" +
			"and the block references. Descriptions are decoded for XLOG, Transaction, Storage, CLOG,\n" +
			"Database, RelMap, Standby, Heap2, Heap, Btree, Sequence and LogicalMessage records; other\n" +
			"resource managers' records show their type and \"<not decoded>\", a record whose data does\n" +
			"not fit its type \"<malformed: REASON>\", and the dump goes on.\n\n" +
			"Every record is checked as PostgreSQL's xlogreader checks it: page headers, xl_tot_len,\n" +
			"the prev link, the CRC, the block headers. The first bad record ends the dump with one\n" +
			"line naming its LSN (a CRC mismatch says so) and exit status 1.\n\n" +
			"Range: --start defaults to the first record the timeline holds; a --start that is not a\n" +
			"record boundary begins at the first record at or after it, after pg_waldump's line \"first\n" +
			"record is after X/X, at X/X, skipping over N bytes\" (as pg_waldump -s). --end\n" +
			"defaults to flush_lsn; records that end after --end are not printed.\n\n" +
			"--stats prints pg_waldump --stats's table instead (count, record size, FPI size, combined\n" +
			"size per resource manager, with percentages); --json one JSON object per record, or the\n" +
			"stats as one object. On a terminal, progress (bytes, rate, ETA) is shown on stderr.\n\n" +
			"A data directory a running safekeeper holds is refused at once: use --http then.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "tenant-id", "timeline-id") },
		Flags: []cli.Flag{
			&cmdLineStringFlag{StringFlag: cli.StringFlag{Name: "data-dir", Usage: "a stopped safekeeper's data directory (holding safekeeper.db); given on the command line, it wins over SAFEKEEPER_HTTP"}},
			&cmdLineStringFlag{StringFlag: cli.StringFlag{Name: "http", Usage: "host:port of a running safekeeper's HTTP API (run --listen-http); https://host:port when it has a certificate; given on the command line, it wins over SAFEKEEPER_DATA_DIR"}},
			&cli.StringFlag{Name: "http-cacert", Usage: "CA certificate file to verify an https:// --http against (default: the system's)"},
			tokenFileFlag(),
			&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)"},
			&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)"},
			&cli.StringFlag{Name: "start", Usage: "first LSN (X/X): the dump begins at the first record at or after it (default: the timeline's first record)"},
			&cli.StringFlag{Name: "end", Usage: "last LSN (X/X): records ending after it are not printed (default: flush_lsn)"},
			&cli.BoolFlag{Name: "stats", Usage: "print per-resource-manager statistics instead of records, as pg_waldump --stats"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON: one object per record, or the statistics"},
		},
		Action: walDump,
	}
}

// dumpInfo is what the range defaults need to know of a timeline.
type dumpInfo struct {
	segSize     uint64
	start       proto.LSN // timeline_start_lsn (0: no WAL yet)
	removedUpTo proto.LSN
	flush       proto.LSN
}

// walSource is where wal dump reads a timeline's WAL: a data directory or
// a running server's HTTP API.
type walSource interface {
	info() dumpInfo
	// read calls fn with the WAL [from, to) in order, in pieces.
	read(ctx context.Context, from, to proto.LSN, fn func([]byte) error) error
	close()
}

func walDump(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("wal dump takes no arguments, got %q", c.Args().Slice())
	}
	// A source the command line names wins over the other's environment
	// variable (SAFEKEEPER_HTTP exported for status and timeline).
	useDir, useHTTP := c.IsSet("data-dir"), c.IsSet("http")
	if useDir && useHTTP {
		if dirCL, httpCL := onCommandLine(c, "data-dir"), onCommandLine(c, "http"); dirCL != httpCL {
			useDir, useHTTP = dirCL, httpCL
		}
	}
	if useDir == useHTTP {
		return usagef("wal dump reads from exactly one of --data-dir DIR (a stopped safekeeper) or --http HOST:PORT (a running one)")
	}
	tenant, timeline, err := parseIDs(c)
	if err != nil {
		return err
	}
	var start, end *proto.LSN
	for _, f := range []struct {
		name string
		dst  **proto.LSN
	}{{"start", &start}, {"end", &end}} {
		if c.IsSet(f.name) {
			l, err := proto.ParseLSN(c.String(f.name))
			if err != nil {
				return usagef("--%s: %w", f.name, err)
			}
			*f.dst = &l
		}
	}
	key := proto.TimelineKey{TenantID: tenant, TimelineID: timeline}
	var src walSource
	if useDir {
		if err := checkDataDir(c); err != nil {
			return err
		}
		src, err = openDataDirSource(c.String("data-dir"), key)
	} else {
		src, err = openHTTPSource(c, key)
	}
	if err != nil {
		return err
	}
	defer src.close()

	info := src.info()
	if info.start == proto.InvalidLSN || info.flush == proto.InvalidLSN {
		fmt.Fprintf(c.App.ErrWriter, "timeline %s holds no WAL\n", key)
		return nil // nothing to dump is not an error, as for wal export
	}
	first := max(info.start, info.removedUpTo)
	from, to := first, info.flush
	if start != nil {
		if *start < first {
			return usagef("--start %s: the timeline holds WAL only from %s (timeline start %s, removed up to %s)", *start, first, info.start, info.removedUpTo)
		}
		from = *start
	}
	if end != nil {
		if *end > info.flush {
			return usagef("--end %s is beyond the timeline's flush_lsn %s", *end, info.flush)
		}
		to = *end
	}
	switch {
	case from >= to && (start != nil || end != nil):
		return usagef("empty range: start %s is not below end %s", from, to)
	case from >= to:
		fmt.Fprintf(c.App.ErrWriter, "timeline %s holds no WAL after %s\n", key, from)
		return nil
	}
	// Read from the page holding the start (or the timeline's first
	// record) and skip the records before it, as XLogFindNextRecord.
	readFrom := max(from&^(xlog.PageSize-1), first)
	r := xlog.NewReader(readFrom, info.segSize)
	r.SkipBefore(from)

	prog := newProgress(c.App.ErrWriter, int64(to-readFrom))
	defer prog.finish()
	out := bufio.NewWriterSize(prog.above(c.App.Writer), 256<<10)
	defer out.Flush()
	st := newDumpStats()
	jsonOut, statsOnly := c.Bool("json"), c.Bool("stats")
	enc := json.NewEncoder(out)
	var firstRec, lastEnd proto.LSN
	err = src.read(c.Context, readFrom, to, func(b []byte) error {
		r.Feed(b)
		prog.set(int64(r.Fed() - readFrom))
		for {
			rec, ok, err := r.Next()
			if err != nil {
				return err
			}
			if !ok {
				return nil
			}
			if firstRec == proto.InvalidLSN {
				firstRec = rec.LSN
				if !jsonOut {
					skipped(out, from, rec.LSN, info.segSize)
				}
			}
			lastEnd = rec.End
			switch {
			case statsOnly:
				st.add(rec)
			case jsonOut:
				if err := enc.Encode(recordJSON(rec)); err != nil {
					return err
				}
			default:
				if _, err := out.WriteString(formatRecord(rec)); err != nil {
					return err
				}
				out.WriteByte('\n')
			}
		}
	})
	prog.finish()
	var xe *xlog.Error
	switch {
	case errors.Is(err, xlog.ErrRecordCRC) && errors.As(err, &xe):
		out.Flush()
		return fmt.Errorf("wal dump: CRC check failed for the record at %s: %s", xe.LSN, xe.Reason)
	case errors.As(err, &xe):
		out.Flush()
		return fmt.Errorf("wal dump: invalid WAL at %s: %s", xe.LSN, xe.Reason)
	case err != nil:
		out.Flush()
		return fmt.Errorf("wal dump: %w", err)
	}
	if statsOnly {
		if jsonOut {
			return enc.Encode(st.json(firstRec, lastEnd))
		}
		st.print(out, firstRec, lastEnd)
	}
	return out.Flush()
}

// skipped prints pg_waldump's note that the first record is past the
// start asked for (a --start inside a record, or the tail of a record
// continued into the first page), on stdout as pg_waldump does; like it,
// not for a start at a segment's first byte.
func skipped(w io.Writer, from, first proto.LSN, segSize uint64) {
	if first == from || from.SegmentOffset(segSize) == 0 {
		return
	}
	n := uint32(first - from)
	unit := "bytes"
	if n == 1 {
		unit = "byte"
	}
	fmt.Fprintf(w, "first record is after %s, at %s, skipping over %d %s\n", from, first, n, unit)
}

// formatRecord is pg_waldump's line for rec, as PostgreSQL 15 prints it:
// "rmgr: Heap        len (rec/tot):     59/    59, tx:        728, lsn:
// 0/0174B598, prev 0/0174B560, desc: INSERT off 2 flags 0x00, blkref #0:
// rel 1663/5/16384 blk 0". Its LSNs are pg_waldump's %X/%08X (the only
// place the project pads them); the description (xlog.Describe) prints
// times in the local time zone, as pg_waldump does.
func formatRecord(rec *xlog.Record) string {
	return fmt.Sprintf("rmgr: %-11s len (rec/tot): %6d/%6d, tx: %10d, lsn: %s, prev %s, desc: %s%s",
		xlog.RmgrName(rec.RmID), int(rec.TotLen)-rec.FPILen(), rec.TotLen, rec.XID, waldumpLSN(rec.LSN), waldumpLSN(rec.Prev),
		xlog.Describe(rec, localTimestamp), xlog.BlockRefs(rec))
}

// waldumpLSN is an LSN as pg_waldump prints it in its record lines
// ("%X/%08X": 0/01000028).
func waldumpLSN(l proto.LSN) string {
	return fmt.Sprintf("%X/%08X", uint32(l>>32), uint32(l))
}

type blockJSON struct {
	ID      uint8  `json:"id"`
	Rel     string `json:"rel"`
	Fork    string `json:"fork"`
	Block   uint32 `json:"block"`
	DataLen int    `json:"data_len"`
	FPILen  int    `json:"fpi_len"` // 0: no image
	FPW     bool   `json:"fpw"`     // an image redo applies
}

type dumpRecordJSON struct {
	LSN    proto.LSN   `json:"lsn"`
	End    proto.LSN   `json:"end"`
	Prev   proto.LSN   `json:"prev"`
	Rmgr   string      `json:"rmgr"`
	Info   uint8       `json:"info"`
	XID    uint32      `json:"xid"`
	RecLen int         `json:"rec_len"`
	TotLen int         `json:"tot_len"`
	FPILen int         `json:"fpi_len"`
	Type   string      `json:"type"`
	Desc   string      `json:"desc"`
	Blocks []blockJSON `json:"blocks"`
}

func recordJSON(rec *xlog.Record) dumpRecordJSON {
	fpi := rec.FPILen()
	j := dumpRecordJSON{LSN: rec.LSN, End: rec.End, Prev: rec.Prev, Rmgr: xlog.RmgrName(rec.RmID), Info: rec.Info, XID: rec.XID,
		RecLen: int(rec.TotLen) - fpi, TotLen: int(rec.TotLen), FPILen: fpi, Type: xlog.RecordType(rec), Desc: xlog.Describe(rec, localTimestamp), Blocks: []blockJSON{}}
	for _, b := range rec.Blocks {
		bj := blockJSON{ID: b.ID, Rel: b.Rel.String(), Fork: b.ForkName(), Block: b.Block, DataLen: int(b.DataLen)}
		if b.Image != nil {
			bj.FPILen, bj.FPW = int(b.Image.Len), b.Image.Apply()
		}
		j.Blocks = append(j.Blocks, bj)
	}
	return j
}

// dumpStats is pg_waldump --stats: per resource manager, records and
// their record (xl_tot_len less images) and image bytes.
type dumpStats struct {
	count, rec, fpi [256]uint64
}

func newDumpStats() *dumpStats { return &dumpStats{} }

func (s *dumpStats) add(rec *xlog.Record) {
	fpi := uint64(rec.FPILen())
	s.count[rec.RmID]++
	s.rec[rec.RmID] += uint64(rec.TotLen) - fpi
	s.fpi[rec.RmID] += fpi
}

// rows are the rmgrs pg_waldump lists: every built-in one, custom ones
// that have records.
func (s *dumpStats) rows() []int {
	var ids []int
	for id := 0; id < 256; id++ {
		if id <= xlog.RMMaxBuiltinID || s.count[id] > 0 {
			ids = append(ids, id)
		}
	}
	return ids
}

func (s *dumpStats) totals() (n, rec, fpi uint64) {
	for id := range s.count {
		n += s.count[id]
		rec += s.rec[id]
		fpi += s.fpi[id]
	}
	return n, rec, fpi
}

func pct(part, whole uint64) float64 {
	if whole == 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

// print writes the table as pg_waldump --stats (XLogDumpDisplayStats).
func (s *dumpStats) print(w io.Writer, start, end proto.LSN) {
	n, rec, fpi := s.totals()
	tot := rec + fpi
	fmt.Fprintf(w, "WAL statistics between %s and %s:\n", start, end)
	fmt.Fprintf(w, "%-27s %20s %8s %20s %8s %20s %8s %20s %8s\n", "Type", "N", "(%)", "Record size", "(%)", "FPI size", "(%)", "Combined size", "(%)")
	fmt.Fprintf(w, "%-27s %20s %8s %20s %8s %20s %8s %20s %8s\n", "----", "-", "---", "-----------", "---", "--------", "---", "-------------", "---")
	for _, id := range s.rows() {
		c, r, f := s.count[id], s.rec[id], s.fpi[id]
		fmt.Fprintf(w, "%-27s %20d (%6.02f) %20d (%6.02f) %20d (%6.02f) %20d (%6.02f)\n",
			xlog.RmgrName(uint8(id)), c, pct(c, n), r, pct(r, rec), f, pct(f, fpi), r+f, pct(r+f, tot))
	}
	fmt.Fprintf(w, "%-27s %20s %8s %20s %8s %20s %8s %20s\n", "", "--------", "", "--------", "", "--------", "", "--------")
	fmt.Fprintf(w, "%-27s %20d %-9s%20d %-9s%20d %-9s%20d %-6s\n", "Total", n, "",
		rec, fmt.Sprintf("[%.2f%%]", pct(rec, tot)), fpi, fmt.Sprintf("[%.2f%%]", pct(fpi, tot)), tot, "[100%]")
}

type statsRowJSON struct {
	Rmgr         string `json:"rmgr"`
	Count        uint64 `json:"count"`
	RecordSize   uint64 `json:"record_size"`
	FPISize      uint64 `json:"fpi_size"`
	CombinedSize uint64 `json:"combined_size"`
}

type statsJSON struct {
	Start proto.LSN      `json:"start"`
	End   proto.LSN      `json:"end"`
	Rmgrs []statsRowJSON `json:"rmgrs"`
	Total statsRowJSON   `json:"total"`
}

func (s *dumpStats) json(start, end proto.LSN) statsJSON {
	out := statsJSON{Start: start, End: end, Rmgrs: []statsRowJSON{}}
	for _, id := range s.rows() {
		out.Rmgrs = append(out.Rmgrs, statsRowJSON{Rmgr: xlog.RmgrName(uint8(id)), Count: s.count[id], RecordSize: s.rec[id], FPISize: s.fpi[id], CombinedSize: s.rec[id] + s.fpi[id]})
	}
	n, rec, fpi := s.totals()
	out.Total = statsRowJSON{Rmgr: "Total", Count: n, RecordSize: rec, FPISize: fpi, CombinedSize: rec + fpi}
	return out
}

// dumpChunk is how much WAL one read takes.
const dumpChunk = 1 << 20

// dataDirSource reads a stopped safekeeper's database, read-only.
type dataDirSource struct {
	wal *timeline.StoredWAL
	in  dumpInfo
}

func openDataDirSource(dir string, key proto.TimelineKey) (*dataDirSource, error) {
	if _, err := os.Stat(filepath.Join(dir, timeline.DatabaseFile)); err != nil {
		return nil, fmt.Errorf("wal dump: %w", err)
	}
	wal, err := timeline.OpenWAL(dir, key)
	switch {
	case errors.Is(err, timeline.ErrInUse):
		return nil, fmt.Errorf("wal dump: %s is in use (a safekeeper is running on it?); read from the running safekeeper with --http HOST:PORT instead: %w", dir, err)
	case errors.Is(err, timeline.ErrNotFound):
		return nil, fmt.Errorf("wal dump: timeline %s not found in %s", key, dir)
	case err != nil:
		return nil, fmt.Errorf("wal dump: %w", err)
	}
	st := wal.State
	return &dataDirSource{wal: wal, in: dumpInfo{segSize: uint64(st.WalSegSize), start: st.TimelineStartLSN,
		removedUpTo: wal.RemovedUpTo, flush: st.FlushLSN}}, nil
}

func (s *dataDirSource) info() dumpInfo { return s.in }
func (s *dataDirSource) close()         { s.wal.Close() }

func (s *dataDirSource) read(ctx context.Context, from, to proto.LSN, fn func([]byte) error) error {
	buf := make([]byte, dumpChunk)
	for pos := from; pos < to; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := s.wal.ReadWAL(pos, buf[:min(uint64(to-pos), dumpChunk)])
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("the stored WAL ends at %s, below %s", pos, to)
		}
		if err := fn(buf[:n]); err != nil {
			return err
		}
		pos += proto.LSN(n)
	}
	return nil
}

// httpSource reads from a running safekeeper's HTTP API: the timeline's
// state from GET /v1/tenant/{t}/timeline/{tl}, the WAL from .../wal.
type httpSource struct {
	api *httpapi.Client
	key proto.TimelineKey
	in  dumpInfo
}

func openHTTPSource(c *cli.Context, key proto.TimelineKey) (*httpSource, error) {
	tl, _, err := apiCall(c, func(api *httpapi.Client, ctx context.Context) (*httpapi.Timeline, []byte, error) {
		return api.Timeline(ctx, key)
	})
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			return nil, err
		}
		return nil, fmt.Errorf("wal dump: %w", err)
	}
	api, err := apiClient(c)
	if err != nil {
		return nil, err
	}
	return &httpSource{api: api, key: key, in: dumpInfo{segSize: uint64(tl.WalSegSize), start: tl.TimelineStartLSN,
		removedUpTo: tl.RemovedUpTo, flush: tl.FlushLSN}}, nil
}

func (s *httpSource) info() dumpInfo { return s.in }
func (s *httpSource) close()         {}

func (s *httpSource) read(ctx context.Context, from, to proto.LSN, fn func([]byte) error) error {
	return apiError(s.api.WAL(ctx, s.key, from, to, fn))
}

// localTimestamp is xlog.TimestampFormat in the local time zone (TZ, or
// /etc/localtime), as pg_waldump prints commit times.
func localTimestamp(ts int64) string {
	t := time.Unix(ts/1_000_000+xlog.PostgresEpochUnix, 0).In(time.Local)
	zone, _ := t.Zone()
	return fmt.Sprintf("%s.%06d %s", t.Format("2006-01-02 15:04:05"), ts%1_000_000, zone)
}
