package xlog

// Btree (nbtdesc.c), Storage (smgrdesc.c), CLOG (clogdesc.c), Database
// (dbasedesc.c), RelMap (relmapdesc.c), Sequence (seqdesc.c) and
// LogicalMessage (logicalmsgdesc.c) records, PostgreSQL 15.

// Btree record types (access/nbtxlog.h).
const (
	btreeInsertLeaf       = 0x00
	btreeInsertUpper      = 0x10
	btreeInsertMeta       = 0x20
	btreeSplitL           = 0x30
	btreeSplitR           = 0x40
	btreeInsertPost       = 0x50
	btreeDedup            = 0x60
	btreeDelete           = 0x70
	btreeUnlinkPage       = 0x80
	btreeUnlinkPageMeta   = 0x90
	btreeNewRoot          = 0xA0
	btreeMarkPageHalfdead = 0xB0
	btreeVacuum           = 0xC0
	btreeReusePage        = 0xD0
	btreeMetaCleanup      = 0xE0
)

func describeBtree(d *descr) error {
	switch d.r.Info & XLRRmgrInfoMask {
	case btreeInsertLeaf, btreeInsertUpper, btreeInsertMeta, btreeInsertPost:
		// xl_btree_insert: offnum 0.
		if err := d.need(2, "xl_btree_insert"); err != nil {
			return err
		}
		d.printf("off %d", d.u16(0))
	case btreeSplitL, btreeSplitR:
		// xl_btree_split: level 0, firstrightoff 4, newitemoff 6,
		// postingoff 8.
		if err := d.need(10, "xl_btree_split"); err != nil {
			return err
		}
		d.printf("level %d, firstrightoff %d, newitemoff %d, postingoff %d", d.u32(0), d.u16(4), d.u16(6), d.u16(8))
	case btreeDedup:
		// xl_btree_dedup: nintervals 0.
		if err := d.need(2, "xl_btree_dedup"); err != nil {
			return err
		}
		d.printf("nintervals %d", d.u16(0))
	case btreeVacuum:
		// xl_btree_vacuum: ndeleted 0, nupdated 2.
		if err := d.need(4, "xl_btree_vacuum"); err != nil {
			return err
		}
		d.printf("ndeleted %d; nupdated %d", d.u16(0), d.u16(2))
	case btreeDelete:
		// xl_btree_delete: latestRemovedXid 0, ndeleted 4, nupdated 6.
		if err := d.need(8, "xl_btree_delete"); err != nil {
			return err
		}
		d.printf("latestRemovedXid %d; ndeleted %d; nupdated %d", d.u32(0), d.u16(4), d.u16(6))
	case btreeMarkPageHalfdead:
		// xl_btree_mark_page_halfdead: poffset 0, leafblk 4, leftblk 8,
		// rightblk 12, topparent 16.
		if err := d.need(20, "xl_btree_mark_page_halfdead"); err != nil {
			return err
		}
		d.printf("topparent %d; leaf %d; left %d; right %d", d.u32(16), d.u32(4), d.u32(8), d.u32(12))
	case btreeUnlinkPage, btreeUnlinkPageMeta:
		// xl_btree_unlink_page: leftsib 0, rightsib 4, level 8, safexid 16
		// (FullTransactionId), leafleftsib 24, leafrightsib 28,
		// leaftopparent 32.
		if err := d.need(36, "xl_btree_unlink_page"); err != nil {
			return err
		}
		safe := d.u64(16)
		d.printf("left %d; right %d; level %d; safexid %d:%d; ", d.u32(0), d.u32(4), d.u32(8), uint32(safe>>32), uint32(safe))
		d.printf("leafleft %d; leafright %d; leaftopparent %d", d.u32(24), d.u32(28), d.u32(32))
	case btreeNewRoot:
		// xl_btree_newroot: rootblk 0, level 4.
		if err := d.need(8, "xl_btree_newroot"); err != nil {
			return err
		}
		d.printf("lev %d", d.u32(4))
	case btreeReusePage:
		// xl_btree_reuse_page: node 0, block 12, latestRemovedFullXid 16.
		if err := d.need(24, "xl_btree_reuse_page"); err != nil {
			return err
		}
		n, x := d.relFileNode(0), d.u64(16)
		d.printf("rel %d/%d/%d; latestRemovedXid %d:%d", n.Spc, n.DB, n.Rel, uint32(x>>32), uint32(x))
	case btreeMetaCleanup:
		// The xl_btree_metadata is block 0's data:
		// last_cleanup_num_delpages at 20.
		var data []byte
		for _, b := range d.r.Blocks {
			if b.ID == 0 {
				data = b.Data
			}
		}
		d.data, d.what = data, "block 0's data"
		if err := d.need(24, "xl_btree_metadata"); err != nil {
			return err
		}
		d.printf("last_cleanup_num_delpages %d", d.u32(20))
	}
	return nil
}

// Storage record types (catalog/storage_xlog.h).
const (
	smgrCreate   = 0x10
	smgrTruncate = 0x20
)

func describeSmgr(d *descr) error {
	switch d.r.Info & XLRRmgrInfoMask {
	case smgrCreate:
		// xl_smgr_create: rnode 0, forkNum 12.
		if err := d.need(16, "xl_smgr_create"); err != nil {
			return err
		}
		d.str(relPath(d.relFileNode(0), d.i32(12)))
	case smgrTruncate:
		// xl_smgr_truncate: blkno 0, rnode 4, flags 16.
		if err := d.need(20, "xl_smgr_truncate"); err != nil {
			return err
		}
		d.printf("%s to %d blocks flags %d", relPath(d.relFileNode(4), 0), d.u32(0), d.i32(16))
	}
	return nil
}

// CLOG record types (access/clog.h).
const (
	clogZeroPage = 0x00
	clogTruncate = 0x10
)

func describeClog(d *descr) error {
	switch d.r.Info & XLRRmgrInfoMask {
	case clogZeroPage:
		if err := d.need(4, "int pageno"); err != nil {
			return err
		}
		d.printf("page %d", d.i32(0))
	case clogTruncate:
		// xl_clog_truncate: pageno 0, oldestXact 4, oldestXactDb 8.
		if err := d.need(12, "xl_clog_truncate"); err != nil {
			return err
		}
		d.printf("page %d; oldestXact %d", d.i32(0), d.u32(4))
	}
	return nil
}

// Database record types (commands/dbcommands_xlog.h).
const (
	dbaseCreateFileCopy = 0x00
	dbaseCreateWALLog   = 0x10
	dbaseDrop           = 0x20
)

func describeDbase(d *descr) error {
	switch d.r.Info & XLRRmgrInfoMask {
	case dbaseCreateFileCopy:
		// xl_dbase_create_file_copy_rec: db_id 0, tablespace_id 4,
		// src_db_id 8, src_tablespace_id 12.
		if err := d.need(16, "xl_dbase_create_file_copy_rec"); err != nil {
			return err
		}
		d.printf("copy dir %d/%d to %d/%d", d.u32(12), d.u32(8), d.u32(4), d.u32(0))
	case dbaseCreateWALLog:
		// xl_dbase_create_wal_log_rec: db_id 0, tablespace_id 4.
		if err := d.need(8, "xl_dbase_create_wal_log_rec"); err != nil {
			return err
		}
		d.printf("create dir %d/%d", d.u32(4), d.u32(0))
	case dbaseDrop:
		// xl_dbase_drop_rec: db_id 0, ntablespaces 4, tablespace_ids 8.
		if err := d.need(8, "xl_dbase_drop_rec"); err != nil {
			return err
		}
		d.str("dir")
		n := d.i32(4)
		if n <= 0 {
			return nil
		}
		if _, err := d.count(8, int64(n), 4, "tablespace ids"); err != nil {
			return err
		}
		for i := 0; i < int(n); i++ {
			d.printf(" %d/%d", d.u32(8+4*i), d.u32(0))
		}
	}
	return nil
}

func describeRelMap(d *descr) error {
	if d.r.Info&XLRRmgrInfoMask == 0x00 { // XLOG_RELMAP_UPDATE
		// xl_relmap_update: dbid 0, tsid 4, nbytes 8.
		if err := d.need(12, "xl_relmap_update"); err != nil {
			return err
		}
		d.printf("database %d tablespace %d size %d", d.u32(0), d.u32(4), d.i32(8))
	}
	return nil
}

func describeSeq(d *descr) error {
	if d.r.Info&XLRRmgrInfoMask == 0x00 { // XLOG_SEQ_LOG
		// xl_seq_rec: node 0.
		if err := d.need(12, "xl_seq_rec"); err != nil {
			return err
		}
		n := d.relFileNode(0)
		d.printf("rel %d/%d/%d", n.Spc, n.DB, n.Rel)
	}
	return nil
}

func describeLogicalMsg(d *descr) error {
	if d.r.Info&XLRRmgrInfoMask != 0x00 { // XLOG_LOGICAL_MESSAGE
		return nil
	}
	// xl_logical_message: dbId 0, transactional 4, prefix_size 8,
	// message_size 16, message 24 (the prefix with its NUL, then the
	// payload).
	if err := d.need(24, "xl_logical_message"); err != nil {
		return err
	}
	prefixSize, msgSize := d.u64(8), d.u64(16)
	if prefixSize > uint64(len(d.data)) || msgSize > uint64(len(d.data)) {
		return d.malformed("main data is %d bytes, a message of %d+%d", len(d.data), prefixSize, msgSize)
	}
	end, err := d.count(24, int64(prefixSize+msgSize), 1, "message bytes")
	if err != nil {
		return err
	}
	prefix, err := d.cString(24, 24+int(prefixSize), "the prefix")
	if err != nil {
		return err
	}
	kind := "non-transactional"
	if d.u8(4) != 0 {
		kind = "transactional"
	}
	d.printf("%s, prefix \"%s\"; payload (%d bytes): ", kind, prefix, msgSize)
	const hex = "0123456789ABCDEF"
	d.b.Grow(3 * int(msgSize))
	for i, c := range d.data[end-int(msgSize) : end] {
		if i > 0 {
			d.b.WriteByte(' ')
		}
		d.b.WriteByte(hex[c>>4])
		d.b.WriteByte(hex[c&15])
	}
	return nil
}
