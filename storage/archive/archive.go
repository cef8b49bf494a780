package archive

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage/remote"
)

// Archive is one timeline's archive in a store.
type Archive struct {
	Store remote.Storage
	Codec *Codec
	Key   proto.TimelineKey
	root  string // "T/L/"
}

// Open returns the archive of timeline key in store.
func Open(store remote.Storage, codec *Codec, key proto.TimelineKey) *Archive {
	return &Archive{Store: store, Codec: codec, Key: key, root: key.TenantID.String() + "/" + key.TimelineID.String() + "/"}
}

// Root is the prefix of every object of the timeline ("T/L/").
func (a *Archive) Root() string { return a.root }

// SegmentName is the object of a whole segment (a PostgreSQL file name).
func (a *Archive) SegmentName(file string) string { return a.root + "wal/" + file }

// HistoryName is the object of PostgreSQL timeline tli's history file.
func (a *Archive) HistoryName(tli uint32) string {
	return fmt.Sprintf("%swal/%08X.history", a.root, tli)
}

// PartialName is the object of segment file's WAL up to end.
func (a *Archive) PartialName(file string, end proto.LSN) string {
	return fmt.Sprintf("%spartial/%s.%016X.partial", a.root, file, uint64(end))
}

// PrunedName is the marker a prune leaves before it deletes: the
// timeline's archive is wanted from start on only. An uploader that finds
// a segment below it missing does not store it again (a safekeeper back
// after days would otherwise bring back what retention deleted, with a
// gap after it).
func (a *Archive) PrunedName(start proto.LSN) string {
	return fmt.Sprintf("%spruned/%016X", a.root, uint64(start))
}

// PrunedTo is the highest start a prune marked (0: never pruned).
func (a *Archive) PrunedTo(ctx context.Context) (proto.LSN, error) {
	var hi proto.LSN
	err := a.Store.List(ctx, a.root+"pruned/", func(o remote.Object) error {
		if v, err := strconv.ParseUint(strings.TrimPrefix(o.Name, a.root+"pruned/"), 16, 64); err == nil {
			hi = max(hi, proto.LSN(v))
		}
		return nil
	})
	return hi, err
}

var (
	segmentFile = regexp.MustCompile(`^[0-9A-F]{24}$`)
	historyFile = regexp.MustCompile(`^[0-9A-F]{8}\.history$`)
	partialFile = regexp.MustCompile(`^([0-9A-F]{24})\.([0-9A-F]{16})\.partial$`)
)

// Entry is an object of the archive, by what its name says.
type Entry struct {
	remote.Object
	Kind Kind
	// File is the PostgreSQL file name (a segment's or a history file's).
	File string
	// End is a partial's end LSN.
	End proto.LSN
}

// List calls fn for every object of the timeline's archive that this
// package names (others are skipped), in name order: partial/, then wal/.
func (a *Archive) List(ctx context.Context, fn func(Entry) error) error {
	return a.Store.List(ctx, a.root, func(o remote.Object) error {
		rest := strings.TrimPrefix(o.Name, a.root)
		dir, file, ok := strings.Cut(rest, "/")
		if !ok {
			return nil
		}
		e := Entry{Object: o, File: file}
		switch {
		case dir == "wal" && segmentFile.MatchString(file):
			e.Kind = KindSegment
		case dir == "wal" && historyFile.MatchString(file):
			e.Kind = KindHistory
		case dir == "partial":
			m := partialFile.FindStringSubmatch(file)
			if m == nil {
				return nil
			}
			end, _ := strconv.ParseUint(m[2], 16, 64)
			e.Kind, e.File, e.End = KindPartial, m[1], proto.LSN(end)
		default:
			return nil
		}
		return fn(e)
	})
}

// Partials lists the partial objects, in name order (by segment, then
// end): the newest is the last.
func (a *Archive) Partials(ctx context.Context) ([]Entry, error) {
	var out []Entry
	err := a.Store.List(ctx, a.root+"partial/", func(o remote.Object) error {
		m := partialFile.FindStringSubmatch(strings.TrimPrefix(o.Name, a.root+"partial/"))
		if m == nil {
			return nil
		}
		end, _ := strconv.ParseUint(m[2], 16, 64)
		out = append(out, Entry{Object: o, Kind: KindPartial, File: m[1], End: proto.LSN(end)})
		return nil
	})
	return out, err
}

// Put stores content as object name, described by h. If the object
// exists already with the same content (another uploader, or this one
// before a crash), Put succeeds with existed set; with other content it
// fails with ErrConflict and the object is kept. stored is the object's
// size in the store. content is read only until Encode returns (the
// object is a buffer of its own): the caller may reuse it after Put.
func (a *Archive) Put(ctx context.Context, name string, h Header, content []byte) (stored int64, existed bool, err error) {
	obj, err := a.Codec.Encode(h, content)
	if err != nil {
		return 0, false, err
	}
	want, _ := ParseHeader(obj)
	err = a.Store.Create(ctx, name, obj)
	if err == nil {
		return int64(len(obj)), false, nil
	}
	if !errors.Is(err, remote.ErrExists) {
		return 0, false, err
	}
	got, size, err := a.Head(ctx, name)
	if err != nil {
		return 0, true, err
	}
	if !got.Same(want) {
		return size, true, fmt.Errorf("%w: %s in %s holds %s %s..%s sha256 %x, this safekeeper has %s..%s sha256 %x",
			ErrConflict, name, a.Store, got.Kind, got.Start, got.End(), got.Sum[:8], want.Start, want.End(), want.Sum[:8])
	}
	return size, true, nil
}

// Head reads an object's header only, and its size in the store.
func (a *Archive) Head(ctx context.Context, name string) (Header, int64, error) {
	o, err := a.Store.Stat(ctx, name)
	if err != nil {
		return Header{}, 0, err
	}
	rc, err := a.Store.Read(ctx, name, 0, HeaderLen)
	if err != nil {
		return Header{}, 0, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, HeaderLen))
	if err != nil {
		return Header{}, 0, fmt.Errorf("%w: read %s: %v", remote.ErrUnavailable, name, err)
	}
	h, err := ParseHeader(b)
	if err != nil {
		return h, o.Size, fmt.Errorf("%s: %w", name, err)
	}
	return h, o.Size, nil
}

// Get reads and checks an object (Codec.Decode).
func (a *Archive) Get(ctx context.Context, name string) (Header, []byte, error) {
	rc, err := a.Store.Read(ctx, name, 0, -1)
	if err != nil {
		return Header{}, nil, err
	}
	defer rc.Close()
	obj, err := io.ReadAll(io.LimitReader(rc, 1<<30+1<<20))
	if err != nil {
		return Header{}, nil, fmt.Errorf("%w: read %s: %v", remote.ErrUnavailable, name, err)
	}
	return a.Codec.Decode(name, obj)
}

// GetTo is Get with the content written to w as it is decoded
// (Codec.DecodeTo: w holds the checked content only if GetTo returns
// nil). A failed read from the store is ErrUnavailable.
func (a *Archive) GetTo(ctx context.Context, name string, w io.Writer) (Header, error) {
	rc, err := a.Store.Read(ctx, name, 0, -1)
	if err != nil {
		return Header{}, err
	}
	defer rc.Close()
	return a.Codec.DecodeTo(name, storeReader{rc, name}, w, nil)
}

// storeReader reads an object from the store: its errors are the store's
// (ErrUnavailable), not the object's.
type storeReader struct {
	r    io.Reader
	name string
}

func (s storeReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("%w: read %s: %v", remote.ErrUnavailable, s.name, err)
	}
	return n, err
}

// GetSegment is Get that also checks the header describes what the
// caller expects: a segment or partial of system id, at start.
func (a *Archive) GetSegment(ctx context.Context, name string, systemID uint64, start proto.LSN) (Header, []byte, error) {
	h, content, err := a.Get(ctx, name)
	if err != nil {
		return h, nil, err
	}
	if h.Kind == KindHistory || h.Start != start || (systemID != 0 && h.SystemID != systemID) {
		return h, nil, fmt.Errorf("%s: %w: holds %s at %s of system %d, expected WAL at %s of system %d",
			name, ErrCorrupt, h.Kind, h.Start, h.SystemID, start, systemID)
	}
	return h, content, nil
}
