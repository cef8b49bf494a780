// Package xlog finds WAL record boundaries in a stream of PostgreSQL 15 WAL,
// so that the safekeeper never reports a flush_lsn inside a record, and
// reads the records themselves for `safekeeper wal dump` (Reader).
//
// It owns the knowledge of PostgreSQL's on-disk WAL page and record layout
// (access/xlog_internal.h, access/xlogrecord.h, access/xlogreader.c) and
// nothing else: it does no IO, keeps no clock, and never retains the caller's
// bytes. The boundary sits here because "where does the last complete record
// end" is a pure function of the byte stream; the acceptor consumes its
// answer, the storage layer and network code never need to know about page
// headers. Subpackage xlogtest generates WAL in the same format for tests.
//
// # Format
//
// WAL is a sequence of XLOG_BLCKSZ (8 KiB) pages, little-endian. Every page
// starts with a page header:
//
//	XLogPageHeaderData (SizeOfXLogShortPHD = 24 bytes after MAXALIGN)
//	  0 xlp_magic    u16  XLOG_PAGE_MAGIC, 0xD110 in PostgreSQL 15
//	  2 xlp_info     u16  XLP_* flags
//	  4 xlp_tli      u32  timeline of the page
//	  8 xlp_pageaddr u64  LSN of the page itself
//	 16 xlp_rem_len  u32  bytes of a record continued from the previous page
//	 20 padding
//	XLogLongPageHeaderData (SizeOfXLogLongPHD = 40 bytes), when xlp_info has
//	XLP_LONG_HEADER; always on the first page of a segment:
//	 24 xlp_sysid       u64  database system identifier
//	 32 xlp_seg_size    u32  WAL segment size in bytes
//	 36 xlp_xlog_blcksz u32  XLOG_BLCKSZ
//
// Records start MAXALIGNed (8 bytes) and begin with an XLogRecord header:
//
//	XLogRecord (SizeOfXLogRecord = 24 bytes)
//	  0 xl_tot_len u32  header + data, page headers not counted
//	  4 xl_xid     u32
//	  8 xl_prev    u64  start of the previous record
//	 16 xl_info    u8
//	 17 xl_rmid    u8
//	 18 padding
//	 20 xl_crc     u32  CRC-32C of the data, then of the header up to xl_crc
//
// A record flows across page boundaries (even its header may be split; its
// xl_tot_len is always on the first page). The next page then has
// XLP_FIRST_IS_CONTRECORD set and xlp_rem_len = bytes of the record still to
// come. The record ends (EndRecPtr) at its start + xl_tot_len + the page
// headers it spans, rounded up to MAXALIGN; a record ending exactly at a page
// end ends at the page boundary, before the next page's header. An
// XLOG_SWITCH record (RM_XLOG_ID, info 0x40) ends at the next segment start:
// PostgreSQL zero-fills the rest of the segment, page headers included.
//
// # Decoder lifecycle
//
// NewDecoder(start) is given a record boundary: a record end, or a page start.
// If it is a page start whose page has XLP_FIRST_IS_CONTRECORD, the first
// xlp_rem_len bytes continue a record begun before start; they are skipped
// and are not a record of this stream. Feed then takes the following bytes in
// any split; RecordEnd reports the end of the last complete record, Pos the
// end of the bytes fed. The first malformed byte stops the decoder: Feed
// returns an *Error (wrapping ErrInvalidWAL, naming the LSN) then and ever
// after.
//
// # Reader
//
// Reader (reader.go) is the record-level counterpart of the Decoder, as
// xlogreader.c's XLogReadRecord: it keeps the bytes of the record being
// assembled and returns whole records. Feed takes the WAL from the start in
// any split (it copies), Next returns the next record once its last byte is
// fed, or reports that more bytes are needed. Each record's header is
// checked (xl_tot_len, a valid xl_rmid, xl_prev equal to the previous
// record's start, or below its own for the first), each page header it
// crosses (magic, info bits, pageaddr, timeline, segment and page size,
// system id, XLP_FIRST_IS_CONTRECORD with the right xlp_rem_len), then its
// CRC (an *Error wrapping ErrRecordCRC at the record's start) and its body
// (DecodeRecord, record.go, as DecodeXLogRecord: block headers with their
// image headers, RelFileNode or BKPBLOCK_SAME_REL and block number; the
// origin, top-level xid and main data headers; the lengths must add up to
// xl_tot_len). XLOG_SWITCH ends the segment; a page with
// XLP_FIRST_IS_OVERWRITE_CONTRECORD abandons the record it interrupts.
//
// A Reader starts at a record boundary or at a page start, skipping the
// tail of a record continued into that page; with SkipBefore it starts
// anywhere, as pg_waldump's XLogFindNextRecord: reading begins at the
// page, records before the position are checked and not returned.
// rmgr.go holds PostgreSQL 15's resource manager names and the record type
// names of the common ones (rm_identify), for pg_waldump-style output.
//
// # Descriptions
//
// Describe (desc.go) is the rest of pg_waldump's line: what PostgreSQL 15's
// rm_desc functions (src/backend/access/rmgrdesc/*desc.c) print for a
// record's main data, in their words, and BlockRefs the block references
// (XLogRecGetBlockRefInfo). The resource managers of a pgbench workload and
// of initdb are described (Described: XLOG, Transaction, Storage, CLOG,
// Database, RelMap, Standby, Heap2, Heap, Btree, Sequence, LogicalMessage;
// desc_*.go), the others get their record type's name and "<not decoded>".
// The main data is read as the C structs of PostgreSQL 15's headers, at
// their x86-64 offsets, with every read bounds-checked: data too short for
// its struct, or counts running past its end, is a *DescError (wrapping
// ErrMalformedData) and prints as "<malformed: REASON>", where pg_waldump
// would read past the record. Timestamps print in the location given, as
// pg_waldump prints them in its local time zone.
package xlog
