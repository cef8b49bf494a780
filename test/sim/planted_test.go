package sim

import (
	"strings"
	"testing"

	"github.com/safekeeper/safekeeper/acceptor"
)

// TestPlantedBugIsFound shows the simulation can fail: with a known safety
// bug planted in the acceptor (acceptor.Config.UnsafeTestingBug), some seed
// among the first maxSeeds breaks an invariant — the one the bug is about —
// and the same seed passes without the bug.
func TestPlantedBugIsFound(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bug    acceptor.Bug
		noRep  bool   // invariant 7 off: find the bug by its consequence
		want   string // the invariant that must catch it
		within int    // seeds
	}{
		// Directly: the reply leaves before the vote is durable.
		{"vote without persisting/reply durability", acceptor.BugVoteWithoutPersisting, false, "invariant 7", 5},
		// By its consequence: a crash forgets the vote, the term is granted
		// again to another proposer — two proposers in one term.
		{"vote without persisting/two proposers in a term", acceptor.BugVoteWithoutPersisting, true, "invariant 2", 100},
		// A late ProposerElected of the current term truncates acknowledged
		// (and possibly committed) WAL.
		{"skip common point check", acceptor.BugSkipCommonPointCheck, false, "invariant 1", 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			found := uint64(0)
			var err error
			// Batches of seeds, in parallel, stopping at the first batch
			// with a failure; the lowest failing seed is reported.
			for first := uint64(1); found == 0 && first <= uint64(tc.within); first += 8 {
				var seeds []uint64
				for s := first; s < first+8 && s <= uint64(tc.within); s++ {
					seeds = append(seeds, s)
				}
				for _, r := range runSeeds(seeds, func(s uint64) Config {
					c := simConfig(s)
					c.Bug, c.NoReplyDurabilityCheck = tc.bug, tc.noRep
					return c
				}) {
					if r.Err != nil && strings.Contains(r.Err.Error(), tc.want) {
						found, err = r.Seed, r.Err
						break
					}
				}
			}
			if found == 0 {
				t.Fatalf("%v planted: no seed in 1..%d broke %s", tc.bug, tc.within, tc.want)
			}
			t.Logf("%v found at seed %d: %v", tc.bug, found, err)
			if r := Run(simConfig(found)); r.Err != nil {
				t.Fatalf("seed %d fails without the bug too: %v", found, r.Err)
			}
		})
	}
}
