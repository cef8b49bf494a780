// Package xlogtest generates valid PostgreSQL 15 WAL for tests.
//
// It owns the writing side of the format that package xlog reads: page
// headers (long ones at segment starts), records with correct xl_prev and
// xl_crc, XLP_FIRST_IS_CONTRECORD and xlp_rem_len on continuation pages,
// XLOG_SWITCH with the zero-filled rest of its segment, and the
// XLP_FIRST_IS_OVERWRITE_CONTRECORD page that follows a record lost in a
// crash. Records are RM_XLOG_ID XLOG_NOOP records whose main data is a
// deterministic byte pattern, so pg_waldump and a real PostgreSQL accept them.
//
// It is a normal (non-test) package so that tests of other packages (the
// proposer, the acceptor, the end-to-end harness) can build WAL a safekeeper
// accepts without a running PostgreSQL. It must not be imported by non-test
// code.
package xlogtest
