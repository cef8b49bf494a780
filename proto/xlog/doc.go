// Package xlog finds WAL record boundaries in a stream of PostgreSQL 15 WAL,
// so that the safekeeper never reports a flush_lsn inside a record.
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
package xlog
