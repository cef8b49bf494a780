package archive

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage/remote"
)

// Inventory is what a timeline's archive holds, from one listing, the
// header of one WAL object (for the segment size and system id) and the
// history files (small, read whole): what `safekeeper archive ls` prints
// and what Verify and Prune work from.
type Inventory struct {
	// SegSize is the WAL segment size (0: the archive holds no WAL
	// object); SystemID the cluster's system identifier, both from the
	// header of the first whole segment (else the newest partial).
	SegSize  uint64
	SystemID uint64
	// Segments are the whole segments, by start LSN, then timeline.
	Segments []WALObject
	// Partials are the partial objects in name order: the newest (the
	// one a restore reads) is the last.
	Partials []WALObject
	// Histories are the history files, by timeline.
	Histories []History
	// Strays are objects under wal/ whose names are no segment of this
	// archive's segment size (a segment number past the last one of a
	// 4 GiB "log id").
	Strays []Entry

	cur    uint32  // CurrentTimeline
	hist   History // History
	histOK bool
}

// WALObject is a whole segment or a partial object.
type WALObject struct {
	Entry
	// Timeline is the PostgreSQL timeline in its name.
	Timeline uint32
	// Start is its segment's first LSN; End the LSN after its WAL (the
	// segment's end, or a partial's end).
	Start, End proto.LSN
}

// History is a PostgreSQL timeline history file in the archive.
type History struct {
	Entry
	// Timeline is the timeline whose history it is (its name's).
	Timeline uint32
	// Ends are its lines: where each ancestor timeline ended.
	Ends []proto.PgTimelineEnd
	// Content is the file, as PostgreSQL wrote it.
	Content []byte
	// Err is why it could not be used (nil: it was read, checked and
	// parsed): a corrupt object, no identity to decrypt it, a header
	// of another kind or timeline, content that does not parse.
	Err error
}

// ParseSegmentFile reads a PostgreSQL segment file name
// (TTTTTTTTXXXXXXXXYYYYYYYY) for segments of segSize bytes: its timeline
// and first LSN. ok is false for anything else, including a segment
// number past the last of a log id.
func ParseSegmentFile(file string, segSize uint64) (tli uint32, start proto.LSN, ok bool) {
	if !segmentFile.MatchString(file) || segSize == 0 || segSize&(segSize-1) != 0 || segSize > 1<<30 {
		return 0, 0, false
	}
	t, _ := strconv.ParseUint(file[:8], 16, 32)
	hi, _ := strconv.ParseUint(file[8:16], 16, 32)
	lo, _ := strconv.ParseUint(file[16:], 16, 32)
	perID := uint64(1<<32) / segSize
	if lo >= perID || t == 0 {
		return 0, 0, false
	}
	return uint32(t), proto.LSN((hi*perID + lo) * segSize), true
}

// Scan lists the archive and reads what the listing cannot say: one WAL
// object's header and the history files. A history file that cannot be
// used is kept with its Err set; an error reaching the store is returned.
func Scan(ctx context.Context, ar *Archive) (*Inventory, error) {
	inv := &Inventory{}
	var segs, parts, hists []Entry
	err := ar.List(ctx, func(e Entry) error {
		switch e.Kind {
		case KindSegment:
			segs = append(segs, e)
		case KindPartial:
			parts = append(parts, e)
		case KindHistory:
			hists = append(hists, e)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The segment size is in every WAL object's header: read one.
	var probe []Entry
	if len(segs) > 0 {
		probe = append(probe, segs[0])
	}
	if len(parts) > 0 {
		probe = append(probe, parts[len(parts)-1])
	}
	for _, e := range probe {
		h, _, err := ar.Head(ctx, e.Name)
		if errors.Is(err, ErrCorrupt) || errors.Is(err, remote.ErrNotFound) {
			continue // Verify names it, or a partial superseded meanwhile: another object may say
		}
		if err != nil {
			return nil, err
		}
		inv.SegSize, inv.SystemID = uint64(h.SegSize), h.SystemID
		break
	}
	if inv.SegSize == 0 && len(probe) > 0 {
		return nil, fmt.Errorf("%w: no readable header among %s: the archive's segment size is unknown", ErrCorrupt, probe[0].Name)
	}
	for _, e := range segs {
		tli, start, ok := ParseSegmentFile(e.File, inv.SegSize)
		if !ok {
			inv.Strays = append(inv.Strays, e)
			continue
		}
		inv.Segments = append(inv.Segments, WALObject{Entry: e, Timeline: tli, Start: start, End: start + proto.LSN(inv.SegSize)})
	}
	slices.SortStableFunc(inv.Segments, func(a, b WALObject) int {
		if a.Start != b.Start {
			return cmpLSN(a.Start, b.Start)
		}
		return int(a.Timeline) - int(b.Timeline)
	})
	for _, e := range parts {
		tli, start, ok := ParseSegmentFile(e.File, inv.SegSize)
		if !ok || e.End <= start || e.End > start+proto.LSN(inv.SegSize) {
			inv.Strays = append(inv.Strays, e)
			continue
		}
		inv.Partials = append(inv.Partials, WALObject{Entry: e, Timeline: tli, Start: start, End: e.End})
	}
	for _, e := range hists {
		tli, _ := strconv.ParseUint(e.File[:8], 16, 32)
		h := History{Entry: e, Timeline: uint32(tli)}
		hdr, content, err := ar.Get(ctx, e.Name)
		switch {
		case errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNoIdentity):
			h.Err = err
		case err != nil:
			return nil, err
		case hdr.Kind != KindHistory || hdr.PgTimeline != h.Timeline:
			h.Err = fmt.Errorf("%s: %w: holds a %s of PostgreSQL timeline %d", e.Name, ErrCorrupt, hdr.Kind, hdr.PgTimeline)
		default:
			h.Content = content
			if h.Ends, err = proto.ParsePgHistory(h.Timeline, content); err != nil {
				h.Err = fmt.Errorf("%s: %w", e.Name, err)
			}
		}
		inv.Histories = append(inv.Histories, h)
	}
	inv.index()
	return inv, nil
}

func cmpLSN(a, b proto.LSN) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Newest is the newest partial object: the one a restore reads for the
// end of the WAL.
func (inv *Inventory) Newest() (WALObject, bool) {
	if len(inv.Partials) == 0 {
		return WALObject{}, false
	}
	return inv.Partials[len(inv.Partials)-1], true
}

// Empty reports whether the archive holds no WAL object.
func (inv *Inventory) Empty() bool { return len(inv.Segments) == 0 && len(inv.Partials) == 0 }

// Start is the first LSN of the archive's WAL: its lowest whole segment,
// or the newest partial's segment if it holds no whole segment before it.
func (inv *Inventory) Start() proto.LSN {
	start := proto.LSN(0)
	if len(inv.Segments) > 0 {
		start = inv.Segments[0].Start
	}
	if p, ok := inv.Newest(); ok && (len(inv.Segments) == 0 || p.Start < start) {
		start = p.Start
	}
	return start
}

// End is the end of the archive's WAL: the newest partial's end, or the
// end of the last whole segment when that is later.
func (inv *Inventory) End() proto.LSN {
	end := proto.LSN(0)
	if n := len(inv.Segments); n > 0 {
		end = inv.Segments[n-1].End
	}
	if p, ok := inv.Newest(); ok && p.End > end {
		end = p.End
	}
	return end
}

// CurrentTimeline is the newest PostgreSQL timeline the archive knows: the
// highest in a WAL object's or a history file's name (1 when empty).
func (inv *Inventory) CurrentTimeline() uint32 { return inv.cur }

// History returns the history file of the current timeline
// (CurrentTimeline), which names the archive's segments; ok is false when
// that timeline is after the first and its history file is missing or
// unusable: then no one can tell which timeline owns a position.
func (inv *Inventory) History() (h History, ok bool) { return inv.hist, inv.histOK }

// index sets what CurrentTimeline and History return.
func (inv *Inventory) index() {
	inv.cur = 1
	for _, s := range inv.Segments {
		inv.cur = max(inv.cur, s.Timeline)
	}
	for _, p := range inv.Partials {
		inv.cur = max(inv.cur, p.Timeline)
	}
	for _, h := range inv.Histories {
		inv.cur = max(inv.cur, h.Timeline)
	}
	inv.hist, inv.histOK = History{Timeline: inv.cur}, inv.cur == 1
	for _, h := range inv.Histories {
		if h.Timeline == inv.cur {
			inv.hist, inv.histOK = h, h.Err == nil
		}
	}
}

// TimelineOf is the PostgreSQL timeline that names the segment starting at
// start, per the current timeline's history file: the timeline its WAL
// belongs to, the new one for the segment holding a switch point (as
// PostgreSQL names them, proto.PgSegmentTimeline). Without a usable
// history file it is the current timeline.
func (inv *Inventory) TimelineOf(start proto.LSN) uint32 {
	h, _ := inv.History()
	return proto.PgSegmentTimeline(h.Ends, inv.CurrentTimeline(), start, inv.SegSize)
}

// SegmentFile is the name the segment starting at start has in the
// archive (TimelineOf).
func (inv *Inventory) SegmentFile(start proto.LSN) string {
	return proto.SegmentFileName(inv.TimelineOf(start), start, inv.SegSize)
}

// TimelineSummary is the whole segments of one PostgreSQL timeline.
type TimelineSummary struct {
	Timeline    uint32
	First, Last string    // segment files
	Start, End  proto.LSN // the first one's start, the last one's end
	Count       int
	StoredBytes int64
}

// Timelines summarises the whole segments by the timeline in their names.
func (inv *Inventory) Timelines() []TimelineSummary {
	by := map[uint32]*TimelineSummary{}
	var order []uint32
	for _, s := range inv.Segments {
		t := by[s.Timeline]
		if t == nil {
			t = &TimelineSummary{Timeline: s.Timeline, First: s.File, Start: s.Start}
			by[s.Timeline] = t
			order = append(order, s.Timeline)
		}
		t.Last, t.End = s.File, s.End
		t.Count++
		t.StoredBytes += s.Size
	}
	slices.Sort(order)
	out := make([]TimelineSummary, 0, len(order))
	for _, tli := range order {
		out = append(out, *by[tli])
	}
	return out
}

// Totals are the WAL the archive holds, as put (whole segments at the
// segment size, partials up to their end), and what the store holds for
// those objects (compressed, with their headers). History files are not
// counted: a line per promotion.
func (inv *Inventory) Totals() (wal, stored int64) {
	for _, s := range inv.Segments {
		wal += int64(inv.SegSize)
		stored += s.Size
	}
	for _, p := range inv.Partials {
		wal += int64(p.End - p.Start)
		stored += p.Size
	}
	return wal, stored
}

// Gap is a run of whole segments missing from the archive between WAL it
// holds: [Start, End), First to Last as named by the history.
type Gap struct {
	Start, End  proto.LSN
	First, Last string
	Count       int
}

// Gaps are the segments missing between the archive's start and its end
// (Start, End): a position with no whole segment under the name the
// history gives it (TimelineOf), other than the newest partial's segment
// when it is the last. After a timeline switch the segments continue under
// the new timeline's name from the segment holding the switch point, so a
// segment of the old timeline's name there does not fill it. Without a
// usable history file of the current timeline (History), a segment of any
// timeline's name fills its position.
func (inv *Inventory) Gaps() []Gap {
	if inv.Empty() {
		return nil
	}
	_, named := inv.History()
	have := make(map[string]bool, len(inv.Segments))
	at := make(map[proto.LSN]bool, len(inv.Segments))
	for _, s := range inv.Segments {
		have[s.File] = true
		at[s.Start] = true
	}
	seg := proto.LSN(inv.SegSize)
	end := inv.End()
	newest, hasPartial := inv.Newest()
	var gaps []Gap
	for pos := inv.Start(); pos < end; pos += seg {
		name := inv.SegmentFile(pos)
		if have[name] || (!named && at[pos]) || (hasPartial && pos == newest.Start && pos+seg >= end) {
			continue
		}
		if n := len(gaps); n > 0 && gaps[n-1].End == pos {
			gaps[n-1].End, gaps[n-1].Last = pos+seg, name
			gaps[n-1].Count++
			continue
		}
		gaps = append(gaps, Gap{Start: pos, End: pos + seg, First: name, Last: name, Count: 1})
	}
	return gaps
}

// Misnamed are the WAL objects (whole segments and the newest partial)
// whose name's timeline is not the one the history gives their segment
// (TimelineOf): WAL of a timeline after it ended (a server that went on
// after another was promoted), or a history file that does not belong to
// this WAL. Nil without a usable history file of the current timeline.
func (inv *Inventory) Misnamed() []WALObject {
	if _, ok := inv.History(); !ok {
		return nil
	}
	var out []WALObject
	for _, s := range inv.Segments {
		if s.Timeline != inv.TimelineOf(s.Start) {
			out = append(out, s)
		}
	}
	if p, ok := inv.Newest(); ok && p.Timeline != inv.TimelineOf(p.Start) {
		out = append(out, p)
	}
	return out
}

// Age is how long ago o was last modified, at now.
func (o WALObject) Age(now time.Time) time.Duration { return now.Sub(o.Modified) }
