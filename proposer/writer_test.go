package proposer

import (
	"net"
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
