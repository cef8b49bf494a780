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

// Ballot is a term and the uuid of the proposer that owns it: what a
// safekeeper votes for. The wire calls it NodeId (the walkeeper protocol's
// name, README_PROTO.md); it is not a safekeeper's node id. Ballots are
// ordered by term, then by uuid bytes. Term 0 means "never voted".
type Ballot struct {
	Term uint64
	UUID ID
}

// Compare returns -1, 0 or +1 as b is below, equal to or above o.
func (b Ballot) Compare(o Ballot) int {
	switch {
	case b.Term < o.Term:
		return -1
	case b.Term > o.Term:
		return 1
	}
	return bytes.Compare(b.UUID[:], o.UUID[:])
}

func (b Ballot) String() string { return fmt.Sprintf("%d/%s", b.Term, b.UUID) }

// TimelineKey names a timeline: Neon's (tenant_id, timeline_id), its
// TenantTimelineId. Its text form is "tenant_id/timeline_id".
type TimelineKey struct {
	TenantID, TimelineID ID
}

func (k TimelineKey) String() string { return k.TenantID.String() + "/" + k.TimelineID.String() }
