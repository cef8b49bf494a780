package xlog

import "fmt"

// RmgrNames are PostgreSQL 15's built-in resource manager names by id, in
// access/rmgrlist.h order, as pg_waldump prints them.
var RmgrNames = [RMMaxBuiltinID + 1]string{
	"XLOG", "Transaction", "Storage", "CLOG", "Database", "Tablespace", "MultiXact", "RelMap",
	"Standby", "Heap2", "Heap", "Btree", "Hash", "Gin", "Gist", "Sequence",
	"SPGist", "BRIN", "CommitTs", "ReplicationOrigin", "Generic", "LogicalMessage",
}

// Resource manager ids (RM_*_ID) used below.
const (
	rmXact      = 1
	rmSmgr      = 2
	rmClog      = 3
	rmDbase     = 4
	rmTblspc    = 5
	rmMultiXact = 6
	rmRelMap    = 7
	rmStandby   = 8
	rmHeap2     = 9
	rmHeap      = 10
	rmBtree     = 11
	rmHash      = 12
	rmGin       = 13
	rmGist      = 14
	rmSeq       = 15
	rmSPGist    = 16
	rmBRIN      = 17
	rmCommitTs  = 18
	rmReplOrig  = 19
	rmGeneric   = 20
	rmLogicalMs = 21
)

// RmgrName returns the name of resource manager id: a built-in's, or
// "custom###" for an id of the custom range (pg_waldump's name for an
// unregistered custom rmgr).
func RmgrName(id uint8) string {
	if int(id) < len(RmgrNames) {
		return RmgrNames[id]
	}
	return fmt.Sprintf("custom%03d", id)
}

// record type names by rmgr, keyed by xl_info & ~XLR_INFO_MASK (or by the
// rmgr's own opcode mask, see Identify).
var identify = map[uint8]map[uint8]string{
	RMXLogID: {
		0x00: "CHECKPOINT_SHUTDOWN", 0x10: "CHECKPOINT_ONLINE", 0x20: "NOOP", 0x30: "NEXTOID",
		0x40: "SWITCH", 0x50: "BACKUP_END", 0x60: "PARAMETER_CHANGE", 0x70: "RESTORE_POINT",
		0x80: "FPW_CHANGE", 0x90: "END_OF_RECOVERY", 0xA0: "FPI_FOR_HINT", 0xB0: "FPI",
		0xD0: "OVERWRITE_CONTRECORD",
	},
	// xact: info & XLOG_XACT_OPMASK (0x70); 0x80 is XLOG_XACT_HAS_INFO.
	rmXact: {
		0x00: "COMMIT", 0x10: "PREPARE", 0x20: "ABORT", 0x30: "COMMIT_PREPARED",
		0x40: "ABORT_PREPARED", 0x50: "ASSIGNMENT", 0x60: "INVALIDATION",
	},
	rmSmgr:      {0x10: "CREATE", 0x20: "TRUNCATE"},
	rmClog:      {0x00: "ZEROPAGE", 0x10: "TRUNCATE"},
	rmDbase:     {0x00: "CREATE_FILE_COPY", 0x10: "CREATE_WAL_LOG", 0x20: "DROP"},
	rmTblspc:    {0x00: "CREATE", 0x10: "DROP"},
	rmMultiXact: {0x00: "ZERO_OFF_PAGE", 0x10: "ZERO_MEM_PAGE", 0x20: "CREATE_ID", 0x30: "TRUNCATE_ID"},
	rmRelMap:    {0x00: "UPDATE"},
	rmStandby:   {0x00: "LOCK", 0x10: "RUNNING_XACTS", 0x20: "INVALIDATIONS"},
	rmHeap2: {
		0x00: "REWRITE", 0x10: "PRUNE", 0x20: "VACUUM", 0x30: "FREEZE_PAGE", 0x40: "VISIBLE",
		0x50: "MULTI_INSERT", 0xD0: "MULTI_INSERT+INIT", 0x60: "LOCK_UPDATED", 0x70: "NEW_CID",
	},
	rmHeap: {
		0x00: "INSERT", 0x80: "INSERT+INIT", 0x10: "DELETE", 0x20: "UPDATE", 0xA0: "UPDATE+INIT",
		0x30: "TRUNCATE", 0x40: "HOT_UPDATE", 0xC0: "HOT_UPDATE+INIT", 0x50: "HEAP_CONFIRM",
		0x60: "LOCK", 0x70: "INPLACE",
	},
	rmBtree: {
		0x00: "INSERT_LEAF", 0x10: "INSERT_UPPER", 0x20: "INSERT_META", 0x30: "SPLIT_L",
		0x40: "SPLIT_R", 0x50: "INSERT_POST", 0x60: "DEDUP", 0x70: "DELETE", 0x80: "UNLINK_PAGE",
		0x90: "UNLINK_PAGE_META", 0xA0: "NEWROOT", 0xB0: "MARK_PAGE_HALFDEAD", 0xC0: "VACUUM",
		0xD0: "REUSE_PAGE", 0xE0: "META_CLEANUP",
	},
	rmHash: {
		0x00: "INIT_META_PAGE", 0x10: "INIT_BITMAP_PAGE", 0x20: "INSERT", 0x30: "ADD_OVFL_PAGE",
		0x40: "SPLIT_ALLOCATE_PAGE", 0x50: "SPLIT_PAGE", 0x60: "SPLIT_COMPLETE", 0x70: "MOVE_PAGE_CONTENTS",
		0x80: "SQUEEZE_PAGE", 0x90: "DELETE", 0xA0: "SPLIT_CLEANUP", 0xB0: "UPDATE_META_PAGE", 0xC0: "VACUUM_ONE_PAGE",
	},
	rmGin: {
		0x10: "CREATE_PTREE", 0x20: "INSERT", 0x30: "SPLIT", 0x40: "VACUUM_PAGE", 0x90: "VACUUM_DATA_LEAF_PAGE",
		0x50: "DELETE_PAGE", 0x60: "UPDATE_META_PAGE", 0x70: "INSERT_LISTPAGE", 0x80: "DELETE_LISTPAGE",
	},
	rmGist: {
		0x00: "PAGE_UPDATE", 0x10: "DELETE", 0x20: "PAGE_REUSE", 0x30: "PAGE_SPLIT", 0x60: "PAGE_DELETE", 0x70: "ASSIGN_LSN",
	},
	rmSeq: {0x00: "LOG"},
	rmSPGist: {
		0x10: "ADD_LEAF", 0x20: "MOVE_LEAFS", 0x30: "ADD_NODE", 0x40: "SPLIT_TUPLE", 0x50: "PICKSPLIT",
		0x60: "VACUUM_LEAF", 0x70: "VACUUM_ROOT", 0x80: "VACUUM_REDIRECT",
	},
	// BRIN: 0x80 is XLOG_BRIN_INIT_PAGE.
	rmBRIN: {
		0x00: "CREATE_INDEX", 0x10: "INSERT", 0x90: "INSERT+INIT", 0x20: "UPDATE", 0xA0: "UPDATE+INIT",
		0x30: "SAMEPAGE_UPDATE", 0x40: "REVMAP_EXTEND", 0x50: "DESUMMARIZE",
	},
	rmCommitTs:  {0x00: "ZEROPAGE", 0x10: "TRUNCATE"},
	rmReplOrig:  {0x00: "SET", 0x10: "DROP"},
	rmLogicalMs: {0x00: "MESSAGE"},
}

// Identify returns the record type's name as the rmgr's rm_identify does in
// PostgreSQL 15 (e.g. "CHECKPOINT_ONLINE", "COMMIT", "HOT_UPDATE+INIT"),
// for the resource managers it knows, and ok false otherwise (pg_waldump
// then prints "UNKNOWN (%x)", see RecordType).
func Identify(rmid, info uint8) (name string, ok bool) {
	switch rmid {
	case rmGeneric:
		return "Generic", true
	case rmXact:
		info &= 0x70 // XLOG_XACT_OPMASK
	default:
		info &= XLRRmgrInfoMask
	}
	name, ok = identify[rmid][info]
	return name, ok
}
