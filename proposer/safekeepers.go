package proposer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/safekeeper/safekeeper/proto"
)

// skEvent is what a safekeeper's connection goroutine reports to the owner:
// a new greeted connection (out non-nil), a message, or the connection's end
// (err non-nil). gen names the connection; the owner ignores events of a
// connection it already dropped.
type skEvent struct {
	sk, gen int
	info    *proto.SafeKeeperInfo // the greeting of a new connection
	out     chan []byte           // the new connection's writer queue
	msg     proto.Message
	err     error
	// refused: err is the safekeeper's refusal of our ServerInfo (rule 1:
	// another cluster, major version or segment size), which no retry can
	// fix; the link has stopped.
	refused bool
}

// skLinks runs one connection goroutine per safekeeper: dial, greet with
// ServerInfo, report, then forward every message to the owner until the
// connection fails; then reconnect with backoff. The owner writes through
// the connection's out queue (encoded payloads; closing it ends the writer)
// and never blocks on it: it keeps at most queueCap payloads queued.
type skLinks struct {
	addrs []string
	dial  DialConfig
	si    *proto.ServerInfo
	// hist, when set, follows every greeting: the PostgreSQL timeline
	// history of a promoted primary (README_PROTO.md).
	hist     *proto.TimelineHistory
	queueCap int
	bo       backoff
	log      *slog.Logger
	events   chan skEvent
	wg       sync.WaitGroup
}

func (l *skLinks) start(ctx context.Context) {
	for i := range l.addrs {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.loop(ctx, i)
		}()
	}
}

func (l *skLinks) post(ctx context.Context, ev skEvent) bool {
	select {
	case l.events <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

func (l *skLinks) loop(ctx context.Context, i int) {
	bo := l.bo
	for gen := 1; ctx.Err() == nil; gen++ {
		greeted, err := l.connection(ctx, i, gen)
		if ctx.Err() != nil {
			return
		}
		if !greeted && incompatible(err) {
			l.post(ctx, skEvent{sk: i, gen: gen, err: err, refused: true})
			return
		}
		if greeted {
			bo.reset()
		}
		d := bo.next()
		l.log.Warn("safekeeper connection ended; reconnecting", "safekeeper", l.addrs[i], "err", err, "retry_in", d)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// connection runs one connection to safekeeper i until it fails.
func (l *skLinks) connection(ctx context.Context, i, gen int) (greeted bool, err error) {
	dc := l.dial
	dc.Addr = l.addrs[i]
	c, err := Dial(ctx, dc)
	if err != nil {
		return false, err
	}
	defer c.Close()
	if err := c.Send(l.si); err != nil {
		return false, err
	}
	gctx, cancel := context.WithTimeout(ctx, dc.ConnectTimeout)
	m, err := c.Recv(gctx)
	cancel()
	if err != nil {
		return false, fmt.Errorf("greeting: %w", err)
	}
	info, ok := m.(*proto.SafeKeeperInfo)
	if !ok {
		return false, fmt.Errorf("greeting: got %T, want SafeKeeperInfo", m)
	}
	if l.hist != nil {
		if err := c.Send(l.hist); err != nil {
			return false, err
		}
	}
	out := make(chan []byte, l.queueCap)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		writer(c, out, ctx.Done())
	}()
	defer func() { <-writerDone }() // the owner closes out after our final event
	if !l.post(ctx, skEvent{sk: i, gen: gen, info: info, out: out}) {
		c.Close()
		close(out) // the owner never got it
		return true, ctx.Err()
	}
	for {
		m, err := c.Recv(ctx)
		if err != nil {
			c.Close()
			if errors.Is(err, ErrStreamEnded) {
				err = fmt.Errorf("safekeeper ended the stream")
			}
			if !l.post(ctx, skEvent{sk: i, gen: gen, err: err}) {
				return true, ctx.Err() // the owner is gone; out is closed by the session
			}
			return true, err
		}
		if !l.post(ctx, skEvent{sk: i, gen: gen, msg: m}) {
			c.Close()
			return true, ctx.Err()
		}
	}
}

// writer sends queued payloads, one socket write per burst, until out is
// closed — the owner is done with the connection (it dropped it, or it
// ended): what was queued is sent, then the connection is closed, so its
// reader ends and the link reconnects — or done is (the owner is gone: its
// last events may never have been read, so nobody would close out). After
// a write error it closes the connection (the reader then reports the
// failure) and drains out until it is closed or done is.
func writer(c *Conn, out chan []byte, done <-chan struct{}) {
	for {
		var p []byte
		select {
		case <-done:
			c.Close()
			return
		case q, ok := <-out:
			if !ok {
				c.Close()
				return
			}
			p = q
		}
		c.queueRaw(p)
		for more := true; more; {
			select {
			case p, ok := <-out:
				if !ok {
					c.flush()
					c.Close()
					return
				}
				c.queueRaw(p)
			default:
				more = false
			}
		}
		if err := c.flush(); err != nil {
			c.Close()
			for {
				select {
				case <-done:
					return
				case _, ok := <-out:
					if !ok {
						return
					}
				}
			}
		}
	}
}
