package timeline

import (
	"math/rand/v2"
	"sort"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

// Replication slots on every safekeeper of a timeline (README_PROTO.md,
// "Replication slots on every safekeeper"; docs/serving.md). A persistent
// slot created on one safekeeper is copied to the others through the
// proposer, which is connected to all of them: on a push stream that asked
// for it (START_WAL_PUSH (sync_replication_slots)), the timeline's owner
// sends the safekeeper's slot table (SafeKeeperSlots) right after the
// greeting's answer and again whenever it changed (at most every
// slotReportInterval); the proposer merges the tables of all safekeepers
// and sends the merge (Slots), which applySlots folds in here.
//
// The merge is monotonic, so any order of tables, stale ones included,
// ends in the same state: a slot is known by its name and incarnation (a
// random number given when it was created); a tombstone (the incarnation
// was dropped) wins over the slot it names; of two live incarnations of a
// name the higher wins; a slot's restart_lsn is the highest any
// safekeeper reports. Its restart_lsn thus follows the reader's confirmed
// position wherever the reader reads, and a reader re-pointed at another
// safekeeper resumes where it was.

// slotReportInterval bounds how often a push stream is sent the slot table
// again while it keeps changing (a reader advancing its slot).
const slotReportInterval = time.Second

// Tombstones are kept for tombstoneKeep, and at most maxTombstones per
// timeline (the oldest go first): long enough for every safekeeper to have
// seen the drop. A safekeeper away for longer may bring a dropped slot
// back; drop it again.
const (
	tombstoneKeep = 7 * 24 * time.Hour
	maxTombstones = 1024
)

// tombKey names a tombstone: a slot name and the incarnation dropped.
type tombKey struct {
	name        string
	incarnation uint64
}

// newIncarnation is the incarnation of a slot created now.
func newIncarnation() uint64 { return rand.Uint64() }

// slotsChangedLocked records a change of the persistent slots or the
// tombstones (what a SafeKeeperSlots reports). r.mu is held.
func (r *replState) slotsChangedLocked() {
	r.slotGen++
	if r.slotChanged != nil {
		close(r.slotChanged)
	}
	r.slotChanged = make(chan struct{})
}

// slotsGen returns the generation of the slot table and a channel closed
// at its next change.
func (r *replState) slotsGen() (uint64, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.slotChanged == nil {
		r.slotChanged = make(chan struct{})
	}
	return r.slotGen, r.slotChanged
}

// slotTable returns the persistent slots and the tombstones, sorted, and
// the generation they are of.
func (r *replState) slotTable() (proto.SlotTable, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var t proto.SlotTable
	for _, s := range r.slots {
		if !s.temporary {
			t.Entries = append(t.Entries, proto.SlotEntry{Name: s.Name, Incarnation: s.Incarnation, RestartLSN: s.RestartLSN, RestartTLI: s.RestartTLI})
		}
	}
	for k := range r.tombstones {
		t.Entries = append(t.Entries, proto.SlotEntry{Name: k.name, Incarnation: k.incarnation, Dropped: true})
	}
	sort.Slice(t.Entries, func(i, j int) bool {
		a, b := t.Entries[i], t.Entries[j]
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.Incarnation < b.Incarnation
	})
	return t, r.slotGen
}

// applySlots folds a merged slot table in (the merge rules above): the
// slots it lacks are created, those a tombstone names are dropped (also
// one a reader streams from here: the stream goes on, without the slot),
// restart_lsns move up. removedUpTo is the timeline's retention horizon: a
// slot invalidated here (retention released its WAL) takes a restart_lsn
// again only at or above it. The changes are stored in one transaction
// before they are made in memory; a failure leaves both as they were and
// is returned.
func (r *replState) applySlots(t proto.SlotTable, removedUpTo proto.LSN) error {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var u storage.SlotUpdate
	put := map[string]storage.Slot{}
	drop := map[string]bool{}
	newTombs := map[tombKey]time.Time{}
	for _, e := range t.Entries {
		k := tombKey{e.Name, e.Incarnation}
		if e.Dropped {
			s := r.slots[e.Name]
			if s != nil && !s.temporary && s.Incarnation == e.Incarnation && s.active != 0 {
				// A reader streams from it here: the drop, and its
				// tombstone, wait until its stream ends (releaseSlot), so
				// the WAL it has not confirmed stays.
				if !s.dropPending {
					s.dropPending = true
					r.log.Info("replication slot dropped on another safekeeper; dropped here when its stream ends", "slot", e.Name,
						"active_pid", s.active)
				}
				continue
			}
			if _, ok := r.tombstones[k]; !ok {
				newTombs[k] = now
				u.PutTombstones = append(u.PutTombstones, storage.SlotTombstone{Name: e.Name, Incarnation: e.Incarnation, DroppedAt: now})
			}
			if s != nil && !s.temporary && s.Incarnation == e.Incarnation {
				drop[e.Name] = true
			}
			continue
		}
		if _, dead := r.tombstones[k]; dead {
			continue
		}
		s := r.slots[e.Name]
		switch {
		case s == nil:
			if r.maxSlots > 0 && len(r.slots)+len(put) >= r.maxSlots {
				r.log.Warn("not copying a replication slot from the other safekeepers: --max-slots reached", "slot", e.Name,
					"max_slots", r.maxSlots)
				continue
			}
			put[e.Name] = storage.Slot{Name: e.Name, Incarnation: e.Incarnation, RestartLSN: e.RestartLSN, RestartTLI: e.RestartTLI}
		case s.temporary:
			// A temporary slot of this name lives here; it is never copied,
			// and the copy waits until it is gone.
		case e.Incarnation > s.Incarnation:
			// Another slot of the name, created elsewhere at the same time:
			// the higher incarnation wins everywhere.
			put[e.Name] = storage.Slot{Name: e.Name, Incarnation: e.Incarnation, RestartLSN: e.RestartLSN, RestartTLI: e.RestartTLI}
		case e.Incarnation == s.Incarnation && e.RestartLSN > s.RestartLSN && (!s.invalidated || e.RestartLSN >= removedUpTo):
			cp := s.Slot
			cp.RestartLSN, cp.RestartTLI = e.RestartLSN, e.RestartTLI
			put[e.Name] = cp
		}
	}
	for k := range newTombs {
		if p, ok := put[k.name]; ok && p.Incarnation == k.incarnation {
			delete(put, k.name)
		}
	}
	for name := range drop {
		u.Drop = append(u.Drop, name)
	}
	for _, s := range put {
		u.Put = append(u.Put, s)
	}
	u.DropTombstones = r.expiredTombstonesLocked(now, len(newTombs))
	if len(u.Put) == 0 && len(u.Drop) == 0 && len(u.PutTombstones) == 0 && len(u.DropTombstones) == 0 {
		return nil
	}
	if err := r.store.UpdateSlots(u); err != nil {
		return err
	}
	for _, ts := range u.DropTombstones {
		delete(r.tombstones, tombKey{ts.Name, ts.Incarnation})
	}
	for k, at := range newTombs {
		r.setTombstone(k, at)
	}
	for name := range drop {
		r.log.Info("dropped replication slot: dropped on another safekeeper", "slot", name)
		delete(r.slots, name)
	}
	for _, s := range put {
		cur := r.slots[s.Name]
		switch {
		case cur == nil:
			r.log.Info("created replication slot: copied from another safekeeper", "slot", s.Name, "restart_lsn", s.RestartLSN)
			r.setSlot(&slotState{Slot: s, saved: s.RestartLSN, savedAt: now})
			continue
		case cur.Incarnation != s.Incarnation:
			r.log.Info("replaced replication slot by the one of its name created on another safekeeper", "slot", s.Name,
				"restart_lsn", s.RestartLSN)
		}
		cur.Slot, cur.saved, cur.savedAt, cur.invalidated = s, s.RestartLSN, now, false // a reader streaming from it goes on
	}
	r.slotsChangedLocked()
	r.kickRetention()
	return nil
}

// expiredTombstonesLocked returns the tombstones to forget when adding
// more: those older than tombstoneKeep, and the oldest beyond
// maxTombstones. r.mu is held.
func (r *replState) expiredTombstonesLocked(now time.Time, adding int) []storage.SlotTombstone {
	var out []storage.SlotTombstone
	var kept []storage.SlotTombstone
	for k, at := range r.tombstones {
		ts := storage.SlotTombstone{Name: k.name, Incarnation: k.incarnation, DroppedAt: at}
		if now.Sub(at) > tombstoneKeep {
			out = append(out, ts)
		} else {
			kept = append(kept, ts)
		}
	}
	if over := len(kept) + adding - maxTombstones; over > 0 {
		sort.Slice(kept, func(i, j int) bool { return kept[i].DroppedAt.Before(kept[j].DroppedAt) })
		out = append(out, kept[:min(over, len(kept))]...)
	}
	return out
}
