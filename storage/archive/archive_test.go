package archive

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"filippo.io/age"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage/remote"
)

const seg = 1 << 20

func testKey() proto.TimelineKey {
	var k proto.TimelineKey
	k.TenantID[0], k.TimelineID[0] = 0xab, 0xcd
	return k
}

// walLike is a segment's worth of compressible bytes, like WAL: records
// of repeated structure with some noise, and a zero tail.
func walLike(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := 0; i < n*3/4; i += 64 {
		copy(b[i:], "record header and some tuple data .....")
		b[i+40] = byte(r.Uint32())
	}
	return b
}

func openArchive(t *testing.T, codec *Codec) (*Archive, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "store")
	store, err := remote.Open("file://"+root, remote.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return Open(store, codec, testKey()), root
}

// TestPutGetRoundTrip: a segment put compressed reads back byte for byte,
// smaller than it was; putting it again (a second uploader) is no error
// and reports that it existed.
func TestPutGetRoundTrip(t *testing.T) {
	a, _ := openArchive(t, &Codec{Compress: true})
	ctx := context.Background()
	content := walLike(1, seg)
	name := a.SegmentName(proto.SegmentFileName(1, 3*seg, seg))
	h := Header{Kind: KindSegment, SystemID: 42, PgTimeline: 1, SegSize: seg, Start: 3 * seg}
	size, existed, err := a.Put(ctx, name, h, content)
	if err != nil || existed {
		t.Fatalf("Put: %v (existed %v)", err, existed)
	}
	if size >= seg/4 {
		t.Errorf("stored %d bytes for a %d-byte segment: not compressed", size, seg)
	}
	got, data, err := a.GetSegment(ctx, name, 42, 3*seg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, content) || got.Length != seg || !got.Compressed || got.End() != 4*seg {
		t.Fatalf("read back %d bytes (header %+v)", len(data), got)
	}
	if _, existed, err := a.Put(ctx, name, h, content); err != nil || !existed {
		t.Fatalf("second Put of the same content: %v (existed %v)", err, existed)
	}
	if _, _, err := a.GetSegment(ctx, name, 43, 3*seg); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a segment of another system: %v, want ErrCorrupt", err)
	}
}

// TestPutConflictIsRefused: the same name with other content is
// ErrConflict and the first object stays.
func TestPutConflictIsRefused(t *testing.T) {
	a, _ := openArchive(t, &Codec{Compress: true})
	ctx := context.Background()
	name := a.SegmentName(proto.SegmentFileName(1, 0, seg))
	h := Header{Kind: KindSegment, SystemID: 42, PgTimeline: 1, SegSize: seg}
	first, other := walLike(1, seg), walLike(2, seg)
	if _, _, err := a.Put(ctx, name, h, first); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Put(ctx, name, h, other); !errors.Is(err, ErrConflict) {
		t.Fatalf("Put of other content: %v, want ErrConflict", err)
	}
	if _, data, err := a.Get(ctx, name); err != nil || !bytes.Equal(data, first) {
		t.Fatalf("after a refused Put the object does not hold the first content: %v", err)
	}
}

// TestCorruptObjectIsRefused: a byte flipped anywhere in a stored object
// (header, compressed payload, or the payload of one stored in the clear)
// makes Get fail with ErrCorrupt; nothing is returned.
func TestCorruptObjectIsRefused(t *testing.T) {
	for _, compress := range []bool{true, false} {
		a, root := openArchive(t, &Codec{Compress: compress})
		ctx := context.Background()
		content := walLike(3, seg)
		name := a.SegmentName(proto.SegmentFileName(1, 0, seg))
		if _, _, err := a.Put(ctx, name, Header{Kind: KindSegment, SystemID: 1, PgTimeline: 1, SegSize: seg}, content); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(root, filepath.FromSlash(name))
		orig, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, at := range []int{5, 30, 50, HeaderLen + 10, len(orig) / 2, len(orig) - 1} {
			bad := bytes.Clone(orig)
			bad[at] ^= 0x10
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, data, err := a.Get(ctx, name); !errors.Is(err, ErrCorrupt) || data != nil {
				t.Errorf("compress=%v, byte %d of %d flipped: Get returned %d bytes, %v; want ErrCorrupt", compress, at, len(orig), len(data), err)
			}
		}
	}
}

// TestEncryptedObjects: with age recipients the stored object does not
// hold the content in the clear; it reads back with an identity, not
// without one, and a rotated key (a second recipient) reads it too.
func TestEncryptedObjects(t *testing.T) {
	old, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	next, _ := age.GenerateX25519Identity()
	a, root := openArchive(t, &Codec{Compress: false, Recipients: []age.Recipient{old.Recipient(), next.Recipient()}})
	ctx := context.Background()
	content := walLike(4, seg)
	name := a.PartialName(proto.SegmentFileName(1, 0, seg), 12345)
	if _, _, err := a.Put(ctx, name, Header{Kind: KindPartial, SystemID: 1, PgTimeline: 1, SegSize: seg}, content[:12345]); err != nil {
		t.Fatal(err)
	}
	stored, _ := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
	if bytes.Contains(stored, content[:64]) {
		t.Fatal("the encrypted object holds the content in the clear")
	}
	reader := Open(a.Store, &Codec{}, testKey())
	if _, _, err := reader.Get(ctx, name); !errors.Is(err, ErrNoIdentity) {
		t.Errorf("Get without an identity: %v, want ErrNoIdentity", err)
	}
	for _, id := range []*age.X25519Identity{old, next} {
		reader.Codec.Identities = []age.Identity{id}
		if h, data, err := reader.Get(ctx, name); err != nil || !bytes.Equal(data, content[:12345]) || h.End() != 12345 {
			t.Errorf("Get with one identity: %v", err)
		}
	}
	stranger, _ := age.GenerateX25519Identity()
	reader.Codec.Identities = []age.Identity{stranger}
	if _, _, err := reader.Get(ctx, name); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Get with a stranger's identity: %v, want an error", err)
	}
}

// TestListByKind: List sorts the timeline's objects by what their names
// say; Partials gives the newest last.
func TestListByKind(t *testing.T) {
	a, _ := openArchive(t, &Codec{Compress: true})
	ctx := context.Background()
	segName := proto.SegmentFileName(1, 2*seg, seg)
	put := func(name string, h Header, content []byte) {
		t.Helper()
		if _, _, err := a.Put(ctx, name, h, content); err != nil {
			t.Fatal(err)
		}
	}
	put(a.SegmentName(proto.SegmentFileName(1, seg, seg)), Header{Kind: KindSegment, PgTimeline: 1, SegSize: seg, Start: seg}, walLike(5, seg))
	put(a.HistoryName(2), Header{Kind: KindHistory, PgTimeline: 2}, []byte("1\t0/2000000\tno recovery target specified\n"))
	for _, end := range []proto.LSN{2*seg + 0x100, 2*seg + 0x20000, 2*seg + 0x3000} {
		put(a.PartialName(segName, end), Header{Kind: KindPartial, PgTimeline: 1, SegSize: seg, Start: 2 * seg}, walLike(6, int(end-2*seg)))
	}
	var kinds []string
	if err := a.List(ctx, func(e Entry) error { kinds = append(kinds, e.Kind.String()+":"+e.File); return nil }); err != nil {
		t.Fatal(err)
	}
	want := "partial:000000010000000000000002 partial:000000010000000000000002 partial:000000010000000000000002 segment:000000010000000000000001 history:00000002.history"
	if got := joinSp(kinds); got != want {
		t.Errorf("List:\n got %s\nwant %s", got, want)
	}
	ps, err := a.Partials(ctx)
	if err != nil || len(ps) != 3 || ps[2].End != 2*seg+0x20000 {
		t.Fatalf("Partials: %+v, %v", ps, err)
	}
}

func joinSp(s []string) string {
	var b bytes.Buffer
	for i, x := range s {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(x)
	}
	return b.String()
}
