package archive_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog"
	"github.com/safekeeper/safekeeper/storage/archive"
	"github.com/safekeeper/safekeeper/storage/archive/archivetest"
	"github.com/safekeeper/safekeeper/storage/remote"
)

const segSize = 1 << 20

func key() proto.TimelineKey {
	var k proto.TimelineKey
	k.TenantID[0], k.TimelineID[0] = 0x7a, 0x7b
	return k
}

// dirArchive is a timeline's archive in a fresh file:// store, and the
// store's root directory.
func dirArchive(t *testing.T) (*archive.Archive, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "store")
	store, err := remote.Open("file://"+root, remote.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return archive.Open(store, &archive.Codec{Compress: true}, key()), root
}

// sixAndAHalf is WAL from 0/1000000 to a record end in its seventh
// segment: six whole segments and a partial.
func sixAndAHalf(seed uint64) *archivetest.WAL {
	return archivetest.Generate(archivetest.Options{Start: segSize, End: 7*segSize + 300_000, Seed: seed})
}

func verify(t *testing.T, ar *archive.Archive, from proto.LSN) (archive.VerifyResult, error) {
	t.Helper()
	return archive.Verify(context.Background(), ar, archive.VerifyOptions{From: from})
}

// TestVerifyGoodArchive: an archive as the uploader writes it verifies:
// every segment and the partial read, every record decoded, up to the
// partial's end; the inventory counts them and finds no gap.
func TestVerifyGoodArchive(t *testing.T) {
	ar, _ := dirArchive(t)
	w := sixAndAHalf(1)
	w.Put(t, ar)
	res, err := verify(t, ar, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Segments != 6 || res.Partial != w.SegmentFile(7*segSize) || res.Records != len(w.Records) ||
		res.FirstRecord != w.Records[0] || res.RecordsEnd != w.End || res.From != segSize || res.End != w.End {
		t.Fatalf("verify checked %+v; want 6 segments, the partial, %d records %s..%s", res, len(w.Records), w.Records[0], w.End)
	}
	inv := res.Inventory
	if gaps := inv.Gaps(); len(gaps) != 0 {
		t.Errorf("gaps in a whole archive: %+v", gaps)
	}
	tls := inv.Timelines()
	if len(tls) != 1 || tls[0].Count != 6 || tls[0].First != "000000010000000000000001" || tls[0].Last != "000000010000000000000006" {
		t.Errorf("timelines: %+v", tls)
	}
	var listed int64
	ar.List(context.Background(), func(e archive.Entry) error {
		listed += e.Size
		return nil
	})
	if wal, stored := inv.Totals(); wal != int64(w.End-w.Start) || stored != listed || stored >= wal {
		t.Errorf("totals: WAL %d (want %d), stored %d (the store lists %d)", wal, w.End-w.Start, stored, listed)
	}
	// From a later LSN: only the records from there are counted.
	from := w.Records[len(w.Records)/2]
	res, err = verify(t, ar, from)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(w.Records) - len(w.Records)/2; res.Records != want || res.FirstRecord != from || res.From != from.SegmentStart(segSize) {
		t.Errorf("verify --from %s: %d records from %s (read from %s), want %d from it", from, res.Records, res.FirstRecord, res.From, want)
	}
}

// TestVerifyFindsGap: a whole segment missing between others is a gap:
// the inventory shows it, Verify stops there with ErrGap naming it, after
// checking the WAL before it.
func TestVerifyFindsGap(t *testing.T) {
	ar, _ := dirArchive(t)
	w := sixAndAHalf(2)
	names := w.Put(t, ar)
	if err := ar.Store.Delete(context.Background(), names[2]); err != nil { // 000000010000000000000003
		t.Fatal(err)
	}
	res, err := verify(t, ar, 0)
	if !errors.Is(err, archive.ErrGap) || !strings.Contains(err.Error(), "000000010000000000000003") {
		t.Fatalf("verify with segment 3 missing: %v, want ErrGap naming it", err)
	}
	if res.Segments != 2 || res.RecordsEnd < 3*segSize-40_000 {
		t.Errorf("before the gap verify checked %d segments up to %s, want 2 up to about 0/3000000", res.Segments, res.RecordsEnd)
	}
	gaps := res.Inventory.Gaps()
	if len(gaps) != 1 || gaps[0].First != "000000010000000000000003" || gaps[0].Count != 1 || gaps[0].Start != 3*segSize {
		t.Errorf("gaps: %+v, want segment 3", gaps)
	}
	// The end of the archive is not a gap: without the partial the
	// archive ends with segment 6.
	if err := ar.Store.Delete(context.Background(), names[len(names)-1]); err != nil {
		t.Fatal(err)
	}
	if _, err := verify(t, ar, 4*segSize); err != nil {
		t.Errorf("verify from after the gap, with no partial: %v", err)
	}
}

// TestVerifyFindsCorruptObject: a byte flipped in a stored object (its
// file in the file:// store) makes Verify fail with ErrCorrupt naming the
// object, wherever the byte is.
func TestVerifyFindsCorruptObject(t *testing.T) {
	ar, root := dirArchive(t)
	w := sixAndAHalf(3)
	names := w.Put(t, ar)
	for _, name := range []string{names[3], names[len(names)-1]} {
		path := filepath.Join(root, filepath.FromSlash(name))
		orig, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, at := range []int{20, archive.HeaderLen + 100, len(orig) - 3} {
			bad := bytes.Clone(orig)
			bad[at] ^= 0x04
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := verify(t, ar, 0)
			if !errors.Is(err, archive.ErrCorrupt) || !strings.Contains(err.Error(), name) {
				t.Errorf("byte %d of %s flipped: %v, want ErrCorrupt naming it", at, name, err)
			}
		}
		if err := os.WriteFile(path, orig, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := verify(t, ar, 0); err != nil {
		t.Fatalf("restored: %v", err)
	}

	// An older partial (superseded, not read by a restore) is read and
	// checked too.
	ctx := context.Background()
	older := ar.PartialName(w.SegmentFile(7*segSize), 7*segSize+4096)
	if _, _, err := ar.Put(ctx, older, archive.Header{Kind: archive.KindPartial, SystemID: w.SystemID, PgTimeline: 1, SegSize: segSize, Start: 7 * segSize}, w.Data[7*segSize-w.Start:7*segSize+4096-w.Start]); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, filepath.FromSlash(older))
	b, _ := os.ReadFile(path)
	b[len(b)-2] ^= 1
	os.WriteFile(path, b, 0o600)
	if _, err := verify(t, ar, 0); !errors.Is(err, archive.ErrCorrupt) || !strings.Contains(err.Error(), older) {
		t.Errorf("a flipped byte in an older partial: %v, want ErrCorrupt naming it", err)
	}
	ar.Store.Delete(ctx, older)

	// The newest partial, when its segment is whole now (the uploader
	// stored the segment and had not deleted the partial): not read by a
	// restore, checked all the same.
	{
		ar, root := dirArchive(t)
		w := archivetest.Generate(archivetest.Options{Start: segSize, End: 3*segSize + 100, Seed: 13})
		names := w.Put(t, ar)
		ar.Store.Delete(ctx, names[len(names)-1])
		stale := ar.PartialName(w.SegmentFile(2*segSize), 2*segSize+4096)
		if _, _, err := ar.Put(ctx, stale, archive.Header{Kind: archive.KindPartial, SystemID: w.SystemID, PgTimeline: 1, SegSize: segSize, Start: 2 * segSize}, w.Data[segSize:segSize+4096]); err != nil {
			t.Fatal(err)
		}
		if _, err := verify(t, ar, 0); err != nil {
			t.Fatalf("an archive ending with a whole segment and its stale partial: %v", err)
		}
		path := filepath.Join(root, filepath.FromSlash(stale))
		b, _ := os.ReadFile(path)
		b[len(b)-2] ^= 1
		os.WriteFile(path, b, 0o600)
		if _, err := verify(t, ar, 0); !errors.Is(err, archive.ErrCorrupt) || !strings.Contains(err.Error(), stale) {
			t.Errorf("a flipped byte in the newest partial, superseded by its whole segment: %v, want ErrCorrupt naming it", err)
		}
	}

	// An intact object under another segment's name: segment 3's WAL
	// (its header says so) stored as segment 4.
	if err := ar.Store.Delete(ctx, names[3]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ar.Put(ctx, names[3], archive.Header{Kind: archive.KindSegment, SystemID: w.SystemID, PgTimeline: 1, SegSize: segSize, Start: 3 * segSize}, w.Segment(3*segSize)); err != nil {
		t.Fatal(err)
	}
	if _, err := verify(t, ar, 0); !errors.Is(err, archive.ErrCorrupt) || !strings.Contains(err.Error(), names[3]) {
		t.Errorf("segment 3 stored as segment 4: %v, want ErrCorrupt naming it", err)
	}
}

// TestVerifyFindsBadRecords: WAL that is stored intact (its checksum is
// right) but is not good WAL fails with ErrBadRecord naming the object:
// a record whose CRC does not match, and a segment of other WAL (another
// run of the generator) between two of this WAL's, whose records do not
// continue the ones before the segment boundary.
func TestVerifyFindsBadRecords(t *testing.T) {
	t.Run("crc", func(t *testing.T) {
		ar, _ := dirArchive(t)
		w := sixAndAHalf(4)
		// xl_crc of a record in segment 4 whose header is on one page.
		var at proto.LSN
		for _, r := range w.Records {
			if r.SegmentStart(segSize) == 4*segSize && r%xlog.PageSize+xlog.SizeOfXLogRecord <= xlog.PageSize && r > 4*segSize+100_000 {
				at = r
				break
			}
		}
		w.Data[at-w.Start+20] ^= 0xff
		w.Put(t, ar)
		_, err := verify(t, ar, 0)
		var xe *xlog.Error
		if !errors.Is(err, archive.ErrBadRecord) || !errors.Is(err, xlog.ErrRecordCRC) || !errors.As(err, &xe) || xe.LSN != at ||
			!strings.Contains(err.Error(), "000000010000000000000004") {
			t.Fatalf("a record's CRC broken at %s: %v, want ErrBadRecord with the CRC error there, naming segment 4", at, err)
		}
	})
	t.Run("continuity", func(t *testing.T) {
		ar, _ := dirArchive(t)
		w, other := sixAndAHalf(5), sixAndAHalf(6)
		copy(w.Data[4*segSize-w.Start:5*segSize-w.Start], other.Data[4*segSize-other.Start:])
		w.Put(t, ar)
		// Each boundary is checked: 3 to 4 from the start, 4 to 5 from
		// segment 4; from segment 5 on, the WAL is good.
		for _, c := range []struct {
			from proto.LSN
			in   string
		}{{0, "000000010000000000000004"}, {4 * segSize, "000000010000000000000005"}} {
			_, err := verify(t, ar, c.from)
			if !errors.Is(err, archive.ErrBadRecord) || !strings.Contains(err.Error(), c.in) {
				t.Errorf("segment 4 of other WAL, verify from %s: %v, want ErrBadRecord in %s", c.from, err, c.in)
			}
		}
		if _, err := verify(t, ar, 5*segSize); err != nil {
			t.Errorf("verify from 0/5000000: %v", err)
		}
	})
	t.Run("torn end", func(t *testing.T) {
		// The newest partial ends inside its last record: the archive's
		// end of WAL is no record boundary.
		ar, _ := dirArchive(t)
		w := sixAndAHalf(7)
		w.Put(t, ar)
		torn := w.End - 16
		name := ar.PartialName(w.SegmentFile(7*segSize), torn)
		if _, _, err := ar.Put(context.Background(), name, archive.Header{Kind: archive.KindPartial, SystemID: w.SystemID, PgTimeline: 1, SegSize: segSize, Start: 7 * segSize},
			w.Data[7*segSize-w.Start:torn-w.Start]); err != nil {
			t.Fatal(err)
		}
		if err := ar.Store.Delete(context.Background(), ar.PartialName(w.SegmentFile(7*segSize), w.End)); err != nil {
			t.Fatal(err)
		}
		if _, err := verify(t, ar, 0); !errors.Is(err, archive.ErrBadRecord) || !strings.Contains(err.Error(), "inside the record") {
			t.Errorf("a partial ending inside a record: %v, want ErrBadRecord", err)
		}
	})
}

// TestVerifyTimelineSwitch: after a promotion the segments go on under
// timeline 2's name from the segment holding the switch point, with
// 00000002.history: it verifies, with no gap; a segment of timeline 1's
// name past the switch, a missing history file, and the switch segment
// missing are found.
func TestVerifyTimelineSwitch(t *testing.T) {
	ar, root := dirArchive(t)
	w := archivetest.Generate(archivetest.Options{Start: segSize, SwitchAt: 4*segSize + 123_456, End: 7*segSize + 1000, Seed: 7})
	names := w.Put(t, ar)
	res, err := verify(t, ar, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != len(w.Records) || res.Segments != 6 || res.Histories != 1 || res.Partial != "000000020000000000000007" {
		t.Fatalf("verify across the switch at %s: %+v", w.Switch, res)
	}
	inv := res.Inventory
	tls := inv.Timelines()
	if len(tls) != 2 || tls[0].Last != "000000010000000000000003" || tls[1].First != "000000020000000000000004" || tls[1].Count != 3 {
		t.Errorf("timelines: %+v", tls)
	}
	if g := inv.Gaps(); len(g) != 0 {
		t.Errorf("gaps: %+v", g)
	}

	// A server that went on on timeline 1 past the switch and archived
	// its segment 5: misnamed.
	ctx := context.Background()
	stray := ar.SegmentName("000000010000000000000005")
	if _, _, err := ar.Put(ctx, stray, archive.Header{Kind: archive.KindSegment, SystemID: w.SystemID, PgTimeline: 1, SegSize: segSize, Start: 5 * segSize}, w.Segment(5*segSize)); err != nil {
		t.Fatal(err)
	}
	if _, err := verify(t, ar, 0); !errors.Is(err, archive.ErrTimeline) || !strings.Contains(err.Error(), stray) {
		t.Errorf("a timeline 1 segment past the switch: %v, want ErrTimeline naming it", err)
	}
	ar.Store.Delete(ctx, stray)

	// The history file gone: the timeline 2 WAL has no history.
	hist := filepath.Join(root, filepath.FromSlash(ar.HistoryName(2)))
	saved, _ := os.ReadFile(hist)
	os.Remove(hist)
	if _, err := verify(t, ar, 0); !errors.Is(err, archive.ErrTimeline) || !strings.Contains(err.Error(), "00000002.history") {
		t.Errorf("no history file: %v, want ErrTimeline naming it", err)
	}
	os.WriteFile(hist, saved, 0o600)

	// A history file of timeline 3 whose line for timeline 1 is not
	// 00000002.history's: the histories fork.
	fork := []byte(fmt.Sprintf("1\t%s\tno recovery target specified\n\n2\t%s\tno recovery target specified\n", w.Switch+8, w.End+segSize))
	if _, _, err := ar.Put(ctx, ar.HistoryName(3), archive.Header{Kind: archive.KindHistory, SystemID: w.SystemID, PgTimeline: 3}, fork); err != nil {
		t.Fatal(err)
	}
	if _, err := verify(t, ar, 0); !errors.Is(err, archive.ErrTimeline) || !strings.Contains(err.Error(), "fork") {
		t.Errorf("a timeline 3 history that forks from 00000002.history: %v, want ErrTimeline", err)
	}
	ar.Store.Delete(ctx, ar.HistoryName(3))

	// The switch segment missing: a gap under timeline 2's name; timeline
	// 1's segment 4 (had it been archived) does not fill it.
	if err := ar.Store.Delete(ctx, names[3]); err != nil {
		t.Fatal(err)
	}
	inv, err = archive.Scan(ctx, ar)
	if err != nil {
		t.Fatal(err)
	}
	if g := inv.Gaps(); len(g) != 1 || g[0].First != "000000020000000000000004" {
		t.Errorf("gaps with the switch segment missing: %+v", g)
	}
	if _, err := verify(t, ar, 0); !errors.Is(err, archive.ErrGap) || !strings.Contains(err.Error(), "000000020000000000000004") {
		t.Errorf("switch segment missing: %v, want ErrGap naming 000000020000000000000004", err)
	}
}

// racingStore runs a hook before the first whole read of an object: the
// uploader at work while Verify reads.
type racingStore struct {
	remote.Storage
	before map[string]func()
}

func (s *racingStore) Read(ctx context.Context, name string, off, n int64) (io.ReadCloser, error) {
	if f := s.before[name]; f != nil && off == 0 && n < 0 {
		delete(s.before, name)
		f()
	}
	return s.Storage.Read(ctx, name, off, n)
}

// TestVerifyLiveArchive: the newest partial listed is superseded (a newer
// one stored, the old one deleted, as the uploader does) before Verify
// reads it: Verify reads the newer one and checks up to its end.
func TestVerifyLiveArchive(t *testing.T) {
	ar, _ := dirArchive(t)
	w := sixAndAHalf(12)
	var cut proto.LSN // a record start in segment 7, where the one before ends
	for _, r := range w.Records {
		if r > 7*segSize+100_000 && r%xlog.PageSize > xlog.SizeOfXLogLongPHD {
			cut = r
			break
		}
	}
	ctx := context.Background()
	names := w.Put(t, ar)
	newest := names[len(names)-1]
	h := archive.Header{Kind: archive.KindPartial, SystemID: w.SystemID, PgTimeline: 1, SegSize: segSize, Start: 7 * segSize}
	first := ar.PartialName(w.SegmentFile(7*segSize), cut)
	if err := ar.Store.Delete(ctx, newest); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ar.Put(ctx, first, h, w.Data[7*segSize-w.Start:cut-w.Start]); err != nil {
		t.Fatal(err)
	}
	store := ar.Store
	ar.Store = &racingStore{Storage: store, before: map[string]func(){first: func() {
		if _, _, err := ar.Put(ctx, newest, h, w.Segment(7*segSize)); err != nil {
			t.Error(err)
		}
		if err := store.Delete(ctx, first); err != nil {
			t.Error(err)
		}
	}}}
	res, err := verify(t, ar, 0)
	if err != nil || res.RecordsEnd != w.End || res.End != w.End || res.Records != len(w.Records) {
		t.Fatalf("verify while the partial up to %s was superseded by one up to %s: checked %d records up to %s (end %s), %v",
			cut, w.End, res.Records, res.RecordsEnd, res.End, err)
	}
}
