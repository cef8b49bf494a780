package acceptor

import (
	"math"

	"github.com/safekeeper/safekeeper/proto"
)

// CommonPoint returns the highest LSN up to which the WAL of a safekeeper
// (history skHist, already cut at its flush_lsn skFlush) agrees with a
// proposer's history propHist: the end of their last common term, where a
// term ends at the start of the next term of the same history, at skFlush for
// the safekeeper's last term, and never for the proposer's last term
// (rule 3 of the protocol; Neon's "highest common point"). Entries are
// common when both term and start_lsn are equal. A safekeeper with no common
// entry agrees only at the proposer's timeline start, propHist[0].StartLSN.
// propHist must not be empty.
func CommonPoint(skHist proto.TermHistory, skFlush proto.LSN, propHist proto.TermHistory) proto.LSN {
	i := 0
	for i < len(skHist) && i < len(propHist) && skHist[i] == propHist[i] {
		i++
	}
	if i == 0 {
		return propHist[0].StartLSN
	}
	skEnd := skFlush
	if i < len(skHist) {
		skEnd = skHist[i].StartLSN
	}
	propEnd := proto.LSN(math.MaxUint64)
	if i < len(propHist) {
		propEnd = propHist[i].StartLSN
	}
	return min(skEnd, propEnd)
}
