package pgwire

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgproto3/v2"
)

// Every decoder is fuzzed: no panic, errors are ProtocolViolation *Errors
// wrapping ErrMalformed (or InvalidParameterValue for options), and what
// decodes re-encodes to the same value.

func checkMalformed(t *testing.T, err error) {
	t.Helper()
	var e *Error
	if !errors.Is(err, ErrMalformed) || !errors.As(err, &e) || e.Code != ProtocolViolation {
		t.Fatalf("error %v is not a malformed 08P01", err)
	}
}

// quoteOption escapes s as pg_split_opts expects it.
func quoteOption(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' || isSpace(s[i]) {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func FuzzParseOptions(f *testing.F) {
	for _, s := range []string{
		"", "-c wal_sender_timeout=30s", "-c tenant_id=ab timeline_id=cd", "--a-b=c", `-c x=a\ b\\`,
		"-cfoo=bar", "-c", "-c a", "word", "-B 100", "-c a=1 \\", "\t-c\na=b=c\v",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseOptions(s)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code != InvalidParameterValue {
				t.Fatalf("error %v is not 22023", err)
			}
			return
		}
		// Re-encode as "-c name=value" words and parse again.
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var words []string
		for _, k := range keys {
			words = append(words, "-c", quoteOption(k)+"="+quoteOption(m[k]))
		}
		back, err := ParseOptions(strings.Join(words, " "))
		if err != nil || !maps.Equal(back, m) {
			t.Fatalf("round trip of %q: %v, %v; want %v", s, back, err, m)
		}
	})
}

func FuzzStandbyStatus(f *testing.F) {
	f.Add((&StandbyStatusUpdate{Write: 0xBC36C4D8, Flush: 0xBC36C4D8, SendTime: 1, ReplyRequested: true}).Append(nil))
	f.Add([]byte{'r'})
	f.Add(make([]byte, 34))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseStandbyStatusUpdate(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		// replyRequested is a bool: any nonzero byte reads as true.
		want := append([]byte(nil), b...)
		want[33] = boolByte(want[33] != 0)
		if got := m.Append(nil); !bytes.Equal(got, want) {
			t.Fatalf("round trip %x -> %x", b, got)
		}
	})
}

func FuzzHotStandbyFeedback(f *testing.F) {
	f.Add((&HotStandbyFeedback{SendTime: 42, Xmin: 1000, XminEpoch: 1, CatalogXmin: 900}).Append(nil))
	f.Add([]byte{'h', 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseHotStandbyFeedback(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if got := m.Append(nil); !bytes.Equal(got, b) {
			t.Fatalf("round trip %x -> %x", b, got)
		}
	})
}

func FuzzConsumerFeedback(f *testing.F) {
	f.Add((&ConsumerFeedback{TimelineSize: 1, ReceivedLSN: 2, DiskConsistentLSN: 3, RemoteConsistentLSN: 4, ReplyTime: 5}).Append(nil))
	f.Add(feedback(2, "unknown", []byte("abc"), "ps_flushlsn", uint64(7)))
	f.Add(feedback(1, "x", int32(-1)))
	f.Add([]byte{'z', 0})
	f.Add([]byte{'z', 255, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseConsumerFeedback(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		back, err := ParseConsumerFeedback(m.Append(nil))
		if err != nil || back != m {
			t.Fatalf("round trip %+v -> %+v, %v", m, back, err)
		}
	})
}

func FuzzXLogData(f *testing.F) {
	f.Add((&XLogData{DataStart: 1, WALEnd: 2, SendTime: 3, Data: []byte("wal")}).Append(nil))
	f.Add([]byte{'w'})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseXLogData(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if got := m.Append(nil); !bytes.Equal(got, b) {
			t.Fatalf("round trip %x -> %x", b, got)
		}
	})
}

func FuzzPrimaryKeepalive(f *testing.F) {
	f.Add((&PrimaryKeepalive{WALEnd: 1, SendTime: 2, ReplyRequested: true}).Append(nil))
	f.Add([]byte{'k'})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParsePrimaryKeepalive(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		want := append([]byte(nil), b...)
		want[17] = boolByte(want[17] != 0)
		if got := m.Append(nil); !bytes.Equal(got, want) {
			t.Fatalf("round trip %x -> %x", b, got)
		}
	})
}

func FuzzStartupParams(f *testing.F) {
	f.Add(startupBody("user", "postgres", "database", "replication", "replication", "true"))
	f.Add([]byte{0})
	f.Add([]byte("user\x00"))
	f.Add(startupBody("_pq_.x", "1", "user", "u"))
	f.Fuzz(func(t *testing.T, b []byte) {
		params, unknown, err := parseStartupParams(b)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code != ProtocolViolation {
				t.Fatalf("error %v is not 08P01", err)
			}
			return
		}
		// Re-encode and parse again (a repeated key keeps its last value).
		var kv []string
		for k, v := range params {
			kv = append(kv, k, v)
		}
		for _, u := range unknown {
			kv = append(kv, u, "")
		}
		p2, u2, err := parseStartupParams(startupBody(kv...))
		if err != nil || !maps.Equal(p2, params) || len(u2) != len(unknown) {
			t.Fatalf("round trip: %v %v %v", p2, u2, err)
		}
	})
}

func FuzzParseBool(f *testing.F) {
	for _, s := range []string{"true", "of", "o", "1", "database", "", "YES"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseBool(s)
		if err != nil {
			return
		}
		// Whatever parses is a prefix of one of the words.
		l := strings.ToLower(s)
		ok := false
		for w, v := range map[string]bool{"true": true, "yes": true, "on": true, "1": true, "false": false, "no": false, "off": false, "0": false} {
			if strings.HasPrefix(w, l) && v == b {
				ok = true
			}
		}
		if !ok {
			t.Fatalf("ParseBool(%q) = %v", s, b)
		}
	})
}

// bytesConn is a net.Conn reading a fixed input and discarding writes.
type bytesConn struct {
	net.Conn // nil: other methods are not called
	r        *bytes.Reader
}

func (c *bytesConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *bytesConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *bytesConn) SetWriteDeadline(time.Time) error { return nil }
func (c *bytesConn) SetReadDeadline(time.Time) error  { return nil }
func (c *bytesConn) SetDeadline(time.Time) error      { return nil }
func (c *bytesConn) Close() error                     { return nil }
func (c *bytesConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }

// FuzzReadQuery: the frontend message stream after startup never panics
// the reader; every error is io.EOF, a connection closed inside a message,
// or an 08P01 *Error (FATAL and sticky, or ERROR for a malformed Query, and
// then the next message is read).
func FuzzReadQuery(f *testing.F) {
	f.Add(query("IDENTIFY_SYSTEM"))
	f.Add([]byte{'Q', 0, 0, 0, 4})
	f.Add([]byte{'Q', 0, 0, 0, 6, 'A', 'B'})
	f.Add([]byte{'?', 0, 0, 0, 4})
	f.Add(encode(&pgproto3.Parse{Query: "x"}, &pgproto3.Bind{}, &pgproto3.Sync{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		c := newConn(&bytesConn{r: bytes.NewReader(b)}, false, AcceptOptions{MaxMessageSize: 1 << 16}.withDefaults(), nil)
		for i := 0; i <= len(b); i++ {
			_, err := c.ReadQuery()
			if err == nil {
				continue
			}
			var e *Error
			switch {
			case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
				return
			case !errors.As(err, &e) || e.Code != ProtocolViolation:
				t.Fatalf("error %v is not 08P01", err)
			case e.Severity == SeverityFatal:
				return
			}
		}
		t.Fatal("ReadQuery returned more messages than there are bytes")
	})
}

// FuzzFrontDoor feeds arbitrary client bytes to the whole startup of a
// connection, as the server runs it when auth is on: Accept (SSLRequest,
// GSSENCRequest, CancelRequest, StartupMessage) and then RequestPassword.
// It must not panic or hang: every outcome is a *Conn or an error, within
// the startup deadline, and a refusal the client could see is a FATAL
// *Error.
func FuzzFrontDoor(f *testing.F) {
	start := func(kv ...string) []byte { return packet(3<<16, startupBody(kv...)...) }
	f.Add(start("user", "u", "replication", "true"))
	f.Add(append(packet(sslRequestCode), start("user", "u")...))
	f.Add(append(packet(gssEncRequestCode), start("user", "u", "database", "d")...))
	f.Add(append(start("user", "u"), 'p', 0, 0, 0, 9, 't', 'o', 'k', 0))
	f.Add(append(start("user", "u"), 'Q', 0, 0, 0, 5, 0))
	f.Add(packet(cancelRequestCode, 0, 0, 0, 1, 0, 0, 0, 2))
	f.Add([]byte{0, 0, 0, 8, 0, 3, 0, 1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		defer client.Close()
		go io.Copy(io.Discard, client) // the server's answers
		go func() {
			client.Write(in)
			client.Close() // EOF after the input
		}()
		done := make(chan struct{})
		go func() {
			defer close(done)
			c, err := Accept(server, AcceptOptions{StartupTimeout: 2 * time.Second})
			if err != nil {
				var e *Error
				if errors.As(err, &e) && e.Severity != SeverityFatal && e.Severity != "" {
					t.Errorf("startup refusal %v is not FATAL", err)
				}
				return
			}
			if _, err := c.RequestPassword(); err != nil {
				return
			}
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("startup hung on %q", in)
		}
		server.Close()
	})
}
