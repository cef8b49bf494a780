package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto"
)

// ErrNoTimeline: the safekeepers asked do not hold the timeline (they
// answered TIMELINE_STATUS, or a greeting not allowed to create it, with
// 42704).
var ErrNoTimeline = errors.New("proposer: no safekeeper holds the timeline")

// sqlstateUndefinedObject is what a safekeeper answers TIMELINE_STATUS
// for a timeline it does not hold.
const sqlstateUndefinedObject = "42704"

// Probe is one safekeeper's answer to TIMELINE_STATUS.
type Probe struct {
	Addr    string
	Holds   bool // the timeline exists there; the fields below are set
	Missing bool // the safekeeper answered that it does not hold the timeline
	Err     error

	SystemID                       uint64
	PgVersion, SegSize, PgTimeline uint32

	Term, LastLogTerm                       uint64
	Flush, Commit, TimelineStart, RemovedTo proto.LSN
	// ProposerAddr is the push connection that last streamed, while it is
	// connected ("" otherwise); LastPushTerm its term; LastPushAge the
	// time since (-1: none since the safekeeper started).
	ProposerAddr string
	LastPushTerm uint64
	LastPushAge  time.Duration
}

// Live reports whether a proposer of term streamed to the safekeeper within
// window and is still connected.
func (p Probe) Live(term uint64, window time.Duration) bool {
	return p.ProposerAddr != "" && p.LastPushTerm == term && p.LastPushAge >= 0 && p.LastPushAge <= window
}

// ProbeTimeline asks the safekeeper at addr TIMELINE_STATUS for the
// timeline tenant/timeline; timeout bounds the connection (0: 10 s).
func ProbeTimeline(ctx context.Context, addr string, tenant, timeline proto.ID, sec Security, timeout time.Duration) Probe {
	p := Probe{Addr: addr}
	connStr, err := TimelineConnString(addr, "sync", sec, tenant, timeline)
	if err != nil {
		p.Err = err
		return p
	}
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	up, err := DialReplication(ctx, "safekeeper "+addr, connStr, "sync", timeout)
	if err != nil {
		p.Err = err
		return p
	}
	res, err := up.pg.Exec(ctx, "TIMELINE_STATUS").ReadAll()
	up.Close()
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == sqlstateUndefinedObject:
		p.Missing = true
		return p
	case err != nil:
		p.Err = fmt.Errorf("%s: TIMELINE_STATUS: %w", addr, err)
		return p
	case len(res) != 1 || len(res[0].Rows) != 1:
		p.Err = fmt.Errorf("%s: TIMELINE_STATUS returned no row", addr)
		return p
	}
	p.parse(res[0])
	return p
}

// parse fills p from TIMELINE_STATUS's row; a malformed column is p.Err.
func (p *Probe) parse(res *pgconn.Result) {
	col := map[string]string{}
	null := map[string]bool{}
	for j, f := range res.FieldDescriptions {
		if j < len(res.Rows[0]) {
			col[f.Name] = string(res.Rows[0][j])
			null[f.Name] = res.Rows[0][j] == nil
		}
	}
	parse := func(name string, bits int) uint64 {
		v, err := strconv.ParseUint(col[name], 10, bits)
		if err != nil && p.Err == nil {
			p.Err = fmt.Errorf("%s: TIMELINE_STATUS %s %q: %w", p.Addr, name, col[name], err)
		}
		return v
	}
	p.SystemID = parse("system_id", 64)
	pgv, seg, tli := parse("pg_version", 32), parse("wal_seg_size", 32), parse("pg_timeline", 32)
	p.Term, p.LastLogTerm = parse("term", 64), parse("last_log_term", 64)
	lsn := func(name string) proto.LSN {
		l, err := proto.ParseLSN(col[name])
		if err != nil && p.Err == nil {
			p.Err = fmt.Errorf("%s: TIMELINE_STATUS %s %q: %w", p.Addr, name, col[name], err)
		}
		return l
	}
	p.Flush, p.Commit = lsn("flush_lsn"), lsn("commit_lsn")
	p.TimelineStart, p.RemovedTo = lsn("timeline_start_lsn"), lsn("removed_up_to")
	// A safekeeper of an older build has no push columns: no proposer.
	p.ProposerAddr, p.LastPushAge = col["proposer_addr"], -1
	if _, ok := col["last_push_term"]; ok {
		p.LastPushTerm = parse("last_push_term", 64)
	}
	if _, ok := col["last_push_age_ms"]; ok && !null["last_push_age_ms"] {
		p.LastPushAge = time.Duration(parse("last_push_age_ms", 63)) * time.Millisecond
	}
	if p.Err != nil {
		return
	}
	p.Holds = true
	p.PgVersion, p.SegSize, p.PgTimeline = uint32(pgv), uint32(seg), uint32(tli)
}
