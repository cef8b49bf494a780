package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proto"
)

// ErrStreamEnded is returned by Recv after the safekeeper ended the stream
// with CopyDone (an orderly end).
var ErrStreamEnded = errors.New("proposer: safekeeper ended the WAL push stream")

// Conn is a proposer's START_WAL_PUSH stream to one safekeeper: the client
// side of the WAL push protocol (README_PROTO.md). Send and Recv may be
// used from two goroutines at once (one each); Close from any.
//
// Once the stream is in CopyBoth the connection is hijacked from pgconn:
// pgconn is not safe for a concurrent reader and writer (on a read error it
// sends Terminate itself, racing with a writer). Recv alone uses the
// pgproto3 Frontend; sends frame CopyData themselves under mu.
type Conn struct {
	nc net.Conn
	fe *pgproto3.Frontend // receive side only

	mu   sync.Mutex // guards wbuf, writes to nc and the fields below
	wbuf []byte
	// failed is the first write error; failedAt when it happened. A failed
	// write does not close the connection: the safekeeper may have said
	// why before it closed (a FATAL 53100 from its disk breaker, then a
	// reset), and that reply is still to be read. Recv reads on for at
	// most writeFailGrace and then ends with failed.
	failed   error
	failedAt time.Time
}

// writeFailGrace is how long Recv goes on reading after a write failed,
// for the safekeeper's last words (an ErrorResponse sent before it closed).
// A write fails because the peer reset or closed the connection, so the
// read ends at once in practice; the bound is for a half-open connection.
const writeFailGrace = time.Second

// DialConfig says where and as whom to connect.
type DialConfig struct {
	// Addr is the safekeeper's host:port.
	Addr string
	// TenantID and TimelineID, when non-zero, travel in the startup options
	// (-c tenant_id=… -c timeline_id=…).
	TenantID, TimelineID proto.ID
	// ApplicationName identifies the proposer in the safekeeper's logs.
	ApplicationName string
	// AllowTimelineCreation lets the greeting create the timeline on a
	// safekeeper that does not hold it (START_WAL_PUSH
	// (allow_timeline_creation true)). Without it such a safekeeper
	// refuses the greeting with 42704 (MissingTimeline reports it): a
	// mistyped id must not start a new timeline.
	AllowTimelineCreation bool
	// SyncSlots asks the safekeeper for its slot table after the greeting
	// and whenever it changes (SafeKeeperSlots), and lets the stream carry
	// merged tables to it (Slots): START_WAL_PUSH (sync_replication_slots).
	SyncSlots bool
	// ConnectTimeout bounds connecting and START_WAL_PUSH; default 10 s.
	ConnectTimeout time.Duration
	// Security: sslmode, sslrootcert, password.
	Security Security
}

// Dial connects to a safekeeper and starts a WAL push stream (CopyBoth).
func Dial(ctx context.Context, cfg DialConfig) (*Conn, error) {
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	host, port, err := splitHostPort(cfg.Addr)
	if err != nil {
		return nil, err
	}
	sec, err := cfg.Security.params()
	if err != nil {
		return nil, fmt.Errorf("proposer: connect to safekeeper %s: %w", cfg.Addr, err)
	}
	connStr := fmt.Sprintf("host=%s port=%s user=proposer %s connect_timeout=%d",
		host, port, sec, int(cfg.ConnectTimeout.Seconds()+0.999))
	pcfg, err := pgconn.ParseConfig(connStr)
	if err != nil {
		return nil, err
	}
	if cfg.ApplicationName != "" {
		pcfg.RuntimeParams["application_name"] = cfg.ApplicationName
	}
	if !cfg.TenantID.IsZero() || !cfg.TimelineID.IsZero() {
		pcfg.RuntimeParams["options"] = fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", cfg.TenantID, cfg.TimelineID)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	pg, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("proposer: connect to safekeeper %s: %w", cfg.Addr, err)
	}
	fe := pg.Frontend()
	q := fmt.Sprintf("START_WAL_PUSH (allow_timeline_creation '%t'", cfg.AllowTimelineCreation)
	if cfg.SyncSlots {
		q += ", sync_replication_slots 'true'"
	}
	fe.Send(&pgproto3.Query{String: q + ")"})
	if err := fe.Flush(); err != nil {
		pg.Close(context.Background())
		return nil, err
	}
	for {
		msg, err := pg.ReceiveMessage(ctx)
		if err != nil {
			pg.Close(context.Background())
			return nil, fmt.Errorf("proposer: START_WAL_PUSH on %s: %w", cfg.Addr, err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyBothResponse:
			hc, err := pg.Hijack()
			if err != nil {
				pg.Close(context.Background())
				return nil, err
			}
			return &Conn{nc: hc.Conn, fe: hc.Frontend}, nil
		case *pgproto3.ErrorResponse:
			pg.Close(context.Background())
			return nil, pgconn.ErrorResponseToPgError(m)
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
		default:
			pg.Close(context.Background())
			return nil, fmt.Errorf("proposer: START_WAL_PUSH on %s: unexpected %T", cfg.Addr, msg)
		}
	}
}

// Send sends one message as a CopyData.
func (c *Conn) Send(m proto.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wbuf = appendCopyData(c.wbuf[:0], m.Encode)
	return c.writeLocked()
}

// SendRaw sends payload as one CopyData, unchecked (tests use it for
// malformed input).
func (c *Conn) SendRaw(payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wbuf = appendCopyData(c.wbuf[:0], func(b []byte) []byte { return append(b, payload...) })
	return c.writeLocked()
}

// queueRaw buffers payload as one CopyData without sending it; flush sends
// everything queued in one write.
func (c *Conn) queueRaw(payload []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wbuf = appendCopyData(c.wbuf, func(b []byte) []byte { return append(b, payload...) })
}

func (c *Conn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writeLocked()
}

func (c *Conn) writeLocked() error {
	if len(c.wbuf) == 0 {
		return nil
	}
	_, err := c.nc.Write(c.wbuf)
	c.wbuf = c.wbuf[:0]
	if err != nil && c.failed == nil {
		// Mark, then cut: Recv sets its deadline, then looks at the mark,
		// so either it sees the mark or this cut comes after its set.
		c.failed, c.failedAt = err, time.Now()
		c.nc.SetReadDeadline(c.failedAt.Add(writeFailGrace))
	}
	return err
}

// writeFailure returns the first write error and its time (nil if none).
func (c *Conn) writeFailure() (error, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed, c.failedAt
}

// appendCopyData appends a CopyData message ('d', int32 length, payload)
// whose payload body appends.
func appendCopyData(b []byte, body func([]byte) []byte) []byte {
	start := len(b)
	b = append(b, 'd', 0, 0, 0, 0)
	b = body(b)
	binary.BigEndian.PutUint32(b[start+1:], uint32(len(b)-start-1))
	return b
}

// Recv returns the next safekeeper message. An ErrorResponse is returned as
// a *pgconn.PgError (with its SQLSTATE); CopyDone as ErrStreamEnded. ctx's
// deadline bounds the wait; cancelling ctx interrupts it.
//
// The error names the root cause of the connection's end: the safekeeper's
// ErrorResponse when it sent one — also after a write to it failed (Recv
// reads on for writeFailGrace) — else the first failure, so a write that
// failed first is not reported as the read it broke ("use of closed network
// connection", an i/o timeout).
func (c *Conn) Recv(ctx context.Context) (proto.Message, error) {
	dl, _ := ctx.Deadline() // zero: none
	c.nc.SetReadDeadline(dl)
	if _, at := c.writeFailure(); !at.IsZero() && (dl.IsZero() || at.Add(writeFailGrace).Before(dl)) {
		c.nc.SetReadDeadline(at.Add(writeFailGrace))
	}
	stop := context.AfterFunc(ctx, func() { c.nc.SetReadDeadline(time.Now()) })
	defer stop()
	for {
		msg, err := c.fe.Receive()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if werr, _ := c.writeFailure(); werr != nil {
				return nil, fmt.Errorf("proposer: write to safekeeper: %w", werr)
			}
			return nil, err
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			// Decoding copies what it keeps: the Frontend reuses m.Data.
			return proto.DecodeSafeKeeperMessage(m.Data)
		case *pgproto3.ErrorResponse:
			return nil, pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyDone:
			return nil, ErrStreamEnded
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
		default:
			return nil, fmt.Errorf("proposer: unexpected %T on a WAL push stream", msg)
		}
	}
}

// End sends CopyDone: the safekeeper makes everything durable, answers the
// remaining requests, then CopyDone, CommandComplete and ReadyForQuery.
// Recv returns ErrStreamEnded at its CopyDone; Finish reads the rest.
func (c *Conn) End() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wbuf = append(c.wbuf[:0], 'c', 0, 0, 0, 4)
	return c.writeLocked()
}

// Finish reads what follows the safekeeper's CopyDone after End: it returns
// the CommandComplete tag once ReadyForQuery arrives.
func (c *Conn) Finish(ctx context.Context) (tag string, err error) {
	if dl, ok := ctx.Deadline(); ok {
		c.nc.SetReadDeadline(dl)
	}
	for {
		msg, err := c.fe.Receive()
		if err != nil {
			return tag, err
		}
		switch m := msg.(type) {
		case *pgproto3.CommandComplete:
			tag = string(m.CommandTag)
		case *pgproto3.ReadyForQuery:
			return tag, nil
		case *pgproto3.ErrorResponse:
			return tag, pgconn.ErrorResponseToPgError(m)
		}
	}
}

// Close closes the connection at once.
func (c *Conn) Close() error {
	return c.nc.Close()
}

// NetConn returns the underlying network connection, as pgconn's Conn
// does (for socket-level inspection; writing to it breaks the stream).
func (c *Conn) NetConn() net.Conn { return c.nc }

func splitHostPort(addr string) (string, string, error) {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			h := addr[:i]
			if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
				h = h[1 : len(h)-1]
			}
			return h, addr[i+1:], nil
		}
	}
	return "", "", fmt.Errorf("proposer: safekeeper address %q is not host:port", addr)
}

// TimelineConnString is the connection string of a connection to the
// safekeeper at addr, as user, on timeline tenant/timeline: for its query
// commands (TIMELINE_STATUS) and its walsender (DialReplication).
func TimelineConnString(addr, user string, sec Security, tenant, timeline proto.ID) (string, error) {
	host, port, err := splitHostPort(addr)
	if err != nil {
		return "", err
	}
	params, err := sec.params()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("host=%s port=%s user=%s %s options='-c tenant_id=%s -c timeline_id=%s'",
		host, port, user, params, tenant, timeline), nil
}

// WriteQueue sends payloads queued on out, one socket write per burst, until
// out is closed — the owner is done with the connection (it dropped it, or
// it ended): what was queued is sent, then the connection is closed, so its
// reader ends and the link reconnects — or done is (the owner is gone: its
// last events may never have been read, so nobody would close out). After a
// write error it leaves the connection open for the reader, which reads what
// the safekeeper said before it closed (its FATAL, the root cause) and then
// reports the end (Conn.Recv); it drains out until it is closed or done is,
// and then closes the connection.
func (c *Conn) WriteQueue(out chan []byte, done <-chan struct{}) {
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
			for {
				select {
				case <-done:
					c.Close()
					return
				case _, ok := <-out:
					if !ok {
						c.Close()
						return
					}
				}
			}
		}
	}
}
