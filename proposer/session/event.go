package session

import (
	"fmt"

	"github.com/safekeeper/safekeeper/proto"
)

// Event is one decision of a Session that an operator should hear of. The
// session logs nothing itself (like acceptor.Session, which reports Failed
// and Recovered): it returns its events in Ready.Events, and the caller
// logs them (Run and Sync as the lines docs/operations.md shows; the
// simulation counts them). Which fields are set depends on Kind.
type Event struct {
	Kind EventKind
	// Safekeeper is the index of the safekeeper the event is about; -1 for
	// EventCampaigning and EventElected.
	Safekeeper int
	// Info is the safekeeper's SafeKeeperInfo as the session was given it:
	// its greeting (EventGreeted) or the fresh one sent after its grant
	// (EventVoteGranted).
	Info *proto.SafeKeeperInfo
	// Ballot is the ballot campaigned for (EventCampaigning) or granted
	// (EventVoteGranted).
	Ballot proto.Ballot
	// Election is the outcome of the election (EventElected).
	Election *Election
	// StartStreamingAt is where the safekeeper starts (EventStreaming).
	StartStreamingAt proto.LSN
	// Err says why the safekeeper sits out this term (EventVotedForOther,
	// EventCannotJoin: errors.Is ErrCannotJoin; EventNotMember,
	// EventWrongSafekeeper).
	Err error
	// Msg is the message that had no place in the protocol (EventDropped).
	Msg proto.Message
}

// EventKind says what an Event reports.
type EventKind int

const (
	// EventGreeted: a new connection to the safekeeper was greeted (Info).
	EventGreeted EventKind = iota + 1
	// EventCampaigning: a quorum greeted; the session asks for votes for
	// Ballot.
	EventCampaigning
	// EventVoteGranted: the safekeeper granted Ballot and sent its fresh
	// SafeKeeperInfo (Info).
	EventVoteGranted
	// EventVotedForOther: after the election, the safekeeper had voted for
	// another candidate of our term; it sits out this term (Err).
	EventVotedForOther
	// EventElected: the election was decided (Election).
	EventElected
	// EventCannotJoin: the safekeeper's start point would be below its
	// commit_lsn; it sits out this term (Err).
	EventCannotJoin
	// EventStreaming: the safekeeper was sent ProposerElected and is
	// streamed to from StartStreamingAt.
	EventStreaming
	// EventDropped: the safekeeper sent Msg where the protocol has no place
	// for it; its connection is dropped (Ready.Drop).
	EventDropped
	// EventNotMember: the safekeeper is not a member of the session's
	// configuration: it sits out the term (it would refuse, SK002) (Err).
	EventNotMember
	// EventWrongSafekeeper: another safekeeper than the configuration
	// names answered at the address; its connection is dropped (Err).
	EventWrongSafekeeper
)

var eventNames = [...]string{
	EventGreeted: "greeted", EventCampaigning: "campaigning", EventVoteGranted: "vote granted",
	EventVotedForOther: "voted for another candidate", EventElected: "elected", EventCannotJoin: "cannot join",
	EventStreaming: "streaming", EventDropped: "dropped", EventNotMember: "not a member", EventWrongSafekeeper: "wrong safekeeper",
}

// String is a short name for the kind ("elected", "vote granted", ...).
func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventNames) {
		return eventNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}
