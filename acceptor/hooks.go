package acceptor

import "github.com/safekeeper/safekeeper/proto"

// hooks plant known safety bugs, for the planted-bug test only
// (export_test.go, planted_test.go): it proves the deterministic simulation
// fails when the protocol is broken. Production code never sets them; the
// zero value is the correct protocol. Only bugs that cannot be planted from
// outside live here: one a Storage can plant (acknowledging a commit it did
// not persist) is planted by a Storage in the test.
type hooks struct {
	// skipCommonPointCheck: ProposerElected is obeyed without comparing
	// start_streaming_at with the common point the acceptor computes
	// (rule 4). A late or duplicated ProposerElected of the current term
	// then truncates WAL already acknowledged, perhaps committed.
	skipCommonPointCheck bool
	// replyBeforeFlush: the Session answers each SafeKeeperRequest as soon
	// as it is staged, with the flush_lsn its WAL will have, before the
	// group commit makes it durable (rule 6 says: fsync, then reply). A
	// crash before the commit loses WAL the proposer counted as durable.
	replyBeforeFlush bool
	// acceptOlderGeneration: the acceptor takes a configuration of a lower
	// generation than the stored one (moving back to it), and a connection
	// greeted in an older generation keeps voting and appending (rule 9).
	// A proposer that missed a membership change then commits with a
	// quorum of the old members alone.
	acceptOlderGeneration bool
}

// stagedResponse is the planted bug replyBeforeFlush: the response the
// next Flush would give for the request just staged, taken out of the
// staged count so Flush does not answer it again.
func (a *Acceptor) stagedResponse() *proto.SafeKeeperResponse {
	a.pending--
	flush := a.st.FlushLSN
	if a.dec != nil {
		flush = max(flush, a.dec.RecordEnd())
	}
	return &proto.SafeKeeperResponse{
		Term:      a.st.VotedFor.Term,
		FlushLSN:  flush,
		CommitLSN: max(a.st.CommitLSN, min(a.proposerCommit, flush)),
	}
}
