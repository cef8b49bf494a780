package proposer

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestWriterStopsWhenTheOwnerIsGone: a safekeeper connection's writer
// returns once its session is over, even though the owner never closes its
// queue (its last events may never have been read). Waiting for the close
// hung `safekeeper sync` past its --timeout: the greeting of the last
// safekeeper was still queued when sync returned.
func TestWriterStopsWhenTheOwnerIsGone(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := &Conn{nc: a}
	out := make(chan []byte, 4)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		writer(c, out, done)
		close(finished)
	}()
	close(done)
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("writer still waits for its queue to close after the session ended")
	}
	if _, err := b.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection is still open after the writer stopped")
	}
}

// TestWriterClosesADroppedConnection: when the owner drops a connection (it
// closes the queue: a safekeeper that broke the protocol), the writer sends
// what was queued and then closes the socket, so the reader ends and the
// link reconnects. Before, the socket stayed open and that safekeeper was
// lost for the rest of the term.
func TestWriterClosesADroppedConnection(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := &Conn{nc: a}
	out := make(chan []byte, 4)
	done := make(chan struct{})
	defer close(done)
	go writer(c, out, done)
	out <- []byte("last")
	close(out)
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, 64)
	n, err := io.ReadFull(b, got[:5+4])
	if err != nil || string(got[5:n]) != "last" {
		t.Fatalf("read %q, %v: want the queued CopyData first", got[:n], err)
	}
	if _, err := b.Read(got); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after the queue was closed: %v, want the connection closed", err)
	}

	// Nothing queued when the owner drops it: closed all the same.
	a2, b2 := net.Pipe()
	defer b2.Close()
	out2 := make(chan []byte)
	go writer(&Conn{nc: a2}, out2, done)
	close(out2)
	b2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := b2.Read(got); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an idle connection dropped: %v, want it closed", err)
	}
}
