package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/storage"
	"github.com/safekeeper/safekeeper/test/harness"
)

func shutdown(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestDataDirKeepsItsNodeID: the first start records the node id in the
// data directory; a restart with another id is refused with an error naming
// both ids and the directory, and changes nothing; the same id starts.
func TestDataDirKeepsItsNodeID(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, dir, func(c *Config) { c.NodeID = 7 })
	shutdown(t, s)

	_, err := New(Config{NodeID: 8, ListenPG: "127.0.0.1:0", DataDir: dir, UnsafeNoFsync: true})
	var me *NodeIDMismatchError
	if !errors.Is(err, ErrNodeIDMismatch) || !errors.As(err, &me) || me.Recorded != 7 || me.Configured != 8 || me.DataDir != dir {
		t.Fatalf("New with id 8 on node 7's data dir: %v (%+v), want a NodeIDMismatchError 7/8", err, me)
	}
	for _, want := range []string{"7", "8", dir} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not name %s", err, want)
		}
	}
	// The refused start left the file unlocked and the record as it was.
	shutdown(t, startTestServer(t, dir, func(c *Config) { c.NodeID = 7 }))
}

// TestOldDataDirAdoptsNodeID: a data directory from before the node id was
// recorded (a timeline, no record) adopts the id of its next start, and
// keeps it.
func TestOldDataDirAdoptsNodeID(t *testing.T) {
	dir := t.TempDir()
	// A data directory as an older build left it: a timeline, no record.
	db, err := storage.Open(filepath.Join(dir, "safekeeper.db"), storage.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateTimeline(acceptor.NewState(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018,
		SystemID: tSysID, TenantID: tTenant, TimelineID: tTimeline, PgTimeline: 1, WalSegSize: tSeg})); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s := startTestServer(t, dir, func(c *Config) { c.NodeID = 5 })
	c := replConnect(t, s.Addr().String(), false, "")
	if res := must(exec(t, c, "TIMELINE_STATUS")); len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][11]) != fmt.Sprint(tSysID) {
		t.Fatalf("TIMELINE_STATUS %v: the old timeline is not served", res)
	}
	shutdown(t, s)
	_, err = New(Config{NodeID: 1, ListenPG: "127.0.0.1:0", DataDir: dir, UnsafeNoFsync: true})
	var me *NodeIDMismatchError
	if !errors.As(err, &me) || me.Recorded != 5 || me.Configured != 1 {
		t.Fatalf("New with id 1 after the directory adopted 5: %v", err)
	}
}

// TestShutdownNotHeldByReaderThatStoppedReading: a client starts streaming
// from the timeline start, with more WAL than both socket buffers hold, and
// never reads. Shutdown still returns within about ShutdownGrace (the
// blocked write gets a deadline), and the client's connection is closed.
func TestShutdownNotHeldByReaderThatStoppedReading(t *testing.T) {
	const grace = time.Second
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.ShutdownGrace = grace })
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(800, 9000, 0) // ~7 MiB: more than the server's send buffer (at most 4 MiB) holds

	host, port, _ := strings.Cut(addr, ":")
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=%s port=%s user=tester sslmode=disable replication=true", host, port))
	if err != nil {
		t.Fatal(err)
	}
	// A small receive buffer: the server's writes block sooner.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10)
		}); err != nil {
			return err
		}
		return serr
	}}
	cfg.DialFunc = d.DialContext
	c, err := pgconn.ConnectConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	c.Frontend().Send(&pgproto3.Query{String: "START_REPLICATION " + tStart.String()})
	if err := c.Frontend().Flush(); err != nil {
		t.Fatal(err)
	}
	tl := running(s, proto.TimelineKey{TenantID: tTenant, TimelineID: tTimeline})
	waitFor(t, "the stream to send", func() bool {
		for _, rd := range tl.Replication(0).Readers {
			return rd.Sent > tStart
		}
		return false
	})

	begun := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(begun); el > grace+3*time.Second {
		t.Fatalf("Shutdown took %v with a client that stopped reading (ShutdownGrace %v)", el, grace)
	}
	// The server closed the connection: reading drains it to its end.
	nc := c.Conn()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, nc); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the connection of the client that stopped reading is still open")
		}
	}
}

// wantFatal checks that err is a FATAL ErrorResponse with code and message,
// and that the message is one clean text (no error wrapped in it).
func wantFatal(t *testing.T, err error, code, msg string) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("want FATAL %s %q, got %v", code, msg, err)
	}
	if pe.Severity != pgwire.SeverityFatal || pe.SeverityUnlocalized != pgwire.SeverityFatal || pe.Code != code || pe.Message != msg {
		t.Fatalf("got %s %s %q, want FATAL %s %q", pe.Severity, pe.Code, pe.Message, code, msg)
	}
	if strings.Contains(pe.Message, "SQLSTATE") || strings.Contains(pe.Message, "ERROR:") {
		t.Fatalf("message %q embeds another error", pe.Message)
	}
}

// TestStartupErrorsAreFatal: errors after which the server closes the
// connection are FATAL, as PostgreSQL sends them, with one clean message:
// bad startup options, bad ids in them, a bad or logical replication
// parameter; and a WAL push stream ended by an error.
func TestStartupErrorsAreFatal(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	host, port, _ := strings.Cut(s.Addr().String(), ":")
	for _, tc := range []struct {
		conn, code, msg string
	}{
		{"options='-c foo=bar --x'", pgwire.InvalidParameterValue, `invalid options "-c foo=bar --x": "x" is not name=value`},
		{"options='-c tenant_id=xyz'", pgwire.InvalidParameterValue, `invalid value for parameter "tenant_id": "xyz"`},
		{"options='-c timeline_id=0123'", pgwire.InvalidParameterValue, `invalid value for parameter "timeline_id": "0123"`},
		{"options='-c tenantid=" + tTenant.String() + "'", pgwire.InvalidParameterValue, `unrecognized configuration parameter "tenantid" in startup options`},
		{"options='-c wal_sender_timeout=30s -c timelineid=1'", pgwire.InvalidParameterValue, `unrecognized configuration parameter "timelineid" in startup options`},
		{"replication=maybe", pgwire.InvalidParameterValue, `invalid value for parameter "replication": "maybe"`},
		{"replication=database", pgwire.FeatureNotSupported, "logical replication connections are not supported by a safekeeper"},
	} {
		_, err := pgconn.Connect(testCtx(t), fmt.Sprintf("host=%s port=%s user=tester sslmode=disable %s", host, port, tc.conn))
		wantFatal(t, err, tc.code, tc.msg)
	}
	// What PostgreSQL accepts is accepted (and ignored): its own settings,
	// in any case, and dotted custom names.
	c0, err := pgconn.Connect(testCtx(t), fmt.Sprintf("host=%s port=%s user=tester sslmode=disable options='-c wal_sender_timeout=30s -c TimeZone=UTC -c sk.tenant=t1'", host, port))
	if err != nil {
		t.Fatalf("PostgreSQL settings and a dotted name in the startup options: %v", err)
	}
	c0.Close(testCtx(t))

	// A WAL push stream ended by a protocol violation.
	c := replConnect(t, s.Addr().String(), true, "")
	st := &stream{t: t, c: c, ctx: testCtx(t)}
	st.start("START_WAL_PUSH")
	st.sendCopy([]byte("not a proposer message"))
	for {
		// pgconn returns a FATAL ErrorResponse as an error (and closes).
		m, err := c.ReceiveMessage(st.ctx)
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			wantFatal(t, err, pgwire.ProtocolViolation, pe.Message)
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if e, ok := m.(*pgproto3.ErrorResponse); ok {
			t.Fatalf("%s %s %q, want FATAL", e.Severity, e.Code, e.Message)
		}
	}
}

// rawClient is a client on a plain socket, for bytes no driver sends.
type rawClient struct {
	t  *testing.T
	nc net.Conn
	fe *pgproto3.Frontend
}

func rawConnect(t *testing.T, addr string) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(tTimeout))
	c := &rawClient{t: t, nc: nc, fe: pgproto3.NewFrontend(nc, nc)}
	startup, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": "tester", "replication": "true"}}).Encode(nil)
	c.write(startup)
	for {
		if _, ok := c.recv().(*pgproto3.ReadyForQuery); ok {
			return c
		}
	}
}

func (c *rawClient) write(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawClient) recv() pgproto3.BackendMessage {
	c.t.Helper()
	m, err := c.fe.Receive()
	if err != nil {
		c.t.Fatalf("receive: %v", err)
	}
	return m
}

// expectError receives an ErrorResponse and checks it.
func (c *rawClient) expectError(severity, code, msg string) {
	c.t.Helper()
	e, ok := c.recv().(*pgproto3.ErrorResponse)
	if !ok || e.Severity != severity || e.SeverityUnlocalized != severity || e.Code != code || e.Message != msg {
		c.t.Fatalf("got %+v, want %s %s %q", e, severity, code, msg)
	}
}

// query runs a simple query that returns one value.
func (c *rawClient) query(q string) string {
	c.t.Helper()
	b, _ := (&pgproto3.Query{String: q}).Encode(nil)
	c.write(b)
	var val string
	for {
		switch m := c.recv().(type) {
		case *pgproto3.DataRow:
			val = string(m.Values[0])
		case *pgproto3.ErrorResponse:
			c.t.Fatalf("%s: %s", q, m.Message)
		case *pgproto3.ReadyForQuery:
			return val
		}
	}
}

func rawQuery(body string) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{'Q'}, uint32(4+len(body))), body...)
}

// TestMalformedFrontendMessages: after startup, an unknown message type is
// PostgreSQL's FATAL 08P01 "invalid frontend message type 63" and the
// connection closes; a Query without its NUL terminator (or empty) is ERROR
// 08P01 "invalid string in message", one with a NUL inside ERROR 08P01
// "invalid message format", each followed by ReadyForQuery on a connection
// that stays usable. Each is logged with the client's address.
func TestMalformedFrontendMessages(t *testing.T) {
	var logs harness.SyncBuffer
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	addr := s.Addr().String()

	c := rawConnect(t, addr)
	for _, tc := range []struct {
		msg  []byte
		want string
	}{
		{rawQuery("SHOW wal_block_size"), "invalid string in message"},
		{rawQuery(""), "invalid string in message"},
		{rawQuery("SHOW wal_block_size\x00;\x00"), "invalid message format"},
	} {
		c.write(tc.msg)
		c.expectError(pgwire.SeverityError, pgwire.ProtocolViolation, tc.want)
		if _, ok := c.recv().(*pgproto3.ReadyForQuery); !ok {
			t.Fatalf("%q: want ReadyForQuery after the error", tc.msg)
		}
		if got := c.query("SHOW wal_block_size"); got != "8192" {
			t.Fatalf("after %q: SHOW wal_block_size = %q", tc.msg, got)
		}
	}

	c = rawConnect(t, addr)
	c.write([]byte{'?', 0, 0, 0, 4})
	c.expectError(pgwire.SeverityFatal, pgwire.ProtocolViolation, "invalid frontend message type 63")
	if m, err := c.fe.Receive(); err == nil {
		t.Fatalf("got %T after FATAL, want the connection closed", m)
	}
	remote := "peer=" + c.nc.LocalAddr().String()
	waitFor(t, "the protocol violation in the log", func() bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, remote) && strings.Contains(line, "invalid frontend message type 63") {
				return true
			}
		}
		return false
	})
	if !strings.Contains(logs.String(), "invalid string in message") || !strings.Contains(logs.String(), "invalid message format") {
		t.Fatalf("malformed queries not logged:\n%s", logs.String())
	}
}

// TestTimelineOpensReadOnlyWhenStorageCannotWrite: opening a timeline
// writes (acceptor.New durably cuts WAL above flush_lsn). When that write
// fails — a restart on a full disk — the timeline still opens read-only:
// TIMELINE_STATUS reports its durable state, a proposer's greeting is
// refused with the storage error, and once writing works again the next
// greeting rebuilds it and WAL is accepted where it left off.
func TestTimelineOpensReadOnlyWhenStorageCannotWrite(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, dir, nil)
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	p.push(3, 500, 0)
	end := p.pos
	p.c.Close()
	shutdown(t, s)

	var failing atomic.Bool
	failing.Store(true)
	s = startHookedServer(t, dir, nil, hooks{storage: func(st *storage.Timeline) acceptor.Storage {
		return &failingStorage{Storage: st, fail: &failing}
	}})
	addr := s.Addr().String()
	c := replConnect(t, addr, false, "")
	row := oneRow(t, must(exec(t, c, "TIMELINE_STATUS")), nil, "tenant_id", "timeline_id", "term", "voted_for", "last_log_term",
		"flush_lsn", "commit_lsn", "truncate_lsn", "timeline_start_lsn", "removed_up_to", "pg_timeline", "system_id", "wal_seg_size", "readers", "slots", "pg_version",
		"proposer_addr", "last_push_term", "last_push_age_ms", "retention_horizon", "retention_reason", "backup_lsn")
	if row[2] != "1" || row[5] != end.String() || row[6] != end.String() {
		t.Fatalf("TIMELINE_STATUS of the read-only timeline: %q; want term 1, flush_lsn and commit_lsn %s", row, end)
	}

	// A greeting while storage still fails: the storage error, not a hang.
	q, err := proposer.Dial(testCtx(t), proposer.DialConfig{AllowTimelineCreation: true, Addr: addr, TenantID: tTenant, TimelineID: tTimeline})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
		TimelineID: tTimeline, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xdd}, WalEnd: end}); err != nil {
		t.Fatal(err)
	}
	var pe *pgconn.PgError
	if _, err := q.Recv(testCtx(t)); !errors.As(err, &pe) || pe.Code != codeStorageFailure {
		t.Fatalf("greeting a timeline that cannot write: %v, want SQLSTATE %s", err, codeStorageFailure)
	}

	failing.Store(false)
	p = newTestPush(t, addr, tTimeline, 2, proto.TermHistory{{Term: 1, StartLSN: tStart}, {Term: 2, StartLSN: end}}, end)
	if _, resp := p.push(2, 500, 0); resp.FlushLSN != p.pos {
		t.Fatalf("after recovery: flush_lsn %s, want %s", resp.FlushLSN, p.pos)
	}
}

// failingStorage is a timeline's storage that cannot write while fail is
// set, as on a full disk: a commit fails and nothing staged for it reaches
// the real storage.
type failingStorage struct {
	acceptor.Storage
	fail    *atomic.Bool
	dropped bool // something was staged while failing: the next commit fails
}

func (f *failingStorage) WriteWAL(lsn proto.LSN, data []byte) error {
	if f.fail.Load() {
		f.dropped = true
		return nil
	}
	return f.Storage.WriteWAL(lsn, data)
}

func (f *failingStorage) TruncateWAL(lsn proto.LSN) error {
	if f.fail.Load() {
		f.dropped = true
		return nil
	}
	return f.Storage.TruncateWAL(lsn)
}

func (f *failingStorage) Commit(st acceptor.State) error {
	if f.fail.Load() || f.dropped {
		f.dropped = false
		return errors.New("injected: write failed")
	}
	return f.Storage.Commit(st)
}

// TestStorageFailureMidStreamIsLoggedAndRecovers: a commit that fails while
// a proposer streams (the group commit, not a greeting) ends the stream
// with the storage SQLSTATE and is logged as a storage failure once; after
// the disk works again the next greeting rebuilds the timeline, which is
// logged too, and WAL is accepted where the durable WAL ends.
func TestStorageFailureMidStreamIsLoggedAndRecovers(t *testing.T) {
	var failing atomic.Bool
	var logs harness.SyncBuffer
	s := startHookedServer(t, t.TempDir(), func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) },
		hooks{storage: func(st *storage.Timeline) acceptor.Storage { return &failingStorage{Storage: st, fail: &failing} }})
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(3, 500, 0)
	durable := p.pos

	failing.Store(true)
	p.gen.Record(500)
	wal := p.gen.Take()
	p.send(&proto.SafeKeeperRequest{Sender: p.ballot, BeginLSN: p.pos, EndLSN: p.pos + lsn(len(wal)), CommitLSN: p.pos, WAL: wal})
	var pe *pgconn.PgError
	if _, err := p.c.Recv(p.ctx); !errors.As(err, &pe) || pe.Code != codeStorageFailure {
		t.Fatalf("a request whose commit fails: %v, want SQLSTATE %s", err, codeStorageFailure)
	}
	waitFor(t, "the storage failure in the log", func() bool { return strings.Contains(logs.String(), "storage failed") })

	failing.Store(false)
	p = newTestPush(t, addr, tTimeline, 1, hist1(tStart), durable)
	if _, resp := p.push(2, 500, 0); resp.FlushLSN != p.pos {
		t.Fatalf("after recovery: flush_lsn %s, want %s", resp.FlushLSN, p.pos)
	}
	if !strings.Contains(logs.String(), "timeline recovered from storage failure") {
		t.Fatalf("recovery not logged:\n%s", logs.String())
	}
	if n := strings.Count(logs.String(), "storage failed"); n != 1 {
		t.Fatalf("storage failure logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestFailedListenDoesNotClaimTheDataDir: a server that cannot listen (the
// port is taken) fails without recording its node id in the data
// directory, so the same directory can then be started with another id.
func TestFailedListenDoesNotClaimTheDataDir(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	if _, err := New(Config{NodeID: 7, ListenPG: taken.Addr().String(), DataDir: dir, UnsafeNoFsync: true}); err == nil {
		t.Fatal("a server listening on a taken port started")
	}
	s, err := New(Config{NodeID: 8, ListenPG: "127.0.0.1:0", DataDir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatalf("the data directory was claimed by the server that could not listen: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.Shutdown(ctx)
	<-served
}

// shortListener fails its first accepts as a process out of file
// descriptors does, then accepts from the real listener.
type shortListener struct {
	net.Listener
	errs  []error
	calls []time.Time // when each failing Accept was called
}

func (l *shortListener) Accept() (net.Conn, error) {
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		l.calls = append(l.calls, time.Now())
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", err)}
	}
	return l.Listener.Accept()
}

// TestAcceptSurvivesTooManyOpenFiles: accept failing with EMFILE or
// ENFILE does not end Serve: it is retried after a pause of 5 ms doubling
// each time (net/http's), logged once, and the next client is served.
func TestAcceptSurvivesTooManyOpenFiles(t *testing.T) {
	var logs syncBuffer
	cfg := Config{NodeID: 1, ListenPG: "127.0.0.1:0", DataDir: t.TempDir(), UnsafeNoFsync: true,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	s, err := newServer(cfg, hooks{})
	if err != nil {
		t.Fatal(err)
	}
	ln := &shortListener{Listener: s.ln, errs: []error{syscall.EMFILE, syscall.EMFILE, syscall.EMFILE, syscall.ENFILE, syscall.ENFILE}}
	s.ln = ln
	var serveErr error
	served := make(chan struct{})
	go func() { serveErr = s.Serve(); close(served) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		<-served
	})
	// Connect returns once the server answered the startup (ReadyForQuery).
	connected := make(chan error, 1)
	go func() {
		c, err := pgconn.Connect(testCtx(t), "host=127.0.0.1 port="+strconv.Itoa(s.Addr().(*net.TCPAddr).Port)+" user=tester sslmode=disable")
		if err == nil {
			c.Close(context.Background())
		}
		connected <- err
	}()
	select {
	case <-served:
		t.Fatalf("Serve returned %v", serveErr)
	case err := <-connected:
		if err != nil {
			t.Fatalf("a client after the failed accepts: %v", err)
		}
	}
	// The failed accepts were all made before the client's (Accept runs in
	// Serve's goroutine alone), so ln.calls is complete.
	for i := 1; i < len(ln.calls); i++ {
		if gap, want := ln.calls[i].Sub(ln.calls[i-1]), acceptBackoffMin<<(i-1); gap < want {
			t.Errorf("accept %d came %v after the one before, want at least %v", i+1, gap, want)
		}
	}
	if n := strings.Count(logs.String(), "accept failed"); n != 1 {
		t.Errorf("accept failures logged %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "failed_accepts=5") {
		t.Errorf("the recovery not logged with its count:\n%s", logs.String())
	}
}
