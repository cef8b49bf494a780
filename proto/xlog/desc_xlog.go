package xlog

// XLOG records (xlogdesc.c xlog_desc, PostgreSQL 15).

// XLOG record types (xl_info & XLR_RMGR_INFO_MASK; catalog/pg_control.h).
const (
	xlogCheckpointShutdown = 0x00
	xlogCheckpointOnline   = 0x10
	xlogNextOID            = 0x30
	xlogBackupEnd          = 0x50
	xlogParameterChange    = 0x60
	xlogRestorePoint       = 0x70
	xlogFPWChange          = 0x80
	xlogEndOfRecovery      = 0x90
)

// walLevelString is xlogdesc.c's get_wal_level_string: the first name of
// wal_level_options with that value.
func walLevelString(level int32) string {
	switch level {
	case 0:
		return "minimal"
	case 1:
		return "replica"
	case 2:
		return "logical"
	}
	return "?"
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func describeXLog(d *descr) error {
	switch info := d.r.Info & XLRRmgrInfoMask; info {
	case xlogCheckpointShutdown, xlogCheckpointOnline:
		// CheckPoint: redo 0, ThisTimeLineID 8, PrevTimeLineID 12,
		// fullPageWrites 16, nextXid 24 (FullTransactionId), nextOid 32,
		// nextMulti 36, nextMultiOffset 40, oldestXid 44, oldestXidDB 48,
		// oldestMulti 52, oldestMultiDB 56, time 64, oldestCommitTsXid 72,
		// newestCommitTsXid 76, oldestActiveXid 80; 88 bytes.
		if err := d.need(88, "CheckPoint"); err != nil {
			return err
		}
		kind := "online"
		if info == xlogCheckpointShutdown {
			kind = "shutdown"
		}
		next := d.u64(24)
		d.printf("redo %s; tli %d; prev tli %d; fpw %s; xid %d:%d; oid %d; multi %d; offset %d; "+
			"oldest xid %d in DB %d; oldest multi %d in DB %d; oldest/newest commit timestamp xid: %d/%d; "+
			"oldest running xid %d; %s",
			lsnString(d.u64(0)), d.u32(8), d.u32(12), boolString(d.u8(16) != 0), uint32(next>>32), uint32(next),
			d.u32(32), d.u32(36), d.u32(40), d.u32(44), d.u32(48), d.u32(52), d.u32(56),
			d.u32(72), d.u32(76), d.u32(80), kind)
	case xlogNextOID:
		if err := d.need(4, "Oid"); err != nil {
			return err
		}
		d.printf("%d", d.u32(0))
	case xlogRestorePoint:
		// xl_restore_point: rp_time 0, rp_name[MAXPGPATH] 8.
		name, err := d.cString(8, len(d.data), "xl_restore_point.rp_name")
		if err != nil {
			return err
		}
		d.str(name)
	case xlogBackupEnd:
		if err := d.need(8, "XLogRecPtr"); err != nil {
			return err
		}
		d.str(lsnString(d.u64(0)))
	case xlogParameterChange:
		// xl_parameter_change: MaxConnections 0, max_worker_processes 4,
		// max_wal_senders 8, max_prepared_xacts 12, max_locks_per_xact 16,
		// wal_level 20, wal_log_hints 24, track_commit_timestamp 25.
		if err := d.need(28, "xl_parameter_change"); err != nil {
			return err
		}
		d.printf("max_connections=%d max_worker_processes=%d max_wal_senders=%d max_prepared_xacts=%d "+
			"max_locks_per_xact=%d wal_level=%s wal_log_hints=%s track_commit_timestamp=%s",
			d.i32(0), d.i32(4), d.i32(8), d.i32(12), d.i32(16), walLevelString(d.i32(20)),
			onOff(d.u8(24) != 0), onOff(d.u8(25) != 0))
	case xlogFPWChange:
		if err := d.need(1, "bool"); err != nil {
			return err
		}
		d.str(boolString(d.u8(0) != 0))
	case xlogEndOfRecovery:
		// xl_end_of_recovery: end_time 0, ThisTimeLineID 8, PrevTimeLineID 12.
		if err := d.need(16, "xl_end_of_recovery"); err != nil {
			return err
		}
		d.printf("tli %d; prev tli %d; time %s", d.u32(8), d.u32(12), d.tsf(d.i64(0)))
	case XLogOverwriteContrecord:
		// xl_overwrite_contrecord: overwritten_lsn 0, overwrite_time 8.
		if err := d.need(16, "xl_overwrite_contrecord"); err != nil {
			return err
		}
		d.printf("lsn %s; time %s", lsnString(d.u64(0)), d.tsf(d.i64(8)))
	}
	// NOOP, SWITCH, FPI, FPI_FOR_HINT and unknown types: nothing.
	return nil
}
