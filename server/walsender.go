package server

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/proto/replcmd"
	"github.com/safekeeper/safekeeper/proto/xlog"
	"github.com/safekeeper/safekeeper/server/timeline"
	"github.com/safekeeper/safekeeper/storage"
)

// Serving WAL to replication clients (pg_receivewal, a PostgreSQL standby,
// pageserver-style consumers): the commands of proto/replcmd and the
// START_REPLICATION stream. docs/serving.md describes what each client does
// and what we answer; docs/serving.md has the wire facts.

// Stream limits, as the walsender's (XLOG_BLCKSZ, MAX_SEND_SIZE).
const (
	walPageSize = 8192
	maxSendSize = 16 * walPageSize // 128 KiB of WAL per XLogData
)

// maxIdleKeepalive is the longest a stream stays silent: the walreceiver
// sends 'r' at least every 10 s and expects input as often.
const maxIdleKeepalive = 10 * time.Second

// startCheck returns the error a walsender gives for a start point it cannot
// serve, in its order: timeline, ahead of flush, removed. limit is what the
// reader may read up to.
func startCheck(st startView, cmd replcmd.StartReplication) error {
	tli := cmd.TLI
	if tli == 0 {
		tli = st.PgTimeline
	}
	if tli != st.PgTimeline && !st.Historic {
		e := pgwire.Errorf(pgwire.InternalError, "requested starting point %s on timeline %d is not in this server's history", cmd.Start, tli)
		e.Detail = fmt.Sprintf("This safekeeper holds timeline %d only.", st.PgTimeline)
		return e
	}
	if cmd.HasTerm && cmd.Term != st.Term {
		return pgwire.Errorf(codeStaleTerm, "requested term %d is not the current term %d of this safekeeper", cmd.Term, st.Term)
	}
	if cmd.Start > max(st.Limit, st.TimelineStart) { // the timeline's start is never ahead: its WAL begins there
		return pgwire.Errorf(pgwire.InternalError, "requested starting point %s is ahead of the WAL flush position of this server %s", cmd.Start, st.Limit)
	}
	if cmd.Start < st.RemovedUpTo || (st.TimelineStart != 0 && cmd.Start < st.TimelineStart.SegmentStart(st.SegSize)) {
		return errSegmentRemoved(proto.PgSegmentTimeline(st.PgEnds, st.PgTimeline, cmd.Start, st.SegSize), cmd.Start, st.SegSize)
	}
	// A timeline that starts inside a segment is served from the segment's
	// first byte (stock clients ask for whole segments): before its start,
	// empty pages (walSender.send).
	return nil
}

// startView is what startCheck needs of the timeline.
type startView struct {
	Historic      bool // the stream is of an ancestor PostgreSQL timeline (checked already)
	PgTimeline    uint32
	Term          uint64
	Limit         proto.LSN
	RemovedUpTo   proto.LSN
	TimelineStart proto.LSN
	SegSize       uint64
	// PgEnds is the history of PgTimeline: a removed segment is named for
	// the timeline its WAL belongs to.
	PgEnds []proto.PgTimelineEnd
}

// nextChunk returns the end of the next XLogData from pos when the reader may
// read up to limit (pos < limit): at most maxSendSize bytes, and when that
// limits it, cut down to a WAL page boundary (XLogSendPhysical).
func nextChunk(pos, limit proto.LSN) proto.LSN {
	end := pos + maxSendSize
	if limit <= end {
		return limit
	}
	return end &^ (walPageSize - 1)
}

// historicEnd resolves a START_REPLICATION on an ancestor PostgreSQL
// timeline tli of st's: where tli ended (the switch point) and the
// timeline that followed it, from st's history file. ok is false when tli
// is not an ancestor.
func historicEnd(st acceptor.State, tli uint32) (end proto.LSN, next uint32, ok bool) {
	if tli == 0 || tli >= st.PgTimeline || len(st.PgHistory) == 0 {
		return 0, 0, false
	}
	ends, err := proto.ParsePgHistory(st.PgTimeline, st.PgHistory)
	if err != nil {
		return 0, 0, false
	}
	for i, e := range ends {
		if e.TLI == tli {
			next = st.PgTimeline
			if i+1 < len(ends) {
				next = ends[i+1].TLI
			}
			return e.End, next, true
		}
	}
	return 0, 0, false
}

// sendNextTimeline sends the result set that ends a stream of a historic
// timeline (PostgreSQL's: next_tli, next_tli_startpos), then
// CommandComplete START_STREAMING and START_REPLICATION and ReadyForQuery.
func (c *replConn) sendNextTimeline(next uint32, at proto.LSN) bool {
	cols := []pgwire.Column{pgwire.Int8Column("next_tli"), pgwire.TextColumn("next_tli_startpos")}
	if err := c.pc.SendRows(cols, [][][]byte{{text(strconv.FormatUint(uint64(next), 10)), text(at.String())}}, "START_STREAMING"); err != nil {
		return false
	}
	// Two CommandCompletes: libpqrcv_endstreaming and pg_receivewal each
	// read one more after the result set.
	return c.done(c.pc.SendCommandComplete("START_REPLICATION"))
}

func (c *replConn) startReplication(cmd replcmd.StartReplication) bool {
	tl, err := c.timeline()
	if err != nil {
		return c.fail(err)
	}
	if conf := tl.State().Configuration; c.srv.removedFrom(conf) {
		return c.fail(errRemoved(c.srv.cfg.NodeID, conf))
	}
	if _, err := c.walStarted(tl); err != nil {
		return c.fail(err)
	}
	// Another PostgreSQL timeline than the current one: checked before
	// COPY, as the walsender does (an ancestor is served up to its end; a
	// start at its end gets the next timeline at once).
	hist := histView{end: ^proto.LSN(0)}
	if st := tl.State(); cmd.TLI != 0 && cmd.TLI != st.PgTimeline {
		end, next, ok := historicEnd(st, cmd.TLI)
		switch {
		case !ok:
			// Neither the current timeline nor an ancestor: tliSwitchPoint's
			// error, which PostgreSQL 15's walsender gives before COPY (only
			// the start point checks come after CopyBothResponse).
			e := pgwire.Errorf(pgwire.InternalError, "requested timeline %d is not in this server's history", cmd.TLI)
			e.Detail = fmt.Sprintf("This safekeeper serves timeline %d and its ancestors.", st.PgTimeline)
			c.log.Info("refused START_REPLICATION: timeline not in the history", "pg_timeline", cmd.TLI, "current", st.PgTimeline)
			return c.fail(e)
		case cmd.Start > end:
			e := pgwire.Errorf(pgwire.InternalError, "requested starting point %s on timeline %d is not in this server's history", cmd.Start, cmd.TLI)
			e.Detail = fmt.Sprintf("This server's history forked from timeline %d at %s.", cmd.TLI, end)
			return c.fail(e)
		case cmd.Start == end:
			c.log.Info("START_REPLICATION at the end of a historic timeline", "pg_timeline", cmd.TLI, "next", next, "at", end)
			return c.sendNextTimeline(next, end)
		default:
			hist = histView{on: true, end: end, next: next}
		}
	}
	if cmd.Slot != "" {
		if err := tl.AcquireSlot(cmd.Slot, c.id); err != nil {
			return c.fail(err)
		}
		defer tl.ReleaseSlot(cmd.Slot, c.id)
	}
	// Like the walsender: CopyBothResponse first, then the checks.
	if c.pc.StartCopyBoth() != nil || c.pc.Flush() != nil {
		return false
	}
	st := tl.State()
	tli := st.PgTimeline
	if hist.on {
		tli = cmd.TLI
	}
	firstTLI := st.PgTimeline
	var pgEnds []proto.PgTimelineEnd
	if ends, err := proto.ParsePgHistory(st.PgTimeline, st.PgHistory); err == nil {
		firstTLI, pgEnds = ends[0].TLI, ends
	}
	w := &walSender{
		c: c, tl: tl, cmd: cmd, pos: cmd.Start, segSize: uint64(st.WalSegSize), tli: tli, hist: hist,
		tlStart: st.TimelineStartLSN, firstTLI: firstTLI, pgTLI: st.PgTimeline, pgEnds: pgEnds, sysID: st.SystemID,
		rd: timeline.NewReader(timeline.ReaderConfig{ConnID: c.id, Slot: cmd.Slot, Addr: c.pc.RemoteAddr().String(),
			AppName: c.pc.Params()["application_name"], TermReader: cmd.HasTerm, Start: cmd.Start}),
		replyNow: make(chan struct{}, 1), gotStatus: make(chan struct{}, 1), readerDone: make(chan error, 1),
		archived: c.srv.newArchivedWAL(tl, st.SystemID, uint64(st.WalSegSize)),
	}
	// Register before the check, so retention cannot remove the start
	// segment between the check and the first read.
	tl.AddReader(w.rd)
	defer tl.RemoveReader(w.rd)
	if err := startCheck(w.view(st), cmd); err != nil && !(isRemoved(err) && w.readThrough(st.TimelineStartLSN)) {
		c.log.Info("refused START_REPLICATION", "start", cmd.Start, "err", err)
		return c.fail(err)
	}
	c.log.Info("starting WAL stream", "start", cmd.Start, "slot", cmd.Slot, "term", cmd.Term)
	return w.run()
}

// walSender is one START_REPLICATION stream. The connection's goroutine
// sends; one reader goroutine reads the client's CopyData and signals it.
// histView is a stream of an ancestor PostgreSQL timeline: it ends at end,
// the switch point, and next follows.
type histView struct {
	on   bool
	end  proto.LSN
	next uint32
}

type walSender struct {
	c    *replConn
	tl   *timeline.Timeline
	cmd  replcmd.StartReplication
	hist histView
	// tlStart is the timeline's first byte; below it (inside its first
	// segment) empty pages of firstTLI and sysID are served.
	tlStart  proto.LSN
	firstTLI uint32
	// pgTLI and pgEnds: the timeline's PostgreSQL timeline and its history
	// at the start (a removed segment is named for its WAL's timeline).
	pgTLI   uint32
	pgEnds  []proto.PgTimelineEnd
	sysID   uint64
	rd      *timeline.Reader
	segSize uint64
	tli     uint32

	// archived reads what retention removed here from the archive (nil:
	// no archive; readthrough.go).
	archived *archivedWAL

	pos         proto.LSN // next LSN to send
	lastRecv    atomic.Int64
	clampWarned bool // reader goroutine: a clamped report was logged
	lastPing    time.Time
	buf         []byte

	replyNow   chan struct{} // the client asked for a reply ('r' with replyRequested)
	gotStatus  chan struct{} // an 'r' arrived
	readerDone chan error    // the reader's end: ErrCopyDone or why it stopped
}

func (w *walSender) view(st acceptor.State) startView {
	v := startView{
		PgTimeline: st.PgTimeline, Term: st.VotedFor.Term, Limit: st.CommitLSN,
		RemovedUpTo: max(st.RemovedUpTo, w.tl.RemovedUpTo()), TimelineStart: st.TimelineStartLSN, SegSize: w.segSize,
		PgEnds: w.pgEnds,
	}
	if w.cmd.HasTerm {
		v.Limit = st.FlushLSN
	}
	if w.hist.on {
		v.Historic, v.Limit = true, min(v.Limit, w.hist.end)
	}
	return v
}

// streamEnd says how a stream ended.
type streamEnd int

const (
	endClose    streamEnd = iota // the connection is closed
	endCopyDone                  // the client sent CopyDone: back to query mode
	endHistoric                  // a historic timeline was sent to its end
)

// run streams until the client ends the stream, it fails or times out, or
// the server stops. It returns whether the connection goes on.
func (w *walSender) run() bool {
	w.lastRecv.Store(time.Now().UnixNano())
	go w.reader()
	end := w.loop()
	if end == endHistoric {
		// PostgreSQL's end of a historic timeline: CopyDone, the client's
		// CopyDone, then the next timeline's result set.
		w.c.log.Info("WAL stream reached the end of its timeline", "pg_timeline", w.cmd.TLI, "at", w.pos, "next", w.hist.next)
		if w.c.pc.SendCopyDone() != nil || w.c.pc.Flush() != nil {
			w.c.pc.Close()
			<-w.readerDone
			return false
		}
		wait := w.c.srv.cfg.WalSenderTimeout
		if wait <= 0 {
			wait = time.Minute
		}
		select {
		case err := <-w.readerDone:
			if !errors.Is(err, pgwire.ErrCopyDone) {
				w.c.pc.Close()
				return false
			}
		case <-time.After(wait):
			w.c.pc.Close()
			<-w.readerDone
			return false
		}
		return w.c.sendNextTimeline(w.hist.next, w.hist.end)
	}
	if end == endCopyDone {
		// The reader has exited (it stops at CopyDone).
		w.c.pc.SendCopyDone()
		w.c.pc.SendCommandComplete("START_STREAMING")
		w.c.pc.SendCommandComplete("START_REPLICATION")
		w.c.log.Info("WAL stream ended by the client", "sent_up_to", w.pos)
		return w.c.pc.SendReadyForQuery() == nil
	}
	w.c.pc.Close()
	<-w.readerDone // wait for the reader goroutine: no leak
	return false
}

// reader reads the client's messages until CopyDone or an error.
func (w *walSender) reader() {
	pc := w.c.pc
	for {
		payload, err := pc.ReadCopy()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && w.c.srv.isStopping() {
				// Shutdown set the deadline; keep reading the client's
				// confirmations while the stream ends.
				pc.SetReadDeadline(time.Now().Add(w.c.srv.cfg.ShutdownGrace + time.Second))
				continue
			}
			w.readerDone <- err
			return
		}
		w.lastRecv.Store(time.Now().UnixNano())
		msg, err := parseFeedback(payload)
		if err != nil {
			w.readerDone <- err
			return
		}
		switch m := msg.(type) {
		case pgwire.StandbyStatusUpdate:
			w.clampReported("standby status update", &m.Write, &m.Flush, &m.Apply)
			w.tl.OnStatus(w.rd, timeline.ReaderStatus{Write: m.Write, Flush: m.Flush, Apply: m.Apply})
			signal(w.gotStatus)
			if m.ReplyRequested {
				signal(w.replyNow)
			}
		case pgwire.HotStandbyFeedback:
			w.tl.OnHotStandby(w.rd, hotStandby(m))
		case pgwire.ConsumerFeedback:
			w.clampReported("consumer feedback", &m.ReceivedLSN, &m.DiskConsistentLSN, &m.RemoteConsistentLSN)
			w.tl.OnConsumer(w.rd, proto.ConsumerFeedback{TimelineSize: m.TimelineSize, ReceivedLSN: m.ReceivedLSN,
				DiskConsistentLSN: m.DiskConsistentLSN, RemoteConsistentLSN: m.RemoteConsistentLSN, ReplyTime: m.ReplyTime})
		}
	}
}

// clampReported limits the positions a client reports to the end of the WAL
// this stream has sent it: retention, slots and the proposer trust these
// positions (one bogus ps_applylsn would otherwise let retention remove WAL
// up to commit_lsn for good). Stock clients report past it as a matter of
// course — a standby that reconnects reports its replay position as flush
// and apply before it has been sent anything, since it asks for the
// segment's start — so that is not logged. A position past the end of the
// timeline's WAL on this server is no client's WAL: the first one of a
// stream is logged. Reader goroutine only.
func (w *walSender) clampReported(what string, lsns ...*proto.LSN) {
	sent := w.rd.Position()
	var over proto.LSN
	for _, l := range lsns {
		if *l > sent {
			over = max(over, *l)
			*l = sent
		}
	}
	if over == 0 || w.clampWarned {
		return
	}
	if st := w.tl.State(); over > st.FlushLSN {
		w.clampWarned = true
		w.c.log.Warn("replication client reported a position past the end of this timeline's WAL; using the end of what was sent",
			"message", what, "reported", over, "flush_lsn", st.FlushLSN, "sent_up_to", sent, "slot", w.cmd.Slot, "conn", w.c.id)
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (w *walSender) keepalive(replyRequested bool) error {
	if replyRequested {
		w.lastPing = time.Now()
	}
	return w.c.pc.SendKeepalive(&pgwire.PrimaryKeepalive{WALEnd: w.pos, SendTime: pgwire.TimeToPG(time.Now()), ReplyRequested: replyRequested})
}

// readerEnded turns the reader's end into the stream's.
func (w *walSender) readerEnded(err error) streamEnd {
	var pe *pgwire.Error
	switch {
	case errors.Is(err, pgwire.ErrCopyDone):
		return endCopyDone
	case errors.Is(err, io.EOF):
		w.c.log.Info("WAL stream ended: client disconnected", "sent_up_to", w.pos)
	case errors.As(err, &pe):
		w.c.log.Info("WAL stream ended: client protocol violation", "err", err)
		w.c.pc.SendError(fatalError(pe))
		w.c.pc.Flush()
	case w.tl.Deleted():
		w.c.log.Info("WAL stream ended: the timeline was deleted", "sent_up_to", w.pos)
		w.c.pc.SendError(fatalError(errTimelineDeleted))
		w.c.pc.Flush()
	default:
		w.c.log.Info("WAL stream ended: read failed", "err", err)
	}
	w.readerDone <- err // run waits on it
	return endClose
}

// fatal sends a FATAL ErrorResponse and ends the stream (the connection
// closes).
func (w *walSender) fatal(err error) streamEnd {
	w.c.log.Info("WAL stream ended with an error", "err", err)
	w.c.pc.SendError(fatalError(err))
	w.c.pc.Flush()
	return endClose
}

func (w *walSender) loop() streamEnd {
	cfg := &w.c.srv.cfg
	timeout := cfg.WalSenderTimeout // negative: no timeout
	pingEvery := maxIdleKeepalive
	if timeout > 0 {
		pingEvery = min(maxIdleKeepalive, timeout/2)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		st, changed := w.tl.Status()
		if w.cmd.HasTerm && st.VotedFor.Term != w.cmd.Term {
			return w.fatal(pgwire.Errorf(codeStaleTerm, "term changed from %d to %d: this stream of term %d ends", w.cmd.Term, st.VotedFor.Term, w.cmd.Term))
		}
		if w.c.srv.removedFrom(st.Configuration) {
			// Moved away: this copy gets no more WAL, so a reader here would
			// wait for nothing without a word. It is told, and reads from a
			// member.
			w.c.log.Info("ending WAL stream: this safekeeper was removed from the timeline's configuration", "generation", st.Configuration.Generation,
				"members", fmt.Sprint(st.Configuration.Members), "sent_up_to", w.pos)
			return w.fatal(errRemoved(w.c.srv.cfg.NodeID, st.Configuration))
		}
		if !w.hist.on && st.PgTimeline != w.tli {
			// The timeline switched under this stream (a promoted primary's
			// proposer): what it streams is historic now, up to the switch.
			if end, next, ok := historicEnd(st, w.tli); ok {
				w.hist = histView{on: true, end: end, next: next}
			}
		}
		limit := w.view(st).Limit
		select {
		case err := <-w.readerDone:
			return w.readerEnded(err)
		case <-w.replyNow:
			if w.keepalive(false) != nil {
				return endClose
			}
		default:
		}
		if w.c.srv.isStopping() {
			return w.shutdown()
		}
		now := time.Now()
		lastRecv := time.Unix(0, w.lastRecv.Load())
		if timeout > 0 && now.Sub(lastRecv) >= timeout {
			w.c.log.Info("terminating walsender process due to replication timeout", "timeout", timeout, "sent_up_to", w.pos)
			return endClose
		}
		quietSince := lastRecv
		if w.lastPing.After(quietSince) {
			quietSince = w.lastPing
		}
		if now.Sub(quietSince) >= pingEvery {
			if w.keepalive(true) != nil {
				return endClose
			}
			quietSince = now
		}
		if w.hist.on && w.pos >= w.hist.end {
			if w.c.pc.Flush() != nil {
				return endClose
			}
			return endHistoric
		}
		if w.pos < limit {
			sent, err := w.send(limit)
			if err != nil {
				if errors.Is(err, storage.ErrWALRemoved) {
					return w.fatal(errSegmentRemoved(proto.PgSegmentTimeline(w.pgEnds, w.pgTLI, w.pos, w.segSize), w.pos, w.segSize))
				}
				var pe *pgwire.Error
				if errors.As(err, &pe) {
					return w.fatal(err)
				}
				w.c.log.Info("WAL stream ended: send failed", "err", err)
				return endClose
			}
			if sent {
				continue
			}
		}
		if w.c.pc.Flush() != nil {
			return endClose
		}
		wait := time.Until(quietSince.Add(pingEvery))
		if timeout > 0 {
			wait = min(wait, time.Until(lastRecv.Add(timeout)))
		}
		timer.Reset(max(wait, time.Millisecond))
		select {
		case <-changed:
		case <-timer.C:
		case <-w.replyNow:
			if w.keepalive(false) != nil {
				return endClose
			}
		case err := <-w.readerDone:
			return w.readerEnded(err)
		case <-w.c.srv.stopping:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// isRemoved: err is errSegmentRemoved's.
func isRemoved(err error) bool {
	var pe *pgwire.Error
	return errors.As(err, &pe) && pe.Code == pgwire.UndefinedFile
}

// readThrough reports whether a start below the WAL held here (which
// startCheck refused) can be served from the archive: the archive holds
// the start's segment, whole, and it is not before the timeline's start.
func (w *walSender) readThrough(tlStart proto.LSN) bool {
	if w.archived == nil || w.pos < tlStart.SegmentStart(w.segSize) || w.pos >= w.tl.BackupLSN() {
		return false
	}
	_, err := w.archived.read(w.c.srv.stopCtx, w.pos, make([]byte, 1), proto.PgSegmentTimeline(w.pgEnds, w.pgTLI, w.pos, w.segSize))
	if err != nil {
		w.c.log.Info("read-through: the archive cannot serve the start either", "start", w.pos, "err", err)
		return false
	}
	w.c.log.Info("serving WAL removed here from the archive (read-through)", "start", w.pos)
	return true
}

// send reads and sends the next XLogData up to limit and flushes it. sent
// is false when storage had nothing at pos (it should not happen below
// commit_lsn; the stream then waits for the next change).
func (w *walSender) send(limit proto.LSN) (sent bool, err error) {
	end := nextChunk(w.pos, limit)
	if w.buf == nil {
		w.buf = make([]byte, maxSendSize)
	}
	var n int
	if start := w.tlStart; w.pos < start {
		// Before the timeline's first byte (a timeline that starts inside a
		// segment): pages with a header and no record, up to it.
		end = min(end, start)
		n = copy(w.buf, xlog.EmptyPages(w.pos, end, w.segSize, w.firstTLI, w.sysID))
	} else {
		// ReadWAL copies out of a short read transaction: nothing is held
		// across the socket write below.
		n, err = w.tl.ReadWAL(w.pos, w.buf[:end-w.pos])
		if errors.Is(err, storage.ErrWALRemoved) && w.archived != nil {
			// Removed here once it was in the archive: read it there.
			var aerr error
			if n, aerr = w.archived.read(w.c.srv.stopCtx, w.pos, w.buf[:end-w.pos], proto.PgSegmentTimeline(w.pgEnds, w.pgTLI, w.pos, w.segSize)); aerr == nil {
				err = nil
			} else {
				w.c.log.Warn("read-through from the archive failed", "pos", w.pos, "err", aerr)
			}
		}
	}
	if err != nil {
		return false, err
	}
	if n == 0 {
		w.c.log.Warn("no WAL in storage below the readable limit", "pos", w.pos, "limit", limit)
		return false, nil
	}
	// The reader's position moves first: the client may answer (its
	// report clamped to the position) before SendXLogData returns. If
	// the send fails the stream ends, and with it the reader's reports.
	w.rd.Advance(w.pos + proto.LSN(n))
	if err := w.c.pc.SendXLogData(&pgwire.XLogData{DataStart: w.pos, WALEnd: limit, SendTime: pgwire.TimeToPG(time.Now()), Data: w.buf[:n]}); err != nil {
		return false, err
	}
	w.pos += proto.LSN(n)
	w.rd.Sent(w.pos, time.Now())
	return true, w.c.pc.Flush()
}

// shutdown ends the stream as a walsender does at shutdown (WalSndDone):
// send what is committed, ask the client to confirm it with keepalives
// until its flush (or write, if it reports no flush) reaches the end sent,
// then CommandComplete "COPY 0" inside COPY mode and close. The whole phase
// lasts at most Config.ShutdownGrace.
func (w *walSender) shutdown() streamEnd {
	deadline := time.Now().Add(w.c.srv.cfg.ShutdownGrace)
	const repingEvery = 200 * time.Millisecond
	for time.Now().Before(deadline) {
		st := w.tl.State()
		if limit := w.view(st).Limit; w.pos < limit {
			if sent, err := w.send(limit); err != nil || !sent {
				break
			}
			continue
		}
		if w.rd.Confirmed() >= w.pos {
			break
		}
		if w.keepalive(true) != nil || w.c.pc.Flush() != nil {
			return endClose
		}
		wait := min(repingEvery, time.Until(deadline))
		select {
		case <-w.gotStatus:
		case <-w.replyNow:
		case <-time.After(max(wait, 0)):
		case err := <-w.readerDone:
			w.readerDone <- err // run waits on it
			return endClose
		}
	}
	w.c.pc.SendCommandComplete("COPY 0")
	w.c.pc.Flush()
	w.c.log.Info("WAL stream ended by server shutdown", "sent_up_to", w.pos)
	return endClose
}

// parseFeedback decodes one CopyData from a reader.
func parseFeedback(payload []byte) (any, error) {
	if len(payload) == 0 {
		return nil, pgwire.Errorf(pgwire.ProtocolViolation, "invalid standby message: empty CopyData")
	}
	switch payload[0] {
	case pgwire.TagStandbyStatusUpdate:
		return pgwire.ParseStandbyStatusUpdate(payload)
	case pgwire.TagHotStandbyFeedback:
		return pgwire.ParseHotStandbyFeedback(payload)
	case pgwire.TagConsumerFeedback:
		return pgwire.ParseConsumerFeedback(payload)
	}
	return nil, pgwire.Errorf(pgwire.ProtocolViolation, "unexpected message type %q", fmt.Sprintf("%c", payload[0]))
}

// hotStandby is a reader's hot standby feedback as the proposer gets it:
// xmin and catalog_xmin as 64-bit full transaction ids (epoch and xid),
// 0 where the reader has none (an xid of 0).
func hotStandby(m pgwire.HotStandbyFeedback) proto.HotStandbyFeedback {
	h := proto.HotStandbyFeedback{TS: m.SendTime}
	if m.Xmin != 0 {
		h.Xmin = m.FullXmin()
	}
	if m.CatalogXmin != 0 {
		h.CatalogXmin = m.FullCatalogXmin()
	}
	return h
}
