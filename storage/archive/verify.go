package archive

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
	"github.com/safekeeper/safekeeper/storage/remote"
)

var (
	// ErrGap: WAL missing from the archive where it holds WAL after it
	// (or below a start asked for). A restore would stop there.
	ErrGap = errors.New("archive: gap in the WAL")
	// ErrBadRecord: a WAL record (or page header) that does not check: a
	// CRC, a prev-link broken across objects, a page of the wrong place.
	// It wraps the *xlog.Error too.
	ErrBadRecord = errors.New("archive: bad WAL record")
	// ErrTimeline: the history files and the segments' names disagree: a
	// segment named by a timeline that does not own its range, a history
	// file missing for a timeline the WAL is on, or one that is not its
	// descendant's prefix.
	ErrTimeline = errors.New("archive: timeline history and segment names disagree")
	// ErrNoWAL: no WAL in the archive (at or after the start asked for).
	ErrNoWAL = errors.New("archive: no WAL")
)

// VerifyOptions say what Verify checks.
type VerifyOptions struct {
	// From is the first LSN whose records are checked (0: the archive's
	// start). Reading starts at its segment's first byte.
	From proto.LSN
	// Progress, if set, is called after each object with the WAL bytes
	// checked so far and in all.
	Progress func(done, total int64)
}

// VerifyResult is what Verify checked, up to the first problem if there
// was one.
type VerifyResult struct {
	Inventory *Inventory
	// From is where reading began (a segment start), End the end of the
	// archive's WAL (Inventory.End).
	From, End proto.LSN
	// Segments is the whole segments decoded; Partial the newest partial
	// object decoded ("" if none was).
	Segments int
	Partial  string
	// Objects is how many objects were read and their checksums checked
	// (WAL, older partials and history files).
	Objects int
	// Histories is how many history files were checked.
	Histories int
	// Records is how many records were decoded and checked (those from
	// VerifyOptions.From); FirstRecord is the first one's start and
	// RecordsEnd the last one's end.
	Records     int
	FirstRecord proto.LSN
	RecordsEnd  proto.LSN
}

// Verify reads a timeline's archive as a restore would and checks all of
// it, as `wal-g wal-verify` does and more: every object's checksum (Get)
// and header (kind, place, segment size, system id, timeline against its
// name); every history file against the others and against the segment
// names (each segment is named by the timeline that owns its range, and
// each timeline the WAL is on has its history file); then the WAL itself,
// from From (or the archive's start) to the end of the archive (the newest
// partial's end), decoded with proto/xlog: every page header, every
// record's CRC and its prev-link, across segment boundaries, with no
// segment missing on the way, and the last partial ending at a record
// boundary. It stops at the first problem and returns an error wrapping
// ErrGap, ErrCorrupt, ErrBadRecord, ErrTimeline or ErrNoWAL that names the
// object or the segment; the result says what was checked before it. An
// error reaching the store wraps remote's errors instead.
func Verify(ctx context.Context, ar *Archive, opts VerifyOptions) (VerifyResult, error) {
	var res VerifyResult
	inv, err := Scan(ctx, ar)
	if err != nil {
		return res, err
	}
	res.Inventory = inv
	if inv.Empty() {
		return res, fmt.Errorf("%w: %s holds no WAL of timeline %s", ErrNoWAL, ar.Store, ar.Key)
	}
	seg := proto.LSN(inv.SegSize)
	res.End = inv.End()
	from := opts.From
	if from == 0 {
		from = inv.Start()
	}
	res.From = from.SegmentStart(uint64(seg))
	switch {
	case from < inv.Start():
		return res, fmt.Errorf("%w: the archive begins at %s (%s), after %s", ErrGap, inv.Start(), inv.SegmentFile(inv.Start()), from)
	case from >= res.End:
		return res, fmt.Errorf("%w at or after %s: the archive ends at %s", ErrNoWAL, from, res.End)
	}

	// The history files, then the names, before any WAL.
	if err := verifyHistories(inv, &res); err != nil {
		return res, err
	}
	if len(inv.Strays) > 0 {
		return res, fmt.Errorf("%s: %w: the name is no segment of %d-byte segments", inv.Strays[0].Name, ErrCorrupt, inv.SegSize)
	}
	plan, err := planWalk(inv, res.From)
	if err != nil {
		return res, err
	}

	// The WAL, in order, an object or a few fetched ahead.
	r := xlog.NewReader(res.From, uint64(seg))
	r.SkipBefore(from)
	var recent []WALObject // the objects fed last, to name the one a bad record is in
	var readPartial string // the partial the walk read
	total := int64(res.End - res.From)
	err = fetchInOrder(ctx, ar, plan, prefetchFor(inv.SegSize), func(st step, h Header, content []byte) error {
		if st.partial && errors.Is(st.err, remote.ErrNotFound) {
			// A live archive: the uploader stored a newer partial (or the
			// whole segment) and deleted this one. Read what replaced it.
			st, h, content = newerEnd(ctx, ar, st)
			if st.err == nil && (st.obj.End > res.End || !st.partial) {
				res.End = st.obj.End
			}
		}
		if st.err != nil {
			return st.err
		}
		res.Objects++
		o := st.obj
		want := Header{Kind: KindSegment, SystemID: inv.SystemID, PgTimeline: o.Timeline, SegSize: uint32(inv.SegSize), Start: o.Start, Length: uint64(seg)}
		if st.partial {
			want.Kind, want.Length = KindPartial, uint64(o.End-o.Start)
		}
		if h.Kind != want.Kind || h.SystemID != want.SystemID || h.PgTimeline != want.PgTimeline || h.SegSize != want.SegSize ||
			h.Start != want.Start || h.Length != want.Length {
			return fmt.Errorf("%s: %w: holds a %s of system %d, PostgreSQL timeline %d, %s..%s; its name says a %s of system %d, timeline %d, %s..%s",
				o.Name, ErrCorrupt, h.Kind, h.SystemID, h.PgTimeline, h.Start, h.End(), want.Kind, want.SystemID, want.PgTimeline, want.Start, want.End())
		}
		recent = append(recent, o)
		if len(recent) > 4 {
			recent = recent[1:]
		}
		r.Feed(content)
		for {
			rec, ok, err := r.Next()
			if err != nil {
				var xe *xlog.Error
				at := o
				if errors.As(err, &xe) {
					for _, p := range recent {
						if xe.LSN >= p.Start && xe.LSN < p.End {
							at = p
						}
					}
				}
				return fmt.Errorf("%w in %s: %w", ErrBadRecord, at.Name, err)
			}
			if !ok {
				break
			}
			if res.Records == 0 {
				res.FirstRecord = rec.LSN
			}
			res.Records++
			res.RecordsEnd = rec.End
		}
		if st.partial {
			res.Partial, readPartial = o.File, o.Name
			if r.Pos() < o.End {
				return fmt.Errorf("%w in %s: the archive's WAL ends at %s, inside the record at %s", ErrBadRecord, o.Name, o.End, r.Pos())
			}
		} else {
			res.Segments++
		}
		if opts.Progress != nil {
			opts.Progress(int64(o.End-res.From), total)
		}
		return nil
	})
	if err != nil {
		return res, err
	}

	// The partials a restore does not read (superseded ones the uploader
	// has not deleted yet, the newest one too if its segment is whole
	// now): their checksums and headers.
	for _, p := range inv.Partials {
		if p.Name == readPartial || p.End <= from {
			continue
		}
		h, _, err := ar.Get(ctx, p.Name)
		if errors.Is(err, remote.ErrNotFound) {
			continue // superseded and deleted meanwhile
		}
		if err != nil {
			return res, err
		}
		res.Objects++
		if h.Kind != KindPartial || h.Start != p.Start || h.End() != p.End || h.PgTimeline != p.Timeline || h.SystemID != inv.SystemID {
			return res, fmt.Errorf("%s: %w: holds a %s of system %d, PostgreSQL timeline %d, %s..%s", p.Name, ErrCorrupt, h.Kind, h.SystemID, h.PgTimeline, h.Start, h.End())
		}
	}
	return res, nil
}

// verifyHistories checks every history file (read by Scan): usable, each
// ancestor's file the prefix of its descendant's, and one for every
// timeline the WAL is on.
func verifyHistories(inv *Inventory, res *VerifyResult) error {
	byTLI := map[uint32]History{}
	for _, h := range inv.Histories {
		res.Objects++
		res.Histories++
		if h.Err != nil {
			if errors.Is(h.Err, ErrCorrupt) || errors.Is(h.Err, ErrNoIdentity) {
				return h.Err
			}
			return fmt.Errorf("%w: %w", ErrTimeline, h.Err)
		}
		byTLI[h.Timeline] = h
	}
	for _, h := range inv.Histories {
		for _, e := range h.Ends {
			anc, ok := byTLI[e.TLI]
			if !ok || e.TLI < 2 {
				continue
			}
			if want, _ := proto.PgHistoryPrefix(h.Content, e.TLI); !bytes.Equal(anc.Content, want) {
				return fmt.Errorf("%w: %s is not the beginning of %s (its descendant's): the two histories fork", ErrTimeline, anc.Name, h.Name)
			}
		}
	}
	need := func(o WALObject) error {
		if _, ok := byTLI[o.Timeline]; o.Timeline > 1 && !ok {
			return fmt.Errorf("%w: %s is WAL of PostgreSQL timeline %d, and its history file %08X.history is not in the archive", ErrTimeline, o.Name, o.Timeline, o.Timeline)
		}
		return nil
	}
	for _, s := range inv.Segments {
		if err := need(s); err != nil {
			return err
		}
	}
	if p, ok := inv.Newest(); ok {
		return need(p)
	}
	return nil
}

// step is one position of the walk: the object to read there, or the
// problem found there instead.
type step struct {
	obj     WALObject
	partial bool
	err     error
}

// planWalk lists the objects a restore reads from the segment at from to
// the archive's end, with the first problem of naming or a gap as the
// last step.
func planWalk(inv *Inventory, from proto.LSN) ([]step, error) {
	seg := proto.LSN(inv.SegSize)
	end := inv.End()
	byName := map[string]WALObject{}
	byStart := map[proto.LSN][]WALObject{}
	for _, s := range inv.Segments {
		byName[s.File] = s
		byStart[s.Start] = append(byStart[s.Start], s)
	}
	newest, hasPartial := inv.Newest()
	var plan []step
	for pos := from; pos < end; pos += seg {
		name := inv.SegmentFile(pos)
		for _, s := range byStart[pos] {
			if s.File != name {
				return append(plan, step{err: fmt.Errorf("%w: %s is named by PostgreSQL timeline %d, but %s gives %s..%s to timeline %d (%s)",
					ErrTimeline, s.Name, s.Timeline, historyOf(inv), s.Start, s.End, inv.TimelineOf(pos), name)}), nil
			}
		}
		if s, ok := byName[name]; ok {
			plan = append(plan, step{obj: s})
			continue
		}
		if hasPartial && newest.Start == pos && pos+seg >= end {
			if newest.File != name {
				return append(plan, step{err: fmt.Errorf("%w: the newest partial %s is named by PostgreSQL timeline %d, but %s gives its segment to timeline %d (%s)",
					ErrTimeline, newest.Name, newest.Timeline, historyOf(inv), inv.TimelineOf(pos), name)}), nil
			}
			plan = append(plan, step{obj: newest, partial: true})
			break
		}
		only := ""
		if hasPartial && newest.Start == pos {
			only = fmt.Sprintf(" (only a partial up to %s)", newest.End)
		}
		return append(plan, step{err: fmt.Errorf("%w: segment %s (%s..%s) is missing%s, and the archive holds WAL after it, up to %s",
			ErrGap, name, pos, pos+seg, only, end)}), nil
	}
	return plan, nil
}

// newerEnd is what replaced the newest partial st after Scan listed it:
// the whole segment, or a newer partial of the segment (the uploader
// deletes the older ones once a newer one is stored). A few tries, then
// the error.
func newerEnd(ctx context.Context, ar *Archive, st step) (step, Header, []byte) {
	old := st.obj
	for range 3 {
		h, content, err := ar.Get(ctx, ar.SegmentName(old.File))
		if err == nil {
			return step{obj: WALObject{Entry: Entry{Object: remote.Object{Name: ar.SegmentName(old.File)}, Kind: KindSegment, File: old.File},
				Timeline: old.Timeline, Start: old.Start, End: old.Start + proto.LSN(h.SegSize)}}, h, content
		}
		if !errors.Is(err, remote.ErrNotFound) {
			return step{obj: old, err: err}, Header{}, nil
		}
		parts, err := ar.Partials(ctx)
		if err != nil {
			return step{obj: old, err: err}, Header{}, nil
		}
		if n := len(parts); n > 0 && parts[n-1].File == old.File && parts[n-1].End >= old.End {
			p := WALObject{Entry: parts[n-1], Timeline: old.Timeline, Start: old.Start, End: parts[n-1].End}
			h, content, err := ar.Get(ctx, p.Name)
			if err == nil || !errors.Is(err, remote.ErrNotFound) {
				return step{obj: p, partial: true, err: err}, h, content
			}
		}
	}
	return step{obj: old, err: fmt.Errorf("%w: the newest partial %s was listed and is gone, and neither its whole segment nor a newer partial of it is there", ErrGap, old.Name)}, Header{}, nil
}

// historyOf names the history file segment names are checked against.
func historyOf(inv *Inventory) string {
	h, _ := inv.History()
	if h.Name == "" {
		return "the history (timeline 1 only)"
	}
	return h.File
}

// prefetchFor is how many objects Verify reads ahead of the decoder: a
// few small segments, one of the largest (they are held in memory).
func prefetchFor(segSize uint64) int { return int(max(1, min(4, (64<<20)/max(segSize, 1)))) }

// fetchInOrder reads the plan's objects (ahead of fn by up to ahead
// objects, one at a time) and calls fn with each in order; a step that
// is a problem is passed on as it is, and ends the walk with fn's error.
func fetchInOrder(ctx context.Context, ar *Archive, plan []step, ahead int, fn func(step, Header, []byte) error) error {
	type got struct {
		st      step
		h       Header
		content []byte
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan got, ahead)
	go func() {
		defer close(ch)
		for _, st := range plan {
			g := got{st: st}
			if st.err == nil {
				g.h, g.content, g.st.err = ar.Get(ctx, st.obj.Name)
				if errors.Is(g.st.err, remote.ErrNotFound) && !st.partial {
					g.st.err = fmt.Errorf("%w: %s was listed and is gone (deleted meanwhile?): %w", ErrGap, st.obj.Name, g.st.err)
				}
			}
			select {
			case ch <- g:
			case <-ctx.Done():
				return
			}
			if g.st.err != nil {
				return
			}
		}
	}()
	for g := range ch {
		if err := fn(g.st, g.h, g.content); err != nil {
			return err
		}
	}
	return ctx.Err()
}
