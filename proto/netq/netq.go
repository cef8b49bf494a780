// Package netq asks the kernel about a connection's socket queues: the
// bytes received and not yet read (FIONREAD), and the bytes written and not
// yet acknowledged by the peer (SIOCOUTQ). The safekeeper's push reader
// uses them to batch without waiting: it group-commits when nothing more is
// waiting to be read, and writes its replies itself only while the socket's
// backlog is small, leaving the rest to the connection's writer goroutine.
//
// Why the boundary sits here: these are questions about a socket, not
// about the PostgreSQL protocol; proto/pgwire asks them for its Conn, and
// a client-side stream could ask them without importing the server's wire
// layer.
package netq

import (
	"net"
	"syscall"
)

// Socket is a connection's socket, found once.
type Socket struct {
	nc  net.Conn
	raw syscall.RawConn
	err bool // no socket behind nc
}

// Of returns the socket of nc, found through wrappers that name what they
// wrap with a NetConn method, as *tls.Conn does.
func Of(nc net.Conn) *Socket { return &Socket{nc: nc} }

func (s *Socket) rawConn() bool {
	if s.raw != nil {
		return true
	}
	if s.err {
		return false
	}
	nc := s.nc
	for range 8 {
		if sc, ok := nc.(syscall.Conn); ok {
			raw, err := sc.SyscallConn()
			if err != nil {
				break
			}
			s.raw = raw
			return true
		}
		w, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		nc = w.NetConn()
	}
	s.err = true
	return false
}

// Unread is how many bytes the socket has received and not yet given to a
// read (for TLS: of its records; what the TLS layer holds decrypted is not
// seen); ok is false when that cannot be asked.
func (s *Socket) Unread() (n int, ok bool) { return s.ask(inq) }

// Unsent is how many bytes written to the socket its peer has not yet
// acknowledged; ok is false when that cannot be asked. While it is small a
// small write is taken by the kernel at once.
func (s *Socket) Unsent() (n int, ok bool) { return s.ask(outq) }

// ask runs one of the ioctls on the socket's descriptor.
func (s *Socket) ask(ioctl func(fd uintptr) (int, bool)) (n int, ok bool) {
	if !s.rawConn() {
		return 0, false
	}
	if err := s.raw.Control(func(fd uintptr) { n, ok = ioctl(fd) }); err != nil {
		return 0, false
	}
	return n, ok
}

// SmallBacklog bounds the unacknowledged bytes below which a writer that
// must not block writes a few small messages itself.
const SmallBacklog = 64 << 10
