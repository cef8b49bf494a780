package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/server/timeline"
)

type lsn = proto.LSN

const (
	tSeg     = 1 << 20
	tStart   = lsn(0x1000000) // a segment boundary
	tSysID   = 7300000000000000042
	tTimeout = 30 * time.Second
)

var (
	tTenant   = proto.ID{0xaa, 1}
	tTimeline = proto.ID{0xbb, 1}
)

// startTestServer runs a Server in this process on a port it binds itself (port 0).
func startTestServer(t *testing.T, dir string, tweak func(*Config)) *Server {
	t.Helper()
	return startHookedServer(t, dir, tweak, hooks{})
}

// running is timeline key if it is open, else nil.
func running(s *Server, key proto.TimelineKey) *timeline.Timeline {
	for _, tl := range s.reg.Running() {
		if tl.Key() == key {
			return tl
		}
	}
	return nil
}

// startHookedServer is startTestServer with test hooks.
func startHookedServer(t *testing.T, dir string, tweak func(*Config), h hooks) *Server {
	t.Helper()
	cfg := Config{NodeID: 1, ListenPG: "127.0.0.1:0", DataDir: dir, UnsafeNoFsync: true, RetentionInterval: 10 * time.Millisecond, WalKeepSize: -1}
	if tweak != nil {
		tweak(&cfg)
	}
	if cfg.Logger == nil {
		// The server's log, shown when the test fails: what a rare
		// failure needs to be understood.
		log := &testLog{}
		cfg.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("the server's log, last 80 lines:\n%s", log.tail(80))
			}
		})
	}
	s, err := newServer(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		<-served
	})
	return s
}

// testLog is a server's log kept in memory.
type testLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *testLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := strings.Split(strings.TrimRight(l.buf.String(), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), tTimeout)
	t.Cleanup(cancel)
	return ctx
}

// testPush is a proposer pushing generated WAL on one connection.
type testPush struct {
	t        *testing.T
	ctx      context.Context
	c        *proposer.Conn
	ballot   proto.Ballot
	gen      *xlogtest.Generator
	pos      lsn
	truncate bool // send truncate_lsn = commit_lsn
}

func newTestPush(t *testing.T, addr string, tl proto.ID, term uint64, hist proto.TermHistory, start lsn) *testPush {
	t.Helper()
	ctx := testCtx(t)
	c, err := proposer.Dial(ctx, proposer.DialConfig{AllowTimelineCreation: true, Addr: addr, TenantID: tTenant, TimelineID: tl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p := &testPush{t: t, ctx: ctx, c: c, ballot: proto.Ballot{Term: term, UUID: proto.ID{0xcc, byte(term)}}, pos: start}
	p.send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
		TimelineID: tl, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: p.ballot.UUID, WalEnd: start})
	p.recv()
	p.send(&proto.RequestVote{Candidate: p.ballot})
	p.recv()
	p.recv()
	p.send(&proto.ProposerElected{Term: term, StartStreamingAt: start, TimelineStartLSN: hist[0].StartLSN, History: hist})
	p.gen = xlogtest.NewGenerator(start, tSeg, 1, tSysID)
	return p
}

func (p *testPush) send(m proto.Message) {
	p.t.Helper()
	if err := p.c.Send(m); err != nil {
		p.t.Fatalf("send %T: %v", m, err)
	}
}

func (p *testPush) recv() proto.Message {
	p.t.Helper()
	m, err := p.c.Recv(p.ctx)
	if err != nil {
		p.t.Fatalf("recv: %v", err)
	}
	return m
}

// push appends n records of size bytes with commit_lsn = commit (0: the
// end) and returns the WAL bytes pushed and the last response.
func (p *testPush) push(n, size int, commit lsn) ([]byte, *proto.SafeKeeperResponse) {
	p.t.Helper()
	for i := 0; i < n; i++ {
		p.gen.Record(size)
	}
	wal := p.gen.Take()
	end := p.pos + lsn(len(wal))
	if commit == 0 {
		commit = end
	}
	var reqs int
	for off := 0; off < len(wal); off += proto.MaxWALPerRequest {
		chunk := wal[off:min(off+proto.MaxWALPerRequest, len(wal))]
		req := &proto.SafeKeeperRequest{Sender: p.ballot, BeginLSN: p.pos, EndLSN: p.pos + lsn(len(chunk)), CommitLSN: commit, WAL: chunk}
		if p.truncate {
			req.TruncateLSN = commit
		}
		p.send(req)
		p.pos += lsn(len(chunk))
		reqs++
	}
	var resp *proto.SafeKeeperResponse
	for i := 0; i < reqs; i++ {
		resp = p.recv().(*proto.SafeKeeperResponse)
	}
	return wal, resp
}

// heartbeat sends an empty request and returns its response.
func (p *testPush) heartbeat() *proto.SafeKeeperResponse {
	p.t.Helper()
	p.send(&proto.SafeKeeperRequest{Sender: p.ballot, BeginLSN: p.pos, EndLSN: p.pos, CommitLSN: p.pos})
	return p.recv().(*proto.SafeKeeperResponse)
}

func hist1(start lsn) proto.TermHistory { return proto.TermHistory{{Term: 1, StartLSN: start}} }

// replConnect opens a client connection; replication=true unless plain.
func replConnect(t *testing.T, addr string, plain bool, options string) *pgconn.PgConn {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	cs := fmt.Sprintf("host=%s port=%s user=tester sslmode=disable", host, port)
	if !plain {
		cs += " replication=true"
	}
	if options != "" {
		cs += fmt.Sprintf(" options='%s'", options)
	}
	c, err := pgconn.Connect(testCtx(t), cs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// exec runs one simple query and returns its results (or its error).
func exec(t *testing.T, c *pgconn.PgConn, q string) ([]*pgconn.Result, error) {
	t.Helper()
	return c.Exec(testCtx(t), q).ReadAll()
}

func wantCode(t *testing.T, err error, code string) *pgconn.PgError {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != code {
		t.Fatalf("want SQLSTATE %s, got %v", code, err)
	}
	return pe
}

func oneRow(t *testing.T, res []*pgconn.Result, err error, cols ...string) []string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].FieldDescriptions) != len(cols) {
		t.Fatalf("want 1 result of 1 row × %d columns, got %+v", len(cols), res)
	}
	out := make([]string, len(cols))
	for i, f := range res[0].FieldDescriptions {
		if f.Name != cols[i] || f.Format != 0 || f.TableOID != 0 {
			t.Fatalf("column %d: %+v, want %s", i, f, cols[i])
		}
		if v := res[0].Rows[0][i]; v == nil {
			out[i] = "NULL"
		} else {
			out[i] = string(v)
		}
	}
	return out
}

func TestCommandResultShapes(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(10, 100, 0)
	st := statusOf(t, s)

	c := replConnect(t, addr, false, "")
	res, err := exec(t, c, "IDENTIFY_SYSTEM")
	row := oneRow(t, res, err, "systemid", "timeline", "xlogpos", "dbname")
	if row[0] != fmt.Sprint(tSysID) || row[1] != "1" || row[2] != st.CommitLSN.String() || row[3] != "NULL" {
		t.Fatalf("IDENTIFY_SYSTEM row %q", row)
	}
	if oids := []uint32{res[0].FieldDescriptions[0].DataTypeOID, res[0].FieldDescriptions[1].DataTypeOID}; oids[0] != 25 || oids[1] != 23 {
		t.Fatalf("IDENTIFY_SYSTEM types %v", oids)
	}
	if row := oneRow(t, must(exec(t, c, "SHOW wal_segment_size")), nil, "wal_segment_size"); row[0] != "1MB" {
		t.Fatalf("wal_segment_size %q", row)
	}
	if row := oneRow(t, must(exec(t, c, "SHOW data_directory_mode")), nil, "data_directory_mode"); row[0] != "0700" {
		t.Fatalf("data_directory_mode %q", row)
	}
	_, err = exec(t, c, "TIMELINE_HISTORY 2")
	wantCode(t, err, pgwire.UndefinedFile)
	_, err = exec(t, c, "SELECT 1")
	if pe := wantCode(t, err, pgwire.FeatureNotSupported); pe.Message != "cannot execute SQL commands in WAL sender for physical replication" {
		t.Fatalf("SQL refusal %q", pe.Message)
	}
	// Slots.
	if row := oneRow(t, must(exec(t, c, "READ_REPLICATION_SLOT nosuch")), nil, "slot_type", "restart_lsn", "restart_tli"); strings.Join(row, ",") != "NULL,NULL,NULL" {
		t.Fatalf("missing slot %q", row)
	}
	row = oneRow(t, must(exec(t, c, `CREATE_REPLICATION_SLOT "s1" PHYSICAL`)), nil, "slot_name", "consistent_point", "snapshot_name", "output_plugin")
	if strings.Join(row, ",") != "s1,0/0,NULL,NULL" {
		t.Fatalf("CREATE_REPLICATION_SLOT %q", row)
	}
	_, err = exec(t, c, `CREATE_REPLICATION_SLOT "s1" PHYSICAL`)
	wantCode(t, err, pgwire.DuplicateObject)
	if row := oneRow(t, must(exec(t, c, "READ_REPLICATION_SLOT s1")), nil, "slot_type", "restart_lsn", "restart_tli"); strings.Join(row, ",") != "physical,NULL,NULL" {
		t.Fatalf("slot without reserved WAL %q", row)
	}
	oneRow(t, must(exec(t, c, `CREATE_REPLICATION_SLOT "s2" PHYSICAL (RESERVE_WAL)`)), nil, "slot_name", "consistent_point", "snapshot_name", "output_plugin")
	if row := oneRow(t, must(exec(t, c, "READ_REPLICATION_SLOT s2")), nil, "slot_type", "restart_lsn", "restart_tli"); strings.Join(row, ",") != "physical,"+tStart.String()+",1" {
		t.Fatalf("reserved slot %q", row)
	}
	if _, err := exec(t, c, `DROP_REPLICATION_SLOT "s1"`); err != nil {
		t.Fatal(err)
	}
	_, err = exec(t, c, `DROP_REPLICATION_SLOT "s1"`)
	wantCode(t, err, pgwire.UndefinedObject)
	row = oneRow(t, must(exec(t, c, "TIMELINE_STATUS")), nil, "tenant_id", "timeline_id", "term", "voted_for", "last_log_term",
		"flush_lsn", "commit_lsn", "truncate_lsn", "timeline_start_lsn", "removed_up_to", "pg_timeline", "system_id", "wal_seg_size", "readers", "slots", "pg_version",
		"proposer_addr", "last_push_term", "last_push_age_ms", "retention_horizon", "retention_reason", "backup_lsn")
	if row[2] != "1" || row[4] != "1" || row[5] != st.FlushLSN.String() || row[6] != st.CommitLSN.String() || row[8] != tStart.String() || row[14] != "1" {
		t.Fatalf("TIMELINE_STATUS %q", row)
	}

	// A plain connection runs IDENTIFY_SYSTEM and TIMELINE_STATUS only.
	plain := replConnect(t, addr, true, "")
	oneRow(t, must(exec(t, plain, "IDENTIFY_SYSTEM")), nil, "systemid", "timeline", "xlogpos", "dbname")
	_, err = exec(t, plain, "SHOW wal_segment_size")
	wantCode(t, err, pgwire.FeatureNotSupported)
	_, err = exec(t, plain, "SELECT 1")
	wantCode(t, err, pgwire.SyntaxError)
	if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || !strings.Contains(pe.Hint, "replication=true") {
		t.Fatalf("SQL on a plain connection: %v: want a hint naming replication=true", err)
	}

	// Slots are durable: a restarted server still has s2 (not the dropped s1).
	dir := s.cfg.DataDir
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	s2 := startTestServer(t, dir, nil)
	c2 := replConnect(t, s2.Addr().String(), false, "")
	if row := oneRow(t, must(exec(t, c2, "READ_REPLICATION_SLOT s2")), nil, "slot_type", "restart_lsn", "restart_tli"); row[0] != "physical" || row[1] != tStart.String() {
		t.Fatalf("slot after restart %q", row)
	}
	if row := oneRow(t, must(exec(t, c2, "READ_REPLICATION_SLOT s1")), nil, "slot_type", "restart_lsn", "restart_tli"); row[0] != "NULL" {
		t.Fatalf("dropped slot after restart %q", row)
	}
}

func must(res []*pgconn.Result, err error) []*pgconn.Result {
	if err != nil {
		panic(err)
	}
	return res
}

func statusOf(t *testing.T, s *Server) (st struct{ FlushLSN, CommitLSN, RemovedUpTo lsn }) {
	t.Helper()
	tl := running(s, proto.TimelineKey{TenantID: tTenant, TimelineID: tTimeline})
	a, _ := tl.Status()
	st.FlushLSN, st.CommitLSN, st.RemovedUpTo = a.FlushLSN, a.CommitLSN, tl.RemovedUpTo()
	return st
}

func TestTimelineChoice(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	c := replConnect(t, addr, false, "")
	_, err := exec(t, c, "IDENTIFY_SYSTEM")
	wantCode(t, err, pgwire.UndefinedObject)
	newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart).push(1, 10, 0)
	newTestPush(t, addr, proto.ID{0xbb, 2}, 1, hist1(tStart), tStart).push(1, 10, 0)
	_, err = exec(t, c, "IDENTIFY_SYSTEM")
	pe := wantCode(t, err, pgwire.InvalidParameterValue)
	if !strings.Contains(pe.Message, tTimeline.String()) || !strings.Contains(pe.Message, proto.ID{0xbb, 2}.String()) {
		t.Fatalf("error does not name the choices: %s", pe.Message)
	}
	named := replConnect(t, addr, false, fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, proto.ID{0xbb, 2}))
	oneRow(t, must(exec(t, named, "IDENTIFY_SYSTEM")), nil, "systemid", "timeline", "xlogpos", "dbname")
}

// stream is the client side of one START_REPLICATION.
type stream struct {
	t   *testing.T
	c   *pgconn.PgConn
	ctx context.Context
}

func (s *stream) query(q string) {
	s.t.Helper()
	s.c.Frontend().Send(&pgproto3.Query{String: q})
	if err := s.c.Frontend().Flush(); err != nil {
		s.t.Fatal(err)
	}
}

func (s *stream) sendCopy(payload []byte) {
	s.t.Helper()
	s.c.Frontend().Send(&pgproto3.CopyData{Data: payload})
	if err := s.c.Frontend().Flush(); err != nil {
		s.t.Fatal(err)
	}
}

func (s *stream) msg() pgproto3.BackendMessage {
	s.t.Helper()
	for {
		m, err := s.c.ReceiveMessage(s.ctx)
		if err != nil {
			s.t.Fatalf("receive: %v", err)
		}
		if _, ok := m.(*pgproto3.ParameterStatus); !ok {
			return m
		}
	}
}

// expect receives the next message and checks its type by name.
func (s *stream) expect(want string) pgproto3.BackendMessage {
	s.t.Helper()
	m := s.msg()
	if got := fmt.Sprintf("%T", m); got != "*pgproto3."+want {
		s.t.Fatalf("got %s %+v, want %s", got, m, want)
	}
	return m
}

func (s *stream) start(q string) {
	s.t.Helper()
	s.query(q)
	s.expect("CopyBothResponse")
}

// next returns the next CopyData payload's parsed message.
func (s *stream) next() any {
	s.t.Helper()
	m := s.msg()
	cd, ok := m.(*pgproto3.CopyData)
	if !ok {
		s.t.Fatalf("got %T %+v, want CopyData", m, m)
	}
	switch cd.Data[0] {
	case 'w':
		x, err := pgwire.ParseXLogData(bytes.Clone(cd.Data))
		if err != nil {
			s.t.Fatal(err)
		}
		return x
	case 'k':
		k, err := pgwire.ParsePrimaryKeepalive(cd.Data)
		if err != nil {
			s.t.Fatal(err)
		}
		return k
	}
	s.t.Fatalf("unexpected CopyData %q", cd.Data[0])
	return nil
}

// readWAL reads XLogData until it has everything up to end, checking that
// it is contiguous from from and cut as the walsender cuts it.
func (s *stream) readWAL(from, end lsn) []byte {
	s.t.Helper()
	var out []byte
	pos := from
	for pos < end {
		switch m := s.next().(type) {
		case pgwire.XLogData:
			if m.DataStart != pos {
				s.t.Fatalf("XLogData at %s, want %s", m.DataStart, pos)
			}
			if len(m.Data) == 0 || len(m.Data) > maxSendSize {
				s.t.Fatalf("XLogData of %d bytes", len(m.Data))
			}
			if e := m.DataStart + lsn(len(m.Data)); e != m.WALEnd && e%walPageSize != 0 {
				s.t.Fatalf("XLogData %s..%s cut inside a page below walEnd %s", m.DataStart, e, m.WALEnd)
			}
			out = append(out, m.Data...)
			pos += lsn(len(m.Data))
		case pgwire.PrimaryKeepalive:
		}
	}
	if pos != end {
		s.t.Fatalf("stream went to %s, past %s", pos, end)
	}
	return out
}

func (s *stream) status(write, flush lsn, reply bool) {
	s.t.Helper()
	m := pgwire.StandbyStatusUpdate{Write: write, Flush: flush, SendTime: pgwire.TimeToPG(time.Now()), ReplyRequested: reply}
	s.sendCopy(m.Append(nil))
}

func newStream(t *testing.T, addr string) *stream {
	return &stream{t: t, c: replConnect(t, addr, false, ""), ctx: testCtx(t)}
}

// TestStreamFromExactLSNThenCopyDoneThenAgain: the first byte is exactly the
// requested LSN (not a segment start), new WAL is pushed as it commits, a
// client CopyDone gets CopyDone + START_STREAMING + START_REPLICATION + Z and
// the connection runs the next START_REPLICATION.
func TestStreamFromExactLSNThenCopyDoneThenAgain(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	wal1, _ := p.push(40, 9000, 0) // ~360 KiB: several XLogData
	from := tStart + 1000
	c := newStream(t, addr)
	c.start("START_REPLICATION " + from.String() + " TIMELINE 1")
	got := c.readWAL(from, p.pos)
	if !bytes.Equal(got, wal1[1000:]) {
		t.Fatal("streamed WAL differs from what was pushed")
	}
	// Pushed as soon as it commits.
	start2 := p.pos
	wal2, _ := p.push(3, 100, 0)
	if got := c.readWAL(start2, p.pos); !bytes.Equal(got, wal2) {
		t.Fatal("new WAL differs")
	}
	c.c.Frontend().Send(&pgproto3.CopyDone{})
	c.c.Frontend().Flush()
	for {
		m := c.msg()
		if _, ok := m.(*pgproto3.CopyData); ok {
			continue // keepalives in flight
		}
		if _, ok := m.(*pgproto3.CopyDone); !ok {
			t.Fatalf("got %T, want CopyDone", m)
		}
		break
	}
	if cc := c.expect("CommandComplete").(*pgproto3.CommandComplete); string(cc.CommandTag) != "START_STREAMING" {
		t.Fatalf("tag %q", cc.CommandTag)
	}
	if cc := c.expect("CommandComplete").(*pgproto3.CommandComplete); string(cc.CommandTag) != "START_REPLICATION" {
		t.Fatalf("tag %q", cc.CommandTag)
	}
	c.expect("ReadyForQuery")
	// Second stream on the same connection, from a segment start.
	c.start("START_REPLICATION " + tStart.String())
	if got := c.readWAL(tStart, p.pos); !bytes.Equal(got, append(wal1, wal2...)) {
		t.Fatal("second stream differs")
	}
}

// TestStartAheadOfCommitThenUsable: 'W', then XX000 with the stock text,
// then ReadyForQuery; the connection goes on.
func TestStartAheadOfCommitThenUsable(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(5, 100, 0)
	commit := p.pos
	c := newStream(t, addr)
	c.start("START_REPLICATION 0/FF000000 TIMELINE 1")
	e := c.expect("ErrorResponse").(*pgproto3.ErrorResponse)
	want := "requested starting point 0/FF000000 is ahead of the WAL flush position of this server " + commit.String()
	if e.Code != pgwire.InternalError || e.Message != want {
		t.Fatalf("error %s %q, want %q", e.Code, e.Message, want)
	}
	c.expect("ReadyForQuery")
	// A PostgreSQL timeline the safekeeper does not hold: refused before
	// COPY, with tliSwitchPoint's XX000 text, as PostgreSQL 15's walsender
	// refuses it.
	for _, tli := range []string{"2", "7"} {
		c.query("START_REPLICATION " + tStart.String() + " TIMELINE " + tli)
		if e := c.expect("ErrorResponse").(*pgproto3.ErrorResponse); e.Code != pgwire.InternalError ||
			e.Message != "requested timeline "+tli+" is not in this server's history" {
			t.Fatalf("TIMELINE %s: error %s %q", tli, e.Code, e.Message)
		}
		c.expect("ReadyForQuery")
	}
	// Before the timeline's first byte: 58P01 naming the segment.
	c.start("START_REPLICATION 0/F00000")
	if e := c.expect("ErrorResponse").(*pgproto3.ErrorResponse); e.Code != pgwire.UndefinedFile ||
		e.Message != "requested WAL segment 00000001000000000000000F has already been removed" {
		t.Fatalf("error %s %q", e.Code, e.Message)
	}
	c.expect("ReadyForQuery")
	oneRow(t, must(exec(t, c.c, "IDENTIFY_SYSTEM")), nil, "systemid", "timeline", "xlogpos", "dbname")
}

// TestStartReplicationOfUnknownTimelineBeforeCopy: START_REPLICATION for a
// tenant/timeline the safekeeper does not hold fails before COPY (no
// CopyBothResponse) with 42704, and the connection goes on.
func TestStartReplicationOfUnknownTimelineBeforeCopy(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart).push(1, 10, 0)
	c := &stream{t: t, c: replConnect(t, addr, false, fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, proto.ID{0xbb, 9})), ctx: testCtx(t)}
	c.query("START_REPLICATION " + tStart.String() + " TIMELINE 1")
	if e := c.expect("ErrorResponse").(*pgproto3.ErrorResponse); e.Code != pgwire.UndefinedObject || !strings.Contains(e.Message, "does not exist on this safekeeper") {
		t.Fatalf("error %s %q", e.Code, e.Message)
	}
	c.expect("ReadyForQuery")
}

// TestTermReaderReadsToFlushUntilTermChanges: an ordinary reader stops at
// commit_lsn, a reader naming the term gets flush_lsn, and a new term ends
// its stream with 40001.
func TestTermReaderReadsToFlushUntilTermChanges(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	wal, _ := p.push(5, 100, tStart) // commit_lsn stays at the start
	flush := statusOf(t, s).FlushLSN
	if statusOf(t, s).CommitLSN != tStart || flush != p.pos {
		t.Fatalf("setup: %+v, pushed to %s", statusOf(t, s), p.pos)
	}
	ordinary := newStream(t, addr)
	ordinary.start("START_REPLICATION " + (tStart + 8).String())
	e := ordinary.expect("ErrorResponse").(*pgproto3.ErrorResponse)
	if e.Code != pgwire.InternalError {
		t.Fatalf("ordinary reader above commit: %s %s", e.Code, e.Message)
	}
	ordinary.expect("ReadyForQuery")

	tr := newStream(t, addr)
	tr.start("START_REPLICATION " + tStart.String() + " TIMELINE 1 (term '1')")
	if got := tr.readWAL(tStart, flush); !bytes.Equal(got, wal) {
		t.Fatal("term reader WAL differs")
	}
	// A new proposer of term 2 is elected: the term-1 stream ends with a
	// FATAL (the connection closes; pgconn returns it as an error).
	newTestPush(t, addr, tTimeline, 2, proto.TermHistory{{Term: 1, StartLSN: tStart}, {Term: 2, StartLSN: flush}}, flush)
	for {
		m, err := tr.c.ReceiveMessage(tr.ctx)
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			if pe.Code != codeStaleTerm || pe.Severity != pgwire.SeverityFatal {
				t.Fatalf("term change: %s %s %q, want FATAL 40001", pe.Severity, pe.Code, pe.Message)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.(*pgproto3.CopyData); !ok {
			t.Fatalf("term change: %T %+v", m, m)
		}
	}
}

// TestSilentReaderTimesOutRespondingReaderStays: a reader that never
// replies is disconnected after WalSenderTimeout; one that replies only to
// keepalives asking for it stays connected well past it.
func TestSilentReaderTimesOutRespondingReaderStays(t *testing.T) {
	const timeout = 600 * time.Millisecond
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.WalSenderTimeout = timeout })
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(2, 100, 0)

	silent := newStream(t, addr)
	begun := time.Now()
	silent.start("START_REPLICATION " + p.pos.String())
	gotPing := false
	for {
		m, err := silent.c.ReceiveMessage(silent.ctx)
		if err != nil {
			break // disconnected
		}
		if e, ok := m.(*pgproto3.ErrorResponse); ok {
			t.Fatalf("silent reader: %s (SQLSTATE %s)", e.Message, e.Code)
		}
		if cd, ok := m.(*pgproto3.CopyData); ok && cd.Data[0] == 'k' {
			if len(cd.Data) != pgwire.PrimaryKeepaliveLen {
				t.Fatalf("keepalive of %d bytes", len(cd.Data))
			}
			gotPing = gotPing || cd.Data[17] == 1
		}
	}
	if el := time.Since(begun); !gotPing || el < timeout || el > timeout+5*time.Second {
		t.Fatalf("silent reader: ping %v, disconnected after %v (timeout %v)", gotPing, el, timeout)
	}

	polite := newStream(t, addr)
	polite.start("START_REPLICATION " + p.pos.String())
	until := time.Now().Add(4 * timeout)
	pings := 0
	for time.Now().Before(until) {
		k, ok := polite.next().(pgwire.PrimaryKeepalive)
		if ok && k.ReplyRequested {
			pings++
			polite.status(k.WALEnd, k.WALEnd, false)
		}
	}
	if pings < 2 {
		t.Fatalf("%d keepalives asking for a reply in %v", pings, 4*timeout)
	}
	// A status update asking for a reply is answered at once with 'k'.
	polite.status(p.pos, p.pos, true)
	for {
		if k, ok := polite.next().(pgwire.PrimaryKeepalive); ok && !k.ReplyRequested {
			break
		}
	}
}

// TestNegativeWalSenderTimeoutDisablesIt: with the timeout disabled (the
// CLI's --wal-sender-timeout 0, like wal_sender_timeout = 0), SHOW reports 0
// and a reader that stays silent for seconds is still connected and
// still answered.
func TestNegativeWalSenderTimeoutDisablesIt(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.WalSenderTimeout = -1 })
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(2, 100, 0)

	silent := newStream(t, addr)
	res, err := silent.c.Exec(silent.ctx, "SHOW wal_sender_timeout").ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "0" {
		t.Fatalf("SHOW wal_sender_timeout: %v %v, want 0", res, err)
	}
	silent.start("START_REPLICATION " + p.pos.String())
	// Nothing can be waited for here: the point is that time passes.
	// 2 s is well past a timeout of 0 or any other short misreading of -1.
	<-time.After(2 * time.Second)
	silent.status(p.pos, p.pos, true)
	for { // next fails the test if the connection was closed
		if k, ok := silent.next().(pgwire.PrimaryKeepalive); ok && !k.ReplyRequested {
			break
		}
	}
}

// TestFeedbackReachesProposerAndRetention: 'h' and 'z' from readers reach
// the proposer in SafeKeeperResponse; WAL below the consumer's
// remote_consistent_lsn (and truncate_lsn) is removed by whole segments;
// a START_REPLICATION there then gets 58P01.
func TestFeedbackReachesProposerAndRetention(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(400, 9000, 0) // ~3.5 segments; truncate_lsn 0: the peers' WAL is unknown

	standby := newStream(t, addr)
	standby.start("START_REPLICATION " + p.pos.String())
	h := pgwire.HotStandbyFeedback{SendTime: 77, Xmin: 1000, XminEpoch: 1, CatalogXmin: 900}
	standby.sendCopy(h.Append(nil))
	other := newStream(t, addr)
	other.start("START_REPLICATION " + p.pos.String())
	h2 := pgwire.HotStandbyFeedback{SendTime: 55, Xmin: 2000, XminEpoch: 1}
	other.sendCopy(h2.Append(nil))

	if statusOf(t, s).RemovedUpTo != 0 {
		t.Fatal("WAL removed while truncate_lsn is 0 (a peer's flush_lsn unknown)")
	}
	end := p.pos
	consumer := newStream(t, addr)
	consumer.start("START_REPLICATION " + end.String())
	remote := tStart + 2*tSeg + 5000
	z := pgwire.ConsumerFeedback{TimelineSize: 1 << 20, ReceivedLSN: end, DiskConsistentLSN: end, RemoteConsistentLSN: remote, ReplyTime: 99}
	consumer.sendCopy(z.Append(nil))
	var r *proto.SafeKeeperResponse
	waitFor(t, "feedback in SafeKeeperResponse", func() bool {
		r = p.heartbeat()
		hsOK := r.HotStandby == proto.HotStandbyFeedback{TS: 77, Xmin: 1<<32 | 1000, CatalogXmin: 900}
		consOK := r.Consumer == proto.ConsumerFeedback{TimelineSize: 1 << 20, ReceivedLSN: end, DiskConsistentLSN: end, RemoteConsistentLSN: remote, ReplyTime: 99}
		return hsOK && consOK
	})
	// Now every peer has it all (truncate_lsn = commit_lsn): the consumer
	// bounds removal.
	p.truncate = true
	p.push(1, 100, 0)
	end = p.pos
	waitFor(t, "removal up to the consumer's segment", func() bool {
		p.heartbeat()
		return statusOf(t, s).RemovedUpTo == tStart+2*tSeg
	})
	tl := running(s, proto.TimelineKey{TenantID: tTenant, TimelineID: tTimeline})
	s.reg.Retain(tl) // one more pass with every input settled
	if got := statusOf(t, s).RemovedUpTo; got != tStart+2*tSeg {
		t.Fatalf("removed_up_to %s, want %s: the consumer's remote_consistent_lsn %s did not hold retention", got, tStart+2*tSeg, remote)
	}
	c := newStream(t, addr)
	c.start("START_REPLICATION " + (tStart + tSeg).String())
	if e := c.expect("ErrorResponse").(*pgproto3.ErrorResponse); e.Code != pgwire.UndefinedFile ||
		e.Message != "requested WAL segment 000000010000000000000011 has already been removed" {
		t.Fatalf("error %s %q", e.Code, e.Message)
	}
	c.expect("ReadyForQuery")
	c.start("START_REPLICATION " + (tStart + 2*tSeg).String())
	c.readWAL(tStart+2*tSeg, end)
}

// TestSlotHoldsRetention: a slot's restart_lsn, following the client's
// flush, bounds removal.
func TestSlotHoldsRetention(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(400, 9000, 0) // truncate_lsn 0: nothing is removed before the slot holds its WAL
	end := p.pos
	c := newStream(t, addr)
	oneRow(t, must(exec(t, c.c, `CREATE_REPLICATION_SLOT "keep" PHYSICAL`)), nil, "slot_name", "consistent_point", "snapshot_name", "output_plugin")
	c.start("START_REPLICATION SLOT keep " + tStart.String())
	c.readWAL(tStart, end)
	c.waitReply(tStart+tSeg+10, tStart+tSeg+10) // the slot follows it before truncate_lsn lets anything go
	consumer := newStream(t, addr)
	consumer.start("START_REPLICATION " + end.String())
	z := pgwire.ConsumerFeedback{ReceivedLSN: end, RemoteConsistentLSN: end}
	consumer.sendCopy(z.Append(nil))
	p.truncate = true // every peer has it all: the slot bounds removal
	p.push(1, 100, 0)
	waitFor(t, "removal up to the slot's segment", func() bool {
		p.heartbeat()
		return statusOf(t, s).RemovedUpTo == tStart+tSeg
	})
	if got := statusOf(t, s).RemovedUpTo; got != tStart+tSeg {
		t.Fatalf("removed past the slot: %s", got)
	}
	// The slot is in use by the stream: it cannot be dropped meanwhile.
	other := replConnect(t, addr, false, "")
	_, err := exec(t, other, `DROP_REPLICATION_SLOT keep`)
	wantCode(t, err, pgwire.ObjectInUse)
}

// TestShutdownEndsStreamsLikeWalSndDone: at Shutdown a stream gets its
// committed WAL, keepalives asking for a reply, and once the client
// confirmed, CommandComplete "COPY 0" inside COPY mode, then the close.
func TestShutdownEndsStreamsLikeWalSndDone(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(20, 1000, 0)
	c := newStream(t, addr)
	c.start("START_REPLICATION " + tStart.String())
	c.readWAL(tStart, p.pos)
	done := make(chan error, 1)
	begun := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	for {
		m := c.msg()
		if cd, ok := m.(*pgproto3.CopyData); ok {
			if k, err := pgwire.ParsePrimaryKeepalive(cd.Data); err == nil && k.ReplyRequested {
				c.status(k.WALEnd, k.WALEnd, false)
			}
			continue
		}
		if cc, ok := m.(*pgproto3.CommandComplete); !ok || string(cc.CommandTag) != "COPY 0" {
			t.Fatalf("got %T %+v, want CommandComplete COPY 0", m, m)
		}
		break
	}
	if _, err := c.c.ReceiveMessage(c.ctx); err == nil {
		t.Fatal("connection still open after COPY 0")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if el := time.Since(begun); el > s.cfg.ShutdownGrace+2*time.Second {
		t.Fatalf("Shutdown took %v", el)
	}
}

// waitFor polls cond until it holds, failing after 10 s (like
// harness.WaitFor: a condition with a deadline, never a fixed sleep).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	delay := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(delay)
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// TestTimelineStatusReportsTheStreamingProposer: TIMELINE_STATUS names the
// push connection that last streamed (sync and wal fetch use it to tell a
// live proposer): nothing before the first SafeKeeperRequest, then its
// address, term and a small age; once it disconnects the address is NULL
// and the term and age remain.
func TestTimelineStatusReportsTheStreamingProposer(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 3, proto.TermHistory{{Term: 3, StartLSN: tStart}}, tStart)
	c := replConnect(t, addr, false, "")
	cols := []string{"proposer_addr", "last_push_term", "last_push_age_ms"}
	status := func() []string {
		t.Helper()
		row := oneRow(t, must(exec(t, c, "TIMELINE_STATUS")), nil, "tenant_id", "timeline_id", "term", "voted_for", "last_log_term",
			"flush_lsn", "commit_lsn", "truncate_lsn", "timeline_start_lsn", "removed_up_to", "pg_timeline", "system_id", "wal_seg_size", "readers", "slots", "pg_version",
			"proposer_addr", "last_push_term", "last_push_age_ms", "retention_horizon", "retention_reason", "backup_lsn")
		return row[16 : 16+len(cols)]
	}
	// Elected, but nothing streamed yet (ProposerElected has no reply: a
	// heartbeat's response shows the server has taken it).
	if got := status(); got[0] != "NULL" || got[1] != "0" || got[2] != "NULL" {
		t.Fatalf("%v before any SafeKeeperRequest = %q; want NULL, 0, NULL", cols, got)
	}
	p.push(5, 200, 0)
	got := status()
	if want := p.c.NetConn().LocalAddr().String(); got[0] != want || got[1] != "3" {
		t.Fatalf("%v while streaming = %q; want %s, 3", cols, got, want)
	}
	if age, err := strconv.Atoi(got[2]); err != nil || age < 0 || age > 5000 {
		t.Fatalf("last_push_age_ms %q while streaming", got[2])
	}
	p.c.Close()
	waitFor(t, "the server to see the proposer leave", func() bool { return status()[0] == "NULL" })
	if got := status(); got[1] != "3" || got[2] == "NULL" {
		t.Fatalf("%v after the proposer left = %q; want NULL, 3, an age", cols, got)
	}
}

// TestIdentifySystemNeverBelowTheTimelineStart: a timeline with nothing
// committed yet answers IDENTIFY_SYSTEM with its start, not 0/0, so a
// pg_receivewal started right then asks for the first segment the timeline
// holds instead of segment 0 (which it would be told was removed).
func TestIdentifySystemNeverBelowTheTimelineStart(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	// A heartbeat with commit_lsn 0: its answer shows ProposerElected was
	// taken; nothing is committed.
	p.send(&proto.SafeKeeperRequest{Sender: p.ballot, BeginLSN: p.pos, EndLSN: p.pos})
	if r := p.recv().(*proto.SafeKeeperResponse); r.CommitLSN != 0 {
		t.Fatalf("commit_lsn %s, want 0/0", r.CommitLSN)
	}
	c := replConnect(t, addr, false, "")
	row := oneRow(t, must(exec(t, c, "IDENTIFY_SYSTEM")), nil, "systemid", "timeline", "xlogpos", "dbname")
	if row[2] != tStart.String() {
		t.Fatalf("IDENTIFY_SYSTEM xlogpos %s on a timeline starting at %s with nothing committed; want its start", row[2], tStart)
	}
}

// logBuffer collects a server's log lines for a test.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestReportsPastWhatWasSent: a standby that reconnects asks for its
// segment's start and reports its replay position as flush before it has
// been sent anything; that is clamped to what was sent (the slot does not
// move past it) but not logged. A position past the end of the timeline's
// WAL is no client's WAL: clamped, and logged once.
func TestReportsPastWhatWasSent(t *testing.T) {
	var logs logBuffer
	s := startTestServer(t, t.TempDir(), func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(20, 300, tStart) // flushed, not yet committed: nothing to send
	end := p.pos
	c := replConnect(t, addr, false, "")
	if _, err := exec(t, c, `CREATE_REPLICATION_SLOT "s" PHYSICAL (RESERVE_WAL)`); err != nil {
		t.Fatal(err)
	}
	st := &stream{t: t, c: c, ctx: testCtx(t)}
	st.start(fmt.Sprintf("START_REPLICATION SLOT s PHYSICAL %s TIMELINE 1", tStart))
	// Before it was sent anything: the replay position, inside the WAL.
	st.waitReply(tStart, tStart+100)
	if strings.Contains(logs.String(), "reported a position past") {
		t.Fatalf("a standby's replay position was logged as misbehaviour:\n%s", logs.String())
	}
	if row := readSlotRow(t, s, "s"); !strings.HasPrefix(row, "physical,"+tStart.String()+",") {
		t.Fatalf("slot %q: want restart_lsn clamped to %s, what was sent", row, tStart)
	}
	p.heartbeat() // commit_lsn = end
	st.readWAL(tStart, end)
	st.waitReply(end, end+1<<20)
	if n := strings.Count(logs.String(), "reported a position past the end of this timeline's WAL"); n != 1 {
		t.Fatalf("a position past the timeline's WAL logged %d times, want once:\n%s", n, logs.String())
	}
	st.waitReply(end, end+2<<20)
	if n := strings.Count(logs.String(), "reported a position past the end of this timeline's WAL"); n != 1 {
		t.Fatalf("logged %d times after a second report, want once per stream", n)
	}
	if row := readSlotRow(t, s, "s"); !strings.HasPrefix(row, "physical,"+end.String()+",") {
		t.Fatalf("slot %q: want restart_lsn clamped to %s, what was sent", row, end)
	}
}

// TestReaderRacingANewTimelinesElectionNeverGetsNoWAL: a reader that asks
// a timeline just created (a proposer's greeting) for IDENTIFY_SYSTEM,
// TIMELINE_HISTORY or START_REPLICATION before its proposer is elected is
// served once the election set the timeline's start — never xlogpos 0/0,
// which pg_receivewal would then ask for and be refused ("requested WAL
// segment 000000010000000000000000 has already been removed"). Raced many
// times, with the reader's command sent at once after the greeting. A
// timeline whose proposer never comes refuses them with 57P03 (retried by
// walreceivers), after wal_sender_timeout.
func TestReaderRacingANewTimelinesElectionNeverGetsNoWAL(t *testing.T) {
	const wait = 2 * time.Second // wal_sender_timeout: how long a reader waits for the start
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.WalSenderTimeout = wait })
	addr := s.Addr().String()
	const rounds = 40
	for i := range rounds {
		tl := proto.ID{0xbb, 0x30, byte(i)}
		p := newGreetedPush(t, addr, tl)
		opts := fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, tl)
		type answer struct {
			xlogpos string
			err     error
		}
		got := make(chan answer, 1)
		go func() {
			ctx := testCtx(t)
			host, port, _ := strings.Cut(addr, ":")
			c, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=tester sslmode=disable replication=true options='%s'", host, port, opts))
			if err != nil {
				got <- answer{err: err}
				return
			}
			defer c.Close(context.Background())
			res, err := c.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll()
			if err != nil {
				got <- answer{err: err}
				return
			}
			got <- answer{xlogpos: string(res[0].Rows[0][2])}
		}()
		p.elect(1, hist1(tStart), tStart)
		a := <-got
		if a.err != nil || a.xlogpos != tStart.String() {
			t.Fatalf("round %d: IDENTIFY_SYSTEM racing the election: xlogpos %q, %v; want the timeline start %s", i, a.xlogpos, a.err, tStart)
		}
	}

	// A timeline created, its proposer never elected: 57P03 for each.
	idle := proto.ID{0xbb, 0x31}
	newGreetedPush(t, addr, idle)
	c := replConnect(t, addr, false, fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, idle))
	for _, q := range []string{"IDENTIFY_SYSTEM", "TIMELINE_HISTORY 2", "START_REPLICATION 0/0"} {
		began := time.Now()
		_, err := exec(t, c, q)
		pe := wantCode(t, err, pgwire.CannotConnectNow)
		if !strings.Contains(pe.Message, "holds no WAL yet") || time.Since(began) < wait {
			t.Fatalf("%s on a timeline never elected: %q after %v; want 57P03 holds no WAL yet after %v", q, pe.Message, time.Since(began), wait)
		}
	}
}

// newGreetedPush greets the server for a new timeline tl (creating it) and
// returns the stream, not yet voted for.
func newGreetedPush(t *testing.T, addr string, tl proto.ID) *testPush {
	t.Helper()
	ctx := testCtx(t)
	c, err := proposer.Dial(ctx, proposer.DialConfig{AllowTimelineCreation: true, Addr: addr, TenantID: tTenant, TimelineID: tl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p := &testPush{t: t, ctx: ctx, c: c}
	p.send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
		TimelineID: tl, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xcc, 1}, WalEnd: tStart})
	p.recv()
	return p
}

// elect wins the vote in term and sends ProposerElected at start.
func (p *testPush) elect(term uint64, hist proto.TermHistory, start lsn) {
	p.t.Helper()
	p.ballot = proto.Ballot{Term: term, UUID: proto.ID{0xcc, byte(term)}}
	p.pos = start
	p.send(&proto.RequestVote{Candidate: p.ballot})
	p.recv()
	p.recv()
	p.send(&proto.ProposerElected{Term: term, StartStreamingAt: start, TimelineStartLSN: hist[0].StartLSN, History: hist})
	p.gen = xlogtest.NewGenerator(start, tSeg, 1, tSysID)
}
