package pgwire

// SQLSTATE codes sent in ErrorResponse and NoticeResponse messages. This file is
// the project's one catalogue: every wire error carries one of these codes.
// Names are PostgreSQL's condition names (errcodes.txt) in Go case, so that
// "grep 08P01" and "grep protocol_violation" both land here. What a code
// means in the WAL push protocol (a refused vote, a stale term, ...) is the
// server's to say: server/errors.go names those codes, as these constants.
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

	// Class 40 — Transaction Rollback.
	SerializationFailure = "40001"

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
	LockNotAvailable             = "55P03"

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
