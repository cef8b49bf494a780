package timeline

import (
	"errors"
	"fmt"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

// The refusals of the timeline host. They carry no SQLSTATE and no HTTP
// status: the front door (package server) gives each kind its SQLSTATE,
// the HTTP API its status, from errors.Is on these sentinels.
var (
	// ErrNotFound: the timeline is not stored here, is being deleted, or
	// was deleted under a connection. It is storage.ErrNoTimeline, so
	// that a delete of a timeline not stored, which storage refuses, is
	// this kind too. Opens and binds return a *NotFoundError wrapping it.
	ErrNotFound = storage.ErrNoTimeline
	// ErrStopped: the registry is stopping (the server's shutdown); no
	// timeline is opened, created or deleted any more.
	ErrStopped = errors.New("timeline: the safekeeper is shutting down")
	// ErrBusy: a delete without force found a proposer or reader
	// connected to the timeline (or another delete of it under way).
	// Nothing was changed.
	ErrBusy = errors.New("timeline: timeline has connections")
	// ErrLimit: a timeline or a slot past Config.MaxTimelines or
	// Config.MaxSlots.
	ErrLimit = errors.New("timeline: limit reached")
	// ErrSlotExists: a replication slot of the name exists.
	ErrSlotExists = errors.New("timeline: replication slot exists")
	// ErrNoSlot: no replication slot of the name exists.
	ErrNoSlot = errors.New("timeline: no such replication slot")
	// ErrSlotActive: a stream uses the replication slot.
	ErrSlotActive = errors.New("timeline: replication slot is active")
	// ErrSlotStorage: a slot's change could not be stored.
	ErrSlotStorage = errors.New("timeline: replication slot not stored")
)

// NotFoundError is the refusal of a timeline this safekeeper does not
// hold; it wraps ErrNotFound. Its text is what a client is shown:
// "timeline T does not exist on this safekeeper", "... is being deleted
// on this safekeeper".
type NotFoundError struct {
	Key proto.TimelineKey
	Why string // what follows the timeline's name
}

func (e *NotFoundError) Error() string { return fmt.Sprintf("timeline %s %s", e.Key, e.Why) }

func (e *NotFoundError) Unwrap() error { return ErrNotFound }

// Error is any other refusal: Kind is its sentinel (ErrLimit, a slot's),
// Msg and Hint the words a client is shown (PostgreSQL's, where it has
// the same refusal), Err the cause when there is one.
type Error struct {
	Kind error
	Msg  string
	Hint string
	Err  error
}

func (e *Error) Error() string { return e.Msg }

func (e *Error) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Kind, e.Err}
	}
	return []error{e.Kind}
}

// Slot errors, with PostgreSQL's texts.
func errSlotMissing(name string) error {
	return &Error{Kind: ErrNoSlot, Msg: fmt.Sprintf("replication slot %q does not exist", name)}
}

func errSlotActive(name string, conn uint64) error {
	return &Error{Kind: ErrSlotActive, Msg: fmt.Sprintf("replication slot %q is active for PID %d", name, conn)}
}

func errSlotExists(name string) error {
	return &Error{Kind: ErrSlotExists, Msg: fmt.Sprintf("replication slot %q already exists", name)}
}

func errSlotStorage(what, name string, err error) error {
	return &Error{Kind: ErrSlotStorage, Msg: fmt.Sprintf("could not %s replication slot %q: %v", what, name, err), Err: err}
}
