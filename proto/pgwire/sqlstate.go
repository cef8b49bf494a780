package pgwire

// SQLSTATE codes sent in ErrorResponse and NoticeResponse messages. This file is
// the project's one catalogue: every wire error carries one of these codes.
// Names are PostgreSQL's condition names (errcodes.txt) in Go case, so that
// "grep 08P01" and "grep protocol_violation" both land here.
const (
	// Class 00 — Successful Completion (used by notices).
	SuccessfulCompletion = "00000"

	// Class 01 — Warning.
	Warning = "01000"

	// Class 08 — Connection Exception.
	ConnectionException = "08000"
	ConnectionFailure   = "08006"
	ProtocolViolation   = "08P01"

	// Class 0A — Feature Not Supported.
	FeatureNotSupported = "0A000"

	// Class 22 — Data Exception.
	DataException             = "22000"
	NumericValueOutOfRange    = "22003"
	InvalidParameterValue     = "22023"
	InvalidTextRepresentation = "22P02"

	// Class 25 — Invalid Transaction State.
	InvalidTransactionState = "25000"

	// Class 28 — Invalid Authorization Specification.
	InvalidAuthorizationSpecification = "28000"
	InvalidPassword                   = "28P01"

	// Class 42 — Syntax Error or Access Rule Violation.
	SyntaxError           = "42601"
	InsufficientPrivilege = "42501"
	InvalidName           = "42602"
	UndefinedObject       = "42704"
	DuplicateObject       = "42710"

	// Class 53 — Insufficient Resources.
	InsufficientResources      = "53000"
	DiskFull                   = "53100"
	OutOfMemory                = "53200"
	TooManyConnections         = "53300"
	ConfigurationLimitExceeded = "53400"

	// Class 54 — Program Limit Exceeded.
	ProgramLimitExceeded = "54000"

	// Class 55 — Object Not In Prerequisite State.
	ObjectNotInPrerequisiteState = "55000"
	ObjectInUse                  = "55006"

	// Class 57 — Operator Intervention.
	QueryCanceled    = "57014"
	AdminShutdown    = "57P01"
	CrashShutdown    = "57P02"
	CannotConnectNow = "57P03"

	// Class 58 — System Error (errors external to PostgreSQL itself).
	SystemError   = "58000"
	IoError       = "58030"
	UndefinedFile = "58P01"
	DuplicateFile = "58P02"

	// Class XX — Internal Error.
	InternalError  = "XX000"
	DataCorrupted  = "XX001"
	IndexCorrupted = "XX002"
)

// ---------------------------------------------------------------------------
// WAL push protocol codes (wal-push-protocol.md, rule 8).
//
// Refused votes, ProposerElected refusals and stale-term messages each have
// their own SQLSTATE, different from ProtocolViolation (08P01) and from each
// other; README_PROTO.md lists them with their reasons. They reuse standard
// PostgreSQL codes whose names fit.
const (
	// VoteRefused (rule 2): another ballot ≥ the candidate holds the vote
	// (lock_not_available).
	VoteRefused = "55P03"
	// StaleTerm (rules 4, 5): a message from a term below the one voted
	// for; its proposer was deposed (serialization_failure).
	StaleTerm = "40001"
	// CommonPointMismatch (rule 4): start_streaming_at differs from the
	// common point the safekeeper computes (data_exception).
	CommonPointMismatch = "22000"
	// TruncateCommitted (rule 4): ProposerElected would truncate below
	// commit_lsn (object_not_in_prerequisite_state).
	TruncateCommitted = "55000"
	// IncompatibleTimeline (rule 1): ServerInfo names another cluster,
	// major version, segment size or TLI (invalid_parameter_value).
	IncompatibleTimeline = "22023"
	// StorageFailure: the safekeeper's storage failed (io_error).
	StorageFailure = "58030"
)

// ---------------------------------------------------------------------------
