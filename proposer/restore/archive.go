package restore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage/archive"
	"github.com/safekeeper/safekeeper/storage/remote"
)

// ErrArchiveGap: the file asked for is missing from the archive although
// the archive holds WAL after it. Recovery must stop there, not end: an
// end of WAL here would promote without the WAL after the gap.
var ErrArchiveGap = errors.New("restore: gap in the archive")

// FetchArchive is `safekeeper wal fetch --remote-storage` without
// safekeepers: the WAL file name from the archive alone, written to w as
// it is decoded (Fetched.Data is nil). w holds the file only if
// FetchArchive returns nil: after an error it may hold part of it, and
// the caller discards it. A whole segment
// is served as archived (its checksum checked); the segment of the newest
// partial object is served up to that partial's end, zero-padded, which
// recovery reads as the end of WAL. A history file the archive lacks, and
// a segment at or past the archive's end, are ErrNotFound (the end of the
// archive for PostgreSQL); a segment missing below the archive's end is
// ErrArchiveGap, and a corrupt object archive.ErrCorrupt: both stop
// recovery.
func FetchArchive(ctx context.Context, ar *archive.Archive, name string, w io.Writer) (Fetched, error) {
	from := ar.Store.String()
	if hist := historyName.FindStringSubmatch(name); hist != nil {
		_, err := ar.GetTo(ctx, ar.SegmentName(name), w)
		if errors.Is(err, remote.ErrNotFound) {
			return Fetched{}, fmt.Errorf("%w: %s is not in the archive %s", ErrNotFound, name, from)
		}
		if err != nil {
			return Fetched{}, err
		}
		return Fetched{From: from}, nil
	}
	seg := segmentName.FindStringSubmatch(name)
	if seg == nil {
		return Fetched{}, fmt.Errorf("restore: %q is not a WAL segment (TTTTTTTTXXXXXXXXYYYYYYYY) or history file (TTTTTTTT.history) name", name)
	}
	h, err := ar.GetTo(ctx, ar.SegmentName(name), w)
	switch {
	case err == nil:
		if start, ok := segmentStart(name, h.SegSize); !ok || h.Kind != archive.KindSegment || start != h.Start {
			return Fetched{}, fmt.Errorf("%s: %w: the object holds a %s at %s, not this segment", name, archive.ErrCorrupt, h.Kind, h.Start)
		}
		return Fetched{Start: h.Start, End: h.End(), From: from}, nil
	case !errors.Is(err, remote.ErrNotFound):
		return Fetched{}, err
	}
	// Not archived whole: the newest partial, or past the end, or a gap.
	parts, err := ar.Partials(ctx)
	if err != nil {
		return Fetched{}, err
	}
	if n := len(parts); n > 0 && parts[n-1].File == name {
		p := parts[n-1]
		h, err := ar.GetTo(ctx, p.Name, w)
		if errors.Is(err, remote.ErrNotFound) {
			// Superseded while we looked (the uploader deletes older
			// partials once a newer one is stored): look again. Nothing
			// was written: a missing object fails before its first byte.
			return FetchArchive(ctx, ar, name, w)
		}
		if err != nil {
			return Fetched{}, err
		}
		if start, ok := segmentStart(name, h.SegSize); !ok || h.Kind != archive.KindPartial || start != h.Start || h.End() != p.End {
			return Fetched{}, fmt.Errorf("%s: %w: the partial object holds %s %s..%s, its name says %s", p.Name, archive.ErrCorrupt, h.Kind, h.Start, h.End(), p.End)
		}
		// Zero-padded to the segment's size: recovery reads the zeros
		// as the end of WAL.
		if _, err := io.CopyN(w, zeros{}, int64(h.SegSize)-int64(h.Length)); err != nil {
			return Fetched{}, err
		}
		return Fetched{Start: h.Start, End: h.End(), From: from, Padded: h.Length < uint64(h.SegSize)}, nil
	}
	// Anything archived after it on its PostgreSQL timeline makes it a
	// gap; nothing after it, the end of the archive.
	tli := seg[1]
	for _, p := range parts {
		if strings.HasPrefix(p.File, tli) && p.File > name {
			return Fetched{}, fmt.Errorf("%w: %s is missing from %s, which holds WAL after it (%s up to %s)", ErrArchiveGap, name, from, p.File, p.End)
		}
	}
	var later string
	err = ar.Store.List(ctx, ar.SegmentName(tli), func(o remote.Object) error {
		if f := o.Name[strings.LastIndexByte(o.Name, '/')+1:]; len(f) == len(name) && f > name {
			later = f
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return Fetched{}, err
	}
	if later != "" {
		return Fetched{}, fmt.Errorf("%w: %s is missing from %s, which holds %s after it", ErrArchiveGap, name, from, later)
	}
	return Fetched{}, fmt.Errorf("%w: %s is at or past the end of the archive %s", ErrNotFound, name, from)
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

var errStop = errors.New("stop")

// segmentStart is the first LSN of segment file name for segSize-byte
// segments.
func segmentStart(name string, segSize uint32) (proto.LSN, bool) {
	_, start, ok := archive.ParseSegmentFile(name, uint64(segSize))
	return start, ok
}

// FetchArchivedSegment is the archive's part in `wal fetch` with both
// safekeepers and --remote-storage: a whole segment the safekeepers could
// not serve (removed there, or none answered), if the archive holds it.
// Anything else (a partial, a history file, nothing) is left to the
// safekeepers' answer: only they know where the committed WAL ends.
func FetchArchivedSegment(ctx context.Context, ar *archive.Archive, name string) (Fetched, bool, error) {
	if segmentName.FindStringSubmatch(name) == nil {
		return Fetched{}, false, nil
	}
	h, content, err := ar.Get(ctx, ar.SegmentName(name))
	if errors.Is(err, remote.ErrNotFound) {
		return Fetched{}, false, nil
	}
	if err != nil {
		return Fetched{}, false, err
	}
	if start, ok := segmentStart(name, h.SegSize); !ok || h.Kind != archive.KindSegment || start != h.Start {
		return Fetched{}, false, fmt.Errorf("%s: %w: the object holds a %s at %s, not this segment", name, archive.ErrCorrupt, h.Kind, h.Start)
	}
	return Fetched{Data: content, Start: h.Start, End: h.End(), From: ar.Store.String()}, true, nil
}
