package xlog_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto/xlog"
)

// le encodes values little-endian by their Go type, as a record's main
// data holds its C struct: uint8, uint16, uint32, int32, uint64, int64;
// a string or []byte as its bytes; pad(n) as n zero bytes.
func le(vals ...any) []byte {
	var b []byte
	for _, v := range vals {
		switch v := v.(type) {
		case uint8:
			b = append(b, v)
		case uint16:
			b = binary.LittleEndian.AppendUint16(b, v)
		case uint32:
			b = binary.LittleEndian.AppendUint32(b, v)
		case int32:
			b = binary.LittleEndian.AppendUint32(b, uint32(v))
		case uint64:
			b = binary.LittleEndian.AppendUint64(b, v)
		case int64:
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		case string:
			b = append(b, v...)
		case []byte:
			b = append(b, v...)
		case pad:
			b = append(b, make([]byte, v)...)
		default:
			panic(fmt.Sprintf("le: %T", v))
		}
	}
	return b
}

type pad int

// rel encodes a RelFileNode.
func rel(spc, db, r uint32) []byte { return le(spc, db, r) }

// Timestamps (TimestampTz: microseconds since 2000-01-01 00:00 UTC) and how
// pg_waldump prints them in UTC.
const (
	ts1    = int64(86400*1_000_000 + 123456)
	ts1UTC = "2000-01-02 00:00:00.123456 UTC"
)

// descCase is a record of a resource manager and type with its main data,
// and the text pg_waldump prints after "desc: " before the block
// references.
type descCase struct {
	name   string
	rmid   uint8
	info   uint8
	main   []byte
	blocks []xlog.BlockRef
	origin uint16
	want   string
}

// checkpoint is a CheckPoint (88 bytes).
func checkpoint() []byte {
	return le(uint64(0x14F98D8), uint32(1), uint32(1), uint8(1), pad(7),
		uint64(717), uint32(20192), uint32(1), uint32(0), uint32(716), uint32(1), uint32(1), uint32(1), pad(4),
		int64(1700000000), uint32(0), uint32(0), uint32(716), pad(4))
}

// inval encodes a SharedInvalidationMessage: id, then two u32 fields at
// 4 and 8 (dbId and relId / catId), 16 bytes.
func inval(id int8, at4, at8 uint32) []byte {
	return le(uint8(id), pad(3), at4, at8, pad(4))
}

// gid is a NUL-terminated two-phase gid.
func gid(s string) []byte { return append([]byte(s), 0) }

func descCases() []descCase {
	const (
		xlog0, xact, smgr, clog, dbase, relmap, standby, heap2, heap, btree, seq, logical = 0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 15, 21
	)
	invals := le(inval(55, 5, 0), inval(-1, 5, 1259), inval(-2, 5, 16391), inval(-3, 0, 0), inval(-4, 5, 0), inval(-5, 5, 2608), inval(-9, 0, 0))
	invalsText := "; inval msgs: catcache 55 catalog 1259 relcache 16391 smgr relmap db 5 snapshot 2608 unrecognized id -9"
	xinfoAll := uint32(1 | 2 | 4 | 8 | 32 | 256 | 1<<29 | 1<<30 | 1<<31)
	restorePoint := le(ts1, "rp1", pad(72-8-3))
	return []descCase{
		{"checkpoint online", xlog0, 0x10, checkpoint(), nil, 0, "CHECKPOINT_ONLINE redo 0/14F98D8; tli 1; prev tli 1; fpw true; xid 0:717; oid 20192; multi 1; offset 0; " +
			"oldest xid 716 in DB 1; oldest multi 1 in DB 1; oldest/newest commit timestamp xid: 0/0; oldest running xid 716; online"},
		{"checkpoint shutdown", xlog0, 0x00, checkpoint(), nil, 0, "CHECKPOINT_SHUTDOWN redo 0/14F98D8; tli 1; prev tli 1; fpw true; xid 0:717; oid 20192; multi 1; offset 0; " +
			"oldest xid 716 in DB 1; oldest multi 1 in DB 1; oldest/newest commit timestamp xid: 0/0; oldest running xid 716; shutdown"},
		{"nextoid", xlog0, 0x30, le(uint32(18192)), nil, 0, "NEXTOID 18192"},
		{"noop", xlog0, 0x20, nil, nil, 0, "NOOP "},
		{"switch", xlog0, 0x40, nil, nil, 0, "SWITCH "},
		{"fpi", xlog0, 0xB0, nil, nil, 0, "FPI "},
		{"fpi for hint", xlog0, 0xA0, nil, nil, 0, "FPI_FOR_HINT "},
		{"backup end", xlog0, 0x50, le(uint64(0x102000028)), nil, 0, "BACKUP_END 1/2000028"},
		{"parameter change", xlog0, 0x60, le(int32(100), int32(8), int32(10), int32(0), int32(64), int32(1), uint8(0), uint8(1), pad(2)), nil, 0,
			"PARAMETER_CHANGE max_connections=100 max_worker_processes=8 max_wal_senders=10 max_prepared_xacts=0 max_locks_per_xact=64 " +
				"wal_level=replica wal_log_hints=off track_commit_timestamp=on"},
		{"parameter change, odd wal_level", xlog0, 0x60, le(int32(1), int32(2), int32(3), int32(4), int32(5), int32(7), uint8(1), uint8(0), pad(2)), nil, 0,
			"PARAMETER_CHANGE max_connections=1 max_worker_processes=2 max_wal_senders=3 max_prepared_xacts=4 max_locks_per_xact=5 " +
				"wal_level=? wal_log_hints=on track_commit_timestamp=off"},
		{"restore point", xlog0, 0x70, restorePoint, nil, 0, "RESTORE_POINT rp1"},
		{"fpw change", xlog0, 0x80, le(uint8(0)), nil, 0, "FPW_CHANGE false"},
		{"end of recovery", xlog0, 0x90, le(ts1, uint32(2), uint32(1)), nil, 0, "END_OF_RECOVERY tli 2; prev tli 1; time " + ts1UTC},
		{"overwrite contrecord", xlog0, 0xD0, le(uint64(0x3000010), int64(-1)), nil, 0,
			"OVERWRITE_CONTRECORD lsn 0/3000010; time 2000-01-01 00:00:00.-00001 UTC"},
		{"xlog unknown", xlog0, 0xC0, le(uint32(7)), nil, 0, "UNKNOWN (c0) "},

		{"commit, no xinfo", xact, 0x00, le(ts1), nil, 0, "COMMIT " + ts1UTC},
		{"commit, everything", xact, 0x80, le(ts1, xinfoAll, uint32(5), uint32(1663),
			int32(2), uint32(800), uint32(801),
			int32(3), rel(1663, 5, 16391), rel(1664, 0, 1262), rel(16400, 5, 16500),
			int32(1), int32(2), uint32(5), uint32(16391),
			int32(7), invals,
			uint64(0xABC), int64(0)), nil, 3,
			"COMMIT " + ts1UTC + "; rels: base/5/16391 global/1262 pg_tblspc/16400/PG_15_202209061/5/16500; subxacts: 800 801; " +
				"dropped stats: 2/5/16391; relcache init file inval dbid 5 tsid 1663" + invalsText +
				"; apply_feedback; sync; origin: node 3, lsn 0/ABC, at 2000-01-01 00:00:00.000000 UTC"},
		{"commit prepared", xact, 0xB0, le(ts1, uint32(16|128|8), int32(1), inval(7, 5, 0), uint32(803), gid("sk3"), "garbage after"), nil, 0,
			"COMMIT_PREPARED 803: " + ts1UTC + "; inval msgs: catcache 7"},
		{"abort", xact, 0xA0, le(ts1, uint32(2|4|8|256), int32(1), uint32(9), int32(1), rel(1663, 5, 1), int32(1), int32(2), uint32(5), uint32(1)), nil, 0,
			"ABORT " + ts1UTC + "; rels: base/5/1; subxacts: 9; dropped stats: 2/5/1"},
		{"abort prepared with origin", xact, 0xC0, le(ts1, uint32(16|32), uint32(799), uint64(0x10), ts1), nil, 2,
			"ABORT_PREPARED 799: " + ts1UTC + "; origin: node 2, lsn 0/10, at " + ts1UTC},
		{"prepare", xact, 0x10, le(uint32(0x57F94534), uint32(0), uint32(799), uint32(5), ts1, uint32(10),
			int32(1), int32(0), int32(1), int32(0), int32(1), int32(1), uint8(1), pad(1), uint16(4), uint64(0), int64(0),
			gid("sk2"), pad(4), uint32(800), pad(4), rel(1663, 5, 16391), pad(4), int32(2), uint32(5), uint32(16391), pad(4), inval(80, 5, 0),
			"two-phase records follow"), nil, 0,
			"PREPARE gid sk2: " + ts1UTC + "; rels(abort): base/5/16391; abort dropped stats: 2/5/16391; subxacts: 800; " +
				"relcache init file inval dbid 5 tsid 0; inval msgs: catcache 80"},
		{"assignment", xact, 0x50, le(uint32(727), int32(2), uint32(728), uint32(729)), nil, 0, "ASSIGNMENT xtop 727: subxacts: 728 729"},
		{"xact invalidations", xact, 0x60, le(int32(2), inval(55, 5, 0), inval(-5, 5, 2608)), nil, 0, "INVALIDATION ; inval msgs: catcache 55 snapshot 2608"},

		{"standby lock", standby, 0x00, le(int32(2), uint32(4), uint32(1), uint32(1255), uint32(4), uint32(1), uint32(1259)), nil, 0,
			"LOCK xid 4 db 1 rel 1255 xid 4 db 1 rel 1259 "},
		{"running xacts", standby, 0x10, le(int32(1), int32(0), uint8(1), pad(3), uint32(717), uint32(716), uint32(715), uint32(716)), nil, 0,
			"RUNNING_XACTS nextXid 717 latestCompletedXid 715 oldestRunningXid 716; 1 xacts: 716; subxid ovf"},
		{"running xacts, none", standby, 0x10, le(int32(0), int32(0), uint8(0), pad(3), uint32(717), uint32(717), uint32(716)), nil, 0,
			"RUNNING_XACTS nextXid 717 latestCompletedXid 716 oldestRunningXid 717"},
		{"standby invalidations", standby, 0x20, le(uint32(1), uint32(1663), uint8(1), pad(3), int32(1), inval(-2, 1, 3118)), nil, 0,
			"INVALIDATIONS ; relcache init file inval dbid 1 tsid 1663; inval msgs: relcache 3118"},

		{"heap insert+init", heap, 0x80, le(uint16(2), uint8(0)), nil, 0, "INSERT+INIT off 2 flags 0x00"},
		{"heap delete", heap, 0x10, le(uint32(353), uint16(42), uint8(0x10), uint8(0)), nil, 0, "DELETE off 42 flags 0x00 KEYS_UPDATED "},
		{"heap update", heap, 0x20, le(uint32(3), uint16(34), uint8(0), uint8(0), uint32(0), uint16(34)), nil, 0, "UPDATE off 34 xmax 3 flags 0x00 ; new off 34 xmax 0"},
		{"heap hot update+init", heap, 0xC0, le(uint32(6), uint16(39), uint8(0x1F), uint8(0x60), uint32(9), uint16(46)), nil, 0,
			"HOT_UPDATE+INIT off 39 xmax 6 flags 0x60 IS_MULTI LOCK_ONLY EXCL_LOCK KEYSHR_LOCK KEYS_UPDATED ; new off 46 xmax 9"},
		{"heap truncate", heap, 0x30, le(uint32(5), uint32(2), uint8(3), pad(3), uint32(16400), uint32(16401)), nil, 0,
			"TRUNCATE cascade restart_seqs nrelids 2 relids 16400 16401"},
		{"heap confirm", heap, 0x50, le(uint16(3)), nil, 0, "HEAP_CONFIRM off 3"},
		{"heap lock", heap, 0x60, le(uint32(2827), uint16(55), uint8(0x06), uint8(0x01)), nil, 0, "LOCK off 55: xid 2827: flags 0x01 LOCK_ONLY EXCL_LOCK "},
		{"heap inplace", heap, 0x70, le(uint16(17)), nil, 0, "INPLACE off 17"},
		{"heap delete+init (no such type)", heap, 0x90, le(uint32(1), uint16(2), uint8(0), uint8(0)), nil, 0, "UNKNOWN (90) off 2 flags 0x00 "},

		{"prune", heap2, 0x10, le(uint32(3), uint16(0), uint16(1)), nil, 0, "PRUNE latestRemovedXid 3 nredirected 0 ndead 1"},
		{"vacuum", heap2, 0x20, le(uint16(13)), nil, 0, "VACUUM nunused 13"},
		{"freeze page", heap2, 0x30, le(uint32(716), uint16(19)), nil, 0, "FREEZE_PAGE cutoff xid 716 ntuples 19"},
		{"visible", heap2, 0x40, le(uint32(682), uint8(3)), nil, 0, "VISIBLE cutoff xid 682 flags 0x03"},
		{"multi insert+init", heap2, 0xD0, le(uint8(2), pad(1), uint16(8)), nil, 0, "MULTI_INSERT+INIT 8 tuples flags 0x02"},
		{"lock updated", heap2, 0x60, le(uint32(900), uint16(4), uint8(0x08), uint8(0)), nil, 0, "LOCK_UPDATED off 4: xmax 900: flags 0x00 KEYSHR_LOCK "},
		{"new cid", heap2, 0x70, le(uint32(700), uint32(0), uint32(0xFFFFFFFF), uint32(0xFFFFFFFF), rel(1663, 5, 1249), uint16(1), uint16(0x2345), uint16(12)), nil, 0,
			"NEW_CID rel 1663/5/1249; tid 74565/12; cmin: 0, cmax: 4294967295, combo: 4294967295"},
		{"rewrite", heap2, 0x00, le(pad(40)), nil, 0, "REWRITE "},

		{"insert leaf", btree, 0x00, le(uint16(3)), nil, 0, "INSERT_LEAF off 3"},
		{"insert post", btree, 0x50, le(uint16(9)), nil, 0, "INSERT_POST off 9"},
		{"split r", btree, 0x40, le(uint32(0), uint16(251), uint16(273), uint16(0)), nil, 0, "SPLIT_R level 0, firstrightoff 251, newitemoff 273, postingoff 0"},
		{"dedup", btree, 0x60, le(uint16(45)), nil, 0, "DEDUP nintervals 45"},
		{"btree delete", btree, 0x70, le(uint32(0), uint16(9), uint16(0)), nil, 0, "DELETE latestRemovedXid 0; ndeleted 9; nupdated 0"},
		{"unlink page", btree, 0x80, le(uint32(4), uint32(15), uint32(0), pad(4), uint64(1<<32|805), uint32(4), uint32(15), uint32(0xFFFFFFFF)), nil, 0,
			"UNLINK_PAGE left 4; right 15; level 0; safexid 1:805; leafleft 4; leafright 15; leaftopparent 4294967295"},
		{"newroot", btree, 0xA0, le(uint32(3), uint32(1)), nil, 0, "NEWROOT lev 1"},
		{"mark page halfdead", btree, 0xB0, le(uint16(2), pad(2), uint32(14), uint32(4), uint32(15), uint32(14)), nil, 0,
			"MARK_PAGE_HALFDEAD topparent 14; leaf 14; left 4; right 15"},
		{"btree vacuum", btree, 0xC0, le(uint16(13), uint16(0)), nil, 0, "VACUUM ndeleted 13; nupdated 0"},
		{"reuse page", btree, 0xD0, le(rel(1663, 5, 16389), uint32(7), uint64(805)), nil, 0, "REUSE_PAGE rel 1663/5/16389; latestRemovedXid 0:805"},
		{"meta cleanup", btree, 0xE0, nil, []xlog.BlockRef{{ID: 0, Data: le(uint32(4), uint32(3), uint32(1), uint32(3), uint32(1), uint32(12), uint8(1), pad(3))}}, 0,
			"META_CLEANUP last_cleanup_num_delpages 12"},

		{"smgr create", smgr, 0x10, le(rel(1663, 5, 16384), int32(0)), nil, 0, "CREATE base/5/16384"},
		{"smgr create fsm", smgr, 0x10, le(rel(1663, 5, 16384), int32(1)), nil, 0, "CREATE base/5/16384_fsm"},
		{"smgr create global vm", smgr, 0x10, le(rel(1664, 0, 1262), int32(2)), nil, 0, "CREATE global/1262_vm"},
		{"smgr create tablespace init", smgr, 0x10, le(rel(16400, 5, 16384), int32(3)), nil, 0, "CREATE pg_tblspc/16400/PG_15_202209061/5/16384_init"},
		{"smgr truncate", smgr, 0x20, le(uint32(0), rel(1663, 5, 16391), int32(7)), nil, 0, "TRUNCATE base/5/16391 to 0 blocks flags 7"},
		{"clog zeropage", clog, 0x00, le(int32(0)), nil, 0, "ZEROPAGE page 0"},
		{"clog truncate", clog, 0x10, le(int32(12), uint32(1000), uint32(5)), nil, 0, "TRUNCATE page 12; oldestXact 1000"},
		{"create file copy", dbase, 0x00, le(uint32(4), uint32(1663), uint32(1), uint32(1663)), nil, 0, "CREATE_FILE_COPY copy dir 1663/1 to 1663/4"},
		{"create wal log", dbase, 0x10, le(uint32(16400), uint32(1663)), nil, 0, "CREATE_WAL_LOG create dir 1663/16400"},
		{"drop database", dbase, 0x20, le(uint32(16400), int32(2), uint32(1663), uint32(16500)), nil, 0, "DROP dir 1663/16400 16500/16400"},
		{"relmap", relmap, 0x00, le(uint32(0), uint32(1664), int32(512)), nil, 0, "UPDATE database 0 tablespace 1664 size 512"},
		{"sequence", seq, 0x00, le(rel(1663, 5, 16400), "tuple"), nil, 0, "LOG rel 1663/5/16400"},
		{"logical message", logical, 0x00, le(uint32(5), uint8(1), pad(3), uint64(4), uint64(5), "pfx\x00hello"), nil, 0,
			`MESSAGE transactional, prefix "pfx"; payload (5 bytes): 68 65 6C 6C 6F`},
		{"empty logical message", logical, 0x00, le(uint32(5), uint8(0), pad(3), uint64(3), uint64(0), "p2\x00"), nil, 0,
			`MESSAGE non-transactional, prefix "p2"; payload (0 bytes): `},

		{"gin, not decoded", 13, 0x20, le(pad(30)), nil, 0, "INSERT <not decoded>"},
		{"custom rmgr, not decoded", 200, 0x10, nil, nil, 0, "UNKNOWN (10) <not decoded>"},
	}
}

// TestDescribe: each record type of the described resource managers reads
// the fields of its main data and prints them in pg_waldump's words; a
// resource manager not decoded says so.
func TestDescribe(t *testing.T) {
	for _, c := range descCases() {
		r := &xlog.Record{LSN: 0x1000028, RmID: c.rmid, Info: c.info, MainData: c.main, Blocks: c.blocks, Origin: c.origin, HasOrigin: c.origin != 0}
		if got := xlog.Describe(r, nil); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
		_, err := xlog.Description(r, nil)
		if described := xlog.Described(c.rmid); described != (err == nil) || (!described && !errors.Is(err, xlog.ErrNotDescribed)) {
			t.Errorf("%s: Described %v, Description error %v", c.name, described, err)
		}
	}
}

// TestDescribeTimeZone: times print in the zone given, with its
// abbreviation, as pg_waldump prints them in its local zone; nil is UTC.
func TestDescribeTimeZone(t *testing.T) {
	r := &xlog.Record{RmID: 1, Info: 0x00, MainData: le(ts1)}
	if got := xlog.Describe(r, zoned(time.FixedZone("XYZ", -90*60))); got != "COMMIT 2000-01-01 22:30:00.123456 XYZ" {
		t.Errorf("fixed zone: %q", got)
	}
	if got := xlog.Describe(r, nil); got != "COMMIT "+ts1UTC {
		t.Errorf("nil location: %q", got)
	}
}

// TestDescribeMalformed: data too short for its struct, or counts that run
// past its end, are a *DescError wrapping ErrMalformedData naming the
// record, and Describe prints a marker instead of a description.
func TestDescribeMalformed(t *testing.T) {
	for _, c := range []struct {
		name     string
		rmid     uint8
		info     uint8
		main     []byte
		blocks   []xlog.BlockRef
		wantText string
	}{
		{"update short", 10, 0x20, le(pad(10)), nil, "UPDATE <malformed: main data is 10 bytes, xl_heap_update needs 14>"},
		{"insert empty", 10, 0x00, nil, nil, "INSERT <malformed: main data is 0 bytes, xl_heap_insert needs 3>"},
		{"checkpoint short", 0, 0x10, le(pad(87)), nil, "CHECKPOINT_ONLINE <malformed: main data is 87 bytes, CheckPoint needs 88>"},
		{"restore point without NUL", 0, 0x70, le(ts1, "abc"), nil, "RESTORE_POINT <malformed: xl_restore_point.rp_name is not NUL-terminated>"},
		{"commit subxacts past the end", 1, 0x80, le(ts1, uint32(2), int32(1000), uint32(1)), nil,
			"COMMIT <malformed: main data is 20 bytes, 1000 subtransaction xids need 4016>"},
		{"commit negative rels", 1, 0x80, le(ts1, uint32(4), int32(-1)), nil, "COMMIT <malformed: relfilenodes: count -1>"},
		{"commit xinfo missing", 1, 0x80, le(ts1), nil, "COMMIT <malformed: main data is 8 bytes, xl_xact_xinfo needs 12>"},
		{"commit gid without NUL", 1, 0xB0, le(ts1, uint32(16|128), uint32(5), "sk"), nil, "COMMIT_PREPARED <malformed: the gid is not NUL-terminated>"},
		{"commit origin short", 1, 0x80, le(ts1, uint32(32), pad(15)), nil, "COMMIT <malformed: main data is 27 bytes, xl_xact_origin needs 28>"},
		{"prepare gid past the end", 1, 0x10, le(pad(54), uint16(100), pad(16), "x"), nil, "PREPARE <malformed: main data is 73 bytes, 100 gid bytes need 172>"},
		{"assignment too many", 1, 0x50, le(uint32(1), int32(3), uint32(2)), nil, "ASSIGNMENT <malformed: main data is 12 bytes, 3 subtransaction xids need 20>"},
		{"running xacts short", 8, 0x10, le(int32(5), pad(20)), nil, "RUNNING_XACTS <malformed: main data is 24 bytes, 5 running xids need 44>"},
		{"standby invalidations short", 8, 0x20, le(pad(12), int32(1), pad(8)), nil,
			"INVALIDATIONS <malformed: main data is 24 bytes, 1 invalidation messages need 32>"},
		{"heap truncate relids past the end", 10, 0x30, le(uint32(5), uint32(0xFFFFFFFF), pad(4)), nil,
			"TRUNCATE <malformed: main data is 12 bytes, 4294967295 relids need 17179869192>"},
		{"meta cleanup without block 0", 11, 0xE0, nil, nil, "META_CLEANUP <malformed: block 0's data is 0 bytes, xl_btree_metadata needs 24>"},
		{"logical message sizes past the end", 21, 0x00, le(pad(8), uint64(1<<62), uint64(1<<62)), nil,
			"MESSAGE <malformed: main data is 24 bytes, a message of 4611686018427387904+4611686018427387904>"},
		{"logical message prefix without NUL", 21, 0x00, le(pad(8), uint64(2), uint64(0), "ab"), nil,
			"MESSAGE <malformed: the prefix is not NUL-terminated>"},
		{"drop database short", 4, 0x20, le(uint32(1), int32(3), uint32(1663)), nil, "DROP <malformed: main data is 12 bytes, 3 tablespace ids need 20>"},
	} {
		r := &xlog.Record{LSN: 0x2000028, RmID: c.rmid, Info: c.info, MainData: c.main, Blocks: c.blocks}
		if got := xlog.Describe(r, nil); got != c.wantText {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.wantText)
		}
		_, err := xlog.Description(r, nil)
		var de *xlog.DescError
		if !errors.As(err, &de) || !errors.Is(err, xlog.ErrMalformedData) || de.LSN != 0x2000028 {
			t.Errorf("%s: error %v, want a *DescError at 0/2000028 wrapping ErrMalformedData", c.name, err)
		}
	}
}

// TestBlockRefs: block references as pg_waldump prints them: the fork
// off the main one, FPW for an image redo applies, FPW for WAL
// verification for one it does not; gaps in block ids kept.
func TestBlockRefs(t *testing.T) {
	r := &xlog.Record{Blocks: []xlog.BlockRef{
		{ID: 0, Fork: 2, Rel: xlog.RelFileNode{Spc: 1663, DB: 1, Rel: 2619}, Block: 0, Image: &xlog.BlockImage{Info: xlog.BkpImageApply}},
		{ID: 2, Rel: xlog.RelFileNode{Spc: 1663, DB: 1, Rel: 2619}, Block: 7, Image: &xlog.BlockImage{}},
		{ID: 3, Fork: 9, Rel: xlog.RelFileNode{Spc: 1664, DB: 0, Rel: 1262}, Block: 4294967295},
	}}
	want := ", blkref #0: rel 1663/1/2619 fork vm blk 0 FPW, blkref #2: rel 1663/1/2619 blk 7 FPW for WAL verification, blkref #3: rel 1664/0/1262 fork 9 blk 4294967295"
	if got := xlog.BlockRefs(r); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if got := xlog.BlockRefs(&xlog.Record{}); got != "" {
		t.Errorf("no blocks: %q", got)
	}
}

// FuzzDescribe describes arbitrary main and block 0 data under every
// resource manager and record type: never a panic; the error is nil,
// ErrNotDescribed, or a *DescError at the record wrapping
// ErrMalformedData; Describe starts with the record type's name.
func FuzzDescribe(f *testing.F) {
	for _, c := range descCases() {
		var blk []byte
		if len(c.blocks) > 0 {
			blk = c.blocks[0].Data
		}
		f.Add(c.rmid, c.info, c.main, blk, c.origin)
	}
	f.Fuzz(func(t *testing.T, rmid, info uint8, main, blk []byte, origin uint16) {
		r := &xlog.Record{LSN: 0x3000028, RmID: rmid, Info: info, MainData: main, Origin: origin, HasOrigin: origin != 0}
		if blk != nil {
			r.Blocks = []xlog.BlockRef{{ID: 0, Data: blk}}
		}
		desc, err := xlog.Description(r, nil)
		var de *xlog.DescError
		switch {
		case err == nil:
		case errors.Is(err, xlog.ErrNotDescribed):
			if xlog.Described(rmid) || desc != "" {
				t.Fatalf("rmgr %d: ErrNotDescribed with Described true or text %q", rmid, desc)
			}
		case errors.As(err, &de) && errors.Is(err, xlog.ErrMalformedData) && de.LSN == r.LSN:
		default:
			t.Fatalf("error %v", err)
		}
		full := xlog.Describe(r, nil)
		if !strings.HasPrefix(full, xlog.RecordType(r)+" ") || (err == nil && full != xlog.RecordType(r)+" "+desc) {
			t.Fatalf("Describe %q, type %q, description %q", full, xlog.RecordType(r), desc)
		}
		if !bytes.Equal(r.MainData, main) {
			t.Fatal("main data modified")
		}
	})
}

// zoned is xlog.TimestampFormat in loc, as the CLI prints in the local zone.
func zoned(loc *time.Location) xlog.TimestampFormat {
	return func(ts int64) string {
		t := time.Unix(ts/1_000_000+xlog.PostgresEpochUnix, 0).In(loc)
		zone, _ := t.Zone()
		return fmt.Sprintf("%s.%06d %s", t.Format("2006-01-02 15:04:05"), ts%1_000_000, zone)
	}
}

// TestUTCTimestampMatchesTheTimePackage: the package's own UTC formatting
// (it may not read the time package's zone files) equals the time
// package's, around the epochs, leap days, centuries and far dates.
func TestUTCTimestampMatchesTheTimePackage(t *testing.T) {
	want := zoned(time.UTC)
	day := int64(86400 * 1_000_000)
	var cases []int64
	for _, base := range []int64{0, -day * 10957, 60 * day, 59 * day, -day, 36524 * day, 146097 * day, -146097 * day, 1 << 52, -(1 << 52)} {
		for _, off := range []int64{0, 1, -1, 999_999, day - 1, 123_456_789} {
			cases = append(cases, base+off)
		}
	}
	for ts := int64(-40 * 365 * 86400 * 1_000_000); ts < 60*365*86400*1_000_000; ts += 7_777_777_777_777 {
		cases = append(cases, ts)
	}
	for _, ts := range cases {
		if got, w := xlog.UTCTimestamp(ts), want(ts); got != w {
			t.Fatalf("UTCTimestamp(%d) = %q, want %q", ts, got, w)
		}
	}
}
