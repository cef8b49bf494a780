package acceptor_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/test/sim"
)

// TestPlantedBugIsFound shows the deterministic simulation (test/sim) can
// fail: with a known safety bug planted, some seed among the first `within`
// breaks the invariant the bug is about — a typed *sim.Violation — and the
// same seed passes without the bug. Each bug is planted where it would live:
// a Storage that acknowledges what it did not persist, the acceptor's
// common-point check (rule 4), and the session's group commit — the owner
// path, which the simulation runs only since it drives acceptor.Session
// instead of a copy of the server's owner.
//
// It lives here, not in test/sim, because two of the bugs are planted
// through the acceptor's unexported hooks (export_test.go).
func TestPlantedBugIsFound(t *testing.T) {
	for _, tc := range []struct {
		name    string
		session acceptor.PlantedBug // 0: none
		storage func(acceptor.Storage) acceptor.Storage
		noRep   bool // invariant 7 off: find the bug by its consequence
		want    sim.Invariant
		within  int // seeds
	}{
		// A vote answered before it is durable: directly (the reply
		// reports a vote the disk does not hold) ...
		{name: "vote not persisted/reply durability", storage: voteNotPersisted, want: sim.InvPersistThenReply, within: 5},
		// ... and by its consequence: a crash forgets the vote, the term is
		// granted again to another proposer — two proposers in one term.
		{name: "vote not persisted/two proposers in a term", storage: voteNotPersisted, noRep: true, want: sim.InvOneProposerPerTerm, within: 100},
		// A late ProposerElected of the current term truncates acknowledged
		// (and possibly committed) WAL.
		{name: "skip common point check", session: acceptor.SkipCommonPointCheck, want: sim.InvCommittedWAL, within: 100},
		// The owner path: a request answered when staged, before the group
		// commit: directly ...
		{name: "reply before flush/reply durability", session: acceptor.ReplyBeforeFlush, want: sim.InvPersistThenReply, within: 5},
		// ... and by its consequence: the flush_lsn acknowledged is not on
		// the disk.
		{name: "reply before flush/acknowledged WAL lost", session: acceptor.ReplyBeforeFlush, noRep: true, want: sim.InvCommittedWAL, within: 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			planted := func(seed uint64) sim.Config {
				c := sim.Standard(seed)
				c.WrapStorage, c.NoReplyDurabilityCheck = tc.storage, tc.noRep
				if tc.session != 0 {
					c.NewSession = acceptor.NewPlantedSession(tc.session)
				}
				return c
			}
			var found *sim.Violation
			// Batches of seeds, in parallel, stopping at the first batch
			// with a failure; the lowest failing seed is reported.
			for first := uint64(1); found == nil && first <= uint64(tc.within); first += 8 {
				var seeds []uint64
				for s := first; s < first+8 && s <= uint64(tc.within); s++ {
					seeds = append(seeds, s)
				}
				for _, r := range sim.RunSeeds(seeds, planted) {
					var v *sim.Violation
					if errors.As(r.Err, &v) && v.Invariant == tc.want {
						found = v
						t.Logf("found at seed %d: %v", r.Seed, v)
						if r := sim.Run(sim.Standard(r.Seed)); r.Err != nil {
							t.Fatalf("seed %d fails without the bug too: %v", r.Seed, r.Err)
						}
						break
					}
				}
			}
			if found == nil {
				t.Fatalf("planted: no seed in 1..%d broke %v", tc.within, tc.want)
			}
		})
	}
}

// voteNotPersisted is a storage that acknowledges a commit recording only a
// new vote without persisting it: the vote reaches the disk with the next
// commit that carries anything else, or, after a crash, never.
func voteNotPersisted(s acceptor.Storage) acceptor.Storage { return &lazyVotes{Storage: s} }

type lazyVotes struct{ acceptor.Storage }

func (l *lazyVotes) Commit(st acceptor.State) error {
	if prev, err := l.Storage.Load(); err == nil && prev.VotedFor != st.VotedFor {
		same := st.Clone()
		same.VotedFor = prev.VotedFor
		if reflect.DeepEqual(same, prev) {
			return nil // PLANTED BUG: acknowledged, not persisted
		}
	}
	return l.Storage.Commit(st)
}
