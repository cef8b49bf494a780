package proto

// RequestVote ('v') asks a safekeeper for its vote in Candidate.Term.
type RequestVote struct {
	Candidate Ballot
}

func (*RequestVote) Tag() byte { return TagRequestVote }

func (m *RequestVote) Encode(b []byte) []byte {
	return putBallot(append(b, TagRequestVote), m.Candidate)
}

func (m *RequestVote) Decode(src []byte) error {
	r := newReader(src, TagRequestVote, "RequestVote")
	m.Candidate = r.ballot()
	return r.done()
}

// VoteResponse ('n', the spec's "NodeId" message) is the vote verdict: the
// candidate itself when granted, the ballot the safekeeper voted for instead
// when refused.
type VoteResponse struct {
	VotedFor Ballot
}

func (*VoteResponse) Tag() byte { return TagVoteResponse }

func (m *VoteResponse) Encode(b []byte) []byte {
	return putBallot(append(b, TagVoteResponse), m.VotedFor)
}

func (m *VoteResponse) Decode(src []byte) error {
	r := newReader(src, TagVoteResponse, "NodeId")
	m.VotedFor = r.ballot()
	return r.done()
}
