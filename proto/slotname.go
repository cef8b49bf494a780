package proto

import (
	"errors"
	"fmt"
)

// Replication slot names, PostgreSQL's ReplicationSlotValidateName: the one
// home of the rule, for the server (CREATE_REPLICATION_SLOT), storage (what
// it stores) and the CLI (propose --slot, a slot on the primary).

// MaxSlotNameLen is PostgreSQL's NAMEDATALEN-1: the longest replication slot
// name, in bytes.
const MaxSlotNameLen = 63

// ErrBadSlotName is wrapped by every error of CheckSlotName (a
// *SlotNameError).
var ErrBadSlotName = errors.New("proto: bad replication slot name")

// SlotNameReason is why CheckSlotName refuses a name.
type SlotNameReason int

// The reasons, in the order CheckSlotName checks them.
const (
	SlotNameTooShort         SlotNameReason = iota + 1 // empty
	SlotNameTooLong                                    // more than MaxSlotNameLen bytes
	SlotNameInvalidCharacter                           // a byte other than a-z, 0-9 and '_'
)

// String is the end of PostgreSQL's message for the reason: "is too short",
// "is too long", "contains invalid character".
func (r SlotNameReason) String() string {
	switch r {
	case SlotNameTooShort:
		return "is too short"
	case SlotNameTooLong:
		return "is too long"
	case SlotNameInvalidCharacter:
		return "contains invalid character"
	}
	return fmt.Sprintf("is refused (reason %d)", int(r))
}

// SlotNameError is a name CheckSlotName refuses. Its Error is PostgreSQL's
// message (the server sends it with SQLSTATE 42602, invalid_name, and Hint);
// it wraps ErrBadSlotName.
type SlotNameError struct {
	Name   string
	Reason SlotNameReason
}

func (e *SlotNameError) Error() string {
	return fmt.Sprintf("replication slot name %q %s", e.Name, e.Reason)
}

// Unwrap returns ErrBadSlotName.
func (e *SlotNameError) Unwrap() error { return ErrBadSlotName }

// Hint is PostgreSQL's hint for the error: the allowed characters, for
// SlotNameInvalidCharacter; "" otherwise (PostgreSQL gives none).
func (e *SlotNameError) Hint() string {
	if e.Reason == SlotNameInvalidCharacter {
		return "Replication slot names may only contain lower case letters, numbers, and the underscore character."
	}
	return ""
}

// CheckSlotName applies PostgreSQL's rule for replication slot names
// (ReplicationSlotValidateName): 1 to MaxSlotNameLen bytes, each a lower
// case ASCII letter, a digit or '_'. It returns nil or a *SlotNameError.
func CheckSlotName(name string) error {
	if name == "" {
		return &SlotNameError{Name: name, Reason: SlotNameTooShort}
	}
	if len(name) > MaxSlotNameLen {
		return &SlotNameError{Name: name, Reason: SlotNameTooLong}
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return &SlotNameError{Name: name, Reason: SlotNameInvalidCharacter}
		}
	}
	return nil
}
