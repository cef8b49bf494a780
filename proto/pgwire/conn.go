package pgwire

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgproto3/v2"

	"github.com/safekeeper/safekeeper/proto/netq"
)

// Startup packet codes (the int32 after the length of the first packet).
const (
	protocolVersion30 = 3 << 16  // 196608, protocol 3.0
	sslRequestCode    = 80877103 // 1234.5679
	gssEncRequestCode = 80877104 // 1234.5680
	cancelRequestCode = 80877102 // 1234.5678

	// maxStartupPacketLen is MAX_STARTUP_PACKET_LENGTH of PostgreSQL: the
	// largest startup packet accepted, length word included.
	maxStartupPacketLen = 10000
)

// ErrCancelRequest is returned by Accept when the client sent a CancelRequest.
// The connection has been closed: this server does not cancel anything.
var ErrCancelRequest = errors.New("pgwire: cancel request received")

// ErrCopyDone is returned by ReadCopy when the client sent CopyDone.
var ErrCopyDone = errors.New("pgwire: client sent CopyDone")

// errCleanEOF marks an end of stream at a message boundary inside the reader;
// receive turns it into io.EOF (pgproto3 would call it io.ErrUnexpectedEOF).
var errCleanEOF = errors.New("pgwire: clean end of stream")

// AcceptOptions configures Accept. The zero value is usable.
type AcceptOptions struct {
	// StartupTimeout bounds the whole startup phase: from Accept until Ready
	// has flushed its messages (PostgreSQL's authentication_timeout). It is
	// set as the net.Conn's deadline. Default 10s.
	StartupTimeout time.Duration

	// TLSConfig, when set, makes the server answer an SSLRequest with 'S' and
	// run a TLS handshake; nil answers 'N' (no TLS) and the client goes on in
	// plain text on the same socket.
	TLSConfig *tls.Config

	// MaxMessageSize is the largest body of a frontend message (after
	// startup) accepted by ReadQuery and ReadCopy; longer ones are a
	// protocol violation, detected before their body is read or allocated.
	// Default 1 MiB (a WAL push SafeKeeperRequest is at most ~128 KiB).
	MaxMessageSize int

	// WriteBufferSize is the number of buffered output bytes past which a
	// Send* call flushes by itself. Default 64 KiB.
	WriteBufferSize int

	// WriteTimeout, when positive, is set as the write deadline of every
	// Flush after the startup phase, so a client that stops reading cannot
	// block a writer forever. Zero means no write deadline.
	WriteTimeout time.Duration
}

func (o AcceptOptions) withDefaults() AcceptOptions {
	if o.StartupTimeout <= 0 {
		o.StartupTimeout = 10 * time.Second
	}
	if o.MaxMessageSize <= 0 {
		o.MaxMessageSize = 1 << 20
	}
	if o.WriteBufferSize <= 0 {
		o.WriteBufferSize = 64 << 10
	}
	return o
}

// Param is one ParameterStatus (a server setting reported to the client).
type Param struct {
	Name, Value string
}

// BackendKey is the process id and secret key of BackendKeyData, which a
// client would use in a CancelRequest.
type BackendKey struct {
	ProcessID uint32
	SecretKey uint32
}

// Conn is the server side of one PostgreSQL protocol 3.0 connection after a
// successful startup. See the package documentation for the lifecycle and the
// concurrency rules.
type Conn struct {
	nc     net.Conn // the socket, or the *tls.Conn around it
	isTLS  bool
	opts   AcceptOptions
	params map[string]string

	// Reader side: used only by the single reader goroutine.
	backend *pgproto3.Backend
	frames  *frameReader
	readErr error        // sticky: the stream cannot be read any further
	sock    *netq.Socket // the socket, for Pending and SendBacklog (nil until asked)

	// Writer side, safe for concurrent use.
	flushMu sync.Mutex // serialises nc.Write; held across the syscall
	mu      sync.Mutex // guards buf, spare, werr; never held across IO
	buf     []byte
	spare   []byte
	werr    error
	ready   atomic.Bool // Ready has run: the startup deadline is lifted
}

// Accept runs the server side of connection startup on nc: it reads the
// first packet; answers SSLRequest (with 'S' and a TLS handshake when
// opts.TLSConfig is set, else 'N') and GSSENCRequest ('N'), each at most once,
// and reads the next packet on the same connection; and returns a *Conn for a
// protocol 3.x StartupMessage. Nothing has been sent to the client yet:
// authenticate if needed, then call Ready (or SendError, Flush and Close).
//
// A CancelRequest closes nc and returns an error wrapping ErrCancelRequest. A
// malformed, oversized or unsupported startup packet is answered with a FATAL
// ErrorResponse and returned as an *Error. A client asking for protocol 3.1+
// or sending _pq_.* options is answered with NegotiateProtocolVersion (3.0)
// and accepted. On any error nc is closed. The whole phase is bounded by
// opts.StartupTimeout.
func Accept(nc net.Conn, opts AcceptOptions) (*Conn, error) {
	opts = opts.withDefaults()
	if err := nc.SetDeadline(time.Now().Add(opts.StartupTimeout)); err != nil {
		nc.Close()
		return nil, fmt.Errorf("pgwire: startup: %w", err)
	}
	c, err := accept(nc, opts)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

func accept(nc net.Conn, opts AcceptOptions) (*Conn, error) {
	conn := nc
	isTLS := false
	sslDone, gssDone := false, false
	// At most three packets: SSLRequest and GSSENCRequest are each answered
	// once; a repeated one falls to the "unsupported protocol" branch.
	for {
		body, err := readStartupPacket(conn)
		if err != nil {
			return nil, startupFailed(conn, err)
		}
		code := binary.BigEndian.Uint32(body)
		switch {
		case code == sslRequestCode && !sslDone && len(body) == 4:
			sslDone = true
			if opts.TLSConfig == nil {
				if _, err := conn.Write([]byte{'N'}); err != nil {
					return nil, fmt.Errorf("pgwire: startup: answering SSLRequest: %w", err)
				}
				continue
			}
			if _, err := conn.Write([]byte{'S'}); err != nil {
				return nil, fmt.Errorf("pgwire: startup: answering SSLRequest: %w", err)
			}
			// readStartupPacket reads no further than the packet, so no
			// plain-text bytes sent after the SSLRequest can leak into the
			// TLS session (CVE-2021-23214).
			tc := tls.Server(nc, opts.TLSConfig)
			if err := tc.Handshake(); err != nil {
				return nil, fmt.Errorf("pgwire: startup: TLS handshake: %w", err)
			}
			conn, isTLS = tc, true
		case code == gssEncRequestCode && !gssDone && len(body) == 4:
			gssDone = true
			if _, err := conn.Write([]byte{'N'}); err != nil {
				return nil, fmt.Errorf("pgwire: startup: answering GSSENCRequest: %w", err)
			}
		case code == cancelRequestCode:
			if len(body) != 12 {
				return nil, startupFailed(conn, Errorf(ProtocolViolation, "invalid length of cancel request packet: %d", len(body)+4).fatal())
			}
			return nil, fmt.Errorf("%w (process %d)", ErrCancelRequest, binary.BigEndian.Uint32(body[4:]))
		case code>>16 == 3:
			params, unknown, err := parseStartupParams(body[4:])
			if err != nil {
				return nil, startupFailed(conn, err)
			}
			if params["user"] == "" {
				return nil, startupFailed(conn, Errorf(InvalidAuthorizationSpecification, "no PostgreSQL user name specified in startup packet").fatal())
			}
			c := newConn(conn, isTLS, opts, params)
			if minor := code & 0xffff; minor > 0 || len(unknown) > 0 {
				if err := c.negotiateProtocolVersion(unknown); err != nil {
					return nil, err
				}
			}
			return c, nil
		default:
			return nil, startupFailed(conn, Errorf(FeatureNotSupported,
				"unsupported frontend protocol %d.%d: server supports 3.0 to 3.0", code>>16, code&0xffff).fatal())
		}
	}
}

// readStartupPacket reads one length-prefixed startup packet with exact-size
// reads (no read-ahead) and returns its body after the length word.
func readStartupPacket(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, fmt.Errorf("pgwire: startup: reading packet length: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 8 || n > maxStartupPacketLen {
		return nil, Errorf(ProtocolViolation, "invalid length of startup packet: %d", n).fatal()
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("pgwire: startup: reading packet body: %w", err)
	}
	return body, nil
}

// parseStartupParams parses the name/value pairs of a StartupMessage (after
// the version word): NUL-terminated strings, ended by an empty name. Keys
// starting with "_pq_." are protocol options; they are returned apart.
func parseStartupParams(b []byte) (map[string]string, []string, error) {
	params := make(map[string]string)
	var unknown []string
	for {
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			return nil, nil, Errorf(ProtocolViolation, "invalid startup packet layout: expected terminator as last byte").fatal()
		}
		if i == 0 {
			if len(b) != 1 {
				return nil, nil, Errorf(ProtocolViolation, "invalid startup packet layout: expected terminator as last byte").fatal()
			}
			return params, unknown, nil
		}
		name := string(b[:i])
		b = b[i+1:]
		j := bytes.IndexByte(b, 0)
		if j < 0 {
			return nil, nil, Errorf(ProtocolViolation, "invalid startup packet layout: expected terminator as last byte").fatal()
		}
		if strings.HasPrefix(name, "_pq_.") {
			unknown = append(unknown, name)
		} else {
			params[name] = string(b[:j])
		}
		b = b[j+1:]
	}
}

// startupFailed answers a startup protocol error with a FATAL ErrorResponse
// (best effort: the client may be gone) and returns err.
func startupFailed(w io.Writer, err error) error {
	var e *Error
	if !errors.As(err, &e) {
		return err // an I/O error: nobody to answer
	}
	buf, encErr := errorResponse(e, SeverityFatal).Encode(nil)
	if encErr == nil {
		w.Write(buf) //nolint:errcheck // best effort, the error returned is err
	}
	return err
}

func newConn(nc net.Conn, isTLS bool, opts AcceptOptions, params map[string]string) *Conn {
	fr := &frameReader{src: countingReader{r: nc}, max: opts.MaxMessageSize}
	return &Conn{
		nc:      nc,
		isTLS:   isTLS,
		opts:    opts,
		params:  params,
		frames:  fr,
		backend: pgproto3.NewBackend(fr, noWriter{}),
	}
}

// negotiateProtocolVersion sends NegotiateProtocolVersion ('v'): newest minor
// version supported (0), then the protocol options not recognised. pgproto3
// v2 has no type for this message, so it is encoded here.
func (c *Conn) negotiateProtocolVersion(unknown []string) error {
	c.mu.Lock()
	c.buf, _ = appendFrame(c.buf, 'v', func(dst []byte) []byte {
		dst = binary.BigEndian.AppendUint32(dst, 0)
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(unknown)))
		for _, u := range unknown {
			dst = append(dst, u...)
			dst = append(dst, 0)
		}
		return dst
	})
	c.mu.Unlock()
	return c.Flush()
}

// Params returns a copy of the StartupMessage parameters (user, database,
// replication, options, application_name, ...). Protocol options (_pq_.*)
// are not included.
func (c *Conn) Params() map[string]string {
	m := make(map[string]string, len(c.params))
	for k, v := range c.params {
		m[k] = v
	}
	return m
}

// TLS reports whether the connection runs over TLS.
func (c *Conn) TLS() bool { return c.isTLS }

// RemoteAddr returns the client's address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// SetReadDeadline sets the deadline for ReadQuery and ReadCopy. A read that
// times out leaves the connection usable: a partly received message is kept
// and completed by the next read.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.nc.SetReadDeadline(t) }

// Close closes the connection without sending anything (buffered output is
// dropped; Flush first). It unblocks a concurrent ReadQuery or ReadCopy.
func (c *Conn) Close() error { return c.nc.Close() }

// Ready ends the startup phase: it sends AuthenticationOk, one
// ParameterStatus per param in order, BackendKeyData if key is not nil and
// ReadyForQuery (idle), flushes them and lifts the startup deadline.
func (c *Conn) Ready(params []Param, key *BackendKey) error {
	msgs := []pgproto3.BackendMessage{&pgproto3.AuthenticationOk{}}
	for _, p := range params {
		msgs = append(msgs, &pgproto3.ParameterStatus{Name: cstring(p.Name), Value: cstring(p.Value)})
	}
	if key != nil {
		msgs = append(msgs, &pgproto3.BackendKeyData{ProcessID: key.ProcessID, SecretKey: key.SecretKey})
	}
	msgs = append(msgs, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := c.send(msgs...); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return err
	}
	c.ready.Store(true)
	if err := c.nc.SetDeadline(time.Time{}); err != nil {
		return fmt.Errorf("pgwire: clearing startup deadline: %w", err)
	}
	return nil
}

// WalsenderParams returns the 13 ParameterStatus settings a PostgreSQL 15
// walsender reports after authentication, in the order it sends them
// (docs/serving.md, Connections). serverVersion should be "15.x..."
// (pg_receivewal picks its commands from it); application_name and
// session_authorization are taken from the startup parameters. Callers may
// change entries (for example in_hot_standby) before passing it to Ready.
func WalsenderParams(serverVersion string, startup map[string]string) []Param {
	clientEncoding := "SQL_ASCII"
	if e := strings.ToUpper(strings.ReplaceAll(startup["client_encoding"], "-", "")); e == "UTF8" || e == "UNICODE" {
		clientEncoding = "UTF8"
	}
	return []Param{
		{"application_name", startup["application_name"]},
		{"client_encoding", clientEncoding},
		{"DateStyle", "ISO, MDY"},
		{"default_transaction_read_only", "off"},
		{"in_hot_standby", "off"},
		{"integer_datetimes", "on"}, // required by pg_receivewal and pg_basebackup
		{"IntervalStyle", "postgres"},
		{"is_superuser", "on"},
		{"server_encoding", "SQL_ASCII"},
		{"server_version", serverVersion}, // required: PQserverVersion() reads it
		{"session_authorization", startup["user"]},
		{"standard_conforming_strings", "on"},
		{"TimeZone", "UTC"},
	}
}

// ---------------------------------------------------------------------------
// Writer side.

// send encodes msgs into the output buffer, flushing if it grew past
// opts.WriteBufferSize.
func (c *Conn) send(msgs ...pgproto3.BackendMessage) error {
	c.mu.Lock()
	if c.werr != nil {
		c.mu.Unlock()
		return c.werr
	}
	for _, m := range msgs {
		b, err := m.Encode(c.buf)
		if err != nil {
			c.mu.Unlock()
			return fmt.Errorf("pgwire: encoding %T: %w", m, err)
		}
		c.buf = b
	}
	full := len(c.buf) >= c.opts.WriteBufferSize
	c.mu.Unlock()
	if full {
		return c.Flush()
	}
	return nil
}

// sendFrame appends one message of type typ whose body is written by body,
// flushing if the buffer grew past opts.WriteBufferSize.
func (c *Conn) sendFrame(typ byte, body func(dst []byte) []byte) error {
	c.mu.Lock()
	if c.werr != nil {
		c.mu.Unlock()
		return c.werr
	}
	b, err := appendFrame(c.buf, typ, body)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	c.buf = b
	full := len(c.buf) >= c.opts.WriteBufferSize
	c.mu.Unlock()
	if full {
		return c.Flush()
	}
	return nil
}

// maxMessageBodyLen is PostgreSQL's PG_LARGE_MESSAGE_LIMIT (MaxAllocSize-1).
const maxMessageBodyLen = 0x3fffffff - 1

// appendFrame appends type byte, length word and body to dst. On error dst is
// returned unchanged in length.
func appendFrame(dst []byte, typ byte, body func(dst []byte) []byte) ([]byte, error) {
	start := len(dst)
	dst = append(dst, typ, 0, 0, 0, 0)
	dst = body(dst)
	n := len(dst) - start - 1
	if n > maxMessageBodyLen {
		return dst[:start], fmt.Errorf("pgwire: message %q of %d bytes is too large", typ, n)
	}
	binary.BigEndian.PutUint32(dst[start+1:], uint32(n))
	return dst, nil
}

// maxRetainedBuffer is the largest output buffer kept for reuse after Flush.
const maxRetainedBuffer = 1 << 20

// Flush writes all buffered messages to the connection in one write. It is
// safe to call from any goroutine; messages buffered by other goroutines
// while a Flush is writing go out with the next Flush. A write error is
// sticky: later Send* and Flush calls return it.
func (c *Conn) Flush() error {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()

	c.mu.Lock()
	if c.werr != nil {
		c.mu.Unlock()
		return c.werr
	}
	if len(c.buf) == 0 {
		c.mu.Unlock()
		return nil
	}
	out := c.buf
	c.buf, c.spare = c.spare[:0], nil
	c.mu.Unlock()

	var err error
	if c.opts.WriteTimeout > 0 && c.ready.Load() {
		err = c.nc.SetWriteDeadline(time.Now().Add(c.opts.WriteTimeout))
	}
	if err == nil {
		_, err = c.nc.Write(out)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.werr = fmt.Errorf("pgwire: write: %w", err)
		return c.werr
	}
	if cap(out) <= maxRetainedBuffer {
		c.spare = out[:0]
	}
	return nil
}

// noWriter is the Backend's writer: every write goes through Conn's buffer,
// never through pgproto3's unbuffered Backend.Send.
type noWriter struct{}

func (noWriter) Write([]byte) (int, error) {
	return 0, errors.New("pgwire: internal error: write through pgproto3.Backend")
}

// ---------------------------------------------------------------------------
// Reader side.

// countingReader counts the bytes read from the socket.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// frameReader is the pgproto3.ChunkReader given to the Backend. It adds what
// pgproto3 v2 lacks: a limit on message bodies (checked before the body is
// allocated), the difference between a connection closed at a message
// boundary (errCleanEOF) and one closed inside a message, the type byte of
// the last message (for PostgreSQL's error texts), PostgreSQL's checks of a
// Query's string, and only bodies pgproto3 v2 can decode: several of its
// decoders index short or lying bodies unchecked and panic (an empty Query,
// an empty FunctionCall or a Bind with a negative length would take the
// whole server down). So a Query or CopyFail whose string is malformed, and
// every message of the extended query protocol and FunctionCall (refused by
// type, as a walsender refuses them before it reads their fields), reach
// pgproto3 as a valid placeholder body.
//
// Backend.Receive calls Next for a 5-byte header, then for the body, and
// retries the same call after an error (a timeout), so the calls alternate.
//
// It buffers the socket itself (pgproto3's ChunkReader grows its one buffer
// to the largest message ever read and keeps it: 128 KiB and more per idle
// WAL push connection). Headers and small bodies come from a small read-ahead
// buffer; a body larger than that is read into a buffer of its own, exactly
// its size, which the caller may keep (owned): ReadCopy hands it on without
// copying it again.
type frameReader struct {
	src countingReader
	// buf[rp:wp] is read from the socket and not yet returned.
	buf    []byte
	rp, wp int
	// big is a large body being read (its first bigN bytes are in), kept
	// across a timeout so that the retried Next goes on where it stopped.
	big   []byte
	bigN  int
	owned bool // the last body returned is big: not aliased by the reader

	max      int
	consumed int64
	body     bool // the next Next call reads a message body
	typ      byte // type byte of the last header read

	// badQuery is the error of the last Query body read, whole but
	// malformed; pgproto3 was given an empty query instead (its decoder
	// panics on an empty body). receive returns it.
	badQuery *Error
}

// Placeholder bodies handed to pgproto3: an empty string (Query, CopyFail),
// and for the messages refused by type, the smallest valid body of each.
var (
	emptyStringBody = []byte{0}
	refusedBodies   = map[byte][]byte{
		'P': make([]byte, 1+1+2),     // Parse: name, query, 0 parameter types
		'B': make([]byte, 1+1+2+2+2), // Bind: portal, statement, 0 formats, 0 parameters, 0 result formats
		'D': {'S', 0},                // Describe: statement ""
		'E': make([]byte, 1+4),       // Execute: portal "", no row limit
		'C': {'S', 0},                // Close: statement ""
		'F': make([]byte, 4+2+2+2),   // FunctionCall: function 0, no arguments, text result
	}
)

// readBufSize is the frameReader's read-ahead buffer: headers and bodies up
// to this size are read through it.
const readBufSize = 8 << 10

func (f *frameReader) Next(n int) ([]byte, error) {
	if f.body && n > f.max {
		return nil, Errorf(ProtocolViolation, "invalid message length: %d bytes exceeds the limit of %d", n, f.max).fatal()
	}
	buf, err := f.next(n)
	if err != nil {
		if err == io.EOF && (f.body || f.consumed != f.src.n) {
			err = io.ErrUnexpectedEOF
		}
		if !f.body && err == io.EOF {
			return nil, errCleanEOF
		}
		return nil, err
	}
	f.consumed += int64(n)
	if !f.body {
		f.typ = buf[0]
	} else {
		switch f.typ {
		case 'Q':
			if e := checkString(buf); e != nil {
				f.badQuery, buf = e, emptyStringBody
			}
		case 'f':
			if checkString(buf) != nil {
				buf = emptyStringBody // "COPY from stdin failed: " all the same
			}
		default:
			if b, ok := refusedBodies[f.typ]; ok {
				buf = b
			}
		}
	}
	f.body = !f.body
	return buf, nil
}

// next returns the next n bytes of the stream. On an error the bytes read so
// far are kept and the same call may be retried.
func (f *frameReader) next(n int) ([]byte, error) {
	f.owned = false
	if n > readBufSize {
		if f.big == nil {
			f.big = newBody(n)
			f.bigN = copy(f.big, f.buf[f.rp:f.wp])
			f.rp += f.bigN
		}
		for f.bigN < n {
			m, err := f.src.Read(f.big[f.bigN:])
			f.bigN += m
			if err != nil && f.bigN < n {
				return nil, err
			}
		}
		b := f.big
		f.big, f.bigN, f.owned = nil, 0, true
		return b, nil
	}
	if err := f.fill(n); err != nil {
		return nil, err
	}
	b := f.buf[f.rp : f.rp+n : f.rp+n]
	f.rp += n
	if f.rp == f.wp {
		f.rp, f.wp = 0, 0
	}
	return b, nil
}

// fill reads until at least n ≤ len(buf) bytes are buffered.
func (f *frameReader) fill(n int) error {
	if f.buf == nil {
		f.buf = make([]byte, readBufSize)
	}
	if f.wp-f.rp < n && len(f.buf)-f.rp < n {
		f.wp = copy(f.buf, f.buf[f.rp:f.wp])
		f.rp = 0
	}
	for f.wp-f.rp < n {
		m, err := f.src.Read(f.buf[f.wp:])
		f.wp += m
		if err != nil && f.wp-f.rp < n {
			if err == io.EOF && f.wp > f.rp {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// PeekMessage waits for the header of the next message from the client and
// returns its type byte and body length, without consuming it: the next
// ReadCopy or ReadQuery reads the message. A caller can so reserve memory
// for a body before it is read. On an error nothing is consumed either, and
// the next read reports it. Call it only from the reader goroutine, between
// messages.
func (c *Conn) PeekMessage() (typ byte, bodyLen int, err error) {
	if c.readErr != nil {
		return 0, 0, c.readErr
	}
	f := c.frames
	if f.body {
		return 0, 0, errors.New("pgwire: PeekMessage inside a message")
	}
	if err := f.fill(5); err != nil {
		return 0, 0, err
	}
	h := f.buf[f.rp : f.rp+5]
	return h[0], int(binary.BigEndian.Uint32(h[1:])) - 4, nil
}

// checkString applies PostgreSQL's checks to a body holding one string: it
// ends at the body's last byte (pq_getmsgstring, then pq_getmsgend).
func checkString(body []byte) *Error {
	switch i := bytes.IndexByte(body, 0); {
	case i < 0:
		return Errorf(ProtocolViolation, "invalid string in message")
	case i != len(body)-1:
		return Errorf(ProtocolViolation, "invalid message format")
	}
	return nil
}

// isFrontendType reports whether typ is a message type pgproto3's Backend
// decodes after startup.
func isFrontendType(typ byte) bool {
	return bytes.IndexByte([]byte("BCDEFfdcHPpQSX"), typ) >= 0
}

// errFrontendType is PostgreSQL's error for a message type it does not take
// (SocketBackend, PostgresMain): the framing may be lost, so it is FATAL.
func errFrontendType(typ byte) *Error {
	return Errorf(ProtocolViolation, "invalid frontend message type %d", typ).fatal()
}

// receive returns the next frontend message. The message is valid only until
// the next receive. Errors other than timeouts and a malformed Query
// (ERROR 08P01, read whole: the framing is intact) are sticky.
func (c *Conn) receive() (pgproto3.FrontendMessage, error) {
	if c.readErr != nil {
		return nil, c.readErr
	}
	msg, err := c.backend.Receive()
	if bad := c.frames.badQuery; bad != nil {
		c.frames.badQuery = nil
		if err == nil {
			return nil, bad
		}
	}
	if err == nil {
		return msg, nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil, err // resumable: partial data is kept
	}
	var (
		e  *Error
		oe *net.OpError
	)
	switch {
	case errors.Is(err, errCleanEOF):
		err = io.EOF
	case errors.Is(err, io.ErrUnexpectedEOF):
		err = fmt.Errorf("pgwire: connection closed inside a message: %w", io.ErrUnexpectedEOF)
	case errors.As(err, &oe): // the socket failed (a reset): not the client's framing
		err = fmt.Errorf("pgwire: read: %w", err)
	case errors.As(err, &e):
	case msg != nil: // a known message type with a bad body
		err = &Error{Severity: SeverityFatal, Code: ProtocolViolation, Message: fmt.Sprintf("invalid %s message: %v", messageName(msg), err), cause: err}
	case !isFrontendType(c.frames.typ): // its body is still unread
		err = errFrontendType(c.frames.typ)
	default: // a length word below 4
		err = &Error{Severity: SeverityFatal, Code: ProtocolViolation, Message: "invalid message length", cause: err}
	}
	c.readErr = err
	return nil, err
}

// messageName is the protocol name of a frontend message type.
func messageName(m pgproto3.FrontendMessage) string {
	return strings.TrimPrefix(fmt.Sprintf("%T", m), "*pgproto3.")
}

// CloseLingering closes the connection once what was written has reached
// the client: it shuts down the sending side (over TLS, close_notify
// first; a FIN follows the data already written), then reads and discards
// what the client still sends until the client's kernel has acknowledged
// everything written, or grace passes, and closes. Closing at once while
// the client's data lies unread makes the kernel reset the connection and
// drop what was written and not yet delivered — the ErrorResponse that
// says why the server ends it, when the client (a proposer streaming WAL)
// is behind in reading our earlier replies. Data acknowledged is the
// client's to read even after a reset. Call it once nothing more is to be
// written.
func (c *Conn) CloseLingering(grace time.Duration) {
	defer c.nc.Close()
	if t, ok := c.nc.(*tls.Conn); ok {
		_ = t.CloseWrite()
	}
	nc := c.nc
	for range 8 {
		if _, isTLS := nc.(*tls.Conn); !isTLS {
			if cw, ok := nc.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
				break
			}
		}
		w, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		nc = w.NetConn()
	}
	sock := netq.Of(c.nc)
	deadline := time.Now().Add(grace)
	var buf []byte
	for time.Now().Before(deadline) {
		if n, ok := sock.Unsent(); !ok || n == 0 {
			return
		}
		if buf == nil {
			buf = make([]byte, 32<<10)
		}
		if c.nc.SetReadDeadline(time.Now().Add(time.Millisecond)) != nil {
			return
		}
		if _, err := c.nc.Read(buf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return // the client closed or reset: nothing more can be delivered
		}
	}
}
