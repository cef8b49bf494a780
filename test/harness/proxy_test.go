package harness

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echoServer answers every line with the same line until the client goes.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func dialEcho(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip writes a line and reads the answer within d.
func roundTrip(c net.Conn, r *bufio.Reader, d time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(d))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

func TestProxyForwardCutPartitionHeal(t *testing.T) {
	p := StartProxy(t, echoServer(t))

	c1, r1 := dialEcho(t, p.Addr)
	if got, err := roundTrip(c1, r1, 5*time.Second); err != nil || got != "ping\n" {
		t.Fatalf("forward: %q %v", got, err)
	}
	WaitFor(t, 5*time.Second, "one open link", func() bool { return p.Open() == 1 })

	// Cut: the open connection is reset; a new one is forwarded.
	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut reset %d connections, want 1", n)
	}
	if _, err := roundTrip(c1, r1, 5*time.Second); err == nil {
		t.Fatal("connection still works after Cut")
	}
	c2, r2 := dialEcho(t, p.Addr)
	if got, err := roundTrip(c2, r2, 5*time.Second); err != nil || got != "ping\n" {
		t.Fatalf("after Cut: %q %v", got, err)
	}

	// Refuse: the open connection is cut, new ones are reset at once.
	p.Partition(Refuse)
	if _, err := roundTrip(c2, r2, 5*time.Second); err == nil {
		t.Fatal("connection survived Partition")
	}
	// The reset may come before connect returns or at the first read.
	if c3, err := net.DialTimeout("tcp", p.Addr, 5*time.Second); err == nil {
		defer c3.Close()
		if _, err := roundTrip(c3, bufio.NewReader(c3), 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("refused connection: want a reset, got %v", err)
		}
	}

	// Blackhole: a new connection is accepted, swallows what is sent, and
	// never answers.
	p.Heal()
	p.Partition(Blackhole)
	c4, r4 := dialEcho(t, p.Addr)
	if _, err := roundTrip(c4, r4, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("blackholed connection: want a timeout, got %v", err)
	}
	before := p.Accepted()

	// Heal: blackholed connections are reset, new ones forwarded.
	p.Heal()
	if _, err := roundTrip(c4, r4, 5*time.Second); err == nil {
		t.Fatal("blackholed connection still open after Heal")
	}
	c5, r5 := dialEcho(t, p.Addr)
	if got, err := roundTrip(c5, r5, 5*time.Second); err != nil || got != "ping\n" {
		t.Fatalf("after Heal: %q %v", got, err)
	}
	if p.Accepted() != before+1 {
		t.Fatalf("accepted %d, want %d", p.Accepted(), before+1)
	}

	p.Close()
	if _, err := roundTrip(c5, r5, 5*time.Second); err == nil {
		t.Fatal("connection open after Close")
	}
	if c, err := net.DialTimeout("tcp", p.Addr, time.Second); err == nil {
		c.Close()
		t.Fatal("proxy still listening after Close")
	}
}
