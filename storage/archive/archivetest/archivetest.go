// Package archivetest builds WAL archives for tests: real PostgreSQL 15
// WAL from proto/xlog/xlogtest's generator (records of many sizes, across
// pages and segments, optionally a PostgreSQL timeline switch), stored
// with archive.Put as the uploader stores it (whole segments under the
// names the history gives them, the unfinished segment as a partial
// object, the history file). It is a normal package so that the tests of
// storage/archive and the command-line tests in test/ share it; it must
// not be imported by non-test code.
package archivetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/storage/archive"
)

// Options describe the WAL to generate.
type Options struct {
	// SegSize is the segment size (default 1 MiB, PostgreSQL's smallest).
	SegSize uint64
	// Start is where the WAL starts: a segment start (default the
	// second segment, where initdb's WAL starts).
	Start proto.LSN
	// End: records are generated until one ends at or after it.
	End proto.LSN
	// SwitchAt, if set, is where PostgreSQL timeline 1 ends and timeline
	// 2 begins (the first record end at or after it): a promotion.
	SwitchAt proto.LSN
	// Seed picks the records' sizes.
	Seed uint64
	// SystemID is the cluster's system identifier (default 7000000000000000042).
	SystemID uint64
}

// WAL is generated WAL, [Start, End) in Data.
type WAL struct {
	SegSize    uint64
	SystemID   uint64
	Start, End proto.LSN
	Data       []byte
	// Records are the records' starts.
	Records []proto.LSN
	// Switch is where timeline 2 begins (0: all on timeline 1), History
	// timeline 2's history file.
	Switch  proto.LSN
	History []byte
}

// Generate makes WAL as opts say.
func Generate(opts Options) *WAL {
	if opts.SegSize == 0 {
		opts.SegSize = 1 << 20
	}
	if opts.Start == 0 {
		opts.Start = proto.LSN(opts.SegSize)
	}
	if opts.SystemID == 0 {
		opts.SystemID = 7000000000000000042
	}
	w := &WAL{SegSize: opts.SegSize, SystemID: opts.SystemID, Start: opts.Start}
	r := rand.New(rand.NewPCG(opts.Seed, 7))
	g := xlogtest.NewGenerator(opts.Start, opts.SegSize, 1, opts.SystemID)
	var last proto.LSN
	record := func() {
		n := r.IntN(600)
		switch r.IntN(20) {
		case 0:
			n = 8000 + r.IntN(30000) // over several pages
		case 1:
			n = 0
		}
		last, w.End = g.Record(n)
		w.Records = append(w.Records, last)
	}
	if opts.SwitchAt != 0 {
		for w.End < opts.SwitchAt {
			record()
		}
		w.Data = append(w.Data, g.Take()...)
		w.Switch = w.End
		w.History = fmt.Appendf(nil, "1\t%s\tno recovery target specified\n", w.Switch)
		// The promoted server goes on from the switch point on timeline
		// 2: the rest of the page keeps its header (timeline 1), the
		// pages after have timeline 2's.
		g = xlogtest.NewGenerator(w.Switch, opts.SegSize, 2, opts.SystemID)
		g.SetPrev(last)
	}
	for w.End < opts.End {
		record()
	}
	w.Data = append(w.Data, g.Take()...)
	return w
}

// Timeline is the PostgreSQL timeline whose name the segment at start
// has (proto.PgSegmentTimeline).
func (w *WAL) Timeline(start proto.LSN) uint32 {
	if w.Switch == 0 {
		return 1
	}
	return proto.PgSegmentTimeline([]proto.PgTimelineEnd{{TLI: 1, End: w.Switch}}, 2, start, w.SegSize)
}

// SegmentFile is the segment at start's name in the archive.
func (w *WAL) SegmentFile(start proto.LSN) string {
	return proto.SegmentFileName(w.Timeline(start), start, w.SegSize)
}

// Segment is the WAL of the segment at start, up to End.
func (w *WAL) Segment(start proto.LSN) []byte {
	return w.Data[start-w.Start : min(start+proto.LSN(w.SegSize), w.End)-w.Start]
}

// Segments are the starts of the whole segments, then the start of the
// partial one (if End is not a segment start).
func (w *WAL) Segments() (whole []proto.LSN, partial proto.LSN) {
	seg := proto.LSN(w.SegSize)
	for at := w.Start; at < w.End; at += seg {
		if at+seg <= w.End {
			whole = append(whole, at)
		} else {
			partial = at
		}
	}
	return whole, partial
}

// Put stores the WAL in ar as the uploader does: the history file (after
// a switch), every whole segment, and the rest as a partial object ending
// at End. It returns the objects' names, whole segments first (in order),
// then the partial.
func (w *WAL) Put(t testing.TB, ar *archive.Archive) []string {
	t.Helper()
	ctx := context.Background()
	put := func(name string, h archive.Header, content []byte) {
		t.Helper()
		if _, _, err := ar.Put(ctx, name, h, content); err != nil {
			t.Fatalf("archivetest: put %s: %v", name, err)
		}
	}
	if w.Switch != 0 {
		put(ar.HistoryName(2), archive.Header{Kind: archive.KindHistory, SystemID: w.SystemID, PgTimeline: 2}, w.History)
	}
	whole, partial := w.Segments()
	var names []string
	for _, at := range whole {
		name := ar.SegmentName(w.SegmentFile(at))
		put(name, archive.Header{Kind: archive.KindSegment, SystemID: w.SystemID, PgTimeline: w.Timeline(at), SegSize: uint32(w.SegSize), Start: at}, w.Segment(at))
		names = append(names, name)
	}
	if partial != 0 {
		name := ar.PartialName(w.SegmentFile(partial), w.End)
		put(name, archive.Header{Kind: archive.KindPartial, SystemID: w.SystemID, PgTimeline: w.Timeline(partial), SegSize: uint32(w.SegSize), Start: partial}, w.Segment(partial))
		names = append(names, name)
	}
	return names
}
