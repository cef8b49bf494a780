package proto

import "fmt"

// ProposerElected ('e') tells a safekeeper that the proposer of Term won the
// election, where its WAL diverges from the proposer's (StartStreamingAt,
// where it truncates) and the proposer's term history.
type ProposerElected struct {
	Term             uint64
	StartStreamingAt LSN
	TimelineStartLSN LSN
	History          TermHistory // the proposer's; last entry is (Term, term_start_lsn)
}

func (*ProposerElected) Tag() byte { return TagProposerElected }

func (m *ProposerElected) Encode(b []byte) []byte {
	b = append(b, TagProposerElected)
	b = putU64(b, m.Term)
	b = putLSN(b, m.StartStreamingAt)
	b = putLSN(b, m.TimelineStartLSN)
	return putHistory(b, m.History)
}

func (m *ProposerElected) Decode(src []byte) error {
	r := newReader(src, TagProposerElected, "ProposerElected")
	m.Term = r.u64()
	m.StartStreamingAt = r.lsn()
	m.TimelineStartLSN = r.lsn()
	m.History = r.history()
	if err := r.done(); err != nil {
		return err
	}
	if len(m.History) == 0 || m.History.LastTerm() != m.Term {
		return fmt.Errorf("%w: ProposerElected: history must end with an entry for term %d", ErrMalformed, m.Term)
	}
	return nil
}
