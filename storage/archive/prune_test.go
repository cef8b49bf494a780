package archive_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage/archive"
	"github.com/safekeeper/safekeeper/storage/archive/archivetest"
	"github.com/safekeeper/safekeeper/storage/remote"
	"github.com/safekeeper/safekeeper/test/s3test"
)

// setModified sets the modification time of objects in a file:// store.
func setModified(t *testing.T, root string, at time.Time, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := os.Chtimes(filepath.Join(root, filepath.FromSlash(n)), at, at); err != nil {
			t.Fatal(err)
		}
	}
}

// objectNames lists the store's objects under the archive.
func objectNames(t *testing.T, ar *archive.Archive) []string {
	t.Helper()
	var out []string
	if err := ar.Store.List(context.Background(), ar.Root(), func(o remote.Object) error {
		out = append(out, strings.TrimPrefix(o.Name, ar.Root()))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPrune: --before deletes the whole segments wholly below it and the
// superseded partials below it, never the newest partial nor a history
// file; --older-than deletes the oldest segments up to the first newer
// one, even where a later segment is older (no gap); a dry run deletes
// nothing and reports the same.
func TestPrune(t *testing.T) {
	ctx := context.Background()
	build := func(t *testing.T) (*archive.Archive, string, *archivetest.WAL, []string) {
		ar, root := dirArchive(t)
		w := archivetest.Generate(archivetest.Options{Start: segSize, SwitchAt: 2*segSize + 5000, End: 7*segSize + 300_000, Seed: 8})
		names := w.Put(t, ar)
		// An older partial of segment 7, superseded (the uploader had not
		// deleted it), and one of segment 2, long since whole.
		for _, p := range []struct{ start, end proto.LSN }{{7 * segSize, 7*segSize + 1000}, {2 * segSize, 2*segSize + 4096}} {
			name := ar.PartialName(w.SegmentFile(p.start), p.end)
			if _, _, err := ar.Put(ctx, name, archive.Header{Kind: archive.KindPartial, SystemID: w.SystemID, PgTimeline: w.Timeline(p.start), SegSize: segSize, Start: p.start}, w.Data[p.start-w.Start:p.end-w.Start]); err != nil {
				t.Fatal(err)
			}
		}
		return ar, root, w, names
	}

	t.Run("before", func(t *testing.T) {
		ar, _, w, _ := build(t)
		before := objectNames(t, ar)
		// 0/4000010 is inside segment 4: segments 1 to 3 go (3 ends at
		// 0/4000000), and the old partial of segment 2.
		dry, err := archive.Prune(ctx, ar, archive.PruneOptions{Before: 4*segSize + 16, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := objectNames(t, ar); strings.Join(got, " ") != strings.Join(before, " ") {
			t.Fatalf("a dry run deleted objects:\nbefore %v\nafter  %v", before, got)
		}
		res, err := archive.Prune(ctx, ar, archive.PruneOptions{Before: 4*segSize + 16})
		if err != nil {
			t.Fatal(err)
		}
		want := "000000010000000000000001 000000020000000000000002 000000020000000000000002.0000000000201000.partial 000000020000000000000003"
		if got, gotDry := files(res.Deleted), files(dry.Deleted); got != want || gotDry != want {
			t.Errorf("deleted %q (dry run: %q), want %q", got, gotDry, want)
		}
		left := strings.Join(objectNames(t, ar), " ")
		superseded := ar.PartialName(w.SegmentFile(7*segSize), 7*segSize+1000)
		newest := ar.PartialName(w.SegmentFile(7*segSize), w.End)
		for _, n := range []string{ar.HistoryName(2), ar.SegmentName("000000020000000000000004"), ar.SegmentName("000000020000000000000006"), superseded, newest} {
			if !strings.Contains(left, n[len(ar.Root()):]) {
				t.Errorf("%s was deleted; left: %s", n, left)
			}
		}
		if res.Start != 4*segSize || res.Kept != 5 {
			t.Errorf("after the prune the archive starts at %s with %d WAL objects, want 0/4000000 and 5", res.Start, res.Kept)
		}
		if _, err := verify(t, ar, 0); err != nil {
			t.Errorf("verify after the prune: %v", err)
		}
		// Past the end: every whole segment and the older partial, never
		// the newest partial or the history file.
		if _, err := archive.Prune(ctx, ar, archive.PruneOptions{Before: w.End + 1<<30}); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(objectNames(t, ar), " "); got != newest[len(ar.Root()):]+" pruned/"+fmt.Sprintf("%016X", uint64(w.End.SegmentStart(segSize)))+" wal/00000002.history" {
			t.Errorf("after a prune past the end: %s, want the newest partial, the prune's mark and the history file", got)
		}
		if pt, err := ar.PrunedTo(ctx); err != nil || pt != w.End.SegmentStart(segSize) {
			t.Errorf("PrunedTo after the prune: %s, %v; want the start of the newest partial's segment %s", pt, err, w.End.SegmentStart(segSize))
		}
	})

	t.Run("older-than", func(t *testing.T) {
		ar, root, _, names := build(t)
		now := time.Now()
		old, recent := now.Add(-10*24*time.Hour), now.Add(-time.Hour)
		setModified(t, root, recent, names...)
		// Segments 1, 2, 3 and 5 are old, 4 is not: 1 to 3 go; 5 stays
		// (deleting it would leave a gap after 4). The old partial of
		// segment 2 is old too; the superseded one of 7 is not.
		setModified(t, root, old, names[0], names[1], names[2], names[4])
		oldPartial := ar.PartialName("000000020000000000000002", 2*segSize+4096)
		setModified(t, root, old, oldPartial)
		// The newest partial is old too, and stays.
		setModified(t, root, old, names[len(names)-1])
		opts := archive.PruneOptions{OlderThan: 7 * 24 * time.Hour, Now: now, DryRun: true}
		dry, err := archive.Prune(ctx, ar, opts)
		if err != nil {
			t.Fatal(err)
		}
		opts.DryRun = false
		res, err := archive.Prune(ctx, ar, opts)
		if err != nil {
			t.Fatal(err)
		}
		want := "000000010000000000000001 000000020000000000000002 000000020000000000000002.0000000000201000.partial 000000020000000000000003"
		if got, gotDry := files(res.Deleted), files(dry.Deleted); got != want || gotDry != want {
			t.Errorf("deleted %q (dry run %q), want %q", got, gotDry, want)
		}
		left := strings.Join(objectNames(t, ar), " ")
		for _, n := range append([]string{ar.HistoryName(2)}, names[3:]...) {
			if !strings.Contains(left, n[len(ar.Root()):]) {
				t.Errorf("%s was deleted; left: %s", n, left)
			}
		}
		if _, err := verify(t, ar, 0); err != nil {
			t.Errorf("verify after the prune: %v", err)
		}
	})

	t.Run("nothing", func(t *testing.T) {
		ar, _, _, _ := build(t)
		if _, err := archive.Prune(ctx, ar, archive.PruneOptions{}); !errors.Is(err, archive.ErrNothingToPrune) {
			t.Errorf("Prune without a limit: %v", err)
		}
	})
}

// files are the objects' file names, partials with their end.
func files(objs []archive.WALObject) string {
	var out []string
	for _, o := range objs {
		out = append(out, o.Name[strings.LastIndexByte(o.Name, '/')+1:])
	}
	return strings.Join(out, " ")
}

// TestDeleteAll removes every object of the timeline, those the archive
// does not name too, and nothing of another timeline.
func TestDeleteAll(t *testing.T) {
	ctx := context.Background()
	ar, _ := dirArchive(t)
	archivetest.Generate(archivetest.Options{Start: segSize, SwitchAt: 2 * segSize, End: 3*segSize + 10, Seed: 9}).Put(t, ar)
	if err := ar.Store.Create(ctx, ar.Root()+"notes/readme", []byte("x")); err != nil {
		t.Fatal(err)
	}
	otherKey := key()
	otherKey.TimelineID[1] = 1
	other := archive.Open(ar.Store, ar.Codec, otherKey)
	archivetest.Generate(archivetest.Options{Start: segSize, End: 2*segSize + 10, Seed: 10}).Put(t, other)
	before := len(objectNames(t, ar))
	n, size, err := archive.DeleteAll(ctx, ar)
	if err != nil || n != before || size == 0 {
		t.Fatalf("DeleteAll: %d objects, %d bytes, %v; the archive had %d", n, size, err, before)
	}
	if left := objectNames(t, ar); len(left) != 0 {
		t.Errorf("left after DeleteAll: %v", left)
	}
	if left := objectNames(t, other); len(left) != 2 {
		t.Errorf("another timeline's archive after DeleteAll: %v", left)
	}
}

// TestToolsOnS3: on a real S3 server (versitygw) an archive verifies,
// a flipped byte in an object's file is found, prune by age (the
// server's LastModified) deletes nothing newer, prune by position
// deletes the segments below it, and DeleteAll empties it.
func TestToolsOnS3(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	store, err := remote.Open(srv.URL("cluster"), remote.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ar := archive.Open(store, &archive.Codec{Compress: true}, key())
	w := archivetest.Generate(archivetest.Options{Start: segSize, SwitchAt: 3*segSize + 77, End: 5*segSize + 9000, Seed: 11})
	names := w.Put(t, ar)
	res, err := verify(t, ar, 0)
	if err != nil || res.Records != len(w.Records) || res.Segments != 4 {
		t.Fatalf("verify on S3: %+v, %v", res, err)
	}

	path := srv.ObjectPath("cluster/" + names[1])
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(orig)
	bad[len(bad)-8] ^= 1
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := verify(t, ar, 0); !errors.Is(err, archive.ErrCorrupt) || !strings.Contains(err.Error(), names[1]) {
		t.Errorf("a flipped byte on S3: %v, want ErrCorrupt naming %s", err, names[1])
	}
	if err := os.WriteFile(path, orig, 0o600); err != nil {
		t.Fatal(err)
	}

	if res, err := archive.Prune(ctx, ar, archive.PruneOptions{OlderThan: time.Hour}); err != nil || len(res.Deleted) != 0 {
		t.Errorf("prune of objects older than an hour, all new: deleted %q, %v", files(res.Deleted), err)
	}
	pr, err := archive.Prune(ctx, ar, archive.PruneOptions{Before: 3 * segSize})
	if err != nil || files(pr.Deleted) != "000000010000000000000001 000000010000000000000002" {
		t.Fatalf("prune --before 0/3000000 on S3: deleted %q, %v", files(pr.Deleted), err)
	}
	if res, err := verify(t, ar, 0); err != nil || res.From != 3*segSize {
		t.Errorf("verify after the prune: from %s, %v", res.From, err)
	}
	if n, _, err := archive.DeleteAll(ctx, ar); err != nil || n != len(names)-2+1+1 { // the prune's mark too
		t.Errorf("DeleteAll on S3: %d objects, %v; want %d", n, err, len(names))
	}
	if left := objectNames(t, ar); len(left) != 0 {
		t.Errorf("left on S3 after DeleteAll: %v", left)
	}
}
