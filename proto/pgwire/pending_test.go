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
