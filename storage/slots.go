package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/safekeeper/safekeeper/proto"
)

// Persistent physical replication slots.
//
// Each timeline bucket may hold a "slots" sub-bucket (created by the first
// CreateSlot), mapping a slot name (its bytes, at most MaxSlotNameLen) to a
// slot record, all integers big-endian:
//
//	magic "SKSL" | version u32 (2) | restart_lsn u64 | restart_tli u32 |
//	incarnation u64 | crc32c u32 (Castagnoli, over all the bytes before it)
//
// Version 1 (written before slots were copied between safekeepers) has no
// incarnation; it is read as incarnation 0 and rewritten as version 2 at
// the slot's next save.
//
// A "slot_tombstones" sub-bucket remembers the slots dropped (so that a
// copy of a dropped slot another safekeeper still reports is not created
// again): its key is the slot's name, a 0 byte and its incarnation (u64),
// its value a tombstone record:
//
//	magic "SKST" | version u32 (1) | dropped_at i64 (unix microseconds) |
//	crc32c u32
//
// A decoder refuses a wrong magic, an unknown version, a CRC mismatch or a
// wrong length, with an error wrapping ErrCorrupt. Every change is its own
// small write transaction (fsynced unless Options.UnsafeNoFsync): slots
// change rarely, and a restart_lsn that lags on disk only retains more WAL.

// Errors of the slot methods.
var (
	// ErrSlotExists: CreateSlot of a name already stored.
	ErrSlotExists = errors.New("storage: replication slot already exists")
	// ErrNoSlot: the slot is not stored.
	ErrNoSlot = errors.New("storage: no such replication slot")
)

// MaxSlotNameLen is PostgreSQL's NAMEDATALEN-1: the longest slot name
// (proto.MaxSlotNameLen).
const MaxSlotNameLen = proto.MaxSlotNameLen

var (
	bucketSlots      = []byte("slots")
	bucketTombstones = []byte("slot_tombstones")
)

// slotRecord is the framing of a slot record; the body is restart_lsn u64 |
// restart_tli u32 | incarnation u64. slotRecordV1 is version 1's, without
// the incarnation. decodeSlot names the slot in its errors.
var (
	slotRecord = recordKind{
		name:    "slot record",
		magic:   [4]byte{'S', 'K', 'S', 'L'},
		version: 2,
		bodyLen: 8 + 4 + 8,
	}
	slotRecordV1 = recordKind{
		name:    "slot record",
		magic:   [4]byte{'S', 'K', 'S', 'L'},
		version: 1,
		bodyLen: 8 + 4,
	}
	tombstoneRecord = recordKind{
		name:    "slot tombstone record",
		magic:   [4]byte{'S', 'K', 'S', 'T'},
		version: 1,
		bodyLen: 8,
	}
)

// Slot is a persistent physical replication slot of a timeline. A zero
// RestartLSN means the slot reserves nothing yet (PostgreSQL's invalid
// restart_lsn). Incarnation tells apart the slots ever created under Name
// (proto.SlotEntry).
type Slot struct {
	Name        string
	RestartLSN  proto.LSN
	RestartTLI  uint32
	Incarnation uint64
}

// SlotTombstone records that incarnation Incarnation of slot Name was
// dropped, at DroppedAt.
type SlotTombstone struct {
	Name        string
	Incarnation uint64
	DroppedAt   time.Time
}

func encodeSlot(dst []byte, s *Slot) []byte {
	return slotRecord.append(dst, func(dst []byte) []byte {
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.RestartLSN))
		dst = binary.BigEndian.AppendUint32(dst, s.RestartTLI)
		return binary.BigEndian.AppendUint64(dst, s.Incarnation)
	})
}

// encodeSlotV1 is version 1's encoding, for the tests that read it.
func encodeSlotV1(dst []byte, s *Slot) []byte {
	return slotRecordV1.append(dst, func(dst []byte) []byte {
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.RestartLSN))
		return binary.BigEndian.AppendUint32(dst, s.RestartTLI)
	})
}

func decodeSlot(name string, src []byte) (Slot, error) {
	k := slotRecord
	if len(src) >= 8 && binary.BigEndian.Uint32(src[4:]) == slotRecordV1.version {
		k = slotRecordV1
	}
	k.name = fmt.Sprintf("slot %q record", name)
	body, err := k.open(src)
	if err != nil {
		return Slot{}, err
	}
	s := Slot{
		Name:       name,
		RestartLSN: proto.LSN(binary.BigEndian.Uint64(body)),
		RestartTLI: binary.BigEndian.Uint32(body[8:]),
	}
	if k.version >= 2 {
		s.Incarnation = binary.BigEndian.Uint64(body[12:])
	}
	return s, nil
}

func tombstoneKey(name string, incarnation uint64) []byte {
	return binary.BigEndian.AppendUint64(append([]byte(name), 0), incarnation)
}

func encodeTombstone(dst []byte, ts *SlotTombstone) []byte {
	return tombstoneRecord.append(dst, func(dst []byte) []byte {
		return binary.BigEndian.AppendUint64(dst, uint64(ts.DroppedAt.UnixMicro()))
	})
}

func decodeTombstone(key, src []byte) (SlotTombstone, error) {
	k := tombstoneRecord
	i := bytes.IndexByte(key, 0)
	if i < 0 || len(key)-i-1 != 8 {
		return SlotTombstone{}, k.corrupt("key %q is not a slot name, 0 and an incarnation", key)
	}
	k.name = fmt.Sprintf("slot %q tombstone record", key[:i])
	body, err := k.open(src)
	if err != nil {
		return SlotTombstone{}, err
	}
	return SlotTombstone{Name: string(key[:i]), Incarnation: binary.BigEndian.Uint64(key[i+1:]),
		DroppedAt: time.UnixMicro(int64(binary.BigEndian.Uint64(body)))}, nil
}

// checkSlotName refuses, with ErrBadState, a name PostgreSQL's rule for
// slot names refuses (proto.CheckSlotName): such a name is never stored.
func checkSlotName(name string) error {
	if err := proto.CheckSlotName(name); err != nil {
		return fmt.Errorf("%w: %w", ErrBadState, err)
	}
	return nil
}

// Slots returns the timeline's persistent slots, sorted by name.
func (t *Timeline) Slots() ([]Slot, error) {
	var out []Slot
	err := t.forEachIn(bucketSlots, func(k, v []byte) error {
		s, err := decodeSlot(string(k), v) // copies out of the transaction
		if err != nil {
			return err
		}
		out = append(out, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("storage: slots of timeline %s: %w", t.Key(), err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// CreateSlot stores a new slot. It fails with ErrSlotExists if the name is
// taken.
func (t *Timeline) CreateSlot(s Slot) error {
	return t.updateSlot(s.Name, func(sb *bolt.Bucket) error {
		if sb.Get([]byte(s.Name)) != nil {
			return fmt.Errorf("%w: %q", ErrSlotExists, s.Name)
		}
		return sb.Put([]byte(s.Name), encodeSlot(nil, &s))
	})
}

// SaveSlot replaces the stored record of an existing slot. It fails with
// ErrNoSlot if the slot is not stored (it was dropped).
func (t *Timeline) SaveSlot(s Slot) error {
	return t.updateSlot(s.Name, func(sb *bolt.Bucket) error {
		if sb.Get([]byte(s.Name)) == nil {
			return fmt.Errorf("%w: %q", ErrNoSlot, s.Name)
		}
		return sb.Put([]byte(s.Name), encodeSlot(nil, &s))
	})
}

// DropSlot removes a slot. It fails with ErrNoSlot if it is not stored.
func (t *Timeline) DropSlot(name string) error {
	return t.updateSlot(name, func(sb *bolt.Bucket) error {
		if sb.Get([]byte(name)) == nil {
			return fmt.Errorf("%w: %q", ErrNoSlot, name)
		}
		return sb.Delete([]byte(name))
	})
}

func (t *Timeline) updateSlot(name string, fn func(sb *bolt.Bucket) error) error {
	if err := checkSlotName(name); err != nil {
		return err
	}
	err := t.updateSlots(func(sb *bolt.Bucket, _ *bolt.Bucket) error { return fn(sb) })
	if err != nil {
		if errors.Is(err, ErrSlotExists) || errors.Is(err, ErrNoSlot) {
			return err
		}
		return fmt.Errorf("storage: slot %q of timeline %s: %w", name, t.Key(), err)
	}
	return nil
}

// SlotTombstones returns the timeline's slot tombstones, sorted by name and
// incarnation.
func (t *Timeline) SlotTombstones() ([]SlotTombstone, error) {
	var out []SlotTombstone
	err := t.forEachIn(bucketTombstones, func(k, v []byte) error {
		ts, err := decodeTombstone(k, v) // copies out of the transaction
		if err != nil {
			return err
		}
		out = append(out, ts)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("storage: slot tombstones of timeline %s: %w", t.Key(), err)
	}
	return out, nil
}

// SlotUpdate is a set of slot changes UpdateSlots makes in one transaction.
type SlotUpdate struct {
	// Put stores these slots, new or replacing the stored one of the name.
	Put []Slot
	// Drop removes the slots of these names (a name not stored is no error).
	Drop []string
	// PutTombstones and DropTombstones store and remove tombstones (by name
	// and incarnation).
	PutTombstones, DropTombstones []SlotTombstone
}

// UpdateSlots makes the changes of u in one write transaction: after a
// crash all of them are stored or none.
func (t *Timeline) UpdateSlots(u SlotUpdate) error {
	for _, s := range u.Put {
		if err := checkSlotName(s.Name); err != nil {
			return err
		}
	}
	for _, ts := range u.PutTombstones {
		if err := checkSlotName(ts.Name); err != nil {
			return err
		}
	}
	err := t.updateSlots(func(sb, tsb *bolt.Bucket) error {
		for _, name := range u.Drop {
			if err := sb.Delete([]byte(name)); err != nil {
				return err
			}
		}
		for i := range u.Put {
			if err := sb.Put([]byte(u.Put[i].Name), encodeSlot(nil, &u.Put[i])); err != nil {
				return err
			}
		}
		for _, ts := range u.DropTombstones {
			if err := tsb.Delete(tombstoneKey(ts.Name, ts.Incarnation)); err != nil {
				return err
			}
		}
		for i := range u.PutTombstones {
			ts := &u.PutTombstones[i]
			if err := tsb.Put(tombstoneKey(ts.Name, ts.Incarnation), encodeTombstone(nil, ts)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: slots of timeline %s: %w", t.Key(), err)
	}
	return nil
}

// forEachIn calls fn for every key and value of the timeline's sub-bucket
// name (none if there is no such bucket), in one read transaction; fn must
// copy what it keeps.
func (t *Timeline) forEachIn(name []byte, fn func(k, v []byte) error) error {
	return t.db.bolt.View(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTimelines).Bucket(t.key[:])
		if tb == nil {
			return fmt.Errorf("%w: %s", ErrNoTimeline, t.Key())
		}
		b := tb.Bucket(name)
		if b == nil {
			return nil
		}
		return b.ForEach(fn)
	})
}

// updateSlots runs fn on the timeline's slots and tombstones buckets
// (created if missing) in one write transaction.
func (t *Timeline) updateSlots(fn func(slots, tombstones *bolt.Bucket) error) error {
	if err := t.db.checkOpen(); err != nil {
		return err
	}
	return t.db.bolt.Update(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTimelines).Bucket(t.key[:])
		if tb == nil {
			return fmt.Errorf("%w: %s", ErrNoTimeline, t.Key())
		}
		sb, err := tb.CreateBucketIfNotExists(bucketSlots)
		if err != nil {
			return err
		}
		tsb, err := tb.CreateBucketIfNotExists(bucketTombstones)
		if err != nil {
			return err
		}
		return fn(sb, tsb)
	})
}
