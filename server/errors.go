package server

import (
	"encoding/json"
	"errors"
	"syscall"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/proto/replcmd"
	"github.com/safekeeper/safekeeper/server/timeline"
)

// The SQLSTATEs of the WAL push protocol's refusals (README_PROTO.md,
// rule 8).
//
// Refused votes, ProposerElected refusals and stale-term messages each have
// their own SQLSTATE, different from ProtocolViolation (08P01) and from each
// other; README_PROTO.md lists them with their reasons. They reuse standard
// PostgreSQL codes whose names fit (proto/pgwire/sqlstate.go); wireError
// maps the acceptor's errors to them.
const (
	// codeVoteRefused (rule 2): another ballot ≥ the candidate holds the
	// vote (lock_not_available).
	codeVoteRefused = pgwire.LockNotAvailable
	// codeStaleTerm (rules 4, 5): a message from a term below the one voted
	// for; its proposer was deposed (serialization_failure). Also the end
	// of a term reader's stream when the term changes.
	codeStaleTerm = pgwire.SerializationFailure
	// codeCommonPointMismatch (rule 4): start_streaming_at differs from the
	// common point the safekeeper computes (data_exception).
	codeCommonPointMismatch = pgwire.DataException
	// codeTruncateCommitted (rule 4): ProposerElected would truncate below
	// commit_lsn (object_not_in_prerequisite_state).
	codeTruncateCommitted = pgwire.ObjectNotInPrerequisiteState
	// codeIncompatibleTimeline (rule 1): ServerInfo names another cluster,
	// major version, segment size or TLI (invalid_parameter_value).
	codeIncompatibleTimeline = pgwire.InvalidParameterValue
	// codeStaleGeneration (rule 9): the connection greeted in an older
	// generation of the timeline's configuration than the safekeeper holds.
	// PostgreSQL has no code for it; the class SK is this safekeeper's own
	// (implementation-defined classes start with 5–9 or I–Z). Detail
	// carries the configuration as JSON, for the proposer to adopt.
	codeStaleGeneration = "SK001"
	// codeNotMember (rule 9): the safekeeper is not a member of the
	// timeline's configuration. Detail as for SK001.
	codeNotMember = "SK002"
	// codeStorageFailure: the safekeeper's storage failed (io_error);
	// pgwire.DiskFull (53100) when it failed with ENOSPC.
	codeStorageFailure = pgwire.IoError
)

func errSegmentRemoved(tli uint32, lsn proto.LSN, segSize uint64) error {
	return pgwire.Errorf(pgwire.UndefinedFile, "requested WAL segment %s has already been removed", proto.SegmentFileName(tli, lsn, segSize))
}

// errBadID is PostgreSQL's error for a bad setting value, for an id in the
// startup options.
func errBadID(name, value string) *pgwire.Error {
	e := pgwire.Errorf(pgwire.InvalidParameterValue, "invalid value for parameter %q: %q", name, value)
	e.Detail = "A " + name + " is 32 hexadecimal digits."
	return e
}

var errShutdown = pgwire.Errorf(pgwire.AdminShutdown, "terminating connection due to administrator command")

// errTimelineDeleted ends the connections of a deleted timeline.
var errTimelineDeleted = pgwire.Errorf(pgwire.AdminShutdown, "terminating connection: the timeline was deleted")

// fromTimeline gives a refusal of the timeline host (server/timeline) its
// SQLSTATE: the *pgwire.Error this server answers with, its text the
// refusal's, the refusal reachable through it (errors.Is on timeline's
// sentinels still works). Any other error is returned as it is.
func fromTimeline(err error) error {
	var pe *pgwire.Error
	if err == nil || errors.As(err, &pe) {
		return err // nothing to do, or mapped already
	}
	if errors.Is(err, timeline.ErrStopped) {
		return errShutdown
	}
	var nf *timeline.NotFoundError
	if errors.As(err, &nf) {
		return pgwire.Errorf(pgwire.UndefinedObject, "%w", nf)
	}
	var te *timeline.Error
	if !errors.As(err, &te) {
		return err
	}
	code := pgwire.InternalError
	switch {
	case errors.Is(te, timeline.ErrLimit):
		code = pgwire.ConfigurationLimitExceeded
	case errors.Is(te, timeline.ErrSlotExists):
		code = pgwire.DuplicateObject
	case errors.Is(te, timeline.ErrNoSlot):
		code = pgwire.UndefinedObject
	case errors.Is(te, timeline.ErrSlotActive):
		code = pgwire.ObjectInUse
	case errors.Is(te, timeline.ErrSlotStorage):
		code = pgwire.IoError
	}
	e := pgwire.Errorf(code, "%w", te)
	e.Hint = te.Hint
	return e
}

// fatalError is err as the ErrorResponse of an error after which the
// server closes the connection: severity FATAL, as PostgreSQL sends it. It
// copies: err's own *pgwire.Error (perhaps a shared one) is left as it is.
func fatalError(err error) *pgwire.Error {
	var pe *pgwire.Error
	if !errors.As(wireError(err), &pe) {
		pe = pgwire.Errorf(pgwire.InternalError, "%s", err.Error())
	}
	f := *pe
	f.Severity = pgwire.SeverityFatal
	return &f
}

// wireError gives err its SQLSTATE: a query the command grammar refuses, a
// bad slot name, an acceptor's refusal or a storage failure; an error that
// already carries one is returned as it is, anything else is XX000.
func wireError(err error) error {
	err = fromTimeline(err)
	var pe *pgwire.Error
	if errors.As(err, &pe) {
		return err
	}
	var se *proto.SlotNameError
	if errors.As(err, &se) {
		// PostgreSQL's ReplicationSlotValidateName: invalid_name, with its
		// hint for a bad character.
		e := pgwire.Errorf(pgwire.InvalidName, "%s", se.Error())
		e.Hint = se.Hint()
		return e
	}
	var ce *acceptor.ConfigurationError
	if errors.As(err, &ce) {
		code := codeIncompatibleTimeline
		switch {
		case errors.Is(err, acceptor.ErrStaleGeneration):
			code = codeStaleGeneration
		case errors.Is(err, acceptor.ErrNotMember):
			code = codeNotMember
		}
		e := pgwire.Errorf(code, "%s", err.Error())
		if b, jerr := json.Marshal(ce.Configuration); jerr == nil {
			e.Detail = proto.ConfigurationDetail + string(b)
		}
		return e
	}
	code := pgwire.InternalError
	switch {
	case errors.Is(err, replcmd.ErrSyntax):
		code = pgwire.SyntaxError
	case errors.Is(err, replcmd.ErrUnsupported):
		code = pgwire.FeatureNotSupported
	case errors.Is(err, acceptor.ErrProtocol):
		code = pgwire.ProtocolViolation
	case errors.Is(err, acceptor.ErrVoteRefused):
		code = codeVoteRefused
	case errors.Is(err, acceptor.ErrStaleTerm):
		code = codeStaleTerm
	case errors.Is(err, acceptor.ErrCommonPointMismatch):
		code = codeCommonPointMismatch
	case errors.Is(err, acceptor.ErrTruncateCommitted):
		code = codeTruncateCommitted
	case errors.Is(err, acceptor.ErrIncompatible):
		code = codeIncompatibleTimeline
	case errors.Is(err, acceptor.ErrStorage) && errors.Is(err, syscall.ENOSPC):
		code = pgwire.DiskFull
	case errors.Is(err, acceptor.ErrStorage):
		code = codeStorageFailure
	}
	return pgwire.Errorf(code, "%s", err.Error())
}
