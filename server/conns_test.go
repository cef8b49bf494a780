package server

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestEvictedInPasswordExchangeGets53300: the password exchange is part of
// the startup. With MaxConnections 2 held by a client waiting to send its
// password and an idle socket, a newcomer evicts the older, the one in the
// password exchange (not the idle one, which came later): when its password
// comes it is answered FATAL 53300 and closed, and the newcomer
// authenticates. Once all are closed no slot, startup entry or refusal is
// left.
func TestEvictedInPasswordExchangeGets53300(t *testing.T) {
	pub, key := testKeys(t, t.TempDir(), "auth")
	tok := adminToken(t, key)
	s := startHookedServer(t, t.TempDir(), func(c *Config) {
		c.MaxConnections = 2
		c.AuthPublicKeys = []string{pub}
		c.AllowAuthWithoutTLS = true
	}, hooks{evictGrace: 10 * time.Second}) // room for a slow machine between eviction and password
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(20 * time.Second))
		return c, bufio.NewReader(c)
	}
	startup := func(c net.Conn, r *bufio.Reader) {
		t.Helper()
		body := binary.BigEndian.AppendUint32(nil, 196608)
		for _, kv := range []string{"user", "u", "replication", "true", ""} {
			body = append(append(body, kv...), 0)
		}
		if _, err := c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(4+len(body))), body...)); err != nil {
			t.Fatal(err)
		}
		if typ, b := readBackendMessage(t, r); typ != 'R' || len(b) != 4 || binary.BigEndian.Uint32(b) != 3 {
			t.Fatalf("got %q %x, want AuthenticationCleartextPassword", typ, b)
		}
	}
	password := func(c net.Conn) {
		t.Helper()
		msg := binary.BigEndian.AppendUint32([]byte{'p'}, uint32(4+len(tok)+1))
		if _, err := c.Write(append(append(msg, tok...), 0)); err != nil {
			t.Fatal(err)
		}
	}
	slots := func() (held, starting int, refusing int32) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns), s.starting.Len(), s.refusing.Load()
	}

	victim, vr := dial()
	startup(victim, vr)
	idle, _ := dial()
	waitFor(t, "both slots held", func() bool { held, _, _ := slots(); return held == 2 })
	newcomer, nr := dial()
	evicted := func() float64 { return refused(s, "startup_evicted") }
	waitFor(t, "an eviction", func() bool { return evicted() == 1 })
	if held, starting, refusing := slots(); held != 2 || starting != 2 || refusing != 1 {
		t.Fatalf("after the eviction: %d slots held, %d in startup, %d refusing; want 2, 2 (idle, newcomer), 1 (the evicted)", held, starting, refusing)
	}

	password(victim)
	typ, body := readBackendMessage(t, vr)
	if f := errorFields(body); typ != 'E' || f['S'] != "FATAL" || f['C'] != "53300" {
		t.Fatalf("the evicted client after its password: %q %v, want FATAL 53300", typ, f)
	}
	if _, err := vr.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("the evicted client after 53300: %v, want EOF", err)
	}
	startup(newcomer, nr)
	password(newcomer)
	if typ, b := readBackendMessage(t, nr); typ != 'R' || binary.BigEndian.Uint32(b) != 0 {
		t.Fatalf("the newcomer after its password: %q %x, want AuthenticationOk", typ, b)
	}
	if held, starting, _ := slots(); held != 2 || starting != 1 {
		t.Fatalf("%d slots held, %d in startup; want 2 (idle, newcomer), 1 (idle)", held, starting)
	}

	idle.Close()
	newcomer.Close()
	waitFor(t, "every slot and refusal given back", func() bool {
		held, starting, refusing := slots()
		return held == 0 && starting == 0 && refusing == 0
	})
	if n := refused(s, "too_many_clients"); n != 1 {
		t.Errorf("too_many_clients %v, want 1 (the evicted client's answer)", n)
	}
}
