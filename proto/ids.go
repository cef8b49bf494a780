package proto

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
)

// ID is a 16-byte identifier: a Neon tenant_id or timeline_id, or a proposer
// uuid. Its text form is 32 lower-case hex digits.
type ID [16]byte

// ErrBadID is returned by ParseID for text that is not 32 hex digits.
var ErrBadID = errors.New("proto: invalid id")

// String returns the 32 lower-case hex digits of id.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id is all zero bytes.
func (id ID) IsZero() bool { return id == ID{} }

// ParseID parses 32 hex digits (either case).
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 32 {
		return id, fmt.Errorf("%w: %q is not 32 hex digits", ErrBadID, s)
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("%w: %q is not 32 hex digits", ErrBadID, s)
	}
	return id, nil
}

// NodeID is a ballot: a term and the uuid of the proposer that owns it
// (Neon's NodeId / walproposer "term + uuid"). Ballots are ordered by term,
// then by uuid bytes. Term 0 means "never voted".
type NodeID struct {
	Term uint64
	UUID ID
}

// Compare returns -1, 0 or +1 as n is below, equal to or above o.
func (n NodeID) Compare(o NodeID) int {
	switch {
	case n.Term < o.Term:
		return -1
	case n.Term > o.Term:
		return 1
	}
	return bytes.Compare(n.UUID[:], o.UUID[:])
}

func (n NodeID) String() string { return fmt.Sprintf("%d/%s", n.Term, n.UUID) }

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
