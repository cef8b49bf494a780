package timeline

import (
	"errors"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

// slotSaveInterval bounds how often a slot's advancing restart_lsn is
// written to disk while it streams (PostgreSQL saves dirty slots at
// checkpoints). A lagging restart_lsn on disk only retains more WAL.
const slotSaveInterval = time.Second

// slotState is a replication slot of a timeline: a persistent one (mirrored
// in storage) or a temporary one (memory only, dropped with its connection).
type slotState struct {
	storage.Slot
	temporary bool
	owner     uint64 // connection that created a temporary slot
	active    uint64 // connection streaming from it; 0 when free
	saved     proto.LSN
	savedAt   time.Time
	// invalidated: retention found it too far behind (max_slot_wal_keep_size)
	// and released its WAL; it reserves none again while this server runs.
	invalidated bool
	// dropPending: it was dropped on another safekeeper while a reader
	// streamed from it here; it is dropped when that stream ends.
	dropPending bool
}

// invalidateSlot releases slot name's WAL (restart_lsn 0, saved) if its
// restart_lsn is still at; it reports whether it did.
func (r *replState) invalidateSlot(name string, at proto.LSN) bool {
	r.mu.Lock()
	s := r.slots[name]
	if s == nil || s.RestartLSN != at {
		r.mu.Unlock()
		return false
	}
	s.RestartLSN, s.invalidated = 0, true
	save := !s.temporary
	if save {
		r.slotsChangedLocked()
	}
	cp := s.Slot
	r.mu.Unlock()
	if save {
		r.saveSlot(cp)
	}
	return true
}

// CreateSlot creates a replication slot; a temporary one belongs to
// connection conn (DropTemporary drops it). With reserveWAL its
// restart_lsn is the start of the segment a client would ask for first
// (IDENTIFY_SYSTEM's xlogpos rounded down), once the timeline holds WAL;
// it is returned. A bad name is a *proto.SlotNameError.
func (t *Timeline) CreateSlot(name string, reserveWAL, temporary bool, conn uint64) (proto.LSN, error) {
	st := t.State()
	s := storage.Slot{Name: name}
	if reserveWAL && st.CommitLSN != 0 {
		s.RestartLSN = max(st.CommitLSN.SegmentStart(uint64(st.WalSegSize)), st.TimelineStartLSN, t.store.RemovedUpTo())
		s.RestartTLI = st.PgTimeline
	}
	return s.RestartLSN, t.repl.createSlot(s, temporary, conn)
}

// createSlot creates a slot; a temporary one belongs to connection conn.
func (r *replState) createSlot(s storage.Slot, temporary bool, conn uint64) error {
	if err := proto.CheckSlotName(s.Name); err != nil {
		return err // a *proto.SlotNameError
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.slots[s.Name]; ok {
		return errSlotExists(s.Name)
	}
	if r.maxSlots > 0 && len(r.slots) >= r.maxSlots {
		r.metrics.refused("slots")
		return &Error{Kind: ErrLimit, Msg: "all replication slots are in use", Hint: "Free one or increase the safekeeper's --max-slots."}
	}
	if !temporary {
		s.Incarnation = newIncarnation()
		if err := r.store.CreateSlot(s); err != nil {
			if errors.Is(err, storage.ErrSlotExists) {
				return errSlotExists(s.Name)
			}
			return errSlotStorage("create", s.Name, err)
		}
	}
	r.setSlot(&slotState{Slot: s, temporary: temporary, owner: conn, saved: s.RestartLSN, savedAt: time.Now()})
	if !temporary {
		r.slotsChangedLocked()
	}
	return nil
}

// DropSlot drops a replication slot no stream uses.
func (t *Timeline) DropSlot(name string) error { return t.repl.dropSlot(name) }

func (r *replState) dropSlot(name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.slots[name]
	if !ok {
		return errSlotMissing(name)
	}
	if s.active != 0 {
		return errSlotActive(name, s.active)
	}
	if !s.temporary {
		// The tombstone goes to the other safekeepers (slotsync.go), so
		// their copies are dropped too.
		now := time.Now()
		ts := storage.SlotTombstone{Name: name, Incarnation: s.Incarnation, DroppedAt: now}
		u := storage.SlotUpdate{Drop: []string{name}, PutTombstones: []storage.SlotTombstone{ts},
			DropTombstones: r.expiredTombstonesLocked(now, 1)}
		if err := r.store.UpdateSlots(u); err != nil {
			return errSlotStorage("drop", name, err)
		}
		for _, old := range u.DropTombstones {
			delete(r.tombstones, tombKey{old.Name, old.Incarnation})
		}
		r.setTombstone(tombKey{name, s.Incarnation}, now)
		r.slotsChangedLocked()
	}
	delete(r.slots, name)
	r.kickRetention()
	return nil
}

// ReadSlot returns a slot's restart_lsn and the PostgreSQL timeline it
// is on; ok is false if there is no slot of the name.
func (t *Timeline) ReadSlot(name string) (restartLSN proto.LSN, restartTLI uint32, ok bool) {
	r := t.repl
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.slots[name]
	if !ok {
		return 0, 0, false
	}
	return s.RestartLSN, s.RestartTLI, true
}

// AcquireSlot marks a slot as streamed by connection conn; ReleaseSlot
// ends that.
func (t *Timeline) AcquireSlot(name string, conn uint64) error {
	r := t.repl
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.slots[name]
	if !ok || s.dropPending {
		return errSlotMissing(name) // one dropped on another safekeeper is gone for new streams
	}
	if s.active != 0 && s.active != conn {
		return errSlotActive(name, s.active)
	}
	s.active = conn
	return nil
}

// ReleaseSlot ends a stream's use of its slot and saves its restart_lsn;
// a slot dropped on another safekeeper meanwhile is dropped now.
func (t *Timeline) ReleaseSlot(name string, conn uint64) {
	r := t.repl
	r.mu.Lock()
	s, ok := r.slots[name]
	if !ok || s.active != conn {
		r.mu.Unlock()
		return
	}
	s.active = 0
	if s.dropPending {
		r.mu.Unlock()
		if err := r.dropSlot(name); err != nil {
			r.log.Warn("could not drop the replication slot dropped on another safekeeper; its next slot table drops it", "slot", name, "err", err)
			return
		}
		r.log.Info("dropped replication slot: dropped on another safekeeper, its stream here ended", "slot", name)
		return
	}
	var save *storage.Slot
	if !s.temporary && s.RestartLSN != s.saved {
		cp := s.Slot
		save = &cp
		s.saved, s.savedAt = s.RestartLSN, time.Now()
	}
	r.mu.Unlock()
	if save != nil {
		r.saveSlot(*save)
	}
}

// DropTemporary drops the temporary slots of a closing connection.
func (t *Timeline) DropTemporary(conn uint64) {
	r := t.repl
	r.mu.Lock()
	dropped := false
	for name, s := range r.slots {
		if s.temporary && s.owner == conn {
			delete(r.slots, name)
			dropped = true
		}
	}
	if dropped {
		// The table is reported again: a persistent slot of the name that
		// another safekeeper holds can now be copied here.
		r.slotsChangedLocked()
	}
	r.mu.Unlock()
	r.kickRetention()
}

// saveAll writes every persistent slot whose restart_lsn moved since its
// last save (at shutdown).
func (r *replState) saveAll() {
	r.mu.Lock()
	var dirty []storage.Slot
	for _, s := range r.slots {
		if !s.temporary && s.RestartLSN != s.saved {
			dirty = append(dirty, s.Slot)
			s.saved = s.RestartLSN
		}
	}
	r.mu.Unlock()
	for _, s := range dirty {
		r.saveSlot(s)
	}
}

// saveSlot writes a persistent slot's restart_lsn. A slot dropped meanwhile
// has nothing to keep; any other failure is logged, and the slot is marked
// unsaved so the next save (or shutdown) tries again: until then the
// restart_lsn on disk lags, which only retains more WAL.
func (r *replState) saveSlot(s storage.Slot) {
	err := r.store.SaveSlot(s)
	if err == nil || errors.Is(err, storage.ErrNoSlot) {
		return
	}
	r.log.Warn("could not save replication slot; its restart_lsn on disk lags behind", "slot", s.Name, "restart_lsn", s.RestartLSN, "err", err)
	r.mu.Lock()
	if st := r.slots[s.Name]; st != nil && st.saved == s.RestartLSN {
		st.saved, st.savedAt = 0, time.Time{}
	}
	r.mu.Unlock()
}
