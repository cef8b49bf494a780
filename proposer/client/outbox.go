package client

import (
	"sync"

	"github.com/safekeeper/safekeeper/proto/netq"
)

// Outbox is a Conn's queue of outgoing messages (encoded payloads), put
// in by one owner goroutine that must never block on the socket: the
// proposer's driver, or Sync's. Put queues; Flush, called by the owner once
// it has put a round of messages, writes them itself in one socket write
// when the socket takes them at once (its backlog is small: proto/netq),
// and otherwise wakes the connection's writer goroutine (Run), which
// writes everything that could block. Saving the hand-off to the writer
// on every round is what makes the common case cheap: each WAL record
// reaches three safekeepers with three writes and no goroutine woken.
// Messages go out in the order they were put.
type Outbox struct {
	c     *Conn
	sock  *netq.Socket
	limit int

	mu     sync.Mutex
	queue  [][]byte
	closed bool          // Close: nothing more is put
	wake   chan struct{} // capacity 1: Run has something to do

	// wmu is held while a batch is taken from the queue and written, by
	// Flush or by Run, so that batches go out in order.
	wmu   sync.Mutex
	spare [][]byte // the batch slice to reuse (wmu)
}

// NewOutbox is c's outbox, holding at most limit payloads not yet
// written. Start its writer with go o.Run(done). With c nil the outbox
// writes nothing: what is put stays until Take (tests of its owner).
func NewOutbox(c *Conn, limit int) *Outbox {
	o := &Outbox{c: c, limit: limit, wake: make(chan struct{}, 1)}
	if c != nil {
		o.sock = netq.Of(c.nc)
	}
	return o
}

// Take removes and returns what is queued and not yet written.
func (o *Outbox) Take() [][]byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	q := o.queue
	o.queue = nil
	return q
}

// Put queues payload. It never blocks; false means the outbox is closed or
// full (limit payloads wait: the connection is not keeping up, and the
// owner drops it).
func (o *Outbox) Put(payload []byte) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed || len(o.queue) >= o.limit {
		return false
	}
	o.queue = append(o.queue, payload)
	return true
}

// Flush sends what Put queued: from the caller's goroutine, in one write,
// when the writer is not writing and the socket's backlog is small;
// otherwise by waking Run.
func (o *Outbox) Flush() {
	o.mu.Lock()
	n, closed := len(o.queue), o.closed
	bytes := 0
	for _, p := range o.queue {
		bytes += len(p)
	}
	o.mu.Unlock()
	if n == 0 || o.c == nil {
		return
	}
	// A large batch (catch-up, a burst of WAL) may not fit the socket's
	// send buffer: the writer takes it, the owner does not wait.
	if closed || bytes > maxOwnBatch || !o.wmu.TryLock() {
		o.signal()
		return
	}
	if unsent, ok := o.sock.Unsent(); !ok || unsent > netq.SmallBacklog {
		o.wmu.Unlock()
		o.signal()
		return
	}
	err := o.writeTaken()
	o.wmu.Unlock()
	if err != nil {
		o.signal() // Run finds the failure and drains
	}
}

// maxOwnBatch bounds the bytes Flush writes from the owner's goroutine:
// a batch this small fits any TCP send buffer with a small backlog.
const maxOwnBatch = 16 << 10

// Close ends the outbox: Run writes what is queued, then closes the
// connection, so its reader ends and the link reconnects.
func (o *Outbox) Close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.signal()
}

func (o *Outbox) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// writeTaken takes every queued payload and writes them in one socket
// write. wmu held.
func (o *Outbox) writeTaken() error {
	o.mu.Lock()
	batch := o.queue
	o.queue = o.spare[:0]
	o.mu.Unlock()
	o.c.mu.Lock()
	for _, p := range batch {
		o.c.wbuf = appendCopyData(o.c.wbuf, func(b []byte) []byte { return append(b, p...) })
	}
	err := o.c.writeLocked()
	o.c.mu.Unlock()
	clear(batch)
	if cap(batch) > 256 {
		batch = nil // a burst: not kept
	}
	o.spare = batch
	return err
}

// Run is the connection's writer goroutine: it writes what Flush left to
// it, until the outbox is closed — then it writes what is queued and
// closes the connection — or done is (the owner is gone, and nobody would
// close the outbox). After a write error it leaves the connection open for
// the reader, which reads what the safekeeper said before it closed (its
// FATAL, the root cause) and then reports the end (Conn.Recv); it discards
// what is put until the outbox is closed or done is, and then closes the
// connection.
func (o *Outbox) Run(done <-chan struct{}) {
	defer o.c.Close()
	for {
		select {
		case <-done:
			return
		case <-o.wake:
		}
		if failed, _ := o.c.writeFailure(); failed != nil {
			o.discard(done)
			return
		}
		o.wmu.Lock()
		o.mu.Lock()
		closed := o.closed
		o.mu.Unlock()
		err := o.writeTaken()
		o.wmu.Unlock()
		if closed {
			return
		}
		if err != nil {
			o.discard(done)
			return
		}
	}
}

// discard drops what is put until the outbox is closed or done is.
func (o *Outbox) discard(done <-chan struct{}) {
	for {
		o.mu.Lock()
		clear(o.queue)
		o.queue = o.queue[:0]
		closed := o.closed
		o.mu.Unlock()
		if closed {
			return
		}
		select {
		case <-done:
			return
		case <-o.wake:
		}
	}
}
