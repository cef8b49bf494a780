package acceptor_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proposer/session"
	"github.com/safekeeper/safekeeper/test/sim"
)

// TestPlantedBugIsFound shows the deterministic simulation (test/sim) can
// fail: with a known safety bug planted, some seed among the first `within`
// breaks the invariant the bug is about — a typed *sim.Violation — and
// every seed run up to it passes without the bug (for the configuration
// TestSim runs, the finding seed; TestSim runs the others). Each bug is planted where
// it would live: a Storage that acknowledges what it did not persist, the
// acceptor's common-point check (rule 4), the session's group commit — the
// owner path, which the simulation runs only since it drives
// acceptor.Session instead of a copy of the server's owner — and, for
// membership changes (rule 9), the proposer's joint commit rule, the
// acceptor's generation check, and the simulation's own controller.
//
// It lives here, not in test/sim, because three of the bugs are planted
// through the acceptor's unexported hooks (export_test.go).
func TestPlantedBugIsFound(t *testing.T) {
	for _, tc := range []struct {
		name    string
		session acceptor.PlantedBug // 0: none
		storage func(acceptor.Storage) acceptor.Storage
		plant   func(*sim.Config) // a bug outside the acceptor (nil: none)
		noRep   bool              // invariant 7 off: find the bug by its consequence
		noGen   bool              // invariant 10 off: the same
		// membership: seeds with membership changes only (a run in
		// generation 0 cannot show a membership bug).
		membership bool
		want       sim.Invariant
		within     int // seeds
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
		// Membership. (a) The proposer counts commit_lsn on a majority of
		// the new members alone in a joint configuration: a commit the old
		// majority lacks is lost when the change is rolled back and an old
		// majority elects (1b: the new term starts below it).
		{name: "joint commit by the new members only/committed WAL lost", plant: newMembersOnly, membership: true,
			want: sim.InvCommittedWAL, within: 200},
		// (b) A safekeeper takes a configuration of an older generation: a
		// stale proposer's greeting or a late push moves it back —
		// directly ...
		{name: "accept older generation/generation moves back", session: acceptor.AcceptOlderGeneration, membership: true,
			want: sim.InvGenerationNeverDecreases, within: 50},
		// ... and by its consequence: a connection greeted in an older
		// generation still gets votes and acknowledgments.
		{name: "accept older generation/stale connection served", session: acceptor.AcceptOlderGeneration, noGen: true, membership: true,
			want: sim.InvMembersOnly, within: 50},
		// (c) The controller writes the final configuration right after
		// the joint one: the new members, not caught up, elect a proposer
		// that lacks committed WAL (1b).
		{name: "final configuration before the catch-up/committed WAL lost", plant: skipCatchUp, membership: true,
			want: sim.InvCommittedWAL, within: 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unplanted := func(seed uint64) sim.Config {
				c := sim.Standard(seed)
				if tc.membership {
					c.Membership = sim.MembershipOn
				}
				return c
			}
			planted := func(seed uint64) sim.Config {
				c := unplanted(seed)
				c.WrapStorage, c.NoReplyDurabilityCheck, c.NoGenerationCheck = tc.storage, tc.noRep, tc.noGen
				if tc.session != 0 {
					c.NewSession = acceptor.NewPlantedSession(tc.session)
				}
				if tc.plant != nil {
					tc.plant(&c)
				}
				return c
			}
			var found *sim.Result
			var ran []uint64
			// Batches of seeds, in parallel, stopping at the first batch
			// with a failure; the lowest failing seed is reported.
			for first := uint64(1); found == nil && first <= uint64(tc.within); first += 8 {
				var seeds []uint64
				for s := first; s < first+8 && s <= uint64(tc.within); s++ {
					seeds = append(seeds, s)
				}
				ran = append(ran, seeds...)
				for _, r := range sim.RunSeeds(seeds, planted) {
					var v *sim.Violation
					if errors.As(r.Err, &v) && v.Invariant == tc.want {
						found = &r
						t.Logf("found at seed %d: %v", r.Seed, v)
						break
					}
				}
			}
			if found == nil {
				t.Fatalf("planted: no seed in 1..%d broke %v", tc.within, tc.want)
			}
			// Without the bug the same seeds pass. TestSim runs seeds
			// 1..200 of sim.Standard: there the finding seed is enough.
			if !tc.membership {
				ran = []uint64{found.Seed}
			}
			for _, r := range sim.RunSeeds(ran, unplanted) {
				if r.Err != nil {
					t.Fatalf("seed %d fails without the bug too: %v", r.Seed, r.Err)
				}
			}
		})
	}
}

// newMembersOnly plants session.Hooks.NewMembersOnly in every proposer.
func newMembersOnly(c *sim.Config) { c.ProposerHooks = session.Hooks{NewMembersOnly: true} }

// skipCatchUp plants the controller bug of sim.Config.ControllerSkipsCatchUp.
func skipCatchUp(c *sim.Config) { c.ControllerSkipsCatchUp = true }

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
