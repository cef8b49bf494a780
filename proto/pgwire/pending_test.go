package pgwire

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgproto3/v2"
)

// Pending is true exactly while more input is here: a whole message in the
// read-ahead buffer or bytes in the socket's receive queue; not for a
// message only partly in the buffer with nothing behind it.
func TestPendingSeesBufferedAndSocketInput(t *testing.T) {
	client, _, c := ready(t, AcceptOptions{})
	startCopyBoth(t, client, c)
	if c.Pending() {
		t.Fatal("Pending with nothing sent")
	}
	// Two messages in one write: the first read takes both into the buffer.
	client.Write(encode(&pgproto3.CopyData{Data: []byte("one")}, &pgproto3.CopyData{Data: []byte("two")}))
	if p, err := c.ReadCopy(); err != nil || string(p) != "one" {
		t.Fatalf("ReadCopy = %q, %v", p, err)
	}
	if !c.Pending() {
		t.Fatal("a whole message is buffered, and Pending is false")
	}
	if p, err := c.ReadCopy(); err != nil || string(p) != "two" {
		t.Fatalf("ReadCopy = %q, %v", p, err)
	}
	if c.Pending() {
		t.Fatal("Pending after the last message was read")
	}
	// A body larger than the buffer waits in the socket, not the buffer.
	big := bytes.Repeat([]byte{7}, 128<<10)
	client.Write(encode(&pgproto3.CopyData{Data: big}))
	deadline := time.Now().Add(10 * time.Second)
	for !c.Pending() {
		if time.Now().After(deadline) {
			t.Fatal("128 KiB sent, and Pending never saw it in the socket")
		}
		time.Sleep(time.Millisecond)
	}
	if p, err := c.ReadCopy(); err != nil || !bytes.Equal(p, big) {
		t.Fatalf("ReadCopy: %d bytes, %v", len(p), err)
	}
	if c.Pending() {
		t.Fatal("Pending after the large message was read")
	}
	// Part of a message: read into the buffer, nothing behind it.
	msg := encode(&pgproto3.CopyData{Data: []byte("three")})
	client.Write(msg[:7])
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	var ne net.Error
	if _, err := c.ReadCopy(); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("ReadCopy of a partial message: %v, want a timeout", err)
	}
	c.SetReadDeadline(time.Time{})
	if c.Pending() {
		t.Fatal("Pending with only part of a message here")
	}
	client.Write(msg[7:])
	if p, err := c.ReadCopy(); err != nil || string(p) != "three" {
		t.Fatalf("ReadCopy = %q, %v", p, err)
	}
}

// CloseLingering delivers everything written to a client that is still
// sending and slow to read, where a plain Close with its data unread
// resets the connection and drops what the client had not yet received.
func TestCloseLingeringDeliversToASendingClient(t *testing.T) {
	for _, linger := range []bool{true, false} {
		client, _, c := ready(t, AcceptOptions{})
		startCopyBoth(t, client, c)
		go func() { // the client streams without pause, as a proposer does
			msg := encode(&pgproto3.CopyData{Data: make([]byte, 1000)})
			for {
				if _, err := client.Write(msg); err != nil {
					return
				}
			}
		}()
		const total = 4 << 20
		got := make(chan int64, 1)
		go func() { // and reads slowly
			var n int64
			buf := make([]byte, 4096)
			for {
				m, err := client.Read(buf)
				n += int64(m)
				if err != nil {
					got <- n
					return
				}
				if n < total/2 {
					time.Sleep(100 * time.Microsecond)
				}
			}
		}()
		payload := make([]byte, 64<<10)
		for sent := 0; sent < total; sent += len(payload) {
			c.SendCopyData(payload)
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		if linger {
			c.CloseLingering(5 * time.Second)
		} else {
			c.Close()
		}
		n := <-got
		want := int64(total / len(payload) * (5 + len(payload)))
		if linger && n < want {
			t.Fatalf("the client received %d of %d bytes before the close: the tail was dropped", n, want)
		}
		t.Logf("linger %v: the client received %d of %d bytes", linger, n, want)
	}
}
