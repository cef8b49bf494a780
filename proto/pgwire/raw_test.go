package pgwire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgproto3/v2"
)

// Wire-level tests: the client side is hand-written bytes plus pgproto3 v2's
// Frontend (allowed in this package's tests only).

// socketPair returns both ends of a real TCP connection on 127.0.0.1.
func socketPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- nil
			return
		}
		ch <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-ch
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	// No test may hang: every blocking read on the client side has a deadline.
	client.SetDeadline(time.Now().Add(10 * time.Second))
	return client, server
}

// packet builds a startup-phase packet: length, code, body.
func packet(code uint32, body ...byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(8+len(body)))
	b = binary.BigEndian.AppendUint32(b, code)
	return append(b, body...)
}

func startupBody(kv ...string) []byte {
	var b []byte
	for _, s := range kv {
		b = append(b, s...)
		b = append(b, 0)
	}
	return append(b, 0)
}

func acceptAsync(server net.Conn, opts AcceptOptions) <-chan acceptResult {
	ch := make(chan acceptResult, 1)
	go func() {
		c, err := Accept(server, opts)
		ch <- acceptResult{c, err}
	}()
	return ch
}

func readByte(t *testing.T, r io.Reader) byte {
	t.Helper()
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		t.Fatal(err)
	}
	return b[0]
}

func frontend(client net.Conn) *pgproto3.Frontend {
	return pgproto3.NewFrontend(pgproto3.NewChunkReader(client), client)
}

func receive(t *testing.T, fe *pgproto3.Frontend) pgproto3.BackendMessage {
	t.Helper()
	m, err := fe.Receive()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// ready runs a full startup on a socket pair and returns the client side
// (after ReadyForQuery) and the server's Conn.
func ready(t *testing.T, opts AcceptOptions) (net.Conn, *pgproto3.Frontend, *Conn) {
	t.Helper()
	client, server := socketPair(t)
	res := acceptAsync(server, opts)
	client.Write(packet(protocolVersion30, startupBody("user", "bob", "replication", "true")...))
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := r.c.Ready([]Param{{"server_version", "15.18"}}, nil); err != nil {
		t.Fatal(err)
	}
	fe := frontend(client)
	for {
		if _, ok := receive(t, fe).(*pgproto3.ReadyForQuery); ok {
			return client, fe, r.c
		}
	}
}

// libpq's way: SSLRequest, 'N', then the StartupMessage on the same socket;
// a GSSENCRequest in between is refused the same way.
func TestAcceptSSLAndGSSRequestsOnSameSocket(t *testing.T) {
	client, server := socketPair(t)
	res := acceptAsync(server, AcceptOptions{})
	client.Write(packet(sslRequestCode))
	if b := readByte(t, client); b != 'N' {
		t.Fatalf("SSLRequest answered %q", b)
	}
	client.Write(packet(gssEncRequestCode))
	if b := readByte(t, client); b != 'N' {
		t.Fatalf("GSSENCRequest answered %q", b)
	}
	client.Write(packet(protocolVersion30, startupBody("user", "postgres", "database", "replication",
		"replication", "true", "options", `-c wal_sender_timeout=30s`, "application_name", "standby1")...))
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	p := r.c.Params()
	if p["user"] != "postgres" || p["replication"] != "true" || p["application_name"] != "standby1" || p["options"] != "-c wal_sender_timeout=30s" {
		t.Errorf("params = %v", p)
	}
	if r.c.TLS() {
		t.Error("TLS() = true")
	}
	params := WalsenderParams("15.18 (Debian 15.18-0+deb12u1)", p)
	if len(params) != 13 {
		t.Errorf("%d ParameterStatus, want 13", len(params))
	}
	if err := r.c.Ready(params, &BackendKey{ProcessID: 1, SecretKey: 2}); err != nil {
		t.Fatal(err)
	}
	fe := frontend(client)
	if _, ok := receive(t, fe).(*pgproto3.AuthenticationOk); !ok {
		t.Fatal("want AuthenticationOk")
	}
	for i, want := range params {
		ps, ok := receive(t, fe).(*pgproto3.ParameterStatus)
		if !ok || ps.Name != want.Name || ps.Value != want.Value {
			t.Fatalf("ParameterStatus %d = %+v, want %+v", i, ps, want)
		}
	}
	if bk, ok := receive(t, fe).(*pgproto3.BackendKeyData); !ok || bk.ProcessID != 1 || bk.SecretKey != 2 {
		t.Fatalf("BackendKeyData = %+v", bk)
	}
	if rfq, ok := receive(t, fe).(*pgproto3.ReadyForQuery); !ok || rfq.TxStatus != 'I' {
		t.Fatalf("ReadyForQuery = %+v", rfq)
	}
}

func TestAcceptCancelRequest(t *testing.T) {
	client, server := socketPair(t)
	res := acceptAsync(server, AcceptOptions{})
	client.Write(packet(cancelRequestCode, 0, 0, 0, 7, 0, 0, 0, 9))
	if r := <-res; !errors.Is(r.err, ErrCancelRequest) {
		t.Fatalf("err = %v, want ErrCancelRequest", r.err)
	}
	if n, err := client.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after cancel = %d, %v; want EOF (closed)", n, err)
	}
}

// Bad startup packets get a FATAL ErrorResponse with the SQLSTATE, and Accept
// returns the same *Error.
func TestAcceptBadStartupPackets(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes []byte
		code  string
	}{
		{"length too small", []byte{0, 0, 0, 4, 0, 3, 0, 0}, ProtocolViolation},
		{"length too large", []byte{0, 1, 0, 0, 0, 3, 0, 0}, ProtocolViolation},
		{"protocol 2.0", packet(2<<16, startupBody("user", "x")...), FeatureNotSupported},
		{"protocol 4.0", packet(4<<16, startupBody("user", "x")...), FeatureNotSupported},
		{"no terminator", packet(protocolVersion30, []byte("user\x00x\x00")...), ProtocolViolation},
		{"value missing", packet(protocolVersion30, []byte("user\x00")...), ProtocolViolation},
		{"bytes after terminator", packet(protocolVersion30, []byte("user\x00x\x00\x00z")...), ProtocolViolation},
		{"no user", packet(protocolVersion30, startupBody("database", "replication")...), InvalidAuthorizationSpecification},
		{"empty user", packet(protocolVersion30, startupBody("user", "")...), InvalidAuthorizationSpecification},
		{"bad cancel length", packet(cancelRequestCode, 1, 2, 3), ProtocolViolation},
		{"repeated SSLRequest", append(packet(sslRequestCode), packet(sslRequestCode)...), FeatureNotSupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server := socketPair(t)
			res := acceptAsync(server, AcceptOptions{})
			client.Write(tc.bytes)
			r := <-res
			var e *Error
			if !errors.As(r.err, &e) || e.Code != tc.code || e.Severity != SeverityFatal {
				t.Fatalf("err = %v, want FATAL %s", r.err, tc.code)
			}
			if bytes.HasPrefix(tc.bytes, packet(sslRequestCode)) {
				if b := readByte(t, client); b != 'N' {
					t.Fatalf("first SSLRequest answered %q", b)
				}
			}
			er, ok := receive(t, frontend(client)).(*pgproto3.ErrorResponse)
			if !ok || er.Code != tc.code || er.Severity != "FATAL" || er.Message != e.Message {
				t.Fatalf("client got %+v", er)
			}
		})
	}
}

// Protocol 3.2 and _pq_ options: NegotiateProtocolVersion (newest minor 0,
// the unknown options), then the usual startup.
func TestAcceptNegotiatesProtocolVersion(t *testing.T) {
	client, server := socketPair(t)
	res := acceptAsync(server, AcceptOptions{})
	client.Write(packet(3<<16|2, startupBody("user", "bob", "_pq_.fancy", "1")...))
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if _, ok := r.c.Params()["_pq_.fancy"]; ok {
		t.Error("_pq_ option in Params")
	}
	want := []byte{'v', 0, 0, 0, 23, 0, 0, 0, 0, 0, 0, 0, 1}
	want = append(want, "_pq_.fancy\x00"...)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("NegotiateProtocolVersion = %q, %v; want %q", got, err, want)
	}
}

// The startup phase has a deadline: a client that sends nothing is dropped.
func TestAcceptStartupTimeout(t *testing.T) {
	_, server := socketPair(t)
	start := time.Now()
	_, err := Accept(server, AcceptOptions{StartupTimeout: 50 * time.Millisecond})
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err = %v, want a timeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

// deadlineConn records the deadlines set on a connection.
type deadlineConn struct {
	net.Conn
	mu        sync.Mutex
	deadlines []time.Time
}

func (d *deadlineConn) SetDeadline(t time.Time) error {
	d.mu.Lock()
	d.deadlines = append(d.deadlines, t)
	d.mu.Unlock()
	return d.Conn.SetDeadline(t)
}

// Accept sets the startup deadline; Ready lifts it after flushing.
func TestStartupDeadlineSetByAcceptLiftedByReady(t *testing.T) {
	client, server := socketPair(t)
	dc := &deadlineConn{Conn: server}
	before := time.Now()
	res := acceptAsync(dc, AcceptOptions{StartupTimeout: time.Hour})
	client.Write(packet(protocolVersion30, startupBody("user", "bob")...))
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	dc.mu.Lock()
	got := append([]time.Time(nil), dc.deadlines...)
	dc.mu.Unlock()
	if len(got) != 1 || got[0].Before(before.Add(time.Hour)) || got[0].After(time.Now().Add(time.Hour)) {
		t.Fatalf("deadlines after Accept = %v, want one, an hour from now", got)
	}
	if err := r.c.Ready(nil, nil); err != nil {
		t.Fatal(err)
	}
	dc.mu.Lock()
	defer dc.mu.Unlock()
	if len(dc.deadlines) != 2 || !dc.deadlines[1].IsZero() {
		t.Fatalf("deadlines after Ready = %v, want the zero time last", dc.deadlines)
	}
}

func query(s string) []byte {
	b, _ := (&pgproto3.Query{String: s}).Encode(nil)
	return b
}

func encode(msgs ...pgproto3.FrontendMessage) []byte {
	var b []byte
	for _, m := range msgs {
		b, _ = m.Encode(b)
	}
	return b
}

// Extended protocol at the wire level: one ErrorResponse for everything up to
// Sync, then one ReadyForQuery; FunctionCall gets ErrorResponse and
// ReadyForQuery; a lone Sync gets ReadyForQuery; stray COPY messages are
// ignored; then the next Query is returned.
func TestReadQueryRefusesExtendedProtocol(t *testing.T) {
	client, fe, c := ready(t, AcceptOptions{})
	client.Write(encode(
		&pgproto3.Parse{Name: "s", Query: "IDENTIFY_SYSTEM"},
		&pgproto3.Bind{PreparedStatement: "s"},
		&pgproto3.Describe{ObjectType: 'P'},
		&pgproto3.Execute{},
		&pgproto3.Query{String: "ignored: before Sync"},
		&pgproto3.Sync{},
		&pgproto3.FunctionCall{Function: 1},
		&pgproto3.Sync{},
		&pgproto3.CopyData{Data: []byte("x")},
		&pgproto3.CopyDone{},
		&pgproto3.Flush{},
		&pgproto3.Query{String: "IDENTIFY_SYSTEM"},
	))
	q, err := c.ReadQuery()
	if err != nil || q != "IDENTIFY_SYSTEM" {
		t.Fatalf("ReadQuery = %q, %v", q, err)
	}
	want := []string{"E:08P01:extended query protocol not supported in a replication connection", "Z",
		"E:08P01:fastpath function calls not supported in a replication connection", "Z", "Z"}
	for _, w := range want {
		var got string
		switch m := receive(t, fe).(type) {
		case *pgproto3.ErrorResponse:
			got = "E:" + m.Code + ":" + m.Message
		case *pgproto3.ReadyForQuery:
			got = "Z"
		default:
			got = "?"
		}
		if got != w {
			t.Fatalf("got %s, want %s", got, w)
		}
	}
}

// Messages refused by their type are refused whatever their body holds,
// as a walsender does: an empty FunctionCall, a Bind with a negative length
// (pgproto3 v2 panics decoding both) get the usual answers, and a malformed
// CopyFail outside COPY is ignored.
func TestReadQueryRefusedBodiesNotDecoded(t *testing.T) {
	client, fe, c := ready(t, AcceptOptions{})
	client.Write([]byte{'F', 0, 0, 0, 4})
	client.Write([]byte{'B', 0, 0, 0, 14, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xfe}) // one parameter of length -2
	client.Write([]byte{'f', 0, 0, 0, 4})
	client.Write(encode(&pgproto3.Sync{}, &pgproto3.Query{String: "IDENTIFY_SYSTEM"}))
	if q, err := c.ReadQuery(); q != "IDENTIFY_SYSTEM" || err != nil {
		t.Fatalf("ReadQuery = %q, %v", q, err)
	}
	for _, want := range []string{"E:fastpath function calls not supported in a replication connection", "Z",
		"E:extended query protocol not supported in a replication connection", "Z"} {
		var got string
		switch m := receive(t, fe).(type) {
		case *pgproto3.ErrorResponse:
			got = "E:" + m.Message
		case *pgproto3.ReadyForQuery:
			got = "Z"
		}
		if got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
}

func TestReadQueryEndOfStream(t *testing.T) {
	t.Run("Terminate", func(t *testing.T) {
		client, _, c := ready(t, AcceptOptions{})
		client.Write(encode(&pgproto3.Terminate{}))
		if _, err := c.ReadQuery(); err != io.EOF {
			t.Fatalf("err = %v, want io.EOF", err)
		}
	})
	t.Run("close at a message boundary", func(t *testing.T) {
		client, _, c := ready(t, AcceptOptions{})
		client.Write(query("A"))
		client.Close()
		if q, err := c.ReadQuery(); q != "A" || err != nil {
			t.Fatalf("ReadQuery = %q, %v", q, err)
		}
		if _, err := c.ReadQuery(); err != io.EOF {
			t.Fatalf("err = %v, want io.EOF", err)
		}
	})
	t.Run("close inside a message", func(t *testing.T) {
		client, _, c := ready(t, AcceptOptions{})
		client.Write(query("ABC")[:6])
		client.Close()
		if _, err := c.ReadQuery(); err == io.EOF || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("err = %v, want io.ErrUnexpectedEOF", err)
		}
	})
	// A reset is the socket's failure, not bad framing: it was reported as
	// FATAL 08P01 "invalid message length".
	t.Run("reset", func(t *testing.T) {
		client, _, c := ready(t, AcceptOptions{})
		client.(*net.TCPConn).SetLinger(0) // close sends RST
		client.Close()
		_, err := c.ReadQuery()
		var e *Error
		if errors.As(err, &e) || !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("err = %v, want the connection reset, not a protocol error", err)
		}
	})
}

// A message longer than MaxMessageSize is refused from its header, before the
// body is read (or allocated).
func TestReadQueryRefusesOversizedMessage(t *testing.T) {
	client, _, c := ready(t, AcceptOptions{MaxMessageSize: 1000})
	client.Write([]byte{'Q', 0x7f, 0xff, 0xff, 0xff})
	_, err := c.ReadQuery()
	var e *Error
	if !errors.As(err, &e) || e.Code != ProtocolViolation || e.Severity != SeverityFatal {
		t.Fatalf("err = %v, want FATAL 08P01", err)
	}
	if _, err2 := c.ReadQuery(); err2 != err {
		t.Fatalf("error not sticky: %v", err2)
	}
}

// An unknown message type is PostgreSQL's FATAL "invalid frontend message
// type N" (the framing cannot be trusted after it: sticky), also with a
// length word PostgreSQL would refuse; so is a known type not taken in
// query mode. A length word below 4 is "invalid message length".
func TestReadQueryUnknownMessageType(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"unknown", []byte{'?', 0, 0, 0, 4}, "invalid frontend message type 63"},
		{"unknown with a huge length", []byte{'!', 0x7f, 0xff, 0xff, 0xff}, "invalid frontend message type 33"},
		{"password message", []byte{'p', 0, 0, 0, 5, 0}, "invalid frontend message type 112"},
		{"length below 4", []byte{'Q', 0, 0, 0, 3}, "invalid message length"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, _, c := ready(t, AcceptOptions{})
			client.Write(append(tc.msg, query("IDENTIFY_SYSTEM")...))
			_, err := c.ReadQuery()
			var e *Error
			if !errors.As(err, &e) || e.Code != ProtocolViolation || e.Severity != SeverityFatal || e.Message != tc.want {
				t.Fatalf("err = %v, want FATAL 08P01 %q", err, tc.want)
			}
			if _, err2 := c.ReadQuery(); err2 != err {
				t.Fatalf("error not sticky: %v", err2)
			}
		})
	}
}

// A Query read whole but malformed gets PostgreSQL's ERROR 08P01 text and
// leaves the connection usable: no NUL terminator (also an empty body) is
// "invalid string in message", a NUL before the end "invalid message
// format". Between an extended-protocol message and Sync it is discarded,
// like everything else there.
func TestReadQueryMalformedQuery(t *testing.T) {
	rawQuery := func(body string) []byte {
		return append(binary.BigEndian.AppendUint32([]byte{'Q'}, uint32(4+len(body))), body...)
	}
	for _, tc := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"no terminator", rawQuery("IDENTIFY_SYSTEM"), "invalid string in message"},
		{"empty body", rawQuery(""), "invalid string in message"},
		{"NUL inside", rawQuery("IDENTIFY\x00_SYSTEM\x00"), "invalid message format"},
		{"two strings", rawQuery("A\x00B\x00"), "invalid message format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, _, c := ready(t, AcceptOptions{})
			client.Write(append(tc.msg, query("IDENTIFY_SYSTEM")...))
			_, err := c.ReadQuery()
			var e *Error
			if !errors.As(err, &e) || e.Code != ProtocolViolation || e.severity() != SeverityError || e.Message != tc.want {
				t.Fatalf("err = %v, want ERROR 08P01 %q", err, tc.want)
			}
			if q, err := c.ReadQuery(); q != "IDENTIFY_SYSTEM" || err != nil {
				t.Fatalf("next ReadQuery = %q, %v: the connection should go on", q, err)
			}
		})
	}
	t.Run("ignored till Sync", func(t *testing.T) {
		client, fe, c := ready(t, AcceptOptions{})
		client.Write(encode(&pgproto3.Parse{Query: "x"}))
		client.Write(rawQuery("no terminator"))
		client.Write(encode(&pgproto3.Sync{}, &pgproto3.Query{String: "IDENTIFY_SYSTEM"}))
		if q, err := c.ReadQuery(); q != "IDENTIFY_SYSTEM" || err != nil {
			t.Fatalf("ReadQuery = %q, %v", q, err)
		}
		if _, ok := receive(t, fe).(*pgproto3.ErrorResponse); !ok {
			t.Fatal("want the extended protocol's ErrorResponse")
		}
		if _, ok := receive(t, fe).(*pgproto3.ReadyForQuery); !ok {
			t.Fatal("want one ReadyForQuery, at Sync")
		}
	})
}

// A read deadline may expire in the middle of a message; the next read
// completes the message.
func TestReadResumesAfterDeadline(t *testing.T) {
	client, _, c := ready(t, AcceptOptions{})
	msg := query("START_REPLICATION 0/1000000 TIMELINE 1")
	for _, cut := range []int{3, 9} { // inside the header, inside the body
		client.Write(msg[:cut])
		c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
		_, err := c.ReadQuery()
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("cut %d: err = %v, want timeout", cut, err)
		}
		c.SetReadDeadline(time.Time{})
		client.Write(msg[cut:])
		if q, err := c.ReadQuery(); err != nil || q != "START_REPLICATION 0/1000000 TIMELINE 1" {
			t.Fatalf("cut %d: ReadQuery = %q, %v", cut, q, err)
		}
	}
}

// startCopyBoth puts c into CopyBoth and reads the CopyBothResponse on the
// client's side.
func startCopyBoth(t *testing.T, client net.Conn, c *Conn) {
	t.Helper()
	if err := c.StartCopyBoth(); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	// CopyBothResponse is 'W', length 7, body 00 00 00.
	raw := make([]byte, 8)
	if _, err := io.ReadFull(client, raw); err != nil || !bytes.Equal(raw, []byte{'W', 0, 0, 0, 7, 0, 0, 0}) {
		t.Fatalf("CopyBothResponse = %x, %v", raw, err)
	}
}

func TestReadCopy(t *testing.T) {
	client, fe, c := ready(t, AcceptOptions{})
	startCopyBoth(t, client, c)
	_ = fe

	client.Write(encode(
		&pgproto3.CopyData{Data: []byte("first")},
		&pgproto3.Flush{}, &pgproto3.Sync{}, // ignored during COPY
		&pgproto3.CopyData{Data: []byte("second")},
		&pgproto3.CopyData{Data: nil},
		&pgproto3.CopyDone{},
		&pgproto3.CopyFail{Message: "client gave up"},
		&pgproto3.Query{String: "IDENTIFY_SYSTEM"},
		&pgproto3.Terminate{},
	))
	a, err := c.ReadCopy()
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.ReadCopy()
	if err != nil {
		t.Fatal(err)
	}
	e, err := c.ReadCopy()
	if err != nil || len(e) != 0 {
		t.Fatalf("empty CopyData = %q, %v", e, err)
	}
	// Payloads are copies: later reads do not change earlier payloads, and
	// writing into one does not change another.
	a[0] = 'F'
	if string(a) != "First" || string(b) != "second" {
		t.Fatalf("payloads %q %q", a, b)
	}
	if _, err := c.ReadCopy(); err != ErrCopyDone {
		t.Fatalf("err = %v, want ErrCopyDone", err)
	}
	_, err = c.ReadCopy()
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != QueryCanceled || pe.Message != "COPY from stdin failed: client gave up" {
		t.Fatalf("CopyFail: %v", err)
	}
	_, err = c.ReadCopy()
	if !errors.As(err, &pe) || pe.Code != ProtocolViolation {
		t.Fatalf("Query during COPY: %v", err)
	}
	if _, err := c.ReadCopy(); err != io.EOF {
		t.Fatalf("Terminate: %v", err)
	}
}

// Bodies larger than the read-ahead buffer are read into buffers of their
// own: whole, in order, resumable after a deadline inside the body, never
// aliasing each other, and the connection keeps no buffer grown to them.
func TestReadCopyLargeBodies(t *testing.T) {
	client, _, c := ready(t, AcceptOptions{})
	startCopyBoth(t, client, c)
	sizes := []int{128 << 10, 3, readBufSize - 5, readBufSize + 1, 64 << 10, 1}
	var want [][]byte
	var stream []byte
	for i, n := range sizes {
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(i*31 + j*7)
		}
		want = append(want, p)
		stream = append(stream, encode(&pgproto3.CopyData{Data: p})...)
	}
	cut := 5 + 5 + 70<<10 // inside the first body
	client.Write(stream[:cut])
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	var ne net.Error
	if _, err := c.ReadCopy(); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err = %v, want timeout", err)
	}
	c.SetReadDeadline(time.Time{})
	go client.Write(stream[cut:])
	var got [][]byte
	for range sizes {
		p, err := c.ReadCopy()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p)
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("payload %d (%d bytes) differs", i, sizes[i])
		}
		for j := range got[i] {
			got[i][j] = 0xff // each payload is the caller's: the others stay intact
		}
		for k := i + 1; k < len(got); k++ {
			if !bytes.Equal(got[k], want[k]) {
				t.Fatalf("writing payload %d changed payload %d", i, k)
			}
		}
	}
	if n := len(c.frames.buf); n > readBufSize {
		t.Fatalf("read buffer grew to %d bytes", n)
	}
	if c.frames.big != nil {
		t.Fatal("a large body buffer is still held")
	}
}

// One reader goroutine and two writer goroutines on one Conn (run with -race):
// everything arrives, in order per writer, batched by Flush.
func TestConcurrentReaderAndWriters(t *testing.T) {
	client, fe, c := ready(t, AcceptOptions{WriteBufferSize: 4096})
	const fromClient, perWriter = 500, 500

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	// Client writer.
	wg.Add(1)
	go func() {
		defer wg.Done()
		var out []byte
		for i := 0; i < fromClient; i++ {
			out, _ = (&pgproto3.CopyData{Data: binary.BigEndian.AppendUint32([]byte{'x'}, uint32(i))}).Encode(out)
		}
		out, _ = (&pgproto3.CopyDone{}).Encode(out)
		if _, err := client.Write(out); err != nil {
			errs <- err
		}
	}()
	// Server reader.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			p, err := c.ReadCopy()
			if err == ErrCopyDone {
				if i != fromClient {
					errs <- errors.New("CopyDone early")
				}
				return
			}
			if err != nil {
				errs <- err
				return
			}
			if binary.BigEndian.Uint32(p[1:]) != uint32(i) {
				errs <- errors.New("client messages out of order")
				return
			}
		}
	}()
	// Two server writers: XLogData from one, keepalives from the other.
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				var err error
				if w == 0 {
					err = c.SendXLogData(&XLogData{DataStart: 0, WALEnd: 0, SendTime: int64(i), Data: []byte("wal")})
				} else {
					err = c.SendKeepalive(&PrimaryKeepalive{SendTime: int64(i)})
				}
				if err == nil && i%10 == 9 {
					err = c.Flush()
				}
				if err != nil {
					errs <- err
					return
				}
			}
			if err := c.Flush(); err != nil {
				errs <- err
			}
		}()
	}
	// Client reader.
	next := map[byte]int64{'w': 0, 'k': 0}
	for n := 0; n < 2*perWriter; n++ {
		cd, ok := receive(t, fe).(*pgproto3.CopyData)
		if !ok {
			t.Fatal("want CopyData")
		}
		var ts int64
		switch cd.Data[0] {
		case 'w':
			x, err := ParseXLogData(cd.Data)
			if err != nil {
				t.Fatal(err)
			}
			ts = x.SendTime
		case 'k':
			k, err := ParsePrimaryKeepalive(cd.Data)
			if err != nil {
				t.Fatal(err)
			}
			ts = k.SendTime
		}
		if ts != next[cd.Data[0]] {
			t.Fatalf("%q #%d out of order", cd.Data[0], ts)
		}
		next[cd.Data[0]]++
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A write error is sticky and reported by later Send and Flush calls.
func TestWriteErrorIsSticky(t *testing.T) {
	_, _, c := ready(t, AcceptOptions{})
	c.Close()
	c.SendCommandComplete("X")
	if err := c.Flush(); err == nil {
		t.Fatal("Flush on a closed connection succeeded")
	}
	if err := c.SendCommandComplete("Y"); err == nil {
		t.Fatal("error not sticky")
	}
}

// NUL bytes in error texts cannot break the framing.
// TestSendErrorWithoutPackageNames: an ErrorResponse carries no Go package
// names, in its message, detail or hint, nor a FATAL one.
func TestSendErrorWithoutPackageNames(t *testing.T) {
	_, fe, c := ready(t, AcceptOptions{})
	c.SendError(fmt.Errorf("acceptor: storage failure: %w", errors.New("storage: write: no space left on device")))
	c.SendError(&Error{Severity: SeverityFatal, Code: IoError, Message: "server: x", Detail: "storage: y", Hint: "proposer: z"})
	c.SendReadyForQuery()
	er, ok := receive(t, fe).(*pgproto3.ErrorResponse)
	if !ok || er.Message != "storage failure: write: no space left on device" {
		t.Fatalf("got %+v", er)
	}
	er, ok = receive(t, fe).(*pgproto3.ErrorResponse)
	if !ok || er.Severity != SeverityFatal || er.Message != "x" || er.Detail != "y" || er.Hint != "z" {
		t.Fatalf("got %+v", er)
	}
}

func TestSendErrorWithNUL(t *testing.T) {
	_, fe, c := ready(t, AcceptOptions{})
	c.SendError(errors.New("bad\x00name"))
	c.SendReadyForQuery()
	er, ok := receive(t, fe).(*pgproto3.ErrorResponse)
	if !ok || er.Code != InternalError || er.Message != `bad\0name` {
		t.Fatalf("got %+v", er)
	}
	if _, ok := receive(t, fe).(*pgproto3.ReadyForQuery); !ok {
		t.Fatal("want ReadyForQuery")
	}
}
