package proposer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proto"
)

// ErrStreamEnded is returned by Recv after the safekeeper ended the stream
// with CopyDone (an orderly end).
var ErrStreamEnded = errors.New("proposer: safekeeper ended the WAL push stream")

// Conn is a proposer's START_WAL_PUSH stream to one safekeeper: the client
// side of wal-push-protocol.md. Send and Recv may be used from two
// goroutines at once (one each); Close from any.
type Conn struct {
	pg *pgconn.PgConn
	fe *pgproto3.Frontend
}

// DialConfig says where and as whom to connect.
type DialConfig struct {
	// Addr is the safekeeper's host:port.
	Addr string
	// TenantID and TimelineID, when non-zero, travel in the startup options
	// (-c tenant_id=… -c timeline_id=…).
	TenantID, TimelineID proto.ID
	// ApplicationName identifies the proposer in the safekeeper's logs.
	ApplicationName string
	// ConnectTimeout bounds connecting and START_WAL_PUSH; default 10 s.
	ConnectTimeout time.Duration
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
	connStr := fmt.Sprintf("host=%s port=%s user=proposer sslmode=disable connect_timeout=%d",
		host, port, int(cfg.ConnectTimeout.Seconds()+0.999))
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
	c := &Conn{pg: pg, fe: pg.Frontend()}
	c.fe.Send(&pgproto3.Query{String: "START_WAL_PUSH"})
	if err := c.fe.Flush(); err != nil {
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
			return c, nil
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
	c.fe.Send(&pgproto3.CopyData{Data: m.Encode(nil)})
	return c.fe.Flush()
}

// SendRaw sends payload as one CopyData, unchecked (tests use it for
// malformed input).
func (c *Conn) SendRaw(payload []byte) error {
	c.fe.Send(&pgproto3.CopyData{Data: payload})
	return c.fe.Flush()
}

// Recv returns the next safekeeper message. An ErrorResponse is returned as
// a *pgconn.PgError (with its SQLSTATE); CopyDone as ErrStreamEnded.
func (c *Conn) Recv(ctx context.Context) (proto.Message, error) {
	for {
		msg, err := c.pg.ReceiveMessage(ctx)
		if err != nil {
			return nil, err
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			return proto.DecodeSafeKeeperMessage(m.Data) // decoders copy nothing they keep but History, which they allocate
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
func (c *Conn) End() error {
	c.fe.Send(&pgproto3.CopyDone{})
	return c.fe.Flush()
}

// Close closes the connection at once.
func (c *Conn) Close() error {
	return c.pg.Conn().Close()
}

// PgConn exposes the underlying connection (after the stream has ended it is
// back in query mode).
func (c *Conn) PgConn() *pgconn.PgConn { return c.pg }

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
