package proto

import (
	"fmt"
)

// Slot tables: our extension of the WAL push protocol (README_PROTO.md,
// "Replication slots on every safekeeper"). A persistent physical
// replication slot created on one safekeeper of a timeline is copied to
// the others through the proposer, which is connected to all of them: each
// safekeeper reports its slots ('L'), the proposer merges the reports and
// sends the merged table back ('l'). Both messages have the same body.
const (
	// TagSlots is the proposer's merged table (proposer → safekeeper).
	TagSlots = 'l'
	// TagSafeKeeperSlots is a safekeeper's own table (safekeeper →
	// proposer).
	TagSafeKeeperSlots = 'L'
)

// MaxSlotEntries bounds the entries of one slot table: the slots a
// safekeeper allows (--max-slots) and the tombstones it keeps are far
// fewer.
const MaxSlotEntries = 4096

// SlotEntry is one persistent replication slot of a timeline, or the
// tombstone of one that was dropped.
type SlotEntry struct {
	Name string
	// Incarnation tells apart the slots ever created under Name: a random
	// number given at CREATE_REPLICATION_SLOT (0 for a slot stored before
	// incarnations were). A tombstone names the incarnation it dropped, so
	// a slot created again under the same name is not dropped with it.
	Incarnation uint64
	// RestartLSN and RestartTLI are the slot's: the oldest WAL it keeps,
	// 0 when it reserves none yet. Zero in a tombstone.
	RestartLSN LSN
	RestartTLI uint32
	// Dropped marks a tombstone.
	Dropped bool
}

// slotEntryFlagDropped is bit 0 of an entry's flags byte.
const slotEntryFlagDropped = 1

// SlotTable is the body of both slot messages:
//
//	n u32, then n × (name_len u8, name [name_len], incarnation u64,
//	restart_lsn u64, restart_tli u32, flags u8 (bit 0: dropped))
//
// Names follow PostgreSQL's rule (CheckSlotName); no (name, incarnation)
// appears twice; a tombstone has restart_lsn 0 and restart_tli 0; n is at
// most MaxSlotEntries.
type SlotTable struct {
	Entries []SlotEntry
}

func (t *SlotTable) encode(b []byte) []byte {
	b = putU32(b, uint32(len(t.Entries)))
	for _, e := range t.Entries {
		b = append(b, byte(len(e.Name)))
		b = append(b, e.Name...)
		b = putU64(b, e.Incarnation)
		b = putU64(b, uint64(e.RestartLSN))
		b = putU32(b, e.RestartTLI)
		var flags byte
		if e.Dropped {
			flags |= slotEntryFlagDropped
		}
		b = append(b, flags)
	}
	return b
}

func (t *SlotTable) decode(r *reader) error {
	n := r.u32()
	if r.err != nil {
		return r.err
	}
	if n > MaxSlotEntries {
		return fmt.Errorf("%w: %s: %d entries, at most %d", ErrMalformed, r.what, n, MaxSlotEntries)
	}
	// Every entry takes at least 22 bytes of the payload.
	if int(n)*22 > len(r.b) {
		return fmt.Errorf("%w: %s: %d entries in %d bytes", ErrMalformed, r.what, n, len(r.b))
	}
	t.Entries = make([]SlotEntry, 0, n)
	seen := make(map[SlotEntry]bool, n)
	for range n {
		var e SlotEntry
		l := r.take(1)
		if l == nil {
			break
		}
		e.Name = string(r.take(int(l[0])))
		e.Incarnation = r.u64()
		e.RestartLSN = r.lsn()
		e.RestartTLI = r.u32()
		flags := r.take(1)
		if r.err != nil {
			break
		}
		if flags[0]&^slotEntryFlagDropped != 0 {
			return fmt.Errorf("%w: %s: slot %q has unknown flags %#x", ErrMalformed, r.what, e.Name, flags[0])
		}
		e.Dropped = flags[0]&slotEntryFlagDropped != 0
		if err := CheckSlotName(e.Name); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrMalformed, r.what, err)
		}
		if e.Dropped && (e.RestartLSN != 0 || e.RestartTLI != 0) {
			return fmt.Errorf("%w: %s: the tombstone of slot %q has a restart_lsn", ErrMalformed, r.what, e.Name)
		}
		key := SlotEntry{Name: e.Name, Incarnation: e.Incarnation}
		if seen[key] {
			return fmt.Errorf("%w: %s: slot %q incarnation %d twice", ErrMalformed, r.what, e.Name, e.Incarnation)
		}
		seen[key] = true
		t.Entries = append(t.Entries, e)
	}
	return r.done()
}

// Slots is the proposer's merged slot table ('l').
type Slots struct{ SlotTable }

func (*Slots) Tag() byte { return TagSlots }

func (m *Slots) Encode(b []byte) []byte { return m.encode(append(b, TagSlots)) }

func (m *Slots) Decode(src []byte) error {
	return m.decode(newReader(src, TagSlots, "Slots"))
}

// SafeKeeperSlots is a safekeeper's own slot table ('L').
type SafeKeeperSlots struct{ SlotTable }

func (*SafeKeeperSlots) Tag() byte { return TagSafeKeeperSlots }

func (m *SafeKeeperSlots) Encode(b []byte) []byte { return m.encode(append(b, TagSafeKeeperSlots)) }

func (m *SafeKeeperSlots) Decode(src []byte) error {
	return m.decode(newReader(src, TagSafeKeeperSlots, "SafeKeeperSlots"))
}
