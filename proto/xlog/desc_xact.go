package xlog

// Transaction records (xactdesc.c xact_desc) and Standby records
// (standbydesc.c standby_desc), PostgreSQL 15.

// Transaction record types (xl_info & XLOG_XACT_OPMASK; access/xact.h).
const (
	xactOpMask         = 0x70
	xactHasInfo        = 0x80 // XLOG_XACT_HAS_INFO: an xl_xact_xinfo follows the fixed part
	xactCommit         = 0x00
	xactPrepare        = 0x10
	xactAbort          = 0x20
	xactCommitPrepared = 0x30
	xactAbortPrepared  = 0x40
	xactAssignment     = 0x50
	xactInvalidations  = 0x60
)

// xl_xact_xinfo.xinfo bits.
const (
	xinfoHasDBInfo       = 1 << 0
	xinfoHasSubxacts     = 1 << 1
	xinfoHasRelFileNodes = 1 << 2
	xinfoHasInvals       = 1 << 3
	xinfoHasTwoPhase     = 1 << 4
	xinfoHasOrigin       = 1 << 5
	xinfoHasGID          = 1 << 7
	xinfoHasDroppedStats = 1 << 8
	xactApplyFeedback    = 1 << 29 // XACT_COMPLETION_APPLY_FEEDBACK
	xactRelcacheInitFile = 1 << 30 // XACT_COMPLETION_UPDATE_RELCACHE_FILE
	xactForceSyncCommit  = 1 << 31 // XACT_COMPLETION_FORCE_SYNC_COMMIT
)

// Sizes of the parts of transaction records.
const (
	sizeOfSharedInvalMsg = 16 // SharedInvalidationMessage
	sizeOfXactStatsItem  = 12 // xl_xact_stats_item: kind, dboid, objoid
	sizeOfXactPrepare    = 72 // sizeof(xl_xact_prepare), already MAXALIGNed
)

// xactParsed is xl_xact_parsed_commit / _abort / _prepare: what the
// descriptions print, with offsets into the data for the arrays.
type xactParsed struct {
	xinfo          uint32
	xactTime       int64
	dbID, tsID     uint32
	subxacts       []uint32
	rels           []RelFileNode
	abortRels      []RelFileNode // prepare only
	stats          []xactStatsItem
	abortStats     []xactStatsItem // prepare only
	msgsOff, nmsgs int             // the invalidation messages in d.data
	twophaseXID    uint32
	gid            string
	originLSN      uint64
	originTime     int64
}

type xactStatsItem struct {
	kind          int32
	dbOID, objOID uint32
}

func describeXact(d *descr) error {
	info := d.r.Info & xactOpMask
	switch info {
	case xactCommit, xactCommitPrepared:
		p, err := d.parseCommitOrAbort(true)
		if err != nil {
			return err
		}
		if p.twophaseXID != 0 {
			d.printf("%d: ", p.twophaseXID)
		}
		d.str(d.tsf(p.xactTime))
		d.relations("rels", p.rels)
		d.subxacts(p.subxacts)
		d.stats("", p.stats)
		d.invalidations(p.msgsOff, p.nmsgs, p.dbID, p.tsID, p.xinfo&xactRelcacheInitFile != 0)
		if p.xinfo&xactApplyFeedback != 0 {
			d.str("; apply_feedback")
		}
		if p.xinfo&xactForceSyncCommit != 0 {
			d.str("; sync")
		}
		if p.xinfo&xinfoHasOrigin != 0 {
			d.origin(p)
		}
	case xactAbort, xactAbortPrepared:
		p, err := d.parseCommitOrAbort(false)
		if err != nil {
			return err
		}
		if p.twophaseXID != 0 {
			d.printf("%d: ", p.twophaseXID)
		}
		d.str(d.tsf(p.xactTime))
		d.relations("rels", p.rels)
		d.subxacts(p.subxacts)
		if p.xinfo&xinfoHasOrigin != 0 {
			d.origin(p)
		}
		d.stats("", p.stats)
	case xactPrepare:
		p, err := d.parsePrepare()
		if err != nil {
			return err
		}
		d.printf("gid %s: ", p.gid)
		d.str(d.tsf(p.xactTime))
		d.relations("rels(commit)", p.rels)
		d.relations("rels(abort)", p.abortRels)
		d.stats("commit ", p.stats)
		d.stats("abort ", p.abortStats)
		d.subxacts(p.subxacts)
		// initfileinval (offset 52) decides the relcache init file note.
		d.invalidations(p.msgsOff, p.nmsgs, p.dbID, p.tsID, d.u8(52) != 0)
		// The origin as PrepareRedoAdd sees it: the record's own.
		if d.r.HasOrigin && d.r.Origin != 0 {
			d.origin(p)
		}
	case xactAssignment:
		// xl_xact_assignment: xtop 0, nsubxacts 4, xsub 8.
		if err := d.need(8, "xl_xact_assignment"); err != nil {
			return err
		}
		n := d.i32(4)
		if _, err := d.count(8, int64(n), 4, "subtransaction xids"); err != nil {
			return err
		}
		d.printf("xtop %d: subxacts:", d.u32(0))
		for i := 0; i < int(n); i++ {
			d.printf(" %d", d.u32(8+4*i))
		}
	case xactInvalidations:
		// xl_xact_invals: nmsgs 0, msgs 4.
		if err := d.need(4, "xl_xact_invals"); err != nil {
			return err
		}
		n := d.i32(0)
		if _, err := d.count(4, int64(n), sizeOfSharedInvalMsg, "invalidation messages"); err != nil {
			return err
		}
		d.invalidations(4, int(n), 0, 0, false)
	}
	return nil
}

// parseCommitOrAbort is ParseCommitRecord / ParseAbortRecord: after
// xact_time, the parts xinfo announces, in this order: dbinfo, subxacts,
// relfilenodes, dropped stats, invalidations (commit only), twophase xid
// and gid, origin (unaligned).
func (d *descr) parseCommitOrAbort(commit bool) (*xactParsed, error) {
	p := &xactParsed{}
	if err := d.need(8, "xl_xact_commit"); err != nil {
		return nil, err
	}
	p.xactTime = d.i64(0)
	off := 8
	take := func(n int, what string) (int, error) {
		if err := d.need(off+n, what); err != nil {
			return 0, err
		}
		o := off
		off += n
		return o, nil
	}
	if d.r.Info&xactHasInfo != 0 {
		o, err := take(4, "xl_xact_xinfo")
		if err != nil {
			return nil, err
		}
		p.xinfo = d.u32(o)
	}
	if p.xinfo&xinfoHasDBInfo != 0 {
		o, err := take(8, "xl_xact_dbinfo")
		if err != nil {
			return nil, err
		}
		p.dbID, p.tsID = d.u32(o), d.u32(o+4)
	}
	if p.xinfo&xinfoHasSubxacts != 0 {
		o, err := take(4, "xl_xact_subxacts")
		if err != nil {
			return nil, err
		}
		if off, err = d.count(off, int64(d.i32(o)), 4, "subtransaction xids"); err != nil {
			return nil, err
		}
		for i := o + 4; i < off; i += 4 {
			p.subxacts = append(p.subxacts, d.u32(i))
		}
	}
	if p.xinfo&xinfoHasRelFileNodes != 0 {
		o, err := take(4, "xl_xact_relfilenodes")
		if err != nil {
			return nil, err
		}
		if off, err = d.count(off, int64(d.i32(o)), sizeOfRelFileNode, "relfilenodes"); err != nil {
			return nil, err
		}
		for i := o + 4; i < off; i += sizeOfRelFileNode {
			p.rels = append(p.rels, d.relFileNode(i))
		}
	}
	if p.xinfo&xinfoHasDroppedStats != 0 {
		o, err := take(4, "xl_xact_stats_items")
		if err != nil {
			return nil, err
		}
		if off, err = d.count(off, int64(d.i32(o)), sizeOfXactStatsItem, "dropped stats items"); err != nil {
			return nil, err
		}
		for i := o + 4; i < off; i += sizeOfXactStatsItem {
			p.stats = append(p.stats, xactStatsItem{kind: d.i32(i), dbOID: d.u32(i + 4), objOID: d.u32(i + 8)})
		}
	}
	if commit && p.xinfo&xinfoHasInvals != 0 {
		o, err := take(4, "xl_xact_invals")
		if err != nil {
			return nil, err
		}
		n := d.i32(o)
		if off, err = d.count(off, int64(n), sizeOfSharedInvalMsg, "invalidation messages"); err != nil {
			return nil, err
		}
		p.msgsOff, p.nmsgs = o+4, int(n)
	}
	if p.xinfo&xinfoHasTwoPhase != 0 {
		o, err := take(4, "xl_xact_twophase")
		if err != nil {
			return nil, err
		}
		p.twophaseXID = d.u32(o)
		if p.xinfo&xinfoHasGID != 0 {
			gid, err := d.cString(off, len(d.data), "the gid")
			if err != nil {
				return nil, err
			}
			off += len(gid) + 1
		}
	}
	if p.xinfo&xinfoHasOrigin != 0 {
		o, err := take(16, "xl_xact_origin")
		if err != nil {
			return nil, err
		}
		p.originLSN, p.originTime = d.u64(o), d.i64(o+8)
	}
	return p, nil
}

// parsePrepare is ParsePrepareRecord: the xl_xact_prepare header, then
// each part MAXALIGNed: the gid (gidlen bytes), subxacts, commit rels,
// abort rels, commit stats, abort stats, invalidation messages.
func (d *descr) parsePrepare() (*xactParsed, error) {
	// xl_xact_prepare: magic 0, total_len 4, xid 8, database 12,
	// prepared_at 16, owner 24, nsubxacts 28, ncommitrels 32,
	// nabortrels 36, ncommitstats 40, nabortstats 44, ninvalmsgs 48,
	// initfileinval 52, gidlen 54, origin_lsn 56, origin_timestamp 64.
	if err := d.need(sizeOfXactPrepare, "xl_xact_prepare"); err != nil {
		return nil, err
	}
	p := &xactParsed{xactTime: d.i64(16), twophaseXID: d.u32(8), dbID: d.u32(12),
		originLSN: d.u64(56), originTime: d.i64(64)}
	off := sizeOfXactPrepare
	part := func(n int64, size int, what string) (int, error) {
		end, err := d.count(off, n, size, what)
		if err != nil {
			return 0, err
		}
		o := off
		off = o + maxAlign(end-o)
		return o, nil
	}
	gidLen := int(d.u16(54))
	o, err := part(int64(gidLen), 1, "gid bytes")
	if err != nil {
		return nil, err
	}
	// strncpy into a zeroed GIDSIZE buffer, printed with %s.
	gid := d.data[o : o+gidLen]
	for i, c := range gid {
		if c == 0 {
			gid = gid[:i]
			break
		}
	}
	p.gid = string(gid)
	n := d.i32(28)
	if o, err = part(int64(n), 4, "subtransaction xids"); err != nil {
		return nil, err
	}
	for i := 0; i < int(n); i++ {
		p.subxacts = append(p.subxacts, d.u32(o+4*i))
	}
	for _, rels := range []struct {
		n   int32
		dst *[]RelFileNode
	}{{d.i32(32), &p.rels}, {d.i32(36), &p.abortRels}} {
		if o, err = part(int64(rels.n), sizeOfRelFileNode, "relfilenodes"); err != nil {
			return nil, err
		}
		for i := 0; i < int(rels.n); i++ {
			*rels.dst = append(*rels.dst, d.relFileNode(o+sizeOfRelFileNode*i))
		}
	}
	for _, st := range []struct {
		n   int32
		dst *[]xactStatsItem
	}{{d.i32(40), &p.stats}, {d.i32(44), &p.abortStats}} {
		if o, err = part(int64(st.n), sizeOfXactStatsItem, "dropped stats items"); err != nil {
			return nil, err
		}
		for i := 0; i < int(st.n); i++ {
			at := o + sizeOfXactStatsItem*i
			*st.dst = append(*st.dst, xactStatsItem{kind: d.i32(at), dbOID: d.u32(at + 4), objOID: d.u32(at + 8)})
		}
	}
	n = d.i32(48)
	if o, err = part(int64(n), sizeOfSharedInvalMsg, "invalidation messages"); err != nil {
		return nil, err
	}
	p.msgsOff, p.nmsgs = o, int(n)
	return p, nil
}

// maxAlign is MAXALIGN.
func maxAlign(n int) int { return (n + MaxAlign - 1) &^ (MaxAlign - 1) }

func (d *descr) relations(label string, rels []RelFileNode) {
	if len(rels) == 0 {
		return
	}
	d.printf("; %s:", label)
	for _, r := range rels {
		d.printf(" %s", relPath(r, 0))
	}
}

func (d *descr) subxacts(xids []uint32) {
	if len(xids) == 0 {
		return
	}
	d.str("; subxacts:")
	for _, x := range xids {
		d.printf(" %d", x)
	}
}

func (d *descr) stats(label string, items []xactStatsItem) {
	if len(items) == 0 {
		return
	}
	d.printf("; %sdropped stats:", label)
	for _, it := range items {
		d.printf(" %d/%d/%d", it.kind, it.dbOID, it.objOID)
	}
}

func (d *descr) origin(p *xactParsed) {
	d.printf("; origin: node %d, lsn %s, at %s", d.r.Origin, lsnString(p.originLSN), d.tsf(p.originTime))
}

// Shared invalidation message ids below the catcache ids (storage/sinval.h).
const (
	sinvalCatalog  = -1
	sinvalRelcache = -2
	sinvalSmgr     = -3
	sinvalRelmap   = -4
	sinvalSnapshot = -5
)

// invalidations is standby_desc_invalidations: n SharedInvalidationMessages
// (16 bytes each, int8 id first) at off, which the caller has checked.
func (d *descr) invalidations(off, n int, dbID, tsID uint32, relcacheInitFile bool) {
	if n <= 0 {
		return
	}
	if relcacheInitFile {
		d.printf("; relcache init file inval dbid %d tsid %d", dbID, tsID)
	}
	d.str("; inval msgs:")
	for i := 0; i < n; i++ {
		m := off + sizeOfSharedInvalMsg*i
		switch id := int8(d.u8(m)); {
		case id >= 0:
			d.printf(" catcache %d", id)
		case id == sinvalCatalog:
			d.printf(" catalog %d", d.u32(m+8))
		case id == sinvalRelcache:
			d.printf(" relcache %d", d.u32(m+8))
		case id == sinvalSmgr:
			d.str(" smgr")
		case id == sinvalRelmap:
			d.printf(" relmap db %d", d.u32(m+4))
		case id == sinvalSnapshot:
			d.printf(" snapshot %d", d.u32(m+8))
		default:
			d.printf(" unrecognized id %d", id)
		}
	}
}

// Standby record types (storage/standbydefs.h).
const (
	standbyLock          = 0x00
	standbyRunningXacts  = 0x10
	standbyInvalidations = 0x20
)

func describeStandby(d *descr) error {
	switch d.r.Info & XLRRmgrInfoMask {
	case standbyLock:
		// xl_standby_locks: nlocks 0, then xl_standby_lock {xid, dbOid,
		// relOid} from 4.
		if err := d.need(4, "xl_standby_locks"); err != nil {
			return err
		}
		n := d.i32(0)
		if n <= 0 {
			return nil // the loop prints nothing
		}
		if _, err := d.count(4, int64(n), 12, "locks"); err != nil {
			return err
		}
		for i := 0; i < int(n); i++ {
			at := 4 + 12*i
			d.printf("xid %d db %d rel %d ", d.u32(at), d.u32(at+4), d.u32(at+8))
		}
	case standbyRunningXacts:
		// xl_running_xacts: xcnt 0, subxcnt 4, subxid_overflow 8,
		// nextXid 12, oldestRunningXid 16, latestCompletedXid 20, xids 24.
		if err := d.need(24, "xl_running_xacts"); err != nil {
			return err
		}
		d.printf("nextXid %d latestCompletedXid %d oldestRunningXid %d", d.u32(12), d.u32(20), d.u32(16))
		if n := d.i32(0); n > 0 {
			if _, err := d.count(24, int64(n), 4, "running xids"); err != nil {
				return err
			}
			d.printf("; %d xacts:", n)
			for i := 0; i < int(n); i++ {
				d.printf(" %d", d.u32(24+4*i))
			}
		}
		if d.u8(8) != 0 {
			d.str("; subxid ovf")
		}
	case standbyInvalidations:
		// xl_invalidations: dbId 0, tsId 4, relcacheInitFileInval 8,
		// nmsgs 12, msgs 16.
		if err := d.need(16, "xl_invalidations"); err != nil {
			return err
		}
		n := d.i32(12)
		if n > 0 {
			if _, err := d.count(16, int64(n), sizeOfSharedInvalMsg, "invalidation messages"); err != nil {
				return err
			}
		}
		d.invalidations(16, int(n), d.u32(0), d.u32(4), d.u8(8) != 0)
	}
	return nil
}
