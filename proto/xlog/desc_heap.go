package xlog

// Heap and Heap2 records (heapdesc.c heap_desc, heap2_desc, PostgreSQL 15).

// Heap record types (xl_info & XLOG_HEAP_OPMASK; access/heapam_xlog.h).
// XLOG_HEAP_INIT_PAGE (0x80) marks a record that initialises its page.
const (
	heapOpMask    = 0x70
	heapInsert    = 0x00
	heapDelete    = 0x10
	heapUpdate    = 0x20
	heapTruncate  = 0x30
	heapHotUpdate = 0x40
	heapConfirm   = 0x50
	heapLock      = 0x60
	heapInplace   = 0x70

	heap2Rewrite      = 0x00
	heap2Prune        = 0x10
	heap2Vacuum       = 0x20
	heap2FreezePage   = 0x30
	heap2Visible      = 0x40
	heap2MultiInsert  = 0x50
	heap2LockUpdated  = 0x60
	heap2NewCID       = 0x70
	xlhTruncCascade   = 1 << 0 // XLH_TRUNCATE_CASCADE
	xlhTruncRestartSq = 1 << 1 // XLH_TRUNCATE_RESTART_SEQS
)

// infobits is heapdesc.c's out_infobits: the XLHL_* flags, each followed
// by a space.
func (d *descr) infobits(bits uint8) {
	for _, f := range []struct {
		bit  uint8
		name string
	}{{0x01, "IS_MULTI "}, {0x02, "LOCK_ONLY "}, {0x04, "EXCL_LOCK "}, {0x08, "KEYSHR_LOCK "}, {0x10, "KEYS_UPDATED "}} {
		if bits&f.bit != 0 {
			d.str(f.name)
		}
	}
}

func describeHeap(d *descr) error {
	switch d.r.Info & heapOpMask {
	case heapInsert:
		// xl_heap_insert: offnum 0, flags 2.
		if err := d.need(3, "xl_heap_insert"); err != nil {
			return err
		}
		d.printf("off %d flags 0x%02X", d.u16(0), d.u8(2))
	case heapDelete:
		// xl_heap_delete: xmax 0, offnum 4, infobits_set 6, flags 7.
		if err := d.need(8, "xl_heap_delete"); err != nil {
			return err
		}
		d.printf("off %d flags 0x%02X ", d.u16(4), d.u8(7))
		d.infobits(d.u8(6))
	case heapUpdate, heapHotUpdate:
		// xl_heap_update: old_xmax 0, old_offnum 4, old_infobits_set 6,
		// flags 7, new_xmax 8, new_offnum 12.
		if err := d.need(14, "xl_heap_update"); err != nil {
			return err
		}
		d.printf("off %d xmax %d flags 0x%02X ", d.u16(4), d.u32(0), d.u8(7))
		d.infobits(d.u8(6))
		d.printf("; new off %d xmax %d", d.u16(12), d.u32(8))
	case heapTruncate:
		// xl_heap_truncate: dbId 0, nrelids 4, flags 8, relids 12.
		if err := d.need(12, "xl_heap_truncate"); err != nil {
			return err
		}
		flags, n := d.u8(8), d.u32(4)
		if _, err := d.count(12, int64(n), 4, "relids"); err != nil {
			return err
		}
		if flags&xlhTruncCascade != 0 {
			d.str("cascade ")
		}
		if flags&xlhTruncRestartSq != 0 {
			d.str("restart_seqs ")
		}
		d.printf("nrelids %d relids", n)
		for i := 0; i < int(n); i++ {
			d.printf(" %d", d.u32(12+4*i))
		}
	case heapConfirm, heapInplace:
		// xl_heap_confirm, xl_heap_inplace: offnum 0.
		if err := d.need(2, "offnum"); err != nil {
			return err
		}
		d.printf("off %d", d.u16(0))
	case heapLock:
		// xl_heap_lock: locking_xid 0, offnum 4, infobits_set 6, flags 7.
		if err := d.need(8, "xl_heap_lock"); err != nil {
			return err
		}
		d.printf("off %d: xid %d: flags 0x%02X ", d.u16(4), d.u32(0), d.u8(7))
		d.infobits(d.u8(6))
	}
	return nil
}

func describeHeap2(d *descr) error {
	switch d.r.Info & heapOpMask {
	case heap2Prune:
		// xl_heap_prune: latestRemovedXid 0, nredirected 4, ndead 6.
		if err := d.need(8, "xl_heap_prune"); err != nil {
			return err
		}
		d.printf("latestRemovedXid %d nredirected %d ndead %d", d.u32(0), d.u16(4), d.u16(6))
	case heap2Vacuum:
		// xl_heap_vacuum: nunused 0.
		if err := d.need(2, "xl_heap_vacuum"); err != nil {
			return err
		}
		d.printf("nunused %d", d.u16(0))
	case heap2FreezePage:
		// xl_heap_freeze_page: cutoff_xid 0, ntuples 4.
		if err := d.need(6, "xl_heap_freeze_page"); err != nil {
			return err
		}
		d.printf("cutoff xid %d ntuples %d", d.u32(0), d.u16(4))
	case heap2Visible:
		// xl_heap_visible: cutoff_xid 0, flags 4.
		if err := d.need(5, "xl_heap_visible"); err != nil {
			return err
		}
		d.printf("cutoff xid %d flags 0x%02X", d.u32(0), d.u8(4))
	case heap2MultiInsert:
		// xl_heap_multi_insert: flags 0, ntuples 2.
		if err := d.need(4, "xl_heap_multi_insert"); err != nil {
			return err
		}
		d.printf("%d tuples flags 0x%02X", d.u16(2), d.u8(0))
	case heap2LockUpdated:
		// xl_heap_lock_updated: xmax 0, offnum 4, infobits_set 6, flags 7.
		if err := d.need(8, "xl_heap_lock_updated"); err != nil {
			return err
		}
		d.printf("off %d: xmax %d: flags 0x%02X ", d.u16(4), d.u32(0), d.u8(7))
		d.infobits(d.u8(6))
	case heap2NewCID:
		// xl_heap_new_cid: top_xid 0, cmin 4, cmax 8, combocid 12,
		// target_node 16, target_tid 28 (BlockIdData bi_hi, bi_lo;
		// OffsetNumber).
		if err := d.need(34, "xl_heap_new_cid"); err != nil {
			return err
		}
		n := d.relFileNode(16)
		blk := uint32(d.u16(28))<<16 | uint32(d.u16(30))
		d.printf("rel %d/%d/%d; tid %d/%d", n.Spc, n.DB, n.Rel, blk, d.u16(32))
		d.printf("; cmin: %d, cmax: %d, combo: %d", d.u32(4), d.u32(8), d.u32(12))
	}
	// REWRITE: nothing.
	return nil
}
