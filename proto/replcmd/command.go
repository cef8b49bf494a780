package replcmd

import "github.com/safekeeper/safekeeper/proto"

// Command is one parsed query: one of the types below. Name is the
// command's keyword as a client wrote it in upper case ("SQL" for SQL, ""
// for an empty query), for messages such as "X needs a replication
// connection".
type Command interface{ Name() string }

type (
	// IdentifySystem is IDENTIFY_SYSTEM.
	IdentifySystem struct{}
	// Show is SHOW name; Var is folded to lower case, parts joined by '.'.
	Show struct{ Var string }
	// TimelineHistory is TIMELINE_HISTORY n; TLI is never 0.
	TimelineHistory struct{ TLI uint32 }
	// ReadSlot is READ_REPLICATION_SLOT slot.
	ReadSlot struct{ Slot string }
	// CreateSlot is CREATE_REPLICATION_SLOT slot [TEMPORARY] PHYSICAL with
	// RESERVE_WAL or (RESERVE_WAL [bool]).
	CreateSlot struct {
		Slot       string
		Temporary  bool
		ReserveWAL bool
	}
	// DropSlot is DROP_REPLICATION_SLOT slot [WAIT].
	DropSlot struct {
		Slot string
		Wait bool
	}
	// StartReplication is START_REPLICATION [SLOT slot] [PHYSICAL] X/X
	// [TIMELINE n] [(term 'N')].
	StartReplication struct {
		Slot    string // "" when none
		Start   proto.LSN
		TLI     uint32 // 0: the current timeline
		Term    uint64 // with HasTerm: read up to flush_lsn within this term
		HasTerm bool   // (term 'N') was given; Term is then positive
	}
	// TimelineStatus is TIMELINE_STATUS (ours).
	TimelineStatus struct{}
	// StartWALPush is START_WAL_PUSH [(option [value] [, ...])] (ours): the
	// proposer's stream. Options: allow_timeline_creation [bool] — without
	// it a greeting may create the timeline (the WAL push protocol's rule
	// 1), so AllowTimelineCreation is true; with false a greeting naming a
	// timeline this safekeeper does not hold is refused.
	// sync_replication_slots [bool] (default false) — the stream carries
	// slot tables both ways (README_PROTO.md).
	StartWALPush struct {
		AllowTimelineCreation bool
		SyncReplicationSlots  bool
	}
	// SQL is anything that is not a replication command; Text is the query
	// as received.
	SQL struct{ Text string }
	// Empty is an empty query string (blanks, perhaps one ';').
	Empty struct{}
)

func (IdentifySystem) Name() string { return "IDENTIFY_SYSTEM" }

func (Show) Name() string { return "SHOW" }

func (TimelineHistory) Name() string { return "TIMELINE_HISTORY" }

func (ReadSlot) Name() string { return "READ_REPLICATION_SLOT" }

func (CreateSlot) Name() string { return "CREATE_REPLICATION_SLOT" }

func (DropSlot) Name() string { return "DROP_REPLICATION_SLOT" }

func (StartReplication) Name() string { return "START_REPLICATION" }

func (TimelineStatus) Name() string { return "TIMELINE_STATUS" }

func (StartWALPush) Name() string { return "START_WAL_PUSH" }

func (SQL) Name() string { return "SQL" }

func (Empty) Name() string { return "" }
