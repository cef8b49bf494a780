package client

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
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
		c.WriteQueue(out, done)
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
	go c.WriteQueue(out, done)
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
	go (&Conn{nc: a2}).WriteQueue(out2, done)
	close(out2)
	b2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := b2.Read(got); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an idle connection dropped: %v, want it closed", err)
	}
}

// TestRefusalIsReadAfterAFailedWrite: a safekeeper that refuses the WAL it
// was sent (FATAL 53100, its disk breaker tripped) and closes leaves its
// FATAL unread on our side while the writer goes on sending; the write
// after the reset fails. The reader must still report the FATAL — the root
// cause — and not "use of closed network connection", which it did when
// the writer closed the socket at its failed write: the link's warning
// then alternated between the two, and its once-per-reason limiter never
// held the repeats back.
func TestRefusalIsReadAfterAFailedWrite(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	refused := make(chan struct{})
	go func() {
		s, err := l.Accept()
		if err != nil {
			return
		}
		defer close(refused)
		if _, err := io.ReadFull(s, make([]byte, 1)); err != nil { // the client is connected
			return
		}
		be := pgproto3.NewBackend(s, s)
		be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "53100", Message: "could not write WAL: the disk breaker is tripped"})
		be.Flush()
		s.(*net.TCPConn).SetLinger(0) // close with a reset, as with unread WAL in its buffer
		s.Close()
	}()
	nc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := &Conn{nc: nc, fe: pgproto3.NewFrontend(nc, nc)}
	defer c.Close()
	if _, err := nc.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	<-refused
	out := make(chan []byte, 1)
	done := make(chan struct{})
	defer close(done)
	go c.WriteQueue(out, done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if werr, _ := c.writeFailure(); werr != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("writes to a safekeeper that reset the connection still succeed after 10 s")
		}
		select {
		case out <- []byte("WAL the safekeeper never reads"):
		default:
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.Recv(ctx)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "53100" {
		t.Fatalf("Recv after the failed write: %v; want the safekeeper's FATAL 53100", err)
	}
}
