package server

import (
	"errors"
	"syscall"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/proto/replcmd"
)

// Slot errors, with PostgreSQL's texts and SQLSTATEs.
func errSlotMissing(name string) error {
	return pgwire.Errorf(pgwire.UndefinedObject, "replication slot %q does not exist", name)
}

func errSlotActive(name string, conn uint64) error {
	return pgwire.Errorf(pgwire.ObjectInUse, "replication slot %q is active for PID %d", name, conn)
}

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
	code := pgwire.InternalError
	switch {
	case errors.Is(err, replcmd.ErrSyntax):
		code = pgwire.SyntaxError
	case errors.Is(err, replcmd.ErrUnsupported):
		code = pgwire.FeatureNotSupported
	case errors.Is(err, acceptor.ErrProtocol):
		code = pgwire.ProtocolViolation
	case errors.Is(err, acceptor.ErrVoteRefused):
		code = pgwire.VoteRefused
	case errors.Is(err, acceptor.ErrStaleTerm):
		code = pgwire.StaleTerm
	case errors.Is(err, acceptor.ErrCommonPointMismatch):
		code = pgwire.CommonPointMismatch
	case errors.Is(err, acceptor.ErrTruncateCommitted):
		code = pgwire.TruncateCommitted
	case errors.Is(err, acceptor.ErrIncompatible):
		code = pgwire.IncompatibleTimeline
	case errors.Is(err, acceptor.ErrStorage) && errors.Is(err, syscall.ENOSPC):
		code = pgwire.DiskFull
	case errors.Is(err, acceptor.ErrStorage):
		code = pgwire.StorageFailure
	}
	return pgwire.Errorf(code, "%s", err.Error())
}
