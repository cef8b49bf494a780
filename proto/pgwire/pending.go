package pgwire

import (
	"encoding/binary"

	"github.com/safekeeper/safekeeper/proto/netq"
)

// Pending reports whether more of the client's input is already here: a
// whole message in the read-ahead buffer, or bytes in the socket's receive
// queue (proto/netq). A reader that batches work — the WAL push stream's
// group commit — goes on reading while it is true, and commits when it is
// false, before it would wait. The next read may still wait briefly for
// the rest of a message that is only partly here. Call it only from the
// reader goroutine, between messages.
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
	n, _ := c.socket().Unread()
	return n > 0
}

// SendBacklog is how many bytes written to the socket its peer has not yet
// acknowledged; ok is false when that cannot be asked (proto/netq). Call
// it only from the reader goroutine.
func (c *Conn) SendBacklog() (n int, ok bool) { return c.socket().Unsent() }

func (c *Conn) socket() *netq.Socket {
	if c.sock == nil {
		c.sock = netq.Of(c.nc)
	}
	return c.sock
}
