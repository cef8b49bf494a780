package server

import (
	"container/list"
	"net"
	"sync/atomic"
	"time"

	"github.com/safekeeper/safekeeper/proto/pgwire"
)

// Connection slots (Config.MaxConnections) and the eviction of connections
// still in their startup (anti-slowloris).
//
// Every accepted connection holds a slot (Server.conns) from accept until it
// ends. Until it is trusted (its TLS handshake, startup packet and password
// exchange done, just before AuthenticationOk) it is also on Server.starting,
// in arrival order. When a connection arrives with every slot held:
//
//   - If some connection is still in its startup, the oldest one is evicted:
//     its slot goes to the newcomer at once, and it is counted in
//     safekeeper_refused_total{reason="startup_evicted"}. It may still finish
//     its startup packet within evictGrace and is then answered FATAL 53300,
//     as a refused connection is; else it is closed. While maxRefusing
//     refusals already run, it is closed at once.
//   - Only when every slot is held by a trusted connection is the newcomer
//     refused with 53300 (refuseTooMany).
//
// So idle or half-open sockets cannot keep a proposer or a reader out: to do
// that an attacker must open MaxConnections connections within the few
// milliseconds a real client takes for its startup. The bookkeeping is O(1)
// per connection, under Server.mu: a slot is given up either by the evictor
// (when it evicts) or by the connection's own goroutine when it ends (when
// it was not evicted), never both.

// evictGraceMax bounds how long an evicted connection may take to finish its
// startup packet and be answered 53300 (at most AuthenticationTimeout).
const evictGraceMax = time.Second

// evictWarnEvery: the warning that connections are evicted is logged at most
// this often (each eviction is logged at debug).
const evictWarnEvery = 10 * time.Second

// connEntry is an accepted connection's slot.
type connEntry struct {
	nc      *limitedConn
	arrived time.Time
	// evicted is set, under Server.mu, when the connection was evicted in its
	// startup: it holds no slot any more and ends with 53300 or unanswered.
	evicted atomic.Bool
	// Under Server.mu:
	starting *list.Element // its place in Server.starting while in startup, else nil
	refusing bool          // evicted and counted in Server.refusing (written only by admitLocked)
}

// admitLocked gives nc a slot: a free one or, when all are held, the slot of
// the oldest connection still in its startup, which it evicts and returns as
// victim (for evict, outside the lock). ok is false when every slot is held
// by a trusted connection: nc is then to be refused. s.mu is held.
func (s *Server) admitLocked(nc *limitedConn) (e, victim *connEntry, ok bool) {
	if len(s.conns) >= s.cfg.MaxConnections {
		oldest := s.starting.Front()
		if oldest == nil {
			return nil, nil, false
		}
		victim = oldest.Value.(*connEntry)
		s.starting.Remove(oldest)
		victim.starting = nil
		victim.evicted.Store(true)
		delete(s.conns, victim.nc)
		if s.refusing.Add(1) <= maxRefusing {
			victim.refusing = true
		} else {
			s.refusing.Add(-1)
		}
	}
	e = &connEntry{nc: nc, arrived: time.Now()}
	e.starting = s.starting.PushBack(e)
	s.conns[nc] = e
	return e, victim, true
}

// evict ends an evicted connection's startup: it gets evictGrace to finish
// its startup packet and be answered 53300, or, when refusals are already at
// maxRefusing, it is closed. Its goroutine ends promptly either way.
func (s *Server) evict(v *connEntry) {
	s.metrics.Refused("startup_evicted")
	age := time.Since(v.arrived)
	if v.refusing {
		grace := min(s.cfg.AuthenticationTimeout, evictGraceMax)
		if s.hooks.evictGrace > 0 {
			grace = s.hooks.evictGrace
		}
		v.nc.cut(time.Now().Add(grace))
	} else {
		v.nc.Close()
	}
	s.log.Debug("connection evicted in its startup to make room for a new one (--max-connections)",
		"peer", v.nc.RemoteAddr().String(), "startup_age", age)
	n := s.evictions.Add(1)
	now := time.Now().UnixNano()
	if last := s.evictWarned.Load(); now-last >= int64(evictWarnEvery) && s.evictWarned.CompareAndSwap(last, now) {
		s.evictions.Add(-n)
		s.log.Warn("at --max-connections: evicting connections that have not finished their startup, so new clients get in (idle or slow clients, or a flood)",
			"evicted", n, "max_connections", s.cfg.MaxConnections, "oldest_startup_age", age)
	}
}

// trust ends e's startup: from now on it keeps its slot until it ends. It
// returns false if e was evicted meanwhile.
func (s *Server) trust(e *connEntry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.evicted.Load() {
		return false
	}
	if e.starting != nil {
		s.starting.Remove(e.starting)
		e.starting = nil
	}
	return true
}

// release gives up e's slot (or, if it was evicted, its refusal) and closes
// it; its goroutine calls it once, when the connection ends.
func (s *Server) release(e *connEntry) {
	s.mu.Lock()
	if e.evicted.Load() {
		if e.refusing { // set once, by admitLocked; release runs once
			s.refusing.Add(-1)
		}
	} else {
		delete(s.conns, e.nc)
		if e.starting != nil {
			s.starting.Remove(e.starting)
			e.starting = nil
		}
	}
	s.mu.Unlock()
	e.nc.Close()
}

// refuseEvicted answers an evicted connection whose startup packet came in
// time as one over MaxConnections is answered.
func (s *Server) refuseEvicted(pc *pgwire.Conn) {
	s.metrics.Refused("too_many_clients")
	pc.SendError(fatalError(pgwire.Errorf(pgwire.TooManyConnections, "sorry, too many clients already")))
	pc.Flush()
}

// limitedConn is an accepted socket whose write deadlines never pass the
// server's writeLimit once Shutdown has set it, and whose deadlines never
// pass its own cut once evict has set it. pgwire sets a fresh write deadline
// (Config.WalSenderTimeout) before each write; without the cap a client that
// stopped reading would hold its stream's write, and Shutdown with it, for
// that long.
type limitedConn struct {
	net.Conn
	limit *atomic.Int64 // the server's write limit (unix nanoseconds), 0: none
	cutAt atomic.Int64  // this connection's limit on reads and writes, 0: none
}

// NetConn is the socket limitedConn wraps (pgwire asks it for the socket's
// queues, as it asks a *tls.Conn).
func (c *limitedConn) NetConn() net.Conn { return c.Conn }

// capAt is t, or the limit l (unix nanoseconds; 0: none) if t is later or
// zero.
func capAt(t time.Time, l int64) time.Time {
	if l != 0 && (t.IsZero() || t.UnixNano() > l) {
		return time.Unix(0, l)
	}
	return t
}

func (c *limitedConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets t, capped by the cut. If the cut is set meanwhile, it
// sets again: cut stores it before it sets the deadlines, so one of the two
// calls applies it.
func (c *limitedConn) SetReadDeadline(t time.Time) error {
	for {
		k := c.cutAt.Load()
		if err := c.Conn.SetReadDeadline(capAt(t, k)); err != nil {
			return err
		}
		if c.cutAt.Load() == k {
			return nil
		}
	}
}

// SetWriteDeadline sets t, or the limit if t is later (or zero), capped by
// the cut too. If either is set meanwhile, it sets again: Shutdown stores the
// limit before it sets every connection's deadline, so one of the two calls
// applies it.
func (c *limitedConn) SetWriteDeadline(t time.Time) error {
	for {
		l, k := c.limit.Load(), c.cutAt.Load()
		if err := c.Conn.SetWriteDeadline(capAt(capAt(t, l), k)); err != nil {
			return err
		}
		if c.limit.Load() == l && c.cutAt.Load() == k {
			return nil
		}
	}
}

// cut brings the connection's read and write deadlines to t at the latest,
// for good.
func (c *limitedConn) cut(t time.Time) {
	c.cutAt.Store(t.UnixNano())
	c.SetDeadline(t)
}
