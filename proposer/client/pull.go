package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto"
)

// PeerTimeline is what a peer safekeeper holds of a timeline, read for a
// pull (`safekeeper timeline pull`) without changing anything there.
type PeerTimeline struct {
	Addr string
	// Security is how PeerState connected, and CopyWAL connects.
	Security Security
	// Info is the peer's answer to a greeting: voted_for, the term history
	// cut at flush_lsn, flush_lsn, commit_lsn, truncate_lsn,
	// timeline_start_lsn.
	Info                              proto.SafeKeeperInfo
	SystemID                          uint64
	PgVersion, WalSegSize, PgTimeline uint32
	// RemovedUpTo is the peer's retention horizon: it holds no WAL below.
	RemovedUpTo proto.LSN
	// PgHistory is the history file of PostgreSQL timeline PgTimeline,
	// as the promoted primary wrote it (TIMELINE_HISTORY on the peer); nil
	// on timeline 1. A pull must store it with the state: without it the
	// pulled safekeeper refuses the promoted primary's proposer (its
	// TimelineHistory differs from none recorded) for good.
	PgHistory []byte
	// Slots is the peer's slot table (its persistent replication slots and
	// the tombstones of dropped ones): a pull stores it, so the slots
	// survive the loss of this safekeeper's disk.
	Slots []proto.SlotEntry
}

// FirstHeld is where a copy of the peer's WAL starts: the timeline start
// when the peer holds it from there, else the first whole segment it holds.
func (p *PeerTimeline) FirstHeld() proto.LSN {
	start := p.Info.TimelineStartLSN
	if p.RemovedUpTo <= start {
		return start
	}
	l, seg := p.RemovedUpTo, uint64(p.WalSegSize)
	if off := l.SegmentOffset(seg); off != 0 {
		l += proto.LSN(seg - off)
	}
	return l
}

// PeerState reads a peer's state of a timeline: TIMELINE_STATUS, then a
// greeting (ServerInfo; the SafeKeeperInfo answer, then its slot table),
// which changes nothing on a timeline the peer holds, then, on a
// PostgreSQL timeline above 1, its history file (TIMELINE_HISTORY).
// ErrNoTimeline if it does not hold it.
func PeerState(ctx context.Context, addr string, tenant, timeline proto.ID, connectTimeout time.Duration, sec Security) (PeerTimeline, error) {
	if connectTimeout == 0 {
		connectTimeout = 10 * time.Second
	}
	p := ProbeTimeline(ctx, addr, tenant, timeline, sec, connectTimeout)
	switch {
	case p.Missing:
		return PeerTimeline{}, fmt.Errorf("%w: %s does not hold timeline %s/%s", ErrNoTimeline, addr, tenant, timeline)
	case p.Err != nil:
		return PeerTimeline{}, p.Err
	}
	var uuid proto.ID
	if _, err := io.ReadFull(rand.Reader, uuid[:]); err != nil {
		return PeerTimeline{}, err
	}
	c, err := Dial(ctx, DialConfig{Addr: addr, TenantID: tenant, TimelineID: timeline, ApplicationName: "timeline_pull", ConnectTimeout: connectTimeout,
		Security: sec, SyncSlots: true})
	if err != nil {
		return PeerTimeline{}, err
	}
	defer c.Close()
	if err := c.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: p.PgVersion, SystemID: p.SystemID,
		TenantID: tenant, TimelineID: timeline, PgTimeline: p.PgTimeline, WalSegSize: p.SegSize, ProposerUUID: uuid}); err != nil {
		return PeerTimeline{}, err
	}
	m, err := c.Recv(ctx)
	if err != nil {
		return PeerTimeline{}, fmt.Errorf("%s: greeting: %w", addr, err)
	}
	info, ok := m.(*proto.SafeKeeperInfo)
	if !ok {
		return PeerTimeline{}, fmt.Errorf("%s: greeting answered with %T", addr, m)
	}
	if m, err = c.Recv(ctx); err != nil {
		return PeerTimeline{}, fmt.Errorf("%s: slot table: %w", addr, err)
	}
	slots, ok := m.(*proto.SafeKeeperSlots)
	if !ok {
		return PeerTimeline{}, fmt.Errorf("%s: greeting followed by %T, want its slot table", addr, m)
	}
	pt := PeerTimeline{Addr: addr, Security: sec, Info: *info, SystemID: p.SystemID, PgVersion: p.PgVersion, WalSegSize: p.SegSize,
		PgTimeline: p.PgTimeline, RemovedUpTo: p.RemovedTo, Slots: slots.Entries}
	if pt.PgTimeline > 1 {
		if pt.PgHistory, err = peerHistory(ctx, &pt, tenant, timeline, connectTimeout); err != nil {
			return PeerTimeline{}, err
		}
	}
	return pt, nil
}

// peerHistory reads the history file of the peer's PostgreSQL timeline
// (TIMELINE_HISTORY p.PgTimeline) and checks that it is one. A peer on a
// timeline above 1 that holds none (58P01) is an error too: a copy of it
// would refuse the promoted primary's proposer as the peer itself does.
func peerHistory(ctx context.Context, p *PeerTimeline, tenant, timeline proto.ID, connectTimeout time.Duration) ([]byte, error) {
	connStr, err := TimelineConnString(p.Addr, "pull", p.Security, tenant, timeline)
	if err != nil {
		return nil, err
	}
	up, err := DialReplication(ctx, "peer safekeeper "+p.Addr, connStr, "timeline_pull", connectTimeout)
	if err != nil {
		return nil, err
	}
	defer up.Close()
	h, err := up.TimelineHistory(ctx, p.PgTimeline)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "58P01":
		return nil, fmt.Errorf("%s is on PostgreSQL timeline %d but holds no history file for it; pull from a peer that does: %w", p.Addr, p.PgTimeline, err)
	case err != nil:
		return nil, fmt.Errorf("%s: TIMELINE_HISTORY %d: %w", p.Addr, p.PgTimeline, err)
	case len(h) > proto.MaxPgHistory:
		return nil, fmt.Errorf("%s: TIMELINE_HISTORY %d: %d bytes, at most %d", p.Addr, p.PgTimeline, len(h), proto.MaxPgHistory)
	}
	if _, err := proto.ParsePgHistory(p.PgTimeline, h); err != nil {
		return nil, fmt.Errorf("%s: TIMELINE_HISTORY %d: %w", p.Addr, p.PgTimeline, err)
	}
	return bytes.Clone(h), nil
}

// CopyWAL streams the peer's WAL [from, to) to deliver, chunk by chunk in
// order, as a term reader of term (served up to the peer's flush_lsn while
// it votes in that term; a term change ends it with an error). A deliver
// error stops the copy and is returned.
func CopyWAL(ctx context.Context, p *PeerTimeline, tenant, timeline proto.ID, from, to proto.LSN, connectTimeout time.Duration,
	deliver func(start proto.LSN, wal []byte) error) error {
	if connectTimeout == 0 {
		connectTimeout = 10 * time.Second
	}
	connStr, err := TimelineConnString(p.Addr, "pull", p.Security, tenant, timeline)
	if err != nil {
		return err
	}
	up, err := DialReplication(ctx, "peer safekeeper "+p.Addr, connStr, "timeline_pull", connectTimeout)
	if err != nil {
		return err
	}
	defer up.Close()
	if err := up.StartReplicationTerm(ctx, "", from, p.PgTimeline, p.Info.VotedFor.Term); err != nil {
		return fmt.Errorf("%s: %w", p.Addr, err)
	}
	got := from
	var derr error
	err = up.Forward(ctx, from, to, func(at proto.LSN, wal []byte) bool {
		if at != got {
			derr = fmt.Errorf("%s: WAL at %s, expected %s", p.Addr, at, got)
			return false
		}
		wal = wal[:min(len(wal), int(to-at))]
		if derr = deliver(at, wal); derr != nil {
			return false
		}
		got += proto.LSN(len(wal))
		return true
	})
	if err == nil {
		err = derr
	}
	if err == nil && got < to {
		err = fmt.Errorf("%s: stream ended at %s, below %s", p.Addr, got, to)
	}
	return err
}
