package proposer

import (
	"slices"
	"sort"

	"github.com/safekeeper/safekeeper/proto"
)

// slotMerge keeps a persistent replication slot created on one safekeeper
// of the timeline on all of them (README_PROTO.md, "Replication slots on
// every safekeeper"): each safekeeper reports its slot table
// (SafeKeeperSlots) after its greeting and whenever it changes; the merge
// of the last report of every safekeeper goes (Slots) to each one whose
// own report differs from it and that was not sent that merge already. The
// safekeeper folds it in and reports again, equal to the merge once it
// holds everything, and nothing more is sent until something changes.
//
// Merge rules (the safekeeper applies the same, so any order of tables
// ends in the same state): a slot is known by name and incarnation; a
// tombstone wins over the slot it names; of two live incarnations of a
// name the higher wins; restart_lsn is the highest reported. Reports of a
// safekeeper that disconnected stay in the merge: what it knew is not
// lost while it is away.
//
// It is pure (no IO) and owned by the driver's loop.
type slotMerge struct {
	reports [][]proto.SlotEntry // per safekeeper, its last report; nil: none yet
	sent    [][]proto.SlotEntry // per safekeeper, the merge last sent on its current connection
}

func newSlotMerge(n int) *slotMerge {
	return &slotMerge{reports: make([][]proto.SlotEntry, n), sent: make([][]proto.SlotEntry, n)}
}

// connected: safekeeper sk has a new connection; nothing was sent on it.
func (m *slotMerge) connected(sk int) { m.sent[sk] = nil }

// report records safekeeper sk's table and returns, per safekeeper that
// is due one, the merge to send it (in the order of sks; a safekeeper
// counts only if connected(i) says it is).
func (m *slotMerge) report(sk int, t proto.SlotTable, connected func(i int) bool) map[int]proto.SlotTable {
	m.reports[sk] = sortedEntries(t.Entries)
	merged := mergeSlotTables(m.reports)
	out := map[int]proto.SlotTable{}
	for i := range m.reports {
		if m.reports[i] == nil || !connected(i) {
			continue // not reported yet on this connection: it will, right after its greeting
		}
		if slices.Equal(merged, m.reports[i]) || (m.sent[i] != nil && slices.Equal(merged, m.sent[i])) {
			continue
		}
		m.sent[i] = merged
		out[i] = proto.SlotTable{Entries: merged}
	}
	return out
}

func sortedEntries(es []proto.SlotEntry) []proto.SlotEntry {
	out := slices.Clone(es)
	if out == nil {
		out = []proto.SlotEntry{}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		if out[i].Incarnation != out[j].Incarnation {
			return out[i].Incarnation < out[j].Incarnation
		}
		return !out[i].Dropped && out[j].Dropped
	})
	return out
}

// mergeSlotTables merges tables by the rules above. The result is sorted
// by name and incarnation, and holds at most proto.MaxSlotEntries entries
// (every live slot first; tombstones beyond the bound are left out).
func mergeSlotTables(tables [][]proto.SlotEntry) []proto.SlotEntry {
	type key struct {
		name string
		inc  uint64
	}
	dead := map[key]bool{}
	for _, t := range tables {
		for _, e := range t {
			if e.Dropped {
				dead[key{e.Name, e.Incarnation}] = true
			}
		}
	}
	live := map[string]proto.SlotEntry{}
	for _, t := range tables {
		for _, e := range t {
			if e.Dropped || dead[key{e.Name, e.Incarnation}] {
				continue
			}
			cur, ok := live[e.Name]
			switch {
			case !ok || e.Incarnation > cur.Incarnation:
				live[e.Name] = e
			case e.Incarnation == cur.Incarnation && e.RestartLSN > cur.RestartLSN:
				live[e.Name] = e
			}
		}
	}
	out := make([]proto.SlotEntry, 0, len(live)+len(dead))
	for _, e := range live {
		out = append(out, e)
	}
	tombs := make([]proto.SlotEntry, 0, len(dead))
	for k := range dead {
		tombs = append(tombs, proto.SlotEntry{Name: k.name, Incarnation: k.inc, Dropped: true})
	}
	tombs = sortedEntries(tombs)
	out = append(out, tombs[:min(len(tombs), max(0, proto.MaxSlotEntries-len(out)))]...)
	return sortedEntries(out)
}
