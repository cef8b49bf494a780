package sim

import (
	"fmt"
	"sort"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
)

// termLog is the WAL one term's proposer generated: valid PostgreSQL 15
// records from the term's start. Only that proposer appends to it, so for
// each term the bytes at a position never change.
type termLog struct {
	term   uint64
	start  proto.LSN
	data   []byte
	starts []proto.LSN // record starts, ascending
	ends   []proto.LSN // record ends (EndRecPtr), ascending
	gen    *xlogtest.Generator
}

func (l *termLog) end() proto.LSN { return l.start + proto.LSN(len(l.data)) }

// walStore is every term's WAL. It plays the part of the primary's pg_wal:
// an elected proposer streams the WAL its history names (older terms' WAL
// below its term start, its own above), which is what the real driver reads
// from the primary or from a catch-up stream off the donor. The checker uses
// it as the reference: every byte an acceptor holds below flush_lsn must be
// the byte the term its history names there generated ("log matching").
type walStore struct {
	segSize uint64
	sysid   uint64
	logs    []*termLog
	byTerm  map[uint64]*termLog // lookup only, never iterated
}

func newWALStore(segSize, sysid uint64) *walStore {
	return &walStore{segSize: segSize, sysid: sysid, byTerm: map[uint64]*termLog{}}
}

// startTerm opens term's log at start, continuing after the record whose
// start is prev (0 at the timeline start).
func (s *walStore) startTerm(term uint64, start, prev proto.LSN) *termLog {
	if s.byTerm[term] != nil {
		panic(fmt.Sprintf("sim: term %d started twice", term))
	}
	g := xlogtest.NewGenerator(start, s.segSize, 1, s.sysid)
	g.SetPrev(prev)
	l := &termLog{term: term, start: start, gen: g}
	s.logs = append(s.logs, l)
	s.byTerm[term] = l
	return l
}

// record appends one record of dataLen bytes of main data to l.
func (l *termLog) record(dataLen int) {
	st, end := l.gen.Record(dataLen)
	l.data = append(l.data, l.gen.Take()...)
	l.starts = append(l.starts, st)
	l.ends = append(l.ends, end)
}

// cover returns the index of the history entry that wrote the byte at x: the
// last entry starting at or below x (an entry followed by one with the same
// start wrote nothing), or -1.
func cover(h proto.TermHistory, x proto.LSN) int {
	k := sort.Search(len(h), func(i int) bool { return h[i].StartLSN > x }) - 1
	return k
}

// read returns the bytes [from, to) of the WAL described by history h, or an
// error naming what is missing.
func (s *walStore) read(h proto.TermHistory, from, to proto.LSN) ([]byte, error) {
	out := make([]byte, 0, to-from)
	for x := from; x < to; {
		k := cover(h, x)
		if k < 0 {
			return nil, fmt.Errorf("position %s lies before history %v", x, h)
		}
		end := to
		if k+1 < len(h) {
			end = min(end, h[k+1].StartLSN)
		}
		l := s.byTerm[h[k].Term]
		if l == nil || x < l.start || end > l.end() {
			var have string
			if l != nil {
				have = fmt.Sprintf("; term %d generated %s..%s", l.term, l.start, l.end())
			}
			return nil, fmt.Errorf("history %v names term %d for %s..%s, which it never wrote%s", h, h[k].Term, x, end, have)
		}
		out = append(out, l.data[x-l.start:end-l.start]...)
		x = end
	}
	return out, nil
}

// prevRecord returns the start of the record that ends at at in the WAL of
// history h (the xl_prev of the record a new term writes there), 0 when at
// is the timeline start.
func (s *walStore) prevRecord(h proto.TermHistory, at proto.LSN) (proto.LSN, error) {
	if len(h) == 0 || at <= h[0].StartLSN {
		return 0, nil
	}
	k := cover(h, at-1)
	l := s.byTerm[h[k].Term]
	if l == nil {
		return 0, fmt.Errorf("history %v names term %d, which never started", h, h[k].Term)
	}
	i := sort.Search(len(l.ends), func(i int) bool { return l.ends[i] >= at })
	if i == len(l.ends) || l.ends[i] != at {
		return 0, fmt.Errorf("no record of term %d ends at %s (history %v)", l.term, at, h)
	}
	return l.starts[i], nil
}
