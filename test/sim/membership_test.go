package sim

import (
	"errors"
	"slices"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

func conf(gen uint64, members []uint64, newMembers ...uint64) proto.Configuration {
	return proto.Configuration{Generation: gen, Members: members, NewMembers: newMembers}
}

// The quorum intersection invariant 9 checks: each step of a change (the
// joint configuration, the final one, a rollback) keeps every quorum of the
// one before intersecting every quorum of the next; going straight to new
// members does not.
func TestQuorumsIntersect(t *testing.T) {
	old, replaceOne, replaceAll := []uint64{1, 2, 3}, []uint64{1, 2, 4}, []uint64{4, 5, 6}
	for _, c := range []struct {
		a, b proto.Configuration
		want bool
	}{
		{conf(1, old), conf(2, old, replaceOne...), true},        // joint
		{conf(2, old, replaceOne...), conf(3, replaceOne), true}, // final
		{conf(2, old, replaceOne...), conf(3, old), true},        // rollback
		{conf(1, old), conf(2, old, replaceAll...), true},
		{conf(2, old, replaceAll...), conf(3, replaceAll), true},
		{conf(1, old), conf(2, replaceOne), false}, // {1,3} and {2,4}
		{conf(1, old), conf(2, replaceAll), false},
		{conf(1, []uint64{1, 2, 3, 4, 5}), conf(2, []uint64{1, 2, 3, 4, 6}), false}, // {1,2,5} and {3,4,6}
	} {
		qa, qb, ok := quorumsIntersect(c.a, c.b)
		if ok != c.want {
			t.Errorf("%s → %s: intersect %v, want %v", c.a, c.b, ok, c.want)
			continue
		}
		if !ok {
			in := func(q []uint64) func(uint64) bool { return func(id uint64) bool { return slices.Contains(q, id) } }
			if !isQuorum(c.a, in(qa)) || !isQuorum(c.b, in(qb)) {
				t.Errorf("%s → %s: the disjoint quorums shown, %v and %v, are not quorums", c.a, c.b, qa, qb)
			}
		}
	}
}

// The store refuses, as a broken invariant 9, a configuration whose quorums
// miss the current one's: a controller that skipped the joint step.
func TestStoreChecksQuorumIntersection(t *testing.T) {
	w := NewWorld(Config{Seed: 1, Membership: MembershipOn})
	if w.store.cas(1, conf(2, []uint64{1, 2, 4})) {
		t.Fatal("the store took {1,2,3} → {1,2,4} without a joint configuration")
	}
	var v *Violation
	if !errors.As(w.err, &v) || v.Invariant != InvQuorumIntersection {
		t.Fatalf("violation %v, want invariant 9", w.err)
	}
}

// Invariant 8 fails for a safekeeper holding a configuration the store did
// not create (another one of the same generation).
func TestCheckerFindsAForeignConfiguration(t *testing.T) {
	w := NewWorld(Config{Seed: 1, Membership: MembershipOn})
	w.chk.check()
	if w.err != nil {
		t.Fatal(w.err)
	}
	w.sks[0].disk.state.Configuration = conf(1, []uint64{1, 2, 4})
	w.chk.check()
	var v *Violation
	if !errors.As(w.err, &v) || v.Invariant != InvOneConfigurationPerGeneration {
		t.Fatalf("violation %v, want invariant 8", w.err)
	}
}
