package main

import (
	"fmt"
	"io"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage/archive"
)

// `safekeeper archive ls|verify|prune`: a timeline's WAL archive
// (--remote-storage), read and pruned offline; the work is storage/archive's
// (Scan, Verify, Prune), shared with the uploader.

func archiveCommand() *cli.Command {
	return &cli.Command{
		Name:            "archive",
		Usage:           "list, verify or prune a timeline's WAL archive (--remote-storage)",
		OnUsageError:    func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Subcommands:     []*cli.Command{archiveLsCommand(), archiveVerifyCommand(), archivePruneCommand()},
		HideHelpCommand: true,
		Action: func(c *cli.Context) error {
			if c.Args().First() == "help" {
				return c.App.RunContext(c.Context, append([]string{c.App.Name, "help", "archive"}, c.Args().Tail()...))
			}
			if c.NArg() > 0 {
				return usagef("unknown command \"archive %s\"; 'safekeeper help archive' lists its subcommands", c.Args().First())
			}
			return cli.ShowSubcommandHelp(c)
		},
	}
}

// archiveToolFlags are the flags every archive subcommand takes.
func archiveToolFlags(extra ...cli.Flag) []cli.Flag {
	return append(append([]cli.Flag{
		&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)"},
		&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)"},
		jsonFlag(),
	}, extra...), archiveReadFlags()...)
}

// archiveSubcommand fills in what the archive subcommands share: the
// required flags, usage errors, no arguments.
func archiveSubcommand(cmd *cli.Command) *cli.Command {
	cmd.OnUsageError = func(c *cli.Context, err error, _ bool) error { return usageError{err} }
	cmd.Before = func(c *cli.Context) error { return requireFlags(c, "remote-storage", "tenant-id", "timeline-id") }
	action := cmd.Action
	cmd.Action = func(c *cli.Context) error {
		if c.NArg() > 0 {
			return usagef("archive %s takes no arguments, got %q", cmd.Name, c.Args().Slice())
		}
		return action(c)
	}
	return cmd
}

// openTimelineArchive is the archive of --tenant-id/--timeline-id in
// --remote-storage.
func openTimelineArchive(c *cli.Context) (*archive.Archive, error) {
	tenant, timeline, err := parseIDs(c)
	if err != nil {
		return nil, err
	}
	store, codec, err := openArchive(c, nil)
	if err != nil {
		return nil, err
	}
	if store == nil {
		return nil, usagef("--remote-storage must name a store (file:///path or s3://BUCKET/PREFIX)")
	}
	return archive.Open(store, codec, proto.TimelineKey{TenantID: tenant, TimelineID: timeline}), nil
}

// archiveName is how the commands name a timeline's archive.
func archiveName(ar *archive.Archive) string {
	return fmt.Sprintf("%s timeline %s/%s", ar.Store, ar.Key.TenantID, ar.Key.TimelineID)
}

func archiveLsCommand() *cli.Command {
	return archiveSubcommand(&cli.Command{
		Name:      "ls",
		Usage:     "list what a timeline's archive holds: segments by PostgreSQL timeline, history files, the newest partial, sizes, gaps",
		UsageText: "safekeeper archive ls --remote-storage URL --tenant-id HEX --timeline-id HEX [--json]",
		Description: "Lists the archive (one listing, one object header, the history files): the whole segments of each\n" +
			"PostgreSQL timeline (first, last, how many), the history files, the newest partial object (its\n" +
			"segment, end LSN and age), the WAL held against what the store holds for it (the compression\n" +
			"ratio), and the gaps: segments missing between the archive's start and its end, named as the\n" +
			"newest history file names them (after a switch, the new timeline's name from the segment holding\n" +
			"the switch point). It reads no WAL: `archive verify` does. Exit 0 whatever it finds, 1 if the\n" +
			"store cannot be read, 2 for bad flags.",
		Flags:  archiveToolFlags(),
		Action: archiveLs,
	})
}

type lsTimelineJSON struct {
	Timeline    uint32    `json:"timeline"`
	First       string    `json:"first"`
	Last        string    `json:"last"`
	Count       int       `json:"count"`
	Start       proto.LSN `json:"start"`
	End         proto.LSN `json:"end"`
	StoredBytes int64     `json:"stored_bytes"`
}

type lsEndJSON struct {
	Timeline uint32    `json:"timeline"`
	End      proto.LSN `json:"end"`
}

type lsHistoryJSON struct {
	File     string      `json:"file"`
	Timeline uint32      `json:"timeline"`
	Ends     []lsEndJSON `json:"ends"`
	Error    string      `json:"error,omitempty"`
}

type lsPartialJSON struct {
	Object     string    `json:"object"`
	Segment    string    `json:"segment"`
	Timeline   uint32    `json:"timeline"`
	End        proto.LSN `json:"end"`
	Modified   time.Time `json:"modified"`
	AgeSeconds float64   `json:"age_seconds"`
}

type lsGapJSON struct {
	First string    `json:"first"`
	Last  string    `json:"last"`
	Count int       `json:"count"`
	Start proto.LSN `json:"start"`
	End   proto.LSN `json:"end"`
}

type lsJSON struct {
	Store            string           `json:"store"`
	TenantID         string           `json:"tenant_id"`
	TimelineID       string           `json:"timeline_id"`
	SystemID         uint64           `json:"system_id"`
	SegmentSize      uint64           `json:"segment_size"`
	Start            proto.LSN        `json:"start"`
	End              proto.LSN        `json:"end"`
	Timelines        []lsTimelineJSON `json:"timelines"`
	Segments         int              `json:"segments"`
	Histories        []lsHistoryJSON  `json:"histories"`
	NewestPartial    *lsPartialJSON   `json:"newest_partial"`
	Partials         int              `json:"partials"`
	WALBytes         int64            `json:"wal_bytes"`
	StoredBytes      int64            `json:"stored_bytes"`
	CompressionRatio float64          `json:"compression_ratio"`
	Gaps             []lsGapJSON      `json:"gaps"`
	Misnamed         []string         `json:"misnamed"`
	Strays           []string         `json:"strays"`
	// HistoryMissing: the current timeline's history file is missing
	// or unusable, so gaps are counted whatever the names' timelines.
	HistoryMissing bool `json:"history_missing,omitempty"`
}

func archiveLs(c *cli.Context) error {
	ar, err := openTimelineArchive(c)
	if err != nil {
		return err
	}
	inv, err := archive.Scan(c.Context, ar)
	if err != nil {
		return fmt.Errorf("archive ls: %w", err)
	}
	now := time.Now()
	wal, stored := inv.Totals()
	_, histOK := inv.History()
	j := lsJSON{Store: ar.Store.String(), TenantID: ar.Key.TenantID.String(), TimelineID: ar.Key.TimelineID.String(),
		SystemID: inv.SystemID, SegmentSize: inv.SegSize, Start: inv.Start(), End: inv.End(), Segments: len(inv.Segments),
		Timelines: []lsTimelineJSON{}, Histories: []lsHistoryJSON{}, Partials: len(inv.Partials), WALBytes: wal, StoredBytes: stored,
		Gaps: []lsGapJSON{}, Misnamed: []string{}, Strays: []string{}, HistoryMissing: !histOK}
	if stored > 0 {
		j.CompressionRatio = float64(wal) / float64(stored)
	}
	for _, t := range inv.Timelines() {
		j.Timelines = append(j.Timelines, lsTimelineJSON{Timeline: t.Timeline, First: t.First, Last: t.Last, Count: t.Count, Start: t.Start, End: t.End, StoredBytes: t.StoredBytes})
	}
	for _, h := range inv.Histories {
		hj := lsHistoryJSON{File: h.File, Timeline: h.Timeline, Ends: []lsEndJSON{}}
		for _, e := range h.Ends {
			hj.Ends = append(hj.Ends, lsEndJSON{Timeline: e.TLI, End: e.End})
		}
		if h.Err != nil {
			hj.Error = h.Err.Error()
		}
		j.Histories = append(j.Histories, hj)
	}
	if p, ok := inv.Newest(); ok {
		j.NewestPartial = &lsPartialJSON{Object: p.Name, Segment: p.File, Timeline: p.Timeline, End: p.End, Modified: p.Modified.UTC(),
			AgeSeconds: p.Age(now).Round(time.Millisecond).Seconds()}
	}
	for _, g := range inv.Gaps() {
		j.Gaps = append(j.Gaps, lsGapJSON{First: g.First, Last: g.Last, Count: g.Count, Start: g.Start, End: g.End})
	}
	for _, m := range inv.Misnamed() {
		j.Misnamed = append(j.Misnamed, m.Name)
	}
	for _, s := range inv.Strays {
		j.Strays = append(j.Strays, s.Name)
	}
	if c.Bool("json") {
		return writeJSONLine(c, j)
	}
	printLs(c.App.Writer, ar, inv, j)
	return nil
}

func printLs(w io.Writer, ar *archive.Archive, inv *archive.Inventory, j lsJSON) {
	fmt.Fprintf(w, "archive %s\n", archiveName(ar))
	if inv.Empty() && len(inv.Histories) == 0 {
		fmt.Fprintln(w, "empty: no object of this timeline")
		return
	}
	if !inv.Empty() {
		fmt.Fprintf(w, "system id %d, %s segments, WAL %s..%s\n", inv.SystemID, size(int64(inv.SegSize)), j.Start, j.End)
	}
	for _, t := range j.Timelines {
		fmt.Fprintf(w, "PostgreSQL timeline %d: %s..%s, %d %s (%s..%s)\n", t.Timeline, t.First, t.Last, t.Count, plural(t.Count, "segment", "segments"), t.Start, t.End)
	}
	if len(j.Timelines) == 0 {
		fmt.Fprintln(w, "no whole segment")
	}
	for _, h := range j.Histories {
		switch {
		case h.Error != "":
			fmt.Fprintf(w, "history file %s: unusable: %s\n", h.File, h.Error)
		default:
			var ends []string
			for _, e := range h.Ends {
				ends = append(ends, fmt.Sprintf("timeline %d ended at %s", e.Timeline, e.End))
			}
			fmt.Fprintf(w, "history file %s: %s\n", h.File, strings.Join(ends, ", "))
		}
	}
	if h, ok := inv.History(); !ok && h.Err == nil {
		fmt.Fprintf(w, "history file %08X.history: missing (the archive holds timeline %d's name)\n", h.Timeline, h.Timeline)
	}
	if p := j.NewestPartial; p != nil {
		fmt.Fprintf(w, "newest partial: %s up to %s, %s old", p.Segment, p.End, time.Duration(p.AgeSeconds*float64(time.Second)).Round(time.Second))
		if n := j.Partials - 1; n > 0 {
			fmt.Fprintf(w, " (and %d older %s)", n, plural(n, "partial", "partials"))
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintln(w, "no partial")
	}
	if !inv.Empty() {
		ratio := "-"
		if j.CompressionRatio > 0 {
			ratio = fmt.Sprintf("%.2f", j.CompressionRatio)
		}
		fmt.Fprintf(w, "WAL %s in %d %s and %d %s, stored in %s: compression ratio %s\n", size(j.WALBytes), j.Segments, plural(j.Segments, "segment", "segments"),
			j.Partials, plural(j.Partials, "partial", "partials"), size(j.StoredBytes), ratio)
	}
	switch {
	case len(j.Gaps) == 0 && j.HistoryMissing:
		fmt.Fprintln(w, "gaps: none (counted without the history: any timeline's segment fills its place)")
	case len(j.Gaps) == 0:
		fmt.Fprintln(w, "gaps: none")
	}
	for _, g := range j.Gaps {
		names := g.First
		if g.Count > 1 {
			names += ".." + g.Last
		}
		fmt.Fprintf(w, "gap: %s (%s..%s), %d %s missing\n", names, g.Start, g.End, g.Count, plural(g.Count, "segment", "segments"))
	}
	for _, m := range inv.Misnamed() {
		fmt.Fprintf(w, "misnamed: %s: named by timeline %d, but the history gives %s to timeline %d\n", m.Name, m.Timeline, m.Start, inv.TimelineOf(m.Start))
	}
	for _, s := range j.Strays {
		fmt.Fprintf(w, "stray: %s: no segment of %s segments\n", s, size(int64(inv.SegSize)))
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// size is n bytes for people: "512 B", "12.5 KiB", "16 MiB", "1.20 GiB".
func size(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return trimZero(fmt.Sprintf("%.1f", float64(n)/(1<<10))) + " KiB"
	case n < 1<<30:
		return trimZero(fmt.Sprintf("%.1f", float64(n)/(1<<20))) + " MiB"
	}
	return trimZero(fmt.Sprintf("%.2f", float64(n)/(1<<30))) + " GiB"
}

func trimZero(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

func archiveVerifyCommand() *cli.Command {
	return archiveSubcommand(&cli.Command{
		Name:      "verify",
		Usage:     "read a timeline's whole archive and check it: checksums, history files, every WAL record, no gap",
		UsageText: "safekeeper archive verify --remote-storage URL --tenant-id HEX --timeline-id HEX [--from LSN] [--json]",
		Description: "Reads every object of the archive in order, as a restore would, and checks: each object's\n" +
			"SHA-256 and header; the history files against each other and against the segment names (each\n" +
			"segment named by the PostgreSQL timeline that owns its range, a history file for every timeline\n" +
			"the WAL is on); then the WAL from the archive's start (or --from) to its end (the newest\n" +
			"partial's end), decoded record by record: every page header, CRC and prev-link, across segment\n" +
			"boundaries and timeline switches, no segment missing, the last record whole. It prints what it\n" +
			"checked. Exit 0 when all is well; 1 naming the first gap, corrupt object or bad record (or a\n" +
			"store that cannot be read); 2 for bad flags.",
		Flags: archiveToolFlags(
			&cli.StringFlag{Name: "from", Usage: "check the records from this LSN (X/X) on (default: the archive's start); reading starts at its segment"},
		),
		Action: archiveVerify,
	})
}

type verifyJSON struct {
	OK          bool      `json:"ok"`
	Error       string    `json:"error,omitempty"`
	Store       string    `json:"store"`
	TenantID    string    `json:"tenant_id"`
	TimelineID  string    `json:"timeline_id"`
	From        proto.LSN `json:"from"`
	End         proto.LSN `json:"end"`
	Objects     int       `json:"objects"`
	Segments    int       `json:"segments"`
	Partial     string    `json:"partial"`
	Histories   int       `json:"histories"`
	Records     int       `json:"records"`
	FirstRecord proto.LSN `json:"first_record"`
	RecordsEnd  proto.LSN `json:"records_end"`
}

func archiveVerify(c *cli.Context) error {
	var from proto.LSN
	if c.IsSet("from") {
		l, err := proto.ParseLSN(c.String("from"))
		if err != nil {
			return usagef("--from: %w", err)
		}
		if l == 0 {
			return usagef("--from 0/0: give an LSN in the archive, or leave --from out for its start")
		}
		from = l
	}
	ar, err := openTimelineArchive(c)
	if err != nil {
		return err
	}
	var prog *progress
	opts := archive.VerifyOptions{From: from, Progress: func(done, total int64) {
		if prog == nil {
			prog = newProgress(c.App.ErrWriter, total)
		}
		prog.set(done)
	}}
	res, verr := archive.Verify(c.Context, ar, opts)
	if prog != nil {
		prog.finish()
	}
	if c.Bool("json") {
		j := verifyJSON{OK: verr == nil, Store: ar.Store.String(), TenantID: ar.Key.TenantID.String(), TimelineID: ar.Key.TimelineID.String(),
			From: res.From, End: res.End, Objects: res.Objects, Segments: res.Segments, Partial: res.Partial, Histories: res.Histories,
			Records: res.Records, FirstRecord: res.FirstRecord, RecordsEnd: res.RecordsEnd}
		if verr != nil {
			j.Error = verr.Error()
		}
		if err := writeJSONLine(c, j); err != nil {
			return err
		}
	} else {
		printVerify(c.App.Writer, ar, res, verr)
	}
	if verr != nil {
		return fmt.Errorf("archive verify: %w", verr)
	}
	return nil
}

func printVerify(w io.Writer, ar *archive.Archive, res archive.VerifyResult, verr error) {
	fmt.Fprintf(w, "archive %s\n", archiveName(ar))
	if res.Inventory == nil || res.Inventory.Empty() {
		return
	}
	partial := ""
	switch {
	case res.Partial != "":
		partial = ", the partial " + res.Partial
	case verr == nil:
		partial = ", no partial"
	}
	fmt.Fprintf(w, "read %d %s: %d whole %s%s, %d history %s; checksums and headers checked\n",
		res.Objects, plural(res.Objects, "object", "objects"), res.Segments, plural(res.Segments, "segment", "segments"), partial,
		res.Histories, plural(res.Histories, "file", "files"))
	if res.Records > 0 {
		fmt.Fprintf(w, "decoded %d WAL %s from %s to %s: page headers, CRCs and prev-links checked\n",
			res.Records, plural(res.Records, "record", "records"), res.FirstRecord, res.RecordsEnd)
	}
	if verr != nil {
		fmt.Fprintf(w, "FAILED: stopped at the first problem (on stderr); checking from %s, the archive ends at %s\n", res.From, res.End)
		return
	}
	fmt.Fprintf(w, "OK: the WAL from %s to the archive's end at %s\n", res.From, res.End)
}

func archivePruneCommand() *cli.Command {
	return archiveSubcommand(&cli.Command{
		Name:      "prune",
		Usage:     "delete a timeline's archived WAL below an LSN or older than an age",
		UsageText: "safekeeper archive prune --remote-storage URL --tenant-id HEX --timeline-id HEX (--before LSN | --older-than AGE) [--dry-run] [--json]",
		Description: "Deletes whole segments and partial objects: with --before, those wholly below the LSN; with\n" +
			"--older-than (7d, 36h, 90m), the oldest segments up to the first one stored since now minus\n" +
			"the age (a later segment stored earlier stays, so no gap opens) and the older partials stored\n" +
			"before it. Never the newest partial (a restore's end of WAL), never a history file (PostgreSQL\n" +
			"asks for each one in turn to find the newest timeline). Segments go in LSN order, so a prune\n" +
			"that stops half way leaves an archive that starts later, without a hole. Prints each object it\n" +
			"deletes; --dry-run deletes nothing and prints what it would. Keep the WAL your oldest base\n" +
			"backup needs: everything after its start LSN.",
		Flags: archiveToolFlags(
			&cli.StringFlag{Name: "before", Usage: "delete the WAL wholly below this LSN (X/X)"},
			&cli.StringFlag{Name: "older-than", Usage: "delete the WAL stored longer ago than this: 7d, 12h, 90m, 1d12h"},
			&cli.BoolFlag{Name: "dry-run", Usage: "print what would be deleted and delete nothing"},
		),
		Action: archivePrune,
	})
}

type pruneObjectJSON struct {
	Object string    `json:"object"`
	Start  proto.LSN `json:"start"`
	End    proto.LSN `json:"end"`
	Bytes  int64     `json:"bytes"`
}

type pruneJSON struct {
	DryRun       bool              `json:"dry_run"`
	Deleted      []pruneObjectJSON `json:"deleted"`
	DeletedBytes int64             `json:"deleted_bytes"`
	Start        proto.LSN         `json:"start"`
	Kept         int               `json:"kept"`
	Error        string            `json:"error,omitempty"`
}

func archivePrune(c *cli.Context) error {
	var opts archive.PruneOptions
	if c.IsSet("before") == c.IsSet("older-than") {
		return usagef("archive prune takes one of --before LSN or --older-than AGE")
	}
	if c.IsSet("before") {
		l, err := proto.ParseLSN(c.String("before"))
		if err != nil {
			return usagef("--before: %w", err)
		}
		if l == 0 {
			return usagef("--before 0/0 deletes nothing")
		}
		opts.Before = l
	} else {
		d, err := parseAge(c.String("older-than"))
		if err != nil {
			return usagef("--older-than: %w", err)
		}
		opts.OlderThan = d
	}
	opts.DryRun = c.Bool("dry-run")
	ar, err := openTimelineArchive(c)
	if err != nil {
		return err
	}
	res, perr := archive.Prune(c.Context, ar, opts)
	if c.Bool("json") {
		j := pruneJSON{DryRun: opts.DryRun, Deleted: []pruneObjectJSON{}, DeletedBytes: res.DeletedBytes, Start: res.Start, Kept: res.Kept}
		for _, o := range res.Deleted {
			j.Deleted = append(j.Deleted, pruneObjectJSON{Object: o.Name, Start: o.Start, End: o.End, Bytes: o.Size})
		}
		if perr != nil {
			j.Error = perr.Error()
		}
		if err := writeJSONLine(c, j); err != nil {
			return err
		}
	} else {
		w := c.App.Writer
		verb := "deleted"
		if opts.DryRun {
			verb = "would delete"
		}
		fmt.Fprintf(w, "archive %s\n", archiveName(ar))
		for _, o := range res.Deleted {
			what := "segment"
			if o.Kind == archive.KindPartial {
				what = "partial"
			}
			fmt.Fprintf(w, "%s %s %s (%s..%s, %s)\n", verb, what, path.Base(o.Name), o.Start, o.End, size(o.Size))
		}
		n := len(res.Deleted)
		fmt.Fprintf(w, "%s %d %s (%s)", verb, n, plural(n, "object", "objects"), size(res.DeletedBytes))
		if res.Kept > 0 {
			stay := "stay"
			if opts.DryRun {
				stay = "would stay"
			}
			fmt.Fprintf(w, "; %d WAL %s %s, from %s", res.Kept, plural(res.Kept, "object", "objects"), stay, res.Start)
		}
		if opts.DryRun {
			fmt.Fprint(w, "; nothing was deleted (--dry-run)")
		}
		fmt.Fprintln(w)
	}
	if perr != nil {
		return fmt.Errorf("archive prune: %w", perr)
	}
	return nil
}

// ageRE is an age with days: "7d", "1d12h", "2d30m".
var ageRE = regexp.MustCompile(`^(\d+)d(.*)$`)

// parseAge parses an age: a Go duration (36h, 90m) with days allowed in
// front (7d, 1d12h). It must be positive.
func parseAge(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	var d time.Duration
	if m := ageRE.FindStringSubmatch(t); m != nil {
		days, err := strconv.ParseUint(m[1], 10, 32)
		if err != nil || days > 100*365 {
			return 0, fmt.Errorf("%q: too many days", s)
		}
		d, t = time.Duration(days)*24*time.Hour, m[2]
	}
	if t != "" {
		rest, err := time.ParseDuration(t)
		if err != nil || rest < 0 {
			return 0, fmt.Errorf("%q: want an age like 7d, 36h or 90m", s)
		}
		d += rest
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q: want an age above zero, like 7d, 36h or 90m", s)
	}
	return d, nil
}
