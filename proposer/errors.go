package proposer

import (
	"errors"

	"github.com/safekeeper/safekeeper/proposer/session"
)

// The session's errors, which Run and Sync return: the same values as in
// package session, so errors.Is / errors.As match either name.
var (
	// ErrDeposed: another proposer took over (a *DeposedError).
	ErrDeposed = session.ErrDeposed
	// ErrVoteRefused: a safekeeper refused the vote during the campaign.
	ErrVoteRefused = session.ErrVoteRefused
	// ErrNoQuorum: fewer than a quorum of safekeepers greeted or granted.
	ErrNoQuorum = session.ErrNoQuorum
	// ErrUpstreamBehind: the primary's WAL ends below the committed WAL.
	ErrUpstreamBehind = session.ErrUpstreamBehind
	// ErrNoWAL: no voter has WAL and no start for a new timeline was given.
	ErrNoWAL = session.ErrNoWAL
	// ErrDuplicateSafekeeper: two configured addresses reached the same
	// safekeeper.
	ErrDuplicateSafekeeper = session.ErrDuplicateSafekeeper
)

// DeposedError says which safekeeper showed which higher term
// (session.DeposedError).
type DeposedError = session.DeposedError

// ErrUpstreamRejected: the primary refused the proposer for a reason
// reconnecting cannot fix (see Run); the error is a *RejectedError.
var ErrUpstreamRejected = errors.New("proposer: the primary refused the connection for good")

// nameDeposed fills a *DeposedError's Addr from the configured addresses.
func nameDeposed(err error, addrs []string) error {
	var de *DeposedError
	if errors.As(err, &de) && de.Addr == "" && de.Safekeeper >= 0 && de.Safekeeper < len(addrs) {
		de.Addr = addrs[de.Safekeeper]
	}
	return err
}
