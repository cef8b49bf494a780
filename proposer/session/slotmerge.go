package session

import (
	"slices"
	"sort"

	"github.com/safekeeper/safekeeper/proto"
)

// SlotMerge keeps a persistent replication slot created on one safekeeper
// of the timeline on all of them (README_PROTO.md, "Replication slots on
// every safekeeper"): each safekeeper reports its slot table
// (SafeKeeperSlots) after its greeting and whenever it changes; at each
// report the merge of the last report of every safekeeper goes (Slots) to
// each connected one whose own last report differs from it. The safekeeper
// folds it in and reports again if that changed anything: equal to the
// merge once it holds everything, and then nothing more is sent to it
// until something changes. One that cannot take a copy (--max-slots, a
// temporary slot of the name, a reader still streaming from a slot dropped
// elsewhere) is sent the merge again at the next report, its own included
// once what stopped it changed.
//
// Merge rules (the safekeeper applies the same, so any order of tables
// ends in the same state): a slot is known by name and incarnation; a
// tombstone wins over the slot it names; of two live incarnations of a
// name the higher wins; restart_lsn is the highest reported. Reports of a
// safekeeper that disconnected stay in the merge: what it knew is not
// lost while it is away.
//
// It is no part of the consensus (Core and Session know nothing of slots),
// but it is decided by the same rules: pure, one per session, owned by the
// driver's loop, which feeds it the SafeKeeperSlots and sends the Slots.
// Not safe for concurrent use.
type SlotMerge struct {
	reports [][]proto.SlotEntry // per safekeeper, its last report; nil: none yet
	fresh   []bool              // per safekeeper: its last report came on its current connection
}

// NewSlotMerge returns the merge of n safekeepers, none reported yet.
func NewSlotMerge(n int) *SlotMerge {
	return &SlotMerge{reports: make([][]proto.SlotEntry, n), fresh: make([]bool, n)}
}

// Connected: safekeeper sk has a new connection; it reports right after
// its greeting, and is sent nothing before.
func (m *SlotMerge) Connected(sk int) { m.fresh[sk] = false }

// Report records safekeeper sk's table and returns, per safekeeper due
// one, the merge to send it: each connected one (connected(i)) that has
// reported on its connection and whose last report differs from the merge.
func (m *SlotMerge) Report(sk int, t proto.SlotTable, connected func(i int) bool) map[int]proto.SlotTable {
	m.reports[sk], m.fresh[sk] = sortedEntries(t.Entries), true
	merged := mergeSlotTables(m.reports)
	out := map[int]proto.SlotTable{}
	for i := range m.reports {
		if m.fresh[i] && connected(i) && !slices.Equal(merged, m.reports[i]) {
			out[i] = proto.SlotTable{Entries: merged}
		}
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
