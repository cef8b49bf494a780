package proto

import (
	"fmt"
	"math"
)

// TermSwitch is one entry of a TermHistory: WAL from StartLSN up to the next
// entry's StartLSN was written by the proposer of Term (Neon's TermLsn).
type TermSwitch struct {
	Term     uint64
	StartLSN LSN
}

// TermHistory is the ordered list of term switches of a timeline: terms
// strictly ascending, StartLSN non-decreasing (Neon's TermHistory).
type TermHistory []TermSwitch

// Validate checks the ordering rules of a history received from outside.
func (h TermHistory) Validate() error {
	for i := 1; i < len(h); i++ {
		if h[i].Term <= h[i-1].Term {
			return fmt.Errorf("%w: term history terms not ascending at entry %d (%d after %d)", ErrMalformed, i, h[i].Term, h[i-1].Term)
		}
		if h[i].StartLSN < h[i-1].StartLSN {
			return fmt.Errorf("%w: term history start_lsn decreasing at entry %d (%s after %s)", ErrMalformed, i, h[i].StartLSN, h[i-1].StartLSN)
		}
	}
	return nil
}

// LastTerm returns the term of the last entry, 0 for an empty history.
func (h TermHistory) LastTerm() uint64 {
	if len(h) == 0 {
		return 0
	}
	return h[len(h)-1].Term
}

// Upto returns the prefix of h whose entries start at or before lsn: the
// history as seen by a node whose WAL ends at lsn. The result shares h's array.
func (h TermHistory) Upto(lsn LSN) TermHistory {
	n := 0
	for n < len(h) && h[n].StartLSN <= lsn {
		n++
	}
	return h[:n]
}

// Clone returns a copy of h that shares no memory with it.
func (h TermHistory) Clone() TermHistory {
	if h == nil {
		return nil
	}
	return append(TermHistory(nil), h...)
}

// Equal reports whether h and o hold the same entries.
func (h TermHistory) Equal(o TermHistory) bool {
	if len(h) != len(o) {
		return false
	}
	for i := range h {
		if h[i] != o[i] {
			return false
		}
	}
	return true
}

// CommonPoint returns the highest LSN up to which the WAL of a safekeeper
// (history h, already cut at its flush_lsn skFlush) agrees with a
// proposer's history propHist: the end of their last common term, where a
// term ends at the start of the next term of the same history, at skFlush for
// the safekeeper's last term, and never for the proposer's last term
// (rule 3 of the protocol; Neon's "highest common point"). Entries are
// common when both term and start_lsn are equal. A safekeeper with no common
// entry agrees only at the proposer's timeline start, propHist[0].StartLSN.
// propHist must not be empty.
func (h TermHistory) CommonPoint(skFlush LSN, propHist TermHistory) LSN {
	i := 0
	for i < len(h) && i < len(propHist) && h[i] == propHist[i] {
		i++
	}
	if i == 0 {
		return propHist[0].StartLSN
	}
	skEnd := skFlush
	if i < len(h) {
		skEnd = h[i].StartLSN
	}
	propEnd := LSN(math.MaxUint64)
	if i < len(propHist) {
		propEnd = propHist[i].StartLSN
	}
	return min(skEnd, propEnd)
}
