package pgwire

import (
	"io"

	"github.com/jackc/pgproto3/v2"
)

// StartCopyBoth buffers CopyBothResponse ('W') with overall format 0 and no
// columns (body 00 00 00), as the walsender sends it. Flush to send it. From
// then on both sides exchange CopyData until each has sent CopyDone.
func (c *Conn) StartCopyBoth() error {
	return c.send(&pgproto3.CopyBothResponse{OverallFormat: 0})
}

// ReadCopy returns the payload of the next CopyData from the client. The
// slice is the caller's: it does not alias the connection's read buffers, so
// it may be kept and handed to another goroutine; once nothing refers to it
// any more, Recycle may take it back. Call it only from the reader
// goroutine.
//
// It returns ErrCopyDone when the client sends CopyDone (the client's half
// of the COPY is over), io.EOF on Terminate or when the connection is closed
// at a message boundary, an *Error with SQLSTATE QueryCanceled (57014) for
// CopyFail, and an *Error with SQLSTATE ProtocolViolation for any other
// message. Flush and Sync are ignored, as the protocol prescribes during COPY.
func (c *Conn) ReadCopy() ([]byte, error) {
	for {
		msg, err := c.receive()
		if err != nil {
			return nil, err
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			// Backend.Receive reuses its CopyData value and m.Data points into
			// the frame reader's buffers: a large body was read into one of
			// its own, anything else is copied before it escapes.
			if c.frames.owned {
				b := m.Data
				m.Data = nil // the Backend keeps m for the next CopyData: not the payload
				return b, nil
			}
			return append([]byte(nil), m.Data...), nil
		case *pgproto3.CopyDone:
			return nil, ErrCopyDone
		case *pgproto3.CopyFail:
			return nil, Errorf(QueryCanceled, "COPY from stdin failed: %s", m.Message)
		case *pgproto3.Terminate:
			c.readErr = io.EOF
			return nil, io.EOF
		case *pgproto3.Flush, *pgproto3.Sync:
		default:
			return nil, Errorf(ProtocolViolation, "unexpected message type %s during COPY", messageName(msg))
		}
	}
}

// SendCopyData buffers one CopyData carrying payload.
func (c *Conn) SendCopyData(payload []byte) error {
	return c.sendFrame('d', func(dst []byte) []byte { return append(dst, payload...) })
}

// SendCopyDone buffers CopyDone: the server's half of the COPY is over.
func (c *Conn) SendCopyDone() error {
	return c.send(&pgproto3.CopyDone{})
}

// SendXLogData buffers one CopyData carrying m as an XLogData ('w') message.
// The WAL bytes are copied once, straight into the output buffer.
func (c *Conn) SendXLogData(m *XLogData) error {
	return c.sendFrame('d', m.Append)
}

// SendKeepalive buffers one CopyData carrying m as a primary keepalive ('k').
func (c *Conn) SendKeepalive(m *PrimaryKeepalive) error {
	return c.sendFrame('d', m.Append)
}
