package sim

import "fmt"

// Invariant names what a Violation broke: an invariant of
// docs/correctness.md, section 1, by its number there.
type Invariant int

const (
	// Harness: the simulation itself went wrong (a bug in test/sim, or
	// code under test failing in a way no invariant describes).
	Harness                          Invariant = iota
	InvCommittedWAL                            // 1: committed WAL is never truncated or changed
	InvOneProposerPerTerm                      // 2: at most one proposer per term
	InvCommitBounds                            // 3: commit_lsn ≤ flush_lsn, never decreasing
	InvAgreement                               // 4: safekeepers agree on committed WAL
	InvHistories                               // 5: term histories strictly ascend
	InvLogMatching                             // 6: log matching
	InvPersistThenReply                        // 7: persist, then reply
	InvOneConfigurationPerGeneration           // 8: one configuration per generation
	InvQuorumIntersection                      // 9: consecutive configurations' quorums intersect
	InvGenerationNeverDecreases                // 10: a safekeeper never moves to a lower generation
	InvMembersOnly                             // 11: no vote or WAL acknowledged outside the configuration
	InvLiveness                                // L: liveness (bounded)
)

func (i Invariant) String() string {
	switch {
	case i == Harness:
		return "harness"
	case i == InvLiveness:
		return "liveness"
	case i > Harness && i < InvLiveness:
		return fmt.Sprintf("invariant %d", int(i))
	}
	return fmt.Sprintf("Invariant(%d)", int(i))
}

// Violation is the first broken invariant of a run (Result.Err): find it
// with errors.As.
type Violation struct {
	Step      int
	Invariant Invariant
	Msg       string
}

func (v *Violation) Error() string { return fmt.Sprintf("step %d: %s", v.Step, v.Msg) }

// violate records the first broken invariant; the run stops after this
// step.
func (w *World) violate(inv Invariant, format string, args ...any) {
	if w.err == nil {
		w.err = &Violation{Step: w.step, Invariant: inv, Msg: fmt.Sprintf(format, args...)}
		w.tracef("FAILED: %v", w.err)
	}
}
