package session

import (
	"reflect"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

// TestMergeSlotTables: the merge rules, each by a case: a slot on one
// safekeeper is on all; restart_lsn is the highest reported; a tombstone
// wins over the incarnation it names but not over a newer one of the same
// name; of two live incarnations the higher wins.
func TestMergeSlotTables(t *testing.T) {
	live := func(name string, inc uint64, lsn proto.LSN) proto.SlotEntry {
		return proto.SlotEntry{Name: name, Incarnation: inc, RestartLSN: lsn, RestartTLI: 1}
	}
	dead := func(name string, inc uint64) proto.SlotEntry {
		return proto.SlotEntry{Name: name, Incarnation: inc, Dropped: true}
	}
	for _, c := range []struct {
		name   string
		tables [][]proto.SlotEntry
		want   []proto.SlotEntry
	}{
		{"one safekeeper's slot is everyone's", [][]proto.SlotEntry{{live("a", 1, 0x100)}, {}, nil},
			[]proto.SlotEntry{live("a", 1, 0x100)}},
		{"the highest restart_lsn", [][]proto.SlotEntry{{live("a", 1, 0x100)}, {live("a", 1, 0x300)}, {live("a", 1, 0x200)}},
			[]proto.SlotEntry{live("a", 1, 0x300)}},
		{"a tombstone wins over its incarnation", [][]proto.SlotEntry{{live("a", 1, 0x300)}, {dead("a", 1)}, {live("a", 1, 0x100)}},
			[]proto.SlotEntry{dead("a", 1)}},
		{"a slot created again after a drop lives", [][]proto.SlotEntry{{dead("a", 1), live("a", 2, 0x500)}, {live("a", 1, 0x100)}},
			[]proto.SlotEntry{dead("a", 1), live("a", 2, 0x500)}},
		{"the higher of two incarnations", [][]proto.SlotEntry{{live("a", 7, 0x100)}, {live("a", 9, 0x50)}},
			[]proto.SlotEntry{live("a", 9, 0x50)}},
		{"sorted by name", [][]proto.SlotEntry{{live("z", 1, 1), live("b", 1, 1)}, {live("m", 1, 1)}},
			[]proto.SlotEntry{live("b", 1, 1), live("m", 1, 1), live("z", 1, 1)}},
	} {
		if got := mergeSlotTables(c.tables); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestSlotMergeSendsOnlyWhatIsNew: at a report the merge goes to each
// connected safekeeper that reported and holds less; one that reports the
// merge back is sent nothing; nothing goes to one that has not reported on
// its connection yet; one that could not take the merge (it reports the
// same table again) is sent it again.
func TestSlotMergeSendsOnlyWhatIsNew(t *testing.T) {
	m := NewSlotMerge(3)
	up := func(int) bool { return true }
	a := proto.SlotEntry{Name: "a", Incarnation: 1, RestartLSN: 0x100, RestartTLI: 1}
	if got := m.Report(0, proto.SlotTable{Entries: []proto.SlotEntry{a}}, up); len(got) != 0 {
		t.Fatalf("only safekeeper 0 reported: sent %v, want nothing (the others have not reported)", got)
	}
	got := m.Report(1, proto.SlotTable{}, up)
	if len(got) != 1 || !reflect.DeepEqual(got[1].Entries, []proto.SlotEntry{a}) {
		t.Fatalf("safekeeper 1 reported no slots: sent %v, want slot a to safekeeper 1 only", got)
	}
	if got := m.Report(1, proto.SlotTable{Entries: []proto.SlotEntry{a}}, up); len(got) != 0 {
		t.Fatalf("safekeeper 1 reported the merge back: sent %v, want nothing", got)
	}
	if got := m.Report(1, proto.SlotTable{}, up); len(got) != 1 {
		t.Fatalf("safekeeper 1 reported without the slot again (it could not take it): sent %v, want the merge again", got)
	}
	m.Connected(2)
	a2 := a
	a2.RestartLSN = 0x200
	got = m.Report(0, proto.SlotTable{Entries: []proto.SlotEntry{a2}}, func(i int) bool { return i != 1 })
	if len(got) != 0 {
		t.Fatalf("safekeeper 0 reported a higher restart_lsn: sent %v; want nothing (1 is disconnected, 2 has not reported, 0 holds it)", got)
	}
	got = m.Report(2, proto.SlotTable{}, up)
	if len(got) != 2 || got[1].Entries[0].RestartLSN != 0x200 || got[2].Entries[0].RestartLSN != 0x200 {
		t.Fatalf("safekeeper 2 reported on its new connection: sent %v, want the merge at 0/200 to 1 and 2", got)
	}
}
