package acceptor

// Bug names a known safety bug that the acceptor can be told to re-introduce.
//
// UNSAFE. This exists only for the deterministic simulation's planted-bug
// test (test/sim): that test turns a bug on and asserts the simulation's
// invariants catch it within a bounded number of seeds, which proves the
// simulation can fail. The server never sets Config.UnsafeTestingBug; its
// zero value, NoBug, is the only correct setting.
type Bug int

const (
	// NoBug is the correct acceptor (the zero value).
	NoBug Bug = iota
	// BugVoteWithoutPersisting grants a vote in memory and answers before
	// the vote is committed (rule 2 says: persist, then reply). A crash
	// before the next commit forgets the vote, so the acceptor can grant
	// the same term again to another proposer: two proposers in one term.
	BugVoteWithoutPersisting
	// BugSkipCommonPointCheck accepts a ProposerElected without comparing
	// start_streaming_at with the common point it computes itself (rule 4).
	// A late or duplicated ProposerElected of the current term then truncates
	// WAL that was already written, and perhaps committed, in that term.
	BugSkipCommonPointCheck
)

func (b Bug) String() string {
	switch b {
	case NoBug:
		return "NoBug"
	case BugVoteWithoutPersisting:
		return "BugVoteWithoutPersisting"
	case BugSkipCommonPointCheck:
		return "BugSkipCommonPointCheck"
	}
	return "Bug(?)"
}
