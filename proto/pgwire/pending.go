package pgwire

import (
	"encoding/binary"
	"net"
	"syscall"
)

// Pending reports whether more of the client's input is already here: a
// whole message in the read-ahead buffer, or bytes in the socket's receive
// queue (of a TLS connection: its records; what the TLS layer holds
// decrypted is not seen). A reader that batches work — the WAL push
// stream's group commit — goes on reading while it is true, and commits
// when it is false, before it would wait. The next read may still wait
// briefly for the rest of a message that is only partly here. Call it only
// from the reader goroutine, between messages.
func (c *Conn) Pending() bool {
	if c.readErr != nil {
		return false
	}
	f := c.frames
	if n := f.wp - f.rp; n >= 5 && !f.body {
		body := int(binary.BigEndian.Uint32(f.buf[f.rp+1:])) - 4
		if n >= 5+body {
			return true
		}
	}
	return c.socketPending()
}

// SendBacklog is how many bytes written to the socket its peer has not yet
// acknowledged (SIOCOUTQ); ok is false when that cannot be asked. A writer
// that must not block — a reader writing its own replies between reads —
// writes only while the backlog is small: then the kernel takes a small
// write at once. Call it only from the reader goroutine.
func (c *Conn) SendBacklog() (n int, ok bool) {
	if !c.rawConn() {
		return 0, false
	}
	if err := c.raw.Control(func(fd uintptr) { n, ok = outq(fd) }); err != nil {
		return 0, false
	}
	return n, ok
}

// rawConn sets c.raw, the socket's syscall.RawConn, and reports whether
// there is one. The socket is found through wrappers that name what they
// wrap with a NetConn method, as *tls.Conn does.
func (c *Conn) rawConn() bool {
	if c.raw != nil {
		return true
	}
	nc := c.nc
	for range 8 {
		if sc, ok := nc.(syscall.Conn); ok {
			raw, err := sc.SyscallConn()
			if err != nil {
				return false
			}
			c.raw = raw
			return true
		}
		w, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			return false
		}
		nc = w.NetConn()
	}
	return false
}

// socketPending reports whether the socket's receive queue holds bytes
// (FIONREAD); false when that cannot be asked.
func (c *Conn) socketPending() bool {
	if !c.rawConn() {
		return false
	}
	n := 0
	if err := c.raw.Control(func(fd uintptr) { n = inq(fd) }); err != nil {
		return false
	}
	return n > 0
}
