package proto

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// TagTimelineHistory is the tag of TimelineHistory, our extension of the
// protocol (README_PROTO.md, "PostgreSQL timeline switches").
const TagTimelineHistory = 't'

// MaxPgHistory bounds a TimelineHistory's content (a history file is a
// line per ancestor timeline).
const MaxPgHistory = 64 << 10

// TimelineHistory ('t') carries, from a proposer whose primary is on
// PostgreSQL timeline PgTimeline > 1, that timeline's history file as
// PostgreSQL wrote it (TIMELINE_HISTORY on the primary). It comes after
// ServerInfo and before RequestVote; a safekeeper holding an older
// timeline needs it to switch.
type TimelineHistory struct {
	PgTimeline uint32
	Content    []byte
}

func (*TimelineHistory) Tag() byte { return TagTimelineHistory }

func (m *TimelineHistory) Encode(b []byte) []byte {
	b = append(b, TagTimelineHistory)
	b = putU32(b, m.PgTimeline)
	b = putU32(b, uint32(len(m.Content)))
	return append(b, m.Content...)
}

func (m *TimelineHistory) Decode(src []byte) error {
	r := newReader(src, TagTimelineHistory, "TimelineHistory")
	m.PgTimeline = r.u32()
	n := r.u32()
	if n > MaxPgHistory {
		return fmt.Errorf("%w: TimelineHistory of %d bytes, at most %d", ErrMalformed, n, MaxPgHistory)
	}
	m.Content = bytes.Clone(r.take(int(n)))
	if err := r.done(); err != nil {
		return err
	}
	if m.PgTimeline < 2 {
		return fmt.Errorf("%w: TimelineHistory for timeline %d: only timelines after the first have a history", ErrMalformed, m.PgTimeline)
	}
	if _, err := ParsePgHistory(m.PgTimeline, m.Content); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

// PgTimelineEnd is one line of a PostgreSQL timeline history file: timeline
// TLI ended (its successor branched off) at End.
type PgTimelineEnd struct {
	TLI uint32
	End LSN
}

// ParsePgHistory parses the history file of PostgreSQL timeline tli, as
// readTimeLineHistory does: a line per ancestor, "parentTLI<TAB>X/X<TAB>
// reason", blank lines and '#' comments skipped. The ancestors must ascend
// below tli and their ends must not go back.
func ParsePgHistory(tli uint32, content []byte) ([]PgTimelineEnd, error) {
	var out []PgTimelineEnd
	for i, line := range strings.Split(string(content), "\n") {
		s := strings.TrimSpace(line)
		if s == "" || s[0] == '#' {
			continue
		}
		f := strings.Fields(s)
		if len(f) < 2 {
			return nil, fmt.Errorf("proto: timeline %d history, line %d: want \"parent_tli<TAB>X/X<TAB>reason\", got %q", tli, i+1, line)
		}
		t, err := strconv.ParseUint(f[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("proto: timeline %d history, line %d: timeline %q: %w", tli, i+1, f[0], err)
		}
		end, err := ParseLSN(f[1])
		if err != nil {
			return nil, fmt.Errorf("proto: timeline %d history, line %d: %w", tli, i+1, err)
		}
		e := PgTimelineEnd{TLI: uint32(t), End: end}
		if n := len(out); e.TLI == 0 || e.TLI >= tli || (n > 0 && (e.TLI <= out[n-1].TLI || e.End < out[n-1].End)) {
			return nil, fmt.Errorf("proto: timeline %d history, line %d: timeline %d ending at %s is out of order", tli, i+1, e.TLI, e.End)
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("proto: timeline %d history has no ancestor", tli)
	}
	return out, nil
}

// PgHistoryPrefix returns the history file of ancestor timeline tli cut
// from content, the history file of a later timeline: the bytes PostgreSQL
// wrote for tli. Each history file is its parent's, then "\n" (added "in
// case the parent file failed to end with one", writeTimeLineHistory),
// then one line; so tli's file is content up to the line for tli, without
// that separator (dropped only where it follows a newline of the parent's:
// content not written by PostgreSQL keeps its bytes). ok is false if tli
// is not an ancestor in content (or is 1, which has no history file).
func PgHistoryPrefix(content []byte, tli uint32) ([]byte, bool) {
	off := 0
	for off < len(content) {
		nl := bytes.IndexByte(content[off:], '\n')
		end := len(content)
		if nl >= 0 {
			end = off + nl + 1
		}
		s := strings.TrimSpace(string(content[off:end]))
		if s != "" && s[0] != '#' {
			f := strings.Fields(s)
			if t, err := strconv.ParseUint(f[0], 10, 32); err == nil && uint32(t) == tli {
				p := content[:off]
				if bytes.HasSuffix(p, []byte("\n\n")) {
					p = p[:len(p)-1]
				}
				return p, tli > 1
			}
		}
		off = end
	}
	return nil, false
}

// PgTimelineAt is the PostgreSQL timeline the WAL at lsn belongs to, given
// ends, the parsed history of timeline current, and where that timeline
// ends (its successor's switch point; 0 for current, which has no end
// yet). A switch point itself is the first byte of the next timeline, as a
// walsender asked for the end of a timeline answers with the next one.
func PgTimelineAt(ends []PgTimelineEnd, current uint32, lsn LSN) (tli uint32, end LSN) {
	for _, e := range ends {
		if lsn < e.End {
			return e.TLI, e.End
		}
	}
	return current, 0
}

// PgSegmentTimeline is the timeline in the pg_wal name of the segment of
// segSize bytes holding lsn, given ends, the parsed history of timeline
// current: the timeline its WAL belongs to, except that the segment holding
// a switch point has the new timeline's name (the promoted server copies
// its beginning into the new timeline's file), as PostgreSQL names them
// and as wal export writes them.
func PgSegmentTimeline(ends []PgTimelineEnd, current uint32, lsn LSN, segSize uint64) uint32 {
	seg := lsn.SegmentStart(segSize)
	for _, e := range ends {
		if seg < e.End.SegmentStart(segSize) {
			return e.TLI
		}
	}
	return current
}
