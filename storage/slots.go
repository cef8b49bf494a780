package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	bolt "go.etcd.io/bbolt"

	"github.com/safekeeper/safekeeper/proto"
)

// Persistent physical replication slots.
//
// Each timeline bucket may hold a "slots" sub-bucket (created by the first
// CreateSlot), mapping a slot name (its bytes, at most MaxSlotNameLen) to a
// slot record, all integers big-endian:
//
//	magic "SKSL" | version u32 (1) | restart_lsn u64 | restart_tli u32 |
//	crc32c u32 (Castagnoli, over all the bytes before it)
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

var bucketSlots = []byte("slots")

// slotRecord is the framing of a slot record; the body is restart_lsn u64 |
// restart_tli u32. decodeSlot names the slot in its errors.
var slotRecord = recordKind{
	name:    "slot record",
	magic:   [4]byte{'S', 'K', 'S', 'L'},
	version: slotVersion,
	bodyLen: 8 + 4,
}

const slotVersion = 1

// Slot is a persistent physical replication slot of a timeline. A zero
// RestartLSN means the slot reserves nothing yet (PostgreSQL's invalid
// restart_lsn).
type Slot struct {
	Name       string
	RestartLSN proto.LSN
	RestartTLI uint32
}

func encodeSlot(dst []byte, s *Slot) []byte {
	return slotRecord.append(dst, func(dst []byte) []byte {
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.RestartLSN))
		return binary.BigEndian.AppendUint32(dst, s.RestartTLI)
	})
}

func decodeSlot(name string, src []byte) (Slot, error) {
	k := slotRecord
	k.name = fmt.Sprintf("slot %q record", name)
	body, err := k.open(src)
	if err != nil {
		return Slot{}, err
	}
	return Slot{
		Name:       name,
		RestartLSN: proto.LSN(binary.BigEndian.Uint64(body)),
		RestartTLI: binary.BigEndian.Uint32(body[8:]),
	}, nil
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
	err := t.db.bolt.View(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTimelines).Bucket(t.key[:])
		if tb == nil {
			return fmt.Errorf("%w: %s", ErrNoTimeline, t.Key())
		}
		sb := tb.Bucket(bucketSlots)
		if sb == nil {
			return nil
		}
		return sb.ForEach(func(k, v []byte) error {
			s, err := decodeSlot(string(k), v) // copies out of the transaction
			if err != nil {
				return err
			}
			out = append(out, s)
			return nil
		})
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
	if err := t.db.checkOpen(); err != nil {
		return err
	}
	err := t.db.bolt.Update(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTimelines).Bucket(t.key[:])
		if tb == nil {
			return fmt.Errorf("%w: %s", ErrNoTimeline, t.Key())
		}
		sb, err := tb.CreateBucketIfNotExists(bucketSlots)
		if err != nil {
			return err
		}
		return fn(sb)
	})
	if err != nil {
		if errors.Is(err, ErrSlotExists) || errors.Is(err, ErrNoSlot) {
			return err
		}
		return fmt.Errorf("storage: slot %q of timeline %s: %w", name, t.Key(), err)
	}
	return nil
}
