package server

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/proto/replcmd"
	"github.com/safekeeper/safekeeper/server/auth"
	"github.com/safekeeper/safekeeper/server/timeline"
)

// replConn is one client connection in query mode.
type replConn struct {
	srv      *Server
	pc       *pgwire.Conn
	ids      startupIDs
	log      *slog.Logger
	id       uint64 // connection number: the "PID" in slot errors
	physical bool   // replication=true: the walsender command set
	tl       *timeline.Timeline
	claims   *auth.Claims // the token's, when auth is on
}

// close releases what the connection holds: its temporary slots.
func (c *replConn) close() {
	if c.tl != nil {
		c.tl.DropTemporary(c.id)
		c.tl.Unbind(c.pc)
	}
}

// timeline resolves (once) the timeline this connection reads.
func (c *replConn) timeline() (*timeline.Timeline, error) {
	if c.tl != nil {
		return c.tl, nil
	}
	tl, err := c.srv.resolveTimeline(c.ids, c.claims)
	if err != nil {
		return nil, err
	}
	if err := allows(c.claims, c.srv.auth != nil, tl.Key()); err != nil {
		c.log.Info("refused: the token does not cover the timeline", "tenant_id", tl.Key().TenantID.String(), "timeline_id", tl.Key().TimelineID.String())
		return nil, err
	}
	if err := tl.Bind(c.pc); err != nil {
		return nil, fromTimeline(err)
	}
	c.tl = tl
	return tl, nil
}

// fail answers a command with an ErrorResponse and ReadyForQuery; the
// connection stays in query mode.
func (c *replConn) fail(err error) bool {
	c.pc.SendError(wireError(err))
	return c.pc.SendReadyForQuery() == nil
}

// done answers a command that succeeded: ReadyForQuery.
func (c *replConn) done(err error) bool {
	if err != nil {
		return false
	}
	return c.pc.SendReadyForQuery() == nil
}

// handle runs one query. It returns false when the connection must close.
func (c *replConn) handle(q string) bool {
	cmd, err := replcmd.Parse(q)
	if err != nil {
		return c.fail(err)
	}
	switch cmd := cmd.(type) {
	case replcmd.Empty:
		c.pc.SendEmptyQueryResponse()
		return c.done(nil)
	case replcmd.StartWALPush:
		return c.srv.runPush(c.pc, cmd, c.ids, c.claims, c.log)
	case replcmd.SQL:
		if c.physical {
			return c.fail(pgwire.Errorf(pgwire.FeatureNotSupported, "cannot execute SQL commands in WAL sender for physical replication"))
		}
		e := pgwire.Errorf(pgwire.SyntaxError, "syntax error: unknown command %q", firstWord(cmd.Text))
		e.Hint = "This is a safekeeper; it runs no SQL. Connect with replication=true for IDENTIFY_SYSTEM, START_REPLICATION and TIMELINE_STATUS."
		return c.fail(e)
	case replcmd.IdentifySystem:
		return c.identifySystem()
	case replcmd.TimelineStatus:
		return c.timelineStatus()
	}
	if !c.physical {
		return c.fail(pgwire.Errorf(pgwire.FeatureNotSupported,
			"%s needs a replication connection (startup parameter replication=true)", cmd.Name()))
	}
	switch cmd := cmd.(type) {
	case replcmd.Show:
		return c.show(cmd)
	case replcmd.TimelineHistory:
		return c.timelineHistory(cmd)
	case replcmd.ReadSlot:
		return c.readSlot(cmd)
	case replcmd.CreateSlot:
		return c.createSlot(cmd)
	case replcmd.DropSlot:
		return c.dropSlot(cmd)
	case replcmd.StartReplication:
		return c.startReplication(cmd)
	}
	return c.fail(pgwire.Errorf(pgwire.InternalError, "unhandled command %s", cmd.Name()))
}

func text(s string) []byte { return []byte(s) }

func (c *replConn) readSlot(cmd replcmd.ReadSlot) bool {
	tl, err := c.timeline()
	if err != nil {
		return c.fail(err)
	}
	cols := []pgwire.Column{pgwire.TextColumn("slot_type"), pgwire.TextColumn("restart_lsn"), pgwire.Int8Column("restart_tli")}
	row := [][]byte{nil, nil, nil}
	if restart, tli, ok := tl.ReadSlot(cmd.Slot); ok {
		row[0] = text("physical")
		if restart != 0 {
			row[1] = text(restart.String())
			row[2] = text(strconv.FormatUint(uint64(tli), 10))
		}
	}
	return c.done(c.pc.SendRows(cols, [][][]byte{row}, "READ_REPLICATION_SLOT"))
}

func (c *replConn) createSlot(cmd replcmd.CreateSlot) bool {
	tl, err := c.timeline()
	if err != nil {
		return c.fail(err)
	}
	restart, err := tl.CreateSlot(cmd.Slot, cmd.ReserveWAL, cmd.Temporary, c.id)
	if err != nil {
		return c.fail(err)
	}
	c.log.Info("created replication slot", "slot", cmd.Slot, "temporary", cmd.Temporary, "restart_lsn", restart)
	cols := []pgwire.Column{pgwire.TextColumn("slot_name"), pgwire.TextColumn("consistent_point"), pgwire.TextColumn("snapshot_name"), pgwire.TextColumn("output_plugin")}
	return c.done(c.pc.SendRows(cols, [][][]byte{{text(cmd.Slot), text("0/0"), nil, nil}}, "CREATE_REPLICATION_SLOT"))
}

func (c *replConn) dropSlot(cmd replcmd.DropSlot) bool {
	tl, err := c.timeline()
	if err != nil {
		return c.fail(err)
	}
	if err := tl.DropSlot(cmd.Slot); err != nil {
		return c.fail(err)
	}
	c.log.Info("dropped replication slot", "slot", cmd.Slot)
	return c.done(c.pc.SendCommandComplete("DROP_REPLICATION_SLOT"))
}

// timelineHistory answers TIMELINE_HISTORY n with the history file of
// PostgreSQL timeline n, the bytes PostgreSQL wrote: the timeline's own
// (recorded at the switch to it) or, for an ancestor, its first lines. A
// timeline without one (1, or one the timeline never was on) gets the
// walsender's error for a missing file.
func (c *replConn) timelineHistory(cmd replcmd.TimelineHistory) bool {
	tl, err := c.timeline()
	if err != nil {
		return c.fail(err)
	}
	st, err := c.walStarted(tl)
	if err != nil {
		return c.fail(err)
	}
	content, ok := []byte(nil), false
	switch {
	case cmd.TLI == st.PgTimeline && len(st.PgHistory) > 0:
		content, ok = st.PgHistory, true
	case cmd.TLI < st.PgTimeline:
		content, ok = proto.PgHistoryPrefix(st.PgHistory, cmd.TLI)
	}
	name := fmt.Sprintf("%08X.history", cmd.TLI)
	if !ok {
		return c.fail(pgwire.Errorf(pgwire.UndefinedFile, "could not open file \"pg_wal/%s\": No such file or directory", name))
	}
	// As PostgreSQL's walsender: filename text and content bytea, both
	// with typmod 0; the content goes raw (no client decodes the type).
	cols := []pgwire.Column{{Name: "filename", TypeOID: pgwire.TextOID, TypeSize: pgwire.TextSize, TypeMod: 0},
		{Name: "content", TypeOID: 17, TypeSize: -1, TypeMod: 0}}
	return c.done(c.pc.SendRows(cols, [][][]byte{{text(name), content}}, "TIMELINE_HISTORY"))
}

// noWALWait is how long a reader's command waits for a timeline that holds
// no WAL yet to get its start (created by `timeline create` or a greeting,
// its first proposer not elected yet) when wal_sender_timeout is disabled:
// otherwise it waits wal_sender_timeout, the walsender's own bound on a
// client waiting for an answer. A reader racing a proposer's first start
// is served (the election follows the greeting within milliseconds), and
// pg_receivewal, which gives up for good when its first IDENTIFY_SYSTEM
// fails, is served if the proposer starts within that time.
const noWALWait = 60 * time.Second

// walStarted returns the timeline's published state once it holds WAL
// (timeline_start_lsn is set by its first ProposerElected), waiting up to
// wal_sender_timeout (noWALWait when disabled). A timeline that still holds
// none is 57P03 (cannot_connect_now, PostgreSQL's answer while a server
// starts up), which a standby's walreceiver retries by itself: never a
// position it does not have (0/0), which pg_receivewal would ask for and be
// refused.
func (c *replConn) walStarted(tl *timeline.Timeline) (acceptor.State, error) {
	wait := c.srv.cfg.WalSenderTimeout
	if wait <= 0 {
		wait = noWALWait
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		st, changed := tl.Status()
		if st.TimelineStartLSN != 0 {
			return st, nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			c.log.Debug("refused a reader: the timeline holds no WAL yet")
			return st, errNoWALYet(tl.Key())
		case <-c.srv.stopCtx.Done():
			return st, errShutdown
		}
	}
}

// errNoWALYet is the refusal of a reader's command on a timeline that
// holds no WAL yet.
func errNoWALYet(key proto.TimelineKey) error {
	e := pgwire.Errorf(pgwire.CannotConnectNow, "timeline %s holds no WAL yet", key)
	e.Detail = "It exists, but no proposer has been elected on it: its WAL starts at the first election."
	e.Hint = "Retry once its proposer streams (a standby retries by itself; pg_receivewal must be started again)."
	return e
}

func (c *replConn) identifySystem() bool {
	tl, err := c.timeline()
	if err != nil {
		return c.fail(err)
	}
	st, err := c.walStarted(tl)
	if err != nil {
		return c.fail(err)
	}
	cols := []pgwire.Column{pgwire.TextColumn("systemid"), pgwire.Int4Column("timeline"), pgwire.TextColumn("xlogpos"), pgwire.TextColumn("dbname")}
	// xlogpos is where pg_receivewal starts without a slot or files: never
	// below the timeline's first byte (there is nothing there to serve; a
	// new timeline with nothing committed yet answers its start).
	row := [][]byte{text(strconv.FormatUint(st.SystemID, 10)), text(strconv.FormatUint(uint64(st.PgTimeline), 10)), text(max(st.CommitLSN, st.TimelineStartLSN).String()), nil}
	return c.done(c.pc.SendRows(cols, [][][]byte{row}, "IDENTIFY_SYSTEM"))
}

func (c *replConn) timelineStatus() bool {
	tl, err := c.timeline()
	if err != nil {
		return c.fail(err)
	}
	st := tl.State()
	readers, slots := tl.Counts()
	push := tl.Proposer()
	horizon, reason := tl.Retention()
	cols := []pgwire.Column{
		pgwire.TextColumn("tenant_id"), pgwire.TextColumn("timeline_id"),
		pgwire.Int8Column("term"), pgwire.TextColumn("voted_for"), pgwire.Int8Column("last_log_term"),
		pgwire.TextColumn("flush_lsn"), pgwire.TextColumn("commit_lsn"), pgwire.TextColumn("truncate_lsn"),
		pgwire.TextColumn("timeline_start_lsn"), pgwire.TextColumn("removed_up_to"),
		pgwire.Int4Column("pg_timeline"), pgwire.TextColumn("system_id"), pgwire.Int4Column("wal_seg_size"),
		pgwire.Int4Column("readers"), pgwire.Int4Column("slots"), pgwire.Int4Column("pg_version"),
		pgwire.TextColumn("proposer_addr"), pgwire.Int8Column("last_push_term"), pgwire.Int8Column("last_push_age_ms"),
		pgwire.TextColumn("retention_horizon"), pgwire.TextColumn("retention_reason"),
		pgwire.TextColumn("backup_lsn"),
	}
	u := func(v uint64) []byte { return text(strconv.FormatUint(v, 10)) }
	row := [][]byte{
		text(st.TenantID.String()), text(st.TimelineID.String()),
		u(st.VotedFor.Term), text(st.VotedFor.String()), u(st.LastLogTerm()),
		text(st.FlushLSN.String()), text(st.CommitLSN.String()), text(st.TruncateLSN.String()),
		text(st.TimelineStartLSN.String()), text(max(st.RemovedUpTo, tl.RemovedUpTo()).String()),
		u(uint64(st.PgTimeline)), u(st.SystemID), u(uint64(st.WalSegSize)),
		u(uint64(readers)), u(uint64(slots)), u(uint64(st.PgVersion)),
		nil, u(push.Term), nil, // NULL: no proposer connected; none since the server started
		text(horizon.String()), text(reason),
		text(tl.BackupLSN().String()),
	}
	if push.Connected {
		row[16] = text(push.Addr)
	}
	if !push.At.IsZero() {
		row[18] = u(uint64(time.Since(push.At).Milliseconds()))
	}
	if reason == "" {
		row[20] = text("not computed yet")
	}
	return c.done(c.pc.SendRows(cols, [][][]byte{row}, "TIMELINE_STATUS"))
}

// formatSegSize is PostgreSQL's wal_segment_size display: "16MB", "1GB".
func formatSegSize(n uint32) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%dGB", n>>30)
	}
	return fmt.Sprintf("%dMB", n>>20)
}

// formatMS is PostgreSQL's display of a time setting kept in milliseconds
// (SHOW wal_sender_timeout): the largest unit that divides it exactly,
// "1min", "30s", "1500ms"; zero (disabled) is "0".
func formatMS(d time.Duration) string {
	ms := d.Milliseconds()
	if ms <= 0 {
		return "0"
	}
	for _, u := range []struct {
		name string
		ms   int64
	}{{"d", 86400000}, {"h", 3600000}, {"min", 60000}, {"s", 1000}} {
		if ms%u.ms == 0 {
			return fmt.Sprintf("%d%s", ms/u.ms, u.name)
		}
	}
	return fmt.Sprintf("%dms", ms)
}

func (c *replConn) show(cmd replcmd.Show) bool {
	var val string
	switch cmd.Var {
	case "wal_sender_timeout":
		val = formatMS(c.srv.cfg.WalSenderTimeout)
	case "data_directory_mode":
		val = "0700"
	case "wal_block_size":
		val = strconv.Itoa(walPageSize)
	case "server_version":
		val = c.srv.cfg.ServerVersion
	case "integer_datetimes":
		val = "on"
	case "wal_segment_size", "timeline_id", "system_identifier":
		tl, err := c.timeline()
		if err != nil {
			return c.fail(err)
		}
		st := tl.State()
		switch cmd.Var {
		case "wal_segment_size":
			val = formatSegSize(st.WalSegSize)
		case "timeline_id":
			val = strconv.FormatUint(uint64(st.PgTimeline), 10)
		default:
			val = strconv.FormatUint(st.SystemID, 10)
		}
	default:
		return c.fail(pgwire.Errorf(pgwire.UndefinedObject, "unrecognized configuration parameter %q", cmd.Var))
	}
	return c.done(c.pc.SendRows([]pgwire.Column{pgwire.TextColumn(cmd.Var)}, [][][]byte{{text(val)}}, "SHOW"))
}

func firstWord(s string) string {
	if i := strings.IndexAny(s, " \t\r\n"); i >= 0 {
		return s[:i]
	}
	return s
}
