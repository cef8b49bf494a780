package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/timeline"
	"github.com/safekeeper/safekeeper/storage/archive"
	"github.com/safekeeper/safekeeper/storage/remote"
)

// Read-through: a replication stream asking for WAL this safekeeper no
// longer holds (retention removed it after it reached the archive) is
// served from the archive, in order, as if it were local. A stream reads
// one archived segment at a time (decoded, its checksum checked, kept
// while the stream is inside it); a segment missing from the archive, or
// corrupt, ends the stream with 58P01, as removed WAL does without an
// archive: nothing unchecked is ever sent.

// archiveReadTimeout bounds fetching one segment from the archive.
const archiveReadTimeout = 2 * time.Minute

// archivedWAL is a stream's reader of the archive.
type archivedWAL struct {
	ar      *archive.Archive
	sysID   uint64
	segSize uint64
	start   proto.LSN // the segment held in data (data nil: none)
	data    []byte
}

// newArchivedWAL is tl's archive reader, nil without an archive.
func (s *Server) newArchivedWAL(tl *timeline.Timeline, sysID uint64, segSize uint64) *archivedWAL {
	if s.cfg.RemoteStorage == nil {
		return nil
	}
	codec := s.cfg.ArchiveCodec
	if codec == nil {
		codec = &archive.Codec{Compress: true}
	}
	return &archivedWAL{ar: archive.Open(s.cfg.RemoteStorage, codec, tl.Key()), sysID: sysID, segSize: segSize}
}

// errNotArchived: the archive does not hold the segment.
var errNotArchived = errors.New("server: WAL not in the archive")

// read copies archived WAL from pos into buf, within pos's segment, which
// is named for PostgreSQL timeline tli.
func (a *archivedWAL) read(ctx context.Context, pos proto.LSN, buf []byte, tli uint32) (int, error) {
	seg := pos.SegmentStart(a.segSize)
	if a.data == nil || a.start != seg {
		a.data = nil
		ctx, cancel := context.WithTimeout(ctx, archiveReadTimeout)
		defer cancel()
		name := a.ar.SegmentName(proto.SegmentFileName(tli, seg, a.segSize))
		_, content, err := a.ar.GetSegment(ctx, name, a.sysID, seg)
		if errors.Is(err, remote.ErrNotFound) {
			return 0, fmt.Errorf("%w: %s", errNotArchived, name)
		}
		if err != nil {
			return 0, err
		}
		if uint64(len(content)) != a.segSize {
			return 0, fmt.Errorf("%s: %w: %d bytes, a segment has %d", name, archive.ErrCorrupt, len(content), a.segSize)
		}
		a.start, a.data = seg, content
	}
	return copy(buf, a.data[pos-seg:]), nil
}
