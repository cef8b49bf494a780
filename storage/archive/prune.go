package archive

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage/remote"
)

// ErrNothingToPrune: PruneOptions with neither Before nor OlderThan.
var ErrNothingToPrune = errors.New("archive: prune needs a position (Before) or an age (OlderThan)")

// PruneOptions say what Prune deletes. With both Before and OlderThan an
// object goes only if both allow it.
type PruneOptions struct {
	// Before: the whole segments that end at or below it, and the older
	// partial objects that do.
	Before proto.LSN
	// OlderThan: the WAL older than Now-OlderThan, as a prefix: whole
	// segments below the first one (by LSN) last modified at or after
	// that time, so that a segment stored late (uploads run in parallel
	// and retry) never leaves a gap behind it; and the older partial
	// objects last modified before it.
	OlderThan time.Duration
	// Now is the time OlderThan counts back from (zero: time.Now()).
	Now time.Time
	// DryRun: delete nothing, report what would go.
	DryRun bool
}

// PruneResult is what Prune deleted (or would have, with DryRun), in the
// order it deleted them.
type PruneResult struct {
	Deleted []WALObject
	// DeletedBytes is their size in the store.
	DeletedBytes int64
	// Start is where the archive's WAL begins afterwards (0: no WAL left
	// but what Prune never deletes).
	Start proto.LSN
	// Kept is how many WAL objects stay; history files always stay.
	Kept int
}

// Prune deletes a timeline's old WAL from the archive: whole segments and
// partial objects wholly below a position or older than an age
// (PruneOptions), never the newest partial object (a restore's end of
// WAL) and never a history file. History files are a line per promotion,
// and PostgreSQL needs every one from a timeline it restores up to the
// newest: it finds the newest timeline by asking for TTTTTTTT.history
// for one timeline after another, so one missing hides every later one,
// and a new timeline's history comes before its WAL. Segments go in LSN
// order, each deleted only after the one before it, so a prune that fails
// half way leaves an archive that starts later and has no hole. It
// returns what it deleted, up to the error if one stopped it.
//
// The uploader runs it for --archive-retention; `safekeeper archive
// prune` by hand.
func Prune(ctx context.Context, ar *Archive, opts PruneOptions) (PruneResult, error) {
	var res PruneResult
	if opts.Before == 0 && opts.OlderThan <= 0 {
		return res, ErrNothingToPrune
	}
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	cutoff := now.Add(-opts.OlderThan)
	inv, err := Scan(ctx, ar)
	if err != nil {
		return res, err
	}
	// The LSN whole segments must end at or below.
	limit := proto.LSN(1<<64 - 1)
	if opts.Before != 0 {
		limit = opts.Before
	}
	if opts.OlderThan > 0 {
		for _, s := range inv.Segments {
			if !s.Modified.Before(cutoff) {
				limit = min(limit, s.Start)
				break
			}
		}
	}
	newest, hasPartial := inv.Newest()
	var doomed []WALObject
	for _, s := range inv.Segments {
		if s.End <= limit {
			doomed = append(doomed, s)
		}
	}
	for _, p := range inv.Partials {
		if hasPartial && p.Name == newest.Name {
			continue
		}
		if (opts.Before == 0 || p.End <= opts.Before) && (opts.OlderThan <= 0 || p.Modified.Before(cutoff)) {
			doomed = append(doomed, p)
		}
	}
	// In LSN order: an interrupted prune removed a prefix.
	slices.SortStableFunc(doomed, func(a, b WALObject) int { return cmpLSN(a.Start, b.Start) })
	// Mark the new start first, so that no uploader stores again what is
	// about to go (PrunedName); then the older marks go.
	var newStart proto.LSN
	for _, o := range doomed {
		if o.Kind == KindSegment {
			newStart = max(newStart, o.End)
		}
	}
	if newStart != 0 && !opts.DryRun {
		if err := ar.Store.Create(ctx, ar.PrunedName(newStart), []byte(newStart.String()+"\n")); err != nil && !errors.Is(err, remote.ErrExists) {
			return res, err
		}
		if err := ar.Store.List(ctx, ar.Root()+"pruned/", func(o remote.Object) error {
			if o.Name < ar.PrunedName(newStart) {
				return ar.Store.Delete(ctx, o.Name)
			}
			return nil
		}); err != nil {
			return res, err
		}
	}
	gone := make(map[string]bool, len(doomed))
	for _, o := range doomed {
		if !opts.DryRun {
			if err := ar.Store.Delete(ctx, o.Name); err != nil {
				res.tally(inv, gone)
				return res, err
			}
		}
		gone[o.Name] = true
		res.Deleted = append(res.Deleted, o)
		res.DeletedBytes += o.Size
	}
	res.tally(inv, gone)
	return res, nil
}

// tally sets Start and Kept from what is gone.
func (r *PruneResult) tally(inv *Inventory, gone map[string]bool) {
	r.Start, r.Kept = 0, 0
	for _, s := range inv.Segments {
		if !gone[s.Name] {
			if r.Kept == 0 {
				r.Start = s.Start
			}
			r.Kept++
		}
	}
	for _, p := range inv.Partials {
		if !gone[p.Name] {
			if r.Kept == 0 || p.Start < r.Start {
				r.Start = p.Start
			}
			r.Kept++
		}
	}
}

// DeleteAll removes a timeline's whole archive: every object under its
// prefix (T/L/), those this package does not name included. Whole
// segments go first, in LSN order, then the partials, then the history
// files and anything else, so that if it stops half way what is left is
// still an archive that starts later. It returns how many objects it
// deleted and their size.
func DeleteAll(ctx context.Context, ar *Archive) (n int, size int64, err error) {
	var objs []remote.Object
	if err := ar.Store.List(ctx, ar.Root(), func(o remote.Object) error {
		objs = append(objs, o)
		return nil
	}); err != nil {
		return 0, 0, err
	}
	rank := func(name string) int {
		switch rest := strings.TrimPrefix(name, ar.Root()); {
		case strings.HasPrefix(rest, "wal/") && segmentFile.MatchString(rest[4:]):
			return 0
		case strings.HasPrefix(rest, "partial/"):
			return 1
		}
		return 2
	}
	// Names of segments sort by timeline first; the order of whole
	// segments that matters is by position, which is their name's last
	// 16 digits.
	key := func(name string) string {
		if rank(name) == 0 {
			return name[len(name)-16:] + name[len(name)-24:len(name)-16]
		}
		return name
	}
	slices.SortStableFunc(objs, func(a, b remote.Object) int {
		if ra, rb := rank(a.Name), rank(b.Name); ra != rb {
			return ra - rb
		}
		return strings.Compare(key(a.Name), key(b.Name))
	})
	for _, o := range objs {
		if err := ar.Store.Delete(ctx, o.Name); err != nil {
			return n, size, fmt.Errorf("deleting the archive of %s: %d of %d objects deleted: %w", ar.Key, n, len(objs), err)
		}
		n++
		size += o.Size
	}
	return n, size, nil
}
