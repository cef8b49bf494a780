package pgwire

import (
	"github.com/jackc/pgproto3/v2"
)

// maxPasswordMessage is the largest PasswordMessage body taken: PostgreSQL's
// PG_MAX_AUTH_TOKEN_LENGTH (65535) bounds the message length word, which
// counts itself (4 bytes) but not the type byte.
const maxPasswordMessage = 65535 - 4

// RequestPassword asks the client for a cleartext password
// (AuthenticationCleartextPassword, as pg_hba.conf's "password" method) and
// returns what it sends in its PasswordMessage. It belongs to the startup
// phase: call it after Accept and before Ready, under the startup deadline.
// A client that sends anything else gets PostgreSQL's FATAL 08P01, and so
// does a PasswordMessage longer than PostgreSQL takes (maxPasswordMessage),
// refused from its length word before its body is read: before
// authentication a client may not make the server allocate more.
//
// Only over TLS is the password safe from the network; the caller decides
// whether to ask without it.
func (c *Conn) RequestPassword() (string, error) {
	if err := c.send(&pgproto3.AuthenticationCleartextPassword{}); err != nil {
		return "", err
	}
	if err := c.Flush(); err != nil {
		return "", err
	}
	if err := c.backend.SetAuthType(pgproto3.AuthTypeCleartextPassword); err != nil {
		return "", err
	}
	c.frames.max = min(c.frames.max, maxPasswordMessage)
	msg, err := c.receive()
	c.frames.max = c.opts.MaxMessageSize
	if err != nil {
		return "", err
	}
	pm, ok := msg.(*pgproto3.PasswordMessage)
	if !ok {
		e := Errorf(ProtocolViolation, "expected password response, got message type %s", messageName(msg)).fatal()
		c.readErr = e
		return "", e
	}
	return pm.Password, nil
}
