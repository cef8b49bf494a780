package ingest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proto"
)

// Reader is a physical replication client of one timeline, as a
// pageserver or pg_receivewal reads a safekeeper: pgconn with
// replication=true and the timeline in the startup options,
// START_REPLICATION PHYSICAL from an LSN, XLogData parsed by pglogrepl,
// standby status updates ('r') every second and whenever the server asks.
// It reports no consumer feedback ('z'), so the safekeeper removes no WAL
// on its account.
type Reader struct {
	pg  *pgconn.PgConn
	pos proto.LSN // next LSN to receive
}

// StartReader connects and starts streaming from start (an ordinary reader:
// the safekeeper sends WAL up to its commit_lsn).
func StartReader(ctx context.Context, addr string, key proto.TimelineKey, start proto.LSN) (*Reader, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	pg, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=bench application_name=bench-reader sslmode=disable replication=true connect_timeout=10 options='-c tenant_id=%s -c timeline_id=%s'",
		host, port, key.TenantID, key.TimelineID))
	if err != nil {
		return nil, fmt.Errorf("reader: connect: %w", err)
	}
	if _, err := pglogrepl.IdentifySystem(ctx, pg); err != nil {
		pg.Close(ctx)
		return nil, fmt.Errorf("reader: IDENTIFY_SYSTEM: %w", err)
	}
	// pglogrepl.StartReplication always names a slot; this reader has none.
	fe := pg.Frontend()
	fe.Send(&pgproto3.Query{String: fmt.Sprintf("START_REPLICATION PHYSICAL %s TIMELINE 1", start)})
	if err := fe.Flush(); err != nil {
		pg.Close(ctx)
		return nil, err
	}
	for {
		msg, err := pg.ReceiveMessage(ctx)
		if err != nil {
			pg.Close(ctx)
			return nil, fmt.Errorf("reader: START_REPLICATION: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyBothResponse:
			return &Reader{pg: pg, pos: start}, nil
		case *pgproto3.ErrorResponse:
			pg.Close(ctx)
			return nil, fmt.Errorf("reader: START_REPLICATION: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
		default:
			pg.Close(ctx)
			return nil, fmt.Errorf("reader: START_REPLICATION: unexpected %T", msg)
		}
	}
}

// Pos is the next LSN the reader will receive.
func (r *Reader) Pos() proto.LSN { return r.pos }

// Close drops the connection.
func (r *Reader) Close() { r.pg.Close(context.Background()) }

// Follow receives WAL until the reader's position reaches stop, checking
// that every XLogData continues where the last one ended and, when w is
// not nil, that its bytes are w's. It returns, for each of marks, when the
// position first reached it (zero for one not reached).
func (r *Reader) Follow(ctx context.Context, stop proto.LSN, marks []proto.LSN, w *WAL) ([]time.Time, error) {
	at := make([]time.Time, len(marks))
	note := func() {
		now := time.Now()
		for i, m := range marks {
			if at[i].IsZero() && r.pos >= m {
				at[i] = now
			}
		}
	}
	note()
	lastStatus := time.Now()
	for r.pos < stop {
		msg, err := r.pg.ReceiveMessage(ctx)
		if err != nil {
			return at, fmt.Errorf("reader at %v: %w", r.pos, err)
		}
		reply := false
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			switch m.Data[0] {
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return at, fmt.Errorf("reader at %v: %w", r.pos, err)
				}
				if proto.LSN(x.WALStart) != r.pos {
					return at, fmt.Errorf("reader: XLogData at %v, want %v", proto.LSN(x.WALStart), r.pos)
				}
				if w != nil {
					off := int64(r.pos - w.Start)
					if off+int64(len(x.WALData)) > int64(len(w.Data)) || !bytes.Equal(x.WALData, w.Data[off:off+int64(len(x.WALData))]) {
						return at, fmt.Errorf("reader: XLogData at %v (%d bytes) differs from the WAL sent", r.pos, len(x.WALData))
					}
				}
				r.pos += proto.LSN(len(x.WALData))
				note()
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return at, err
				}
				reply = k.ReplyRequested
			}
		case *pgproto3.ErrorResponse:
			return at, fmt.Errorf("reader at %v: %w", r.pos, pgconn.ErrorResponseToPgError(m))
		}
		if reply || time.Since(lastStatus) >= time.Second {
			lastStatus = time.Now()
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, r.pg, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(r.pos)}); err != nil {
				return at, err
			}
		}
	}
	return at, nil
}
