package proposer

import "github.com/safekeeper/safekeeper/proto"

// The helpers below are the session package's test helpers of the same
// names (proposer/session/core_test.go), for the driver's tests.

const tlStart = proto.LSN(0x1000000) // a segment boundary

var us = proto.ID{0xcc}

// info builds a SafeKeeperInfo with the given last_log_term (taken from h),
// flush_lsn and commit_lsn.
func info(voted uint64, flush, commit proto.LSN, h proto.TermHistory) *proto.SafeKeeperInfo {
	i := &proto.SafeKeeperInfo{
		ProtocolVersion: proto.ProtocolVersion, VotedFor: proto.Ballot{Term: voted, UUID: proto.ID{0xdd}},
		FlushLSN: flush, CommitLSN: commit, History: h.Upto(flush),
	}
	i.LastLogTerm = i.History.LastTerm()
	if len(h) > 0 {
		i.TimelineStartLSN = h[0].StartLSN
	}
	return i
}

// grant returns the verdict and fresh info a safekeeper in state g sends
// when it grants b.
func grant(b proto.Ballot, g *proto.SafeKeeperInfo) (*proto.VoteResponse, *proto.SafeKeeperInfo) {
	f := *g
	f.VotedFor = b
	return &proto.VoteResponse{VotedFor: b}, &f
}
