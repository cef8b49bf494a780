package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proto"
)

// Replication is a physical replication connection (replication=true): to
// the primary, or to a safekeeper's walsender (a catch-up from a peer,
// sync's copy from the donor, wal fetch, timeline pull).
type Replication struct {
	pg *pgconn.PgConn
}

// NewReplication wraps an established replication connection (for
// instance one pgconn.Construct made of a hijacked socket).
func NewReplication(pg *pgconn.PgConn) *Replication { return &Replication{pg: pg} }

// SystemInfo is what the primary says about itself (Identify).
type SystemInfo struct {
	SystemID   uint64
	Timeline   uint32
	XLogPos    proto.LSN // the primary's flush position (IDENTIFY_SYSTEM)
	SegSize    uint32
	PgVersion  uint32    // server_version_num
	RestartLSN proto.LSN // the slot's (EnsureSlot), set by the caller
	History    []byte    // the history file of Timeline (> 1: a promoted primary)
}

// DialReplication opens a physical replication connection (replication=true)
// to peer, which names the server in errors: "primary", or "safekeeper
// host:port" when sync reads from a safekeeper.
func DialReplication(ctx context.Context, peer, connStr, appName string, timeout time.Duration) (*Replication, error) {
	pcfg, err := pgconn.ParseConfig(connStr)
	if err != nil {
		return nil, fmt.Errorf("proposer: %s connection string: %w", peer, err)
	}
	pcfg.RuntimeParams["replication"] = "true"
	pcfg.RuntimeParams["application_name"] = appName
	if pcfg.ConnectTimeout == 0 || pcfg.ConnectTimeout > timeout {
		pcfg.ConnectTimeout = timeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pg, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("proposer: connect to %s: %w", peer, err)
	}
	return &Replication{pg: pg}, nil
}

// Close closes the connection.
func (u *Replication) Close() { u.pg.Close(context.Background()) }

// FlushPos returns the primary's current flush position (IDENTIFY_SYSTEM's
// xlogpos). The connection must not be streaming.
func (u *Replication) FlushPos(ctx context.Context) (proto.LSN, error) {
	is, err := pglogrepl.IdentifySystem(ctx, u.pg)
	if err != nil {
		return 0, fmt.Errorf("proposer: IDENTIFY_SYSTEM: %w", err)
	}
	return proto.LSN(is.XLogPos), nil
}

// ErrUpstreamInRecovery: --upstream names a server in recovery (a hot
// standby), not a primary. Its WAL is the primary's, replayed: a proposer
// streaming it would win the timeline's term and leave the real primary's
// proposer waiting, and the primary's commits with it. The session ends
// before it campaigns; Run retries (a standby being promoted becomes the
// primary).
var ErrUpstreamInRecovery = errors.New("proposer: --upstream is a standby in recovery, not a primary: point it at the primary (or promote this server)")

// Identify runs IDENTIFY_SYSTEM and the SHOWs. A server in recovery says
// so at connection start (in_hot_standby, a ParameterStatus of PostgreSQL
// 14 and later): ErrUpstreamInRecovery.
func (u *Replication) Identify(ctx context.Context) (SystemInfo, error) {
	var in SystemInfo
	if u.pg.ParameterStatus("in_hot_standby") == "on" {
		return in, ErrUpstreamInRecovery
	}
	is, err := pglogrepl.IdentifySystem(ctx, u.pg)
	if err != nil {
		return in, fmt.Errorf("proposer: IDENTIFY_SYSTEM: %w", err)
	}
	if in.SystemID, err = strconv.ParseUint(is.SystemID, 10, 64); err != nil {
		return in, fmt.Errorf("proposer: IDENTIFY_SYSTEM system id %q: %w", is.SystemID, err)
	}
	in.Timeline, in.XLogPos = uint32(is.Timeline), proto.LSN(is.XLogPos)
	seg, err := u.show(ctx, "wal_segment_size")
	if err != nil {
		return in, err
	}
	if in.SegSize, err = parseSize(seg); err != nil || !proto.ValidSegSize(in.SegSize) {
		return in, fmt.Errorf("proposer: wal_segment_size %q is not a valid segment size", seg)
	}
	ver, err := u.show(ctx, "server_version_num")
	if err != nil {
		return in, err
	}
	v, err := strconv.ParseUint(ver, 10, 32)
	if err != nil {
		return in, fmt.Errorf("proposer: server_version_num %q: %w", ver, err)
	}
	in.PgVersion = uint32(v)
	if in.Timeline > 1 {
		// A promoted primary: its history file goes to the safekeepers
		// (TimelineHistory), which switch the timeline with it.
		h, err := pglogrepl.TimelineHistory(ctx, u.pg, int32(in.Timeline))
		if err != nil {
			return in, fmt.Errorf("proposer: TIMELINE_HISTORY %d: %w", in.Timeline, err)
		}
		in.History = h.Content
	}
	return in, nil
}

func (u *Replication) show(ctx context.Context, name string) (string, error) {
	res, err := u.pg.Exec(ctx, "SHOW "+name).ReadAll()
	if err != nil {
		return "", fmt.Errorf("proposer: SHOW %s: %w", name, err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return "", fmt.Errorf("proposer: SHOW %s: unexpected result shape", name)
	}
	return string(res[0].Rows[0][0]), nil
}

// parseSize parses PostgreSQL's size display: "16MB", "1GB", "1048576" (bytes).
func parseSize(s string) (uint32, error) {
	mult := uint64(1)
	for _, u := range []struct {
		suf string
		m   uint64
	}{{"kB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSuffix(s, u.suf), u.m
			break
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
	if err != nil {
		return 0, err
	}
	if n*mult > 1<<31 {
		return 0, errors.New("too large")
	}
	return uint32(n * mult), nil
}

// EnsureSlot creates the physical slot with RESERVE_WAL, or reuses it
// (SQLSTATE 42710), and returns its restart_lsn (0 if the slot reserves
// nothing).
func (u *Replication) EnsureSlot(ctx context.Context, name string) (proto.LSN, error) {
	q := fmt.Sprintf("CREATE_REPLICATION_SLOT %s PHYSICAL RESERVE_WAL", quoteIdent(name))
	res, err := u.pg.Exec(ctx, q).ReadAll()
	var pe *pgconn.PgError
	switch {
	case err == nil:
		if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) < 2 {
			return 0, errors.New("proposer: CREATE_REPLICATION_SLOT: unexpected result shape")
		}
		if lsn, err := parseLSNCol(res[0].Rows[0][1]); err != nil || lsn != 0 {
			return lsn, err
		}
		// A physical slot's consistent_point is NULL on PostgreSQL 15: read
		// the restart_lsn RESERVE_WAL gave it.
	case errors.As(err, &pe) && pe.Code == "42710": // duplicate_object: reuse
	default:
		return 0, fmt.Errorf("proposer: %s: %w", q, err)
	}
	res, err = u.pg.Exec(ctx, "READ_REPLICATION_SLOT "+quoteIdent(name)).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("proposer: READ_REPLICATION_SLOT: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) < 2 {
		return 0, errors.New("proposer: READ_REPLICATION_SLOT: unexpected result shape")
	}
	return parseLSNCol(res[0].Rows[0][1])
}

func parseLSNCol(b []byte) (proto.LSN, error) {
	if b == nil {
		return 0, nil // NULL
	}
	return proto.ParseLSN(string(b))
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// StartReplication sends START_REPLICATION [SLOT s] PHYSICAL from TIMELINE
// tli and waits for CopyBothResponse.
func (u *Replication) StartReplication(ctx context.Context, slot string, from proto.LSN, tli uint32) error {
	return u.StartReplicationTerm(ctx, slot, from, tli, 0)
}

// StartReplicationTerm is StartReplication with, for term > 0, a
// safekeeper's term-reader option (term 'N'): the safekeeper then serves WAL
// up to its flush_lsn while it still votes in term N (docs/serving.md).
func (u *Replication) StartReplicationTerm(ctx context.Context, slot string, from proto.LSN, tli uint32, term uint64) error {
	q := "START_REPLICATION "
	if slot != "" {
		q += "SLOT " + quoteIdent(slot) + " "
	}
	q += fmt.Sprintf("PHYSICAL %s TIMELINE %d", from, tli)
	if term > 0 {
		q += fmt.Sprintf(" (term '%d')", term)
	}
	fe := u.pg.Frontend()
	fe.Send(&pgproto3.Query{String: q})
	if err := fe.Flush(); err != nil {
		return err
	}
	for {
		msg, err := u.pg.ReceiveMessage(ctx)
		if err != nil {
			return fmt.Errorf("proposer: %s: %w", q, err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyBothResponse:
			return nil
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("proposer: %s: %w", q, pgconn.ErrorResponseToPgError(m))
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
		default:
			return fmt.Errorf("proposer: %s: unexpected %T", q, msg)
		}
	}
}

// StreamMsg is one message of the replication stream: XLogData (WAL
// non-nil, a private copy, at Start) or a keepalive.
type StreamMsg struct {
	Start          proto.LSN
	WAL            []byte
	ServerEnd      proto.LSN
	ReplyRequested bool
}

// Recv returns the next XLogData or keepalive. The stream's end or an error
// is an error.
func (u *Replication) Recv(ctx context.Context) (StreamMsg, error) {
	for {
		msg, err := u.pg.ReceiveMessage(ctx)
		if err != nil {
			return StreamMsg{}, err
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				return StreamMsg{}, errors.New("proposer: empty CopyData from primary")
			}
			switch m.Data[0] {
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return StreamMsg{}, err
				}
				// Copy: pgconn reuses the message buffer on the next receive.
				return StreamMsg{Start: proto.LSN(x.WALStart), WAL: append([]byte(nil), x.WALData...), ServerEnd: proto.LSN(x.ServerWALEnd)}, nil
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return StreamMsg{}, err
				}
				return StreamMsg{ServerEnd: proto.LSN(k.ServerWALEnd), ReplyRequested: k.ReplyRequested}, nil
			}
		case *pgproto3.ErrorResponse:
			return StreamMsg{}, fmt.Errorf("proposer: primary: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return StreamMsg{}, errors.New("proposer: primary ended the replication stream")
		case *pgproto3.CommandComplete:
			// A walsender ends its stream so when its server shuts down
			// (WalSndDone: CommandComplete inside COPY mode).
			return StreamMsg{}, errors.New("proposer: primary ended the replication stream: it is shutting down")
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
		default:
			// The message's protocol name, not the Go type's.
			return StreamMsg{}, fmt.Errorf("proposer: unexpected message %s on the replication stream", strings.TrimPrefix(fmt.Sprintf("%T", msg), "*pgproto3."))
		}
	}
}

// pgEpoch is PostgreSQL's time origin, 2000-01-01 00:00:00 UTC.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// SendStatus sends a standby status update ('r'): write, flush and apply
// positions exactly as given (pglogrepl's helper would replace apply = 0 by
// write, which would let remote_apply commits return early).
func (u *Replication) SendStatus(write, flush, apply proto.LSN, now time.Time) error {
	var b [1 + 8 + 8 + 8 + 8 + 1]byte
	b[0] = 'r'
	binary.BigEndian.PutUint64(b[1:], uint64(write))
	binary.BigEndian.PutUint64(b[9:], uint64(flush))
	binary.BigEndian.PutUint64(b[17:], uint64(apply))
	binary.BigEndian.PutUint64(b[25:], uint64(now.Sub(pgEpoch).Microseconds()))
	buf, err := (&pgproto3.CopyData{Data: b[:]}).Encode(nil)
	if err != nil {
		return err
	}
	return u.pg.Frontend().SendUnbufferedEncodedCopyData(buf)
}

// Forward reads the started replication stream from `from` and hands each
// XLogData chunk to deliver, answering keepalives that ask for a reply with
// write = received (flush 0: a forwarding stream never counts as a
// synchronous standby). It stops when deliver returns false (nil), when the
// stream reaches `to` (nil; 0 means never), or at the first error.
func (u *Replication) Forward(ctx context.Context, from, to proto.LSN, deliver func(start proto.LSN, wal []byte) bool) error {
	received := from
	for to == 0 || received < to {
		m, err := u.Recv(ctx)
		if err != nil {
			return err
		}
		if m.WAL == nil {
			if m.ReplyRequested {
				u.SendStatus(received, 0, 0, time.Now())
			}
			continue
		}
		if !deliver(m.Start, m.WAL) {
			return nil
		}
		received = m.Start + proto.LSN(len(m.WAL))
	}
	return nil
}

// HandOff returns a deliver function for Forward that passes each chunk to
// post with a fresh ack channel and waits until the receiver closes it (it
// has taken the chunk), which paces the stream to its consumer. It stops
// the stream when post refuses or ctx ends.
func HandOff(ctx context.Context, post func(start proto.LSN, wal []byte, ack chan struct{}) bool) func(proto.LSN, []byte) bool {
	return func(start proto.LSN, wal []byte) bool {
		ack := make(chan struct{})
		if !post(start, wal, ack) {
			return false
		}
		select {
		case <-ack:
			return true
		case <-ctx.Done():
			return false
		}
	}
}

// TimelineHistory reads the history file of PostgreSQL timeline tli
// (TIMELINE_HISTORY). The connection must not be streaming.
func (u *Replication) TimelineHistory(ctx context.Context, tli uint32) ([]byte, error) {
	h, err := pglogrepl.TimelineHistory(ctx, u.pg, int32(tli))
	if err != nil {
		return nil, err
	}
	return h.Content, nil
}
