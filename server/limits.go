package server

import (
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/server/timeline"
)

// Resource limits (Config.MaxConnections, AuthenticationTimeout,
// MaxTimelines, MaxSlots, MaxDiskUsage, MaxTimelineDiskUsage): each has a
// default, a refusal with PostgreSQL's SQLSTATE, and a count in
// safekeeper_refused_total{reason}.
//
//   - A connection arriving when MaxConnections are open takes the slot of
//     the oldest connection still in its startup, which is evicted
//     (conns.go; reason startup_evicted). Only when every open connection
//     has finished its startup is the newcomer refused: FATAL 53300 "sorry,
//     too many clients already" once its startup packet is read (an evicted
//     connection gets the same answer if its startup packet comes within a
//     second); the streams already running are not touched. At most
//     maxRefusing refusals run at once; beyond, a connection is closed
//     unanswered. too_many_clients counts the connections refused at
//     arrival and the evicted ones answered 53300 (those are counted under
//     startup_evicted too).
//   - A connection that does not finish its startup (SSL negotiation,
//     startup packet, password) within AuthenticationTimeout is closed
//     (slowloris). The startup packet is at most 10,000 bytes, the
//     password message at most 64 KiB and every later message at most
//     1 MiB (pgwire).
//   - At most httpapi.MaxWALStreams GET .../wal answers run at once; more get 429
//     (server/httpapi/wal.go).
//   - A greeting that would create a timeline past MaxTimelines gets 53400.
//   - A slot past MaxSlots on a timeline gets 53400, as PostgreSQL's "all
//     replication slots are in use".
//   - The disk circuit breaker: new WAL is refused with FATAL 53100 when the
//     data directory's file system has less free space than the reserve
//     (autoDiskReserve, or MinFreeDisk), when the database file's pages in
//     use reach MaxDiskUsage, or when a timeline's WAL reaches
//     MaxTimelineDiskUsage. The room inside the database file
//     (storage.DB.ReusableBytes: bbolt's free pages, which a DELETE or
//     retention leaves since the file never shrinks) counts as free for
//     both. Reads go on, and /readyz answers 503. The disk is checked every
//     diskCheckInterval, so WAL is taken again by itself once space returns
//     (the proposer reconnects).

const (
	maxRefusing       = 512
	diskCheckInterval = time.Second
	maxDiskReserve    = 1 << 30
)

// refuseTooMany answers a connection over MaxConnections as the postmaster
// does: after its startup packet, FATAL 53300.
func (s *Server) refuseTooMany(nc net.Conn) {
	defer nc.Close()
	opts := pgwire.AcceptOptions{StartupTimeout: min(s.cfg.AuthenticationTimeout, 10*time.Second)}
	if s.certs != nil {
		opts.TLSConfig = s.certs.config()
	}
	pc, err := pgwire.Accept(nc, opts)
	if err != nil {
		return
	}
	pc.SendError(fatalError(pgwire.Errorf(pgwire.TooManyConnections, "sorry, too many clients already")))
	pc.Flush()
}

// diskState is the breaker's last reading.
type diskState struct {
	tripped atomic.Bool
	// refusal is why the breaker refuses WAL, set before tripped; it stays
	// after a reset (tripped false), with the last trip's reason.
	refusal atomic.Pointer[diskRefusal]
	free    atomic.Uint64
	total   atomic.Uint64 // the file system's size
	checked atomic.Int64  // unix nanoseconds of the last check
}

// diskRefusal is why the breaker refuses WAL and since when.
type diskRefusal struct {
	reason string // httpapi.RefusedMinFreeDisk or RefusedMaxDiskUsage
	why    string // the numbers, in words (the 53100 message, the log)
	since  time.Time
}

// diskRecheck is how old a reading may be when WAL arrives: the breaker
// reads the disk again (two syscalls) at most this often on the write
// path, besides every diskCheckInterval, so a fast writer cannot run
// through the reserve between two periodic checks.
const diskRecheck = 10 * time.Millisecond

// autoDiskReserve is the free space MinFreeDisk 0 (auto) keeps on a file
// system of total bytes: 2% of it, at most maxDiskReserve, but at least
// twice the WAL buffer (bufferedWAL, Config.MaxBufferedWAL): WAL already
// read when the breaker trips is still written, so on a small file system
// 2% alone would leave too little room for it and the disk would fill
// (ENOSPC) before the breaker refused anything. That floor is at most a
// quarter of the file system, so a tiny one still takes WAL.
func autoDiskReserve(total uint64, bufferedWAL int64) uint64 {
	floor := min(2*uint64(max(bufferedWAL, 0)), total/4)
	return max(min(total/50, maxDiskReserve), floor)
}

// checkDisk reads the file system and the database size and sets the
// breaker.
func (s *Server) checkDisk() {
	statfs := unix.Statfs
	if s.hooks.statfs != nil {
		statfs = s.hooks.statfs
	}
	var fs unix.Statfs_t
	if err := statfs(s.cfg.DataDir, &fs); err != nil {
		return
	}
	// Room inside the database file counts as free: bbolt's file never
	// shrinks, so after retention or a DELETE the space is in its free
	// pages, which new WAL takes before the file grows.
	reusable := s.db.ReusableBytes()
	used := max(s.db.AllocatedBytes()-reusable, 0)
	free := fs.Bavail*uint64(fs.Bsize) + uint64(reusable)
	total := fs.Blocks * uint64(fs.Bsize)
	reserve, rule := autoDiskReserve(total, s.cfg.MaxBufferedWAL), "auto"
	switch m := s.cfg.MinFreeDisk; {
	case m < 0:
		reserve = 0
	case m > 0:
		reserve, rule = uint64(m), "--min-free-disk"
	}
	why, reason := "", ""
	switch {
	case free < reserve:
		reason = httpapi.RefusedMinFreeDisk
		why = fmt.Sprintf("the file system of %s has %d bytes free (with %d free inside the database file), below the reserve of %d (%s)",
			s.cfg.DataDir, free, reusable, reserve, rule)
	case s.cfg.MaxDiskUsage > 0 && used >= s.cfg.MaxDiskUsage:
		reason = httpapi.RefusedMaxDiskUsage
		why = fmt.Sprintf("the database file holds %d bytes in use (%d free inside it), at --max-disk-usage %d", used, reusable, s.cfg.MaxDiskUsage)
	}
	s.disk.free.Store(free)
	s.disk.total.Store(total)
	s.disk.checked.Store(time.Now().UnixNano())
	was := s.disk.tripped.Load()
	if why != "" {
		since := time.Now()
		if prev := s.disk.refusal.Load(); was && prev != nil {
			since = prev.since // still tripped: since the first reading that tripped it
		}
		s.disk.refusal.Store(&diskRefusal{reason: reason, why: why, since: since})
	}
	s.disk.tripped.Store(why != "")
	switch {
	case why != "" && !was:
		s.log.Warn("disk circuit breaker tripped: new WAL is refused (53100), reads go on", "reason", why)
	case why == "" && was:
		s.log.Info("disk circuit breaker reset: WAL is taken again", "free_bytes", free)
	}
}

// watchDisk runs checkDisk every diskCheckInterval until the server stops.
func (s *Server) watchDisk() {
	t := time.NewTicker(diskCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			s.checkDisk()
		}
	}
}

// walRefusal is why the disk breaker refuses new WAL, nil while it takes
// it.
func (s *Server) walRefusal() *diskRefusal {
	if !s.disk.tripped.Load() {
		return nil
	}
	return s.disk.refusal.Load()
}

// walRefused returns the 53100 error for new WAL on tl, or nil.
func (s *Server) walRefused(tl *timeline.Timeline) error {
	if last := s.disk.checked.Load(); time.Now().UnixNano()-last > int64(diskRecheck) && s.disk.checked.CompareAndSwap(last, time.Now().UnixNano()) {
		s.checkDisk()
	}
	if r := s.walRefusal(); r != nil {
		s.metrics.Refused("disk")
		return pgwire.Errorf(pgwire.DiskFull, "could not write WAL: %s", r.why)
	}
	if limit := s.cfg.MaxTimelineDiskUsage; limit > 0 {
		end := tl.EndLSN()
		start := max(tl.RemovedUpTo(), tl.StartLSN())
		if end > start && int64(end-start) >= limit {
			s.metrics.Refused("disk")
			return pgwire.Errorf(pgwire.DiskFull, "could not write WAL: timeline %s holds %d bytes of WAL, at --max-timeline-disk-usage %d",
				tl.Key(), uint64(end-start), limit)
		}
	}
	return nil
}
