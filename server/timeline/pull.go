package timeline

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

// Pulling a timeline: copying a whole timeline a peer safekeeper holds
// into this one's database, for a safekeeper that lacks it (a replaced
// disk, a peer away longer than the others keep WAL for it). The peer is
// read with proposer/client's peer reads (PeerState, CopyWAL): the same
// greeting and term reader a proposer's catch-up uses. Pull runs offline,
// on a stopped safekeeper's data directory (`safekeeper timeline pull`);
// pullInto is the copy itself, on an open database, for an online pull
// (POST /v1/pull_timeline) to use.

// pullCommitBytes is how much copied WAL one pull transaction holds.
const pullCommitBytes = 64 << 20

// PullConfig is a pull: the timeline, the data directory to copy it into
// and the peer to copy it from.
type PullConfig struct {
	DataDir string
	Key     proto.TimelineKey
	// From is the peer's PostgreSQL-protocol address (host:port), Security
	// how to connect to it.
	From     string
	Security client.Security
}

// PullResult is what a pull copied.
type PullResult struct {
	// WALStart..FlushLSN is the WAL copied (WALStart the timeline's start
	// when the peer holds it from there, else its first whole segment).
	WALStart, FlushLSN proto.LSN
	Term               uint64
	CommitLSN          proto.LSN
	PgTimeline         uint32
	PgHistoryBytes     int // the promoted primary's history file, 0 on PostgreSQL timeline 1
	Slots              int // persistent replication slots copied
}

// Pull copies timeline c.Key from c.From into c.DataDir's database, which
// no safekeeper may hold (ErrInUse). A data directory that does not exist
// yet is created, but only once the peer has answered: a pull that cannot
// start leaves nothing behind. It refuses a timeline the directory
// already holds WAL of, and one whose WAL would not fit on its file
// system. Atomic: the WAL goes in in transactions that leave the timeline
// empty until the last one, which writes the state; a crash or failure
// mid-pull leaves an empty timeline that a new pull (or the proposer)
// fills.
func Pull(ctx context.Context, c PullConfig) (PullResult, error) {
	dir := filepath.Clean(c.DataDir)
	path := filepath.Join(dir, DatabaseFile)
	var peer client.PeerTimeline
	fresh := false
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		fresh = true
		if peer, err = client.PeerState(ctx, c.From, c.Key.TenantID, c.Key.TimelineID, 0, c.Security); err != nil {
			return PullResult{}, err
		}
		if first, end := peer.FirstHeld(), peer.Info.FlushLSN; end > first {
			if err := checkPullSpace(existingAncestor(dir), nil, uint64(end-first)); err != nil {
				return PullResult{}, fmt.Errorf("%w; nothing copied", err)
			}
		}
		if err := storage.MkdirAllDurable(dir, 0o700); err != nil {
			return PullResult{}, err
		}
	}
	db, err := openOffline(dir, false)
	if errors.Is(err, ErrInUse) {
		return PullResult{}, fmt.Errorf("%s is in use (a safekeeper is running on it?); stop it first: %w", dir, err)
	}
	if err != nil {
		return PullResult{}, err
	}
	defer db.Close()
	tl, local, err := db.OpenTimeline(c.Key.TenantID, c.Key.TimelineID)
	switch {
	case errors.Is(err, storage.ErrNoTimeline):
		tl = nil
	case err != nil:
		return PullResult{}, err
	case local.TimelineStartLSN != 0 && local.FlushLSN > local.TimelineStartLSN:
		return PullResult{}, fmt.Errorf("%s already holds timeline %s/%s (WAL up to %s); nothing copied", dir, c.Key.TenantID, c.Key.TimelineID, local.FlushLSN)
	}
	if !fresh {
		if peer, err = client.PeerState(ctx, c.From, c.Key.TenantID, c.Key.TimelineID, 0, c.Security); err != nil {
			return PullResult{}, err
		}
	}
	first, end := peer.FirstHeld(), peer.Info.FlushLSN
	if peer.Info.TimelineStartLSN == 0 || first >= end {
		return PullResult{}, fmt.Errorf("%s holds no whole segment of WAL of the timeline (start %s, removed up to %s, flush_lsn %s)",
			c.From, peer.Info.TimelineStartLSN, peer.RemovedUpTo, end)
	}
	if err := checkPullSpace(dir, db, uint64(end-first)); err != nil {
		return PullResult{}, fmt.Errorf("%w; nothing copied", err)
	}
	if tl != nil && (local.SystemID != peer.SystemID || local.WalSegSize != peer.WalSegSize || local.PgTimeline != peer.PgTimeline) {
		return PullResult{}, fmt.Errorf("the empty timeline here describes another cluster (system_id %d, segment size %d, TLI %d) than %s's (%d, %d, %d)",
			local.SystemID, local.WalSegSize, local.PgTimeline, c.From, peer.SystemID, peer.WalSegSize, peer.PgTimeline)
	}
	return pullInto(ctx, db, tl, c, &peer)
}

// pullInto copies the peer's WAL and then its state and slots into db's
// timeline c.Key (tl: the empty timeline stored, nil when there is none).
func pullInto(ctx context.Context, db *storage.DB, tl *storage.Timeline, c PullConfig, peer *client.PeerTimeline) (PullResult, error) {
	first, end := peer.FirstHeld(), peer.Info.FlushLSN
	// The state of every transaction but the last: no WAL yet (a crash
	// here leaves an empty timeline: acceptor.New discards WAL above
	// flush_lsn 0), the horizon at the first byte copied.
	empty := acceptor.State{TenantID: c.Key.TenantID, TimelineID: c.Key.TimelineID, SystemID: peer.SystemID, PgVersion: peer.PgVersion,
		WalSegSize: peer.WalSegSize, PgTimeline: peer.PgTimeline}
	if tl == nil {
		var err error
		if tl, err = db.CreateTimeline(empty); err != nil {
			return PullResult{}, err
		}
	}
	if first > peer.Info.TimelineStartLSN {
		empty.RemovedUpTo = first // storage takes it: the timeline holds no WAL yet
	}
	if err := tl.TruncateWAL(0); err != nil {
		return PullResult{}, err
	}
	staged := 0
	err := client.CopyWAL(ctx, peer, c.Key.TenantID, c.Key.TimelineID, first, end, 0, func(at proto.LSN, wal []byte) error {
		if err := tl.WriteWAL(at, wal); err != nil {
			return err
		}
		if staged += len(wal); staged >= pullCommitBytes {
			staged = 0
			return tl.Commit(empty)
		}
		return nil
	})
	if err != nil {
		return PullResult{}, fmt.Errorf("copying %s..%s from %s: %w (the timeline here is left empty)", first, end, c.From, err)
	}
	st := empty
	st.VotedFor = peer.Info.VotedFor
	st.History = peer.Info.History.Upto(end).Clone()
	st.TimelineStartLSN = peer.Info.TimelineStartLSN
	st.FlushLSN = end
	st.CommitLSN = min(peer.Info.CommitLSN, end)
	st.TruncateLSN = min(peer.Info.TruncateLSN, st.CommitLSN)
	// The promoted primary's history file goes in with the state, as the
	// acceptor records it at a timeline switch.
	st.PgHistory = peer.PgHistory
	// The peer's configuration too: the pulled copy is in the generation
	// its source was (README_PROTO.md, rule 9), never in none.
	st.Configuration = peer.Info.Configuration.Clone()
	if err := tl.Commit(st); err != nil {
		return PullResult{}, fmt.Errorf("%w (the timeline here is left empty)", err)
	}
	res := PullResult{WALStart: first, FlushLSN: end, Term: st.VotedFor.Term, CommitLSN: st.CommitLSN, PgTimeline: st.PgTimeline,
		PgHistoryBytes: len(st.PgHistory)}
	// The peer's persistent replication slots, and the tombstones of those
	// dropped, so a slot survives the loss of this safekeeper's disk.
	var slots storage.SlotUpdate
	for _, e := range peer.Slots {
		if e.Dropped {
			slots.PutTombstones = append(slots.PutTombstones, storage.SlotTombstone{Name: e.Name, Incarnation: e.Incarnation, DroppedAt: time.Now()})
		} else {
			slots.Put = append(slots.Put, storage.Slot{Name: e.Name, Incarnation: e.Incarnation, RestartLSN: e.RestartLSN, RestartTLI: e.RestartTLI})
		}
	}
	if err := tl.UpdateSlots(slots); err != nil {
		return res, fmt.Errorf("the WAL and state are in; storing the replication slots failed (the proposer copies them once it streams): %w", err)
	}
	res.Slots = len(slots.Put)
	return res, nil
}

// checkPullSpace refuses a pull of walBytes whose WAL would not fit: the
// file system's free space and the pages free inside the database file (db,
// nil before it exists) must hold it with bbolt's overhead (pages,
// branches: about 6%, so 1/8 is allowed) and 16 MiB to spare. A pull that
// fails on ENOSPC would leave the disk full and the next one failing the
// same way.
func checkPullSpace(dir string, db *storage.DB, walBytes uint64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	free := st.Bavail * uint64(st.Bsize)
	if db != nil {
		free += uint64(max(db.ReusableBytes(), 0))
	}
	need := walBytes + walBytes/8 + 16<<20
	if free < need {
		return fmt.Errorf("%s has %d MiB free (file system and free pages of the database), the %d MiB of WAL to copy need about %d MiB",
			dir, free>>20, walBytes>>20, need>>20)
	}
	return nil
}

// existingAncestor is dir or its nearest ancestor that exists: where the
// file system of a directory still to be made can be asked.
func existingAncestor(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil || filepath.Dir(dir) == dir {
			return dir
		}
		dir = filepath.Dir(dir)
	}
}

// PullOnline copies timeline c.Key from peer c.From into this running
// safekeeper's database (POST /v1/pull_timeline; c.DataDir is unused): the
// step of a membership change that gives a new member the timeline before
// it counts toward any quorum (README_PROTO.md, "Membership and
// generations"), so that it has only the WAL written since to catch up
// once it does. A timeline already held is not copied again: existed is
// true and the result is empty. While the copy runs the timeline is
// neither opened nor created by a greeting (a proposer's connection is
// refused as for a timeline not held, and retries); a failed copy leaves
// an empty timeline that a new pull, or a proposer, fills.
func (r *Registry) PullOnline(ctx context.Context, c PullConfig) (res PullResult, existed bool, err error) {
	key := c.Key
	for replaced := false; ; {
		r.mu.Lock()
		t := r.timelines[key]
		switch {
		case r.stopping:
			r.mu.Unlock()
			return PullResult{}, false, ErrStopped
		case t != nil:
			r.mu.Unlock()
			st := t.State()
			if st.VotedFor.Term != 0 || st.TimelineStartLSN != 0 || replaced {
				return PullResult{WALStart: st.TimelineStartLSN, FlushLSN: st.FlushLSN, Term: st.VotedFor.Term, CommitLSN: st.CommitLSN}, true, nil
			}
			// Open but empty and never voted: what an interrupted pull
			// leaves (its state goes in last). Nothing is lost by
			// replacing it; left alone, it would count as held, and the
			// move would leave it for the proposer to fill from the start.
			if _, err := r.Delete(key, false); err != nil {
				return PullResult{}, false, fmt.Errorf("replacing the empty timeline an earlier pull left: %w", err)
			}
			r.log.Info("deleted the empty timeline an interrupted pull left; pulling again", "tenant_id", key.TenantID, "timeline_id", key.TimelineID)
			replaced = true
			continue
		}
		if _, ok := r.pulling[key]; ok {
			r.mu.Unlock()
			return PullResult{}, false, &Error{Kind: ErrBusy, Msg: fmt.Sprintf("timeline %s is being pulled already", key)}
		}
		if _, ok := r.deleting[key]; ok {
			r.mu.Unlock()
			return PullResult{}, false, &Error{Kind: ErrBusy, Msg: fmt.Sprintf("timeline %s is being deleted", key)}
		}
		if _, ok := r.opening[key]; ok {
			r.mu.Unlock()
			return PullResult{}, true, nil // a greeting creates or opens it: held
		}
		break
	}
	r.pulling[key] = struct{}{}
	r.openWG.Add(1) // Close waits for the copy
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.pulling, key)
		r.mu.Unlock()
		r.openWG.Done()
	}()
	tl, local, err := r.db.OpenTimeline(key.TenantID, key.TimelineID)
	switch {
	case errors.Is(err, storage.ErrNoTimeline):
		tl = nil
	case err != nil:
		return PullResult{}, false, err
	case local.TimelineStartLSN != 0 && local.FlushLSN > local.TimelineStartLSN:
		return PullResult{}, true, nil
	}
	peer, err := client.PeerState(ctx, c.From, key.TenantID, key.TimelineID, 0, c.Security)
	if err != nil {
		return PullResult{}, false, err
	}
	first, end := peer.FirstHeld(), peer.Info.FlushLSN
	if peer.Info.TimelineStartLSN == 0 && tl == nil {
		// No WAL yet: the copy is the timeline's identity, the peer's vote
		// and configuration.
		st := acceptor.State{TenantID: key.TenantID, TimelineID: key.TimelineID, SystemID: peer.SystemID, PgVersion: peer.PgVersion,
			WalSegSize: peer.WalSegSize, PgTimeline: peer.PgTimeline, VotedFor: peer.Info.VotedFor,
			Configuration: peer.Info.Configuration.Clone()}
		if _, err := r.db.CreateTimeline(st); err != nil {
			return PullResult{}, false, err
		}
		r.log.Info("timeline pulled (no WAL yet)", "tenant_id", key.TenantID, "timeline_id", key.TimelineID, "from", c.From,
			"term", st.VotedFor.Term, "generation", st.Configuration.Generation)
		return PullResult{Term: st.VotedFor.Term}, false, nil
	}
	if peer.Info.TimelineStartLSN == 0 || first >= end {
		return PullResult{}, false, fmt.Errorf("%s holds no whole segment of WAL of the timeline (start %s, removed up to %s, flush_lsn %s)",
			c.From, peer.Info.TimelineStartLSN, peer.RemovedUpTo, end)
	}
	if err := checkPullSpace(filepath.Dir(r.db.Path()), r.db, uint64(end-first)); err != nil {
		return PullResult{}, false, fmt.Errorf("%w; nothing copied", err)
	}
	if tl != nil && (local.SystemID != peer.SystemID || local.WalSegSize != peer.WalSegSize || local.PgTimeline != peer.PgTimeline) {
		return PullResult{}, false, fmt.Errorf("the empty timeline here describes another cluster (system_id %d, segment size %d, TLI %d) than %s's (%d, %d, %d)",
			local.SystemID, local.WalSegSize, local.PgTimeline, c.From, peer.SystemID, peer.WalSegSize, peer.PgTimeline)
	}
	res, err = pullInto(ctx, r.db, tl, c, &peer)
	if err == nil {
		r.log.Info("timeline pulled", "tenant_id", key.TenantID, "timeline_id", key.TimelineID, "from", c.From, "wal_start_lsn", res.WALStart,
			"flush_lsn", res.FlushLSN, "term", res.Term, "generation", peer.Info.Configuration.Generation)
	}
	return res, false, err
}
