package fleet_test

import (
	"testing"

	"github.com/safekeeper/safekeeper/fleet"
)

// TestBelowQuorum: a timeline is below quorum when fewer of its members are
// live than a majority of them; while its membership changes, the new
// members need a live majority too (a joint configuration commits on
// both).
func TestBelowQuorum(t *testing.T) {
	live := func(ids ...uint64) map[uint64]bool {
		m := map[uint64]bool{}
		for _, id := range ids {
			m[id] = true
		}
		return m
	}
	for _, tc := range []struct {
		name string
		cfg  fleet.Config
		live map[uint64]bool
		want bool
	}{
		{"3 of 3", fleet.Config{Generation: 1, Members: []uint64{1, 2, 3}}, live(1, 2, 3), false},
		{"2 of 3", fleet.Config{Generation: 1, Members: []uint64{1, 2, 3}}, live(1, 3), false},
		{"1 of 3", fleet.Config{Generation: 1, Members: []uint64{1, 2, 3}}, live(3, 9), true},
		{"2 of 4", fleet.Config{Generation: 1, Members: []uint64{1, 2, 3, 4}}, live(1, 2), true},
		{"1 of 1", fleet.Config{Generation: 1, Members: []uint64{1}}, live(1), false},
		{"joint, both sides", fleet.Config{Generation: 2, Members: []uint64{1, 2, 3}, NewMembers: []uint64{2, 3, 4}}, live(2, 3), false},
		{"joint, new side short", fleet.Config{Generation: 2, Members: []uint64{1, 2, 3}, NewMembers: []uint64{3, 4, 5}}, live(1, 2, 3), true},
	} {
		if got := fleet.BelowQuorum(tc.cfg, tc.live); got != tc.want {
			t.Errorf("%s: BelowQuorum(%v, live %v) = %v; want %v", tc.name, tc.cfg, tc.live, got, tc.want)
		}
	}
}
