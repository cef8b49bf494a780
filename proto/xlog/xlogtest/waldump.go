package xlogtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
)

// WaldumpRecord is one record as printed by pg_waldump.
type WaldumpRecord struct {
	Start  proto.LSN // "lsn:", the record's start (ReadRecPtr)
	Prev   proto.LSN // "prev", xl_prev
	Rmgr   string    // resource manager name, e.g. "XLOG"
	RecLen int       // "len (rec/tot)" first half: xl_tot_len minus block images
	TotLen int       // xl_tot_len
	Desc   string    // the rest of the line after "desc: "
}

// IsSwitch reports whether r is an XLOG_SWITCH record.
func (r WaldumpRecord) IsSwitch() bool {
	return r.Rmgr == "XLOG" && len(r.Desc) >= 6 && r.Desc[:6] == "SWITCH"
}

// RunWaldump runs the pg_waldump program at path on the segment files in dir
// from start (a record start, or a page start: pg_waldump then finds the
// first record) to end (InvalidLSN: to the end of valid WAL), and parses its
// records. stderr is returned too: pg_waldump reports the end of valid WAL
// there as an "error" (e.g. "invalid record length at X/Y: expected at least
// 24, got 0"), and exits non-zero, which is not an error here; err is set
// only when the program could not run or printed no record.
func RunWaldump(ctx context.Context, path, dir string, start, end proto.LSN) (recs []WaldumpRecord, stderr string, err error) {
	args := []string{"-p", dir, "-s", start.String()}
	if end != proto.InvalidLSN {
		args = append(args, "-e", end.String())
	}
	cmd := exec.CommandContext(ctx, path, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	runErr := cmd.Run()
	recs, err = ParseWaldump(out.Bytes())
	if err != nil {
		return nil, errb.String(), err
	}
	if len(recs) == 0 {
		return nil, errb.String(), fmt.Errorf("xlogtest: pg_waldump %v printed no record (%v): %s", args, runErr, errb.String())
	}
	return recs, errb.String(), nil
}

// ParseWaldump parses the record lines of pg_waldump's output (or of
// `safekeeper wal dump`'s, the same lines); LSNs may be padded (X/%08X, as
// pg_waldump prints them) or not. Other lines are ignored. It uses no regular expression: dumps of a few
// segments have a hundred thousand lines, parsed under the race detector.
func ParseWaldump(out []byte) ([]WaldumpRecord, error) {
	var recs []WaldumpRecord
	for len(out) > 0 {
		var line []byte
		if i := bytes.IndexByte(out, '\n'); i >= 0 {
			line, out = out[:i], out[i+1:]
		} else {
			line, out = out, nil
		}
		r, ok, err := parseWaldumpLine(string(line))
		if err != nil {
			return nil, err
		}
		if ok {
			recs = append(recs, r)
		}
	}
	return recs, nil
}

// parseWaldumpLine parses "rmgr: NAME len (rec/tot): R/ T, tx: X, lsn:
// L, prev P, desc: D"; ok is false for any other line.
func parseWaldumpLine(l string) (r WaldumpRecord, ok bool, err error) {
	rest, found := strings.CutPrefix(l, "rmgr: ")
	if !found {
		return r, false, nil
	}
	name, rest, _ := strings.Cut(rest, " ")
	rest, found = strings.CutPrefix(strings.TrimLeft(rest, " "), "len (rec/tot):")
	if !found {
		return r, false, nil
	}
	lens, rest, found1 := strings.Cut(rest, ", tx:")
	_, rest, found2 := strings.Cut(rest, ", lsn: ")
	lsn, rest, found3 := strings.Cut(rest, ", prev ")
	prev, desc, found4 := strings.Cut(rest, ", desc: ")
	recLen, totLen, found5 := strings.Cut(lens, "/")
	if !found1 || !found2 || !found3 || !found4 || !found5 {
		return r, false, nil
	}
	r.Rmgr, r.Desc = name, desc
	if r.RecLen, err = strconv.Atoi(strings.TrimSpace(recLen)); err != nil {
		return r, false, fmt.Errorf("xlogtest: %q: %w", l, err)
	}
	if r.TotLen, err = strconv.Atoi(strings.TrimSpace(totLen)); err != nil {
		return r, false, fmt.Errorf("xlogtest: %q: %w", l, err)
	}
	if r.Start, err = proto.ParseLSN(lsn); err != nil {
		return r, false, err
	}
	if r.Prev, err = proto.ParseLSN(prev); err != nil {
		return r, false, err
	}
	return r, true, nil
}

// Blkrefs returns the block references of a record's desc as pg_waldump
// prints them ("blkref #0: rel 1663/5/16384 blk 0 FPW"), in order: each
// runs from "blkref #" to the next ", " or the end.
func (r WaldumpRecord) Blkrefs() []string {
	var out []string
	d := r.Desc
	for {
		i := strings.Index(d, "blkref #")
		if i < 0 {
			return out
		}
		d = d[i:]
		ref, rest, _ := strings.Cut(d, ", ")
		out = append(out, strings.TrimSpace(ref))
		d = rest
	}
}

// EndsFromStarts derives record ends (EndRecPtr) from consecutive record
// starts, as an oracle independent of xl_tot_len arithmetic: a record ends
// where the next one starts, except that when the next one starts right
// after a page header the record ended at that page's start. The last
// record's end is unknown and not included.
func EndsFromStarts(recs []WaldumpRecord, segSize uint64) []proto.LSN {
	var ends []proto.LSN
	for i := 0; i+1 < len(recs); i++ {
		next := recs[i+1].Start
		pageOff := uint64(next) % xlog.PageSize
		switch {
		case next.SegmentOffset(segSize) == xlog.SizeOfXLogLongPHD,
			next.SegmentOffset(segSize) >= xlog.PageSize && pageOff == xlog.SizeOfXLogShortPHD:
			ends = append(ends, next-proto.LSN(pageOff))
		default:
			ends = append(ends, next)
		}
	}
	return ends
}

// WriteSegments writes WAL bytes data, which start at LSN start, as segment
// files of timeline tli into dir (pg_wal layout), zero-filling the segment
// before start and after the data.
func WriteSegments(dir string, tli uint32, segSize uint64, start proto.LSN, data []byte) error {
	first := start.SegmentStart(segSize)
	all := append(make([]byte, start-first), data...)
	for off := 0; off < len(all); off += int(segSize) {
		seg := make([]byte, segSize)
		copy(seg, all[off:])
		name := proto.SegmentFileName(tli, first+proto.LSN(off), segSize)
		if err := os.WriteFile(filepath.Join(dir, name), seg, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// FirstDiff compares two dumps line by line and returns "" when they are
// equal, else a report of the first line that differs: its number, up to
// two equal lines before it, and both versions, labelled nameA and nameB
// (e.g. "wal dump", "pg_waldump").
func FirstDiff(nameA, a, nameB, b string) string {
	if a == b {
		return ""
	}
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	i := 0
	for i < len(la) && i < len(lb) && la[i] == lb[i] {
		i++
	}
	var r strings.Builder
	fmt.Fprintf(&r, "first difference at line %d (%s: %d lines, %s: %d lines):\n", i+1, nameA, len(la), nameB, len(lb))
	for j := max(0, i-2); j < i; j++ {
		fmt.Fprintf(&r, "  %7d  %s\n", j+1, la[j])
	}
	line := func(l []string) string {
		if i < len(l) {
			return l[i]
		}
		return "(end of output)"
	}
	w := max(len(nameA), len(nameB)) + 1
	fmt.Fprintf(&r, "  %7d  %-*s %s\n  %7d  %-*s %s", i+1, w, nameA+":", line(la), i+1, w, nameB+":", line(lb))
	return r.String()
}
