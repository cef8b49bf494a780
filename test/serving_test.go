package test

// Serving WAL to stock PostgreSQL 15 clients (docs/serving.md): a real
// primary makes WAL, a small test proposer pushes the primary's own pg_wal
// bytes into `safekeeper run` over the WAL push protocol, and pg_receivewal,
// a hot standby and a pglogrepl consumer read it back from the safekeeper.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

const svSegMB = 1 // small segments: complete segments come quickly

var (
	svTenant   = proto.ID{0x5e, 0x77}
	svTimeline = proto.ID{0x7a, 0x11}
)

func svOptions() string {
	return fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", svTenant, svTimeline)
}

// svPrimary starts a PostgreSQL 15 primary with 1 MiB segments that keeps
// enough WAL for the test proposer to read it from pg_wal.
func svPrimary(t *testing.T) *pgtest.Cluster {
	return pgtest.Start(t, pgtest.Options{WALSegSizeMB: svSegMB, Conf: []string{"wal_keep_size = '512MB'"}})
}

// walFeeder is the test proposer: it pushes the primary's pg_wal bytes, up
// to the primary's flush LSN, into one safekeeper.
type walFeeder struct {
	t       *testing.T
	pg      *pgtest.Cluster
	sk      *harness.Safekeeper
	sysID   uint64
	version uint32
	seg     uint64
	start   proto.LSN // timeline start: a segment start
	term    uint64
	hist    proto.TermHistory

	c      *proposer.Conn
	ctx    context.Context
	ballot proto.Ballot
	pos    proto.LSN
	// holdTruncate: pushes send truncate_lsn 0 (a peer's flush unknown),
	// so retention removes nothing until the test lets it.
	holdTruncate bool
}

func newFeeder(t *testing.T, pg *pgtest.Cluster, sk *harness.Safekeeper) *walFeeder {
	t.Helper()
	insert := svLSN(t, pg.Exec(t, "select pg_current_wal_insert_lsn()"))
	return newFeederAt(t, pg, sk, insert.SegmentStart(pg.WALSegSize))
}

// newFeederAt starts the timeline at start (a record boundary of the
// primary's WAL).
func newFeederAt(t *testing.T, pg *pgtest.Cluster, sk *harness.Safekeeper, start proto.LSN) *walFeeder {
	t.Helper()
	sys, _ := strconv.ParseUint(pg.Exec(t, "select system_identifier from pg_control_system()"), 10, 64)
	ver, _ := strconv.ParseUint(pg.Exec(t, "show server_version_num"), 10, 32)
	f := &walFeeder{t: t, pg: pg, sk: sk, sysID: sys, version: uint32(ver), seg: pg.WALSegSize, start: start}
	f.connect()
	return f
}

func svLSN(t *testing.T, s string) proto.LSN {
	t.Helper()
	l, err := proto.ParseLSN(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("LSN %q: %v", s, err)
	}
	return l
}

// connect runs the handshake in a new term, starting where the safekeeper's
// WAL ends (the first time: at f.start).
func (f *walFeeder) connect() {
	t := f.t
	t.Helper()
	f.ctx = harness.Context(t, 3*time.Minute)
	c, err := proposer.Dial(f.ctx, proposer.DialConfig{AllowTimelineCreation: true, Addr: f.sk.Addr, TenantID: svTenant, TimelineID: svTimeline, ApplicationName: "svproposer"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	f.c = c
	f.term++
	f.ballot = proto.Ballot{Term: f.term, UUID: proto.ID{0xfe, byte(f.term)}}
	f.send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: f.version, SystemID: f.sysID, TenantID: svTenant,
		TimelineID: svTimeline, PgTimeline: 1, WalSegSize: uint32(f.seg), ProposerUUID: f.ballot.UUID, WalEnd: f.start})
	info, ok := f.recv().(*proto.SafeKeeperInfo)
	if !ok {
		t.Fatal("want SafeKeeperInfo")
	}
	f.send(&proto.RequestVote{Candidate: f.ballot})
	if v, ok := f.recv().(*proto.VoteResponse); !ok || v.VotedFor != f.ballot {
		t.Fatalf("vote refused: %+v", v)
	}
	f.recv()
	from := f.start
	if info.FlushLSN != 0 {
		from = info.FlushLSN
	}
	f.hist = append(f.hist, proto.TermSwitch{Term: f.term, StartLSN: from})
	f.send(&proto.ProposerElected{Term: f.term, StartStreamingAt: from, TimelineStartLSN: f.start, History: f.hist})
	f.pos = from
}

func (f *walFeeder) send(m proto.Message) {
	f.t.Helper()
	if err := f.c.Send(m); err != nil {
		f.t.Fatalf("send %T: %v", m, err)
	}
}

func (f *walFeeder) recv() proto.Message {
	f.t.Helper()
	m, err := f.c.Recv(f.ctx)
	if err != nil {
		f.t.Fatalf("recv: %v", err)
	}
	return m
}

// push sends the primary's WAL from f.pos to its current flush LSN (with
// commit_lsn and truncate_lsn = that LSN) and returns it once the
// safekeeper has committed it.
func (f *walFeeder) push() proto.LSN {
	t := f.t
	t.Helper()
	flush := svLSN(t, f.pg.Exec(t, "select pg_current_wal_flush_lsn()"))
	reqs := 0
	for f.pos < flush {
		segStart := f.pos.SegmentStart(f.seg)
		name := filepath.Join(f.pg.WALDir(), proto.SegmentFileName(1, f.pos, f.seg))
		end := min(flush, segStart+proto.LSN(f.seg))
		file, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, end-f.pos)
		_, err = file.ReadAt(buf, int64(f.pos-segStart))
		file.Close()
		if err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		for off := 0; off < len(buf); off += proto.MaxWALPerRequest {
			chunk := buf[off:min(off+proto.MaxWALPerRequest, len(buf))]
			f.send(&proto.SafeKeeperRequest{Sender: f.ballot, BeginLSN: f.pos, EndLSN: f.pos + proto.LSN(len(chunk)),
				CommitLSN: flush, TruncateLSN: f.truncateAt(flush), WAL: chunk})
			f.pos += proto.LSN(len(chunk))
			reqs++
		}
	}
	var last *proto.SafeKeeperResponse
	for i := 0; i < reqs; i++ {
		last = f.recv().(*proto.SafeKeeperResponse)
	}
	if last != nil && last.Term != f.term {
		t.Fatalf("deposed: %+v", last)
	}
	return flush
}

// truncateAt is the truncate_lsn a push at flush sends: flush (every peer
// has it: there are none), or 0 while holdTruncate is set.
func (f *walFeeder) truncateAt(flush proto.LSN) proto.LSN {
	if f.holdTruncate {
		return 0
	}
	return flush
}

// heartbeat sends an empty request and returns the response.
func (f *walFeeder) heartbeat() *proto.SafeKeeperResponse {
	f.t.Helper()
	f.send(&proto.SafeKeeperRequest{Sender: f.ballot, BeginLSN: f.pos, EndLSN: f.pos})
	return f.recv().(*proto.SafeKeeperResponse)
}

func skHostPort(sk *harness.Safekeeper) (string, string) {
	h, p, _ := strings.Cut(sk.Addr, ":")
	return h, p
}

// receiveWAL runs pg_receivewal against the safekeeper until it has written
// the complete segments up to upTo (exclusive), then SIGINTs it and checks
// that it exits 0 and that each complete segment equals the primary's.
func receiveWAL(t *testing.T, pg *pgtest.Cluster, f *walFeeder, extra ...string) {
	t.Helper()
	dir := pgtest.Dir(t, "svtest-")
	host, port := skHostPort(f.sk)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := append([]string{"-D", dir, "-h", host, "-p", port, "-U", "postgres", "--no-loop", "-v", "-d",
		"options='" + svOptions() + "'"}, extra...)
	cmd := pg.Cmd(ctx, "pg_receivewal", args...)
	var out harness.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// It starts at the segment of IDENTIFY_SYSTEM's xlogpos: wait for its
	// .partial file, then make and push more complete segments.
	harness.WaitFor(t, 30*time.Second, "pg_receivewal's first .partial file", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("pg_receivewal exited early: %v\n%s", err, out.String())
		default:
		}
		m, _ := filepath.Glob(filepath.Join(dir, "*.partial"))
		return len(m) > 0
	})
	first, _ := filepath.Glob(filepath.Join(dir, "*.partial"))
	pg.Exec(t, "create table if not exists rw(x int, pad text); insert into rw select g, repeat('x', 200) from generate_series(1, 3000) g; select pg_switch_wal();")
	pg.Exec(t, "insert into rw select g, repeat('y', 200) from generate_series(1, 3000) g; select pg_switch_wal();")
	pg.Exec(t, "insert into rw values (1, 'tail')")
	upTo := f.push()
	want := proto.SegmentFileName(1, upTo, f.seg) // the segment still open
	harness.WaitFor(t, 60*time.Second, "pg_receivewal to reach segment "+want, func() bool {
		_, err := os.Stat(filepath.Join(dir, want+".partial"))
		return err == nil
	})
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("pg_receivewal after SIGINT: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("pg_receivewal did not exit after SIGINT\n%s", out.String())
	}
	complete, _ := filepath.Glob(filepath.Join(dir, "0000000*"))
	n := 0
	for _, path := range complete {
		if strings.HasSuffix(path, ".partial") {
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		wantBytes, err := os.ReadFile(filepath.Join(pg.WALDir(), filepath.Base(path)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, wantBytes) {
			t.Fatalf("segment %s differs from the primary's", filepath.Base(path))
		}
		n++
	}
	if n < 2 {
		t.Fatalf("only %d complete segments (first partial %v)\n%s", n, first, out.String())
	}
	if !strings.Contains(f.sk.Log(), "WAL stream ended by the client") {
		t.Fatalf("the safekeeper did not log the clean ending\n%s", out.String())
	}
}

// TestPgReceiveWALSegmentsMatchPrimary: pg_receivewal --synchronous, then
// with a slot it created, then with that slot again into an empty directory
// (it starts from the slot's restart_lsn and restart_tli), write segments
// byte-identical to the primary's and end cleanly on SIGINT.
func TestPgReceiveWALSegmentsMatchPrimary(t *testing.T) {
	pg := svPrimary(t)
	sk := harness.StartSafekeeper(t, 1, "--unsafe-no-fsync")
	f := newFeeder(t, pg, sk)
	pg.Exec(t, "create table warm(x int); insert into warm select generate_series(1, 1000)")
	f.push()
	receiveWAL(t, pg, f, "--synchronous")

	host, port := skHostPort(sk)
	pg.Run(t, "pg_receivewal", "-h", host, "-p", port, "-U", "postgres", "-d", "options='"+svOptions()+"'", "--slot", "rwslot", "--create-slot")
	receiveWAL(t, pg, f, "--slot", "rwslot")
	c := svConn(t, sk)
	res, err := c.Exec(harness.Context(t, 10*time.Second), "READ_REPLICATION_SLOT rwslot").ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "physical" || res[0].Rows[0][1] == nil {
		t.Fatalf("slot after pg_receivewal --slot: %+v %v", res, err)
	}
	// --create-slot made it without RESERVE_WAL; the stream moved its
	// restart_lsn, and restart_tli with it: a pg_receivewal with an empty
	// directory starts from these two (restart_tli 0 made it fail with
	// "TIMELINE_HISTORY: invalid timeline 0").
	if tli := string(res[0].Rows[0][2]); tli != "1" {
		t.Fatalf("slot after pg_receivewal --slot: restart_tli %q, want 1", tli)
	}
	receiveWAL(t, pg, f, "--slot", "rwslot")
}

func svConn(t *testing.T, sk *harness.Safekeeper) *pgconn.PgConn {
	t.Helper()
	host, port := skHostPort(sk)
	c, err := pgconn.Connect(harness.Context(t, 10*time.Second),
		fmt.Sprintf("host=%s port=%s user=postgres sslmode=disable replication=true options='%s'", host, port, svOptions()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// startStandby starts a hot standby of pg that streams from sk, retrying
// a lost connection every second.
func startStandby(t *testing.T, pg *pgtest.Cluster, sk *harness.Safekeeper) *pgtest.Cluster {
	t.Helper()
	return harness.StartStandby(t, pg, sk, harness.StandbyOptions{Tenant: svTenant.String(), Timeline: svTimeline.String(),
		Conf: []string{"wal_retrieve_retry_interval = 1s"}})
}

// pointAt makes the standby stream from host:port (with startup options)
// from now on: primary_conninfo is reloaded, the walreceiver restarts.
func pointAt(t *testing.T, sb *pgtest.Cluster, host, port, options string) {
	t.Helper()
	conn := fmt.Sprintf("host=%s port=%s user=postgres application_name=standby1", host, port)
	if options != "" {
		conn += " options=''" + options + "''"
	}
	sb.Exec(t, "alter system set primary_conninfo = '"+conn+"'")
	sb.Exec(t, "select pg_reload_conf()")
}

// replayTimeout bounds a standby's wait to replay what the primary wrote.
const replayTimeout = 90 * time.Second

const accountsQuery = "select count(*), sum(abalance) from pgbench_accounts"

// TestHotStandbyFedBySafekeeper: a standby from pg_basebackup whose
// primary_conninfo points at the safekeeper streams and replays; after
// pgbench its results equal the primary's; after kill -9 and restart of
// the safekeeper it reconnects by itself and catches up.
func TestHotStandbyFedBySafekeeper(t *testing.T) {
	pg := svPrimary(t)
	sk := harness.StartSafekeeper(t, 1, "--unsafe-no-fsync")
	f := newFeeder(t, pg, sk)
	f.push()
	sb := startStandby(t, pg, sk)
	f.push()

	pg.Run(t, "pgbench", "-i", "-s", "1", "-h", pg.SocketDir, "-p", strconv.Itoa(pg.Port), "-U", "postgres", "postgres")
	pg.Run(t, "pgbench", "-n", "-t", "200", "-h", pg.SocketDir, "-p", strconv.Itoa(pg.Port), "-U", "postgres", "postgres")
	sb.WaitReplay(t, f.push().String(), replayTimeout)
	if got, want := sb.Exec(t, accountsQuery), pg.Exec(t, accountsQuery); got != want {
		t.Fatalf("standby %q, primary %q", got, want)
	}
	if st := sb.Exec(t, "select status from pg_stat_wal_receiver"); st != "streaming" {
		t.Fatalf("wal receiver status %q", st)
	}

	sk.Kill()
	sk.Start()
	f.connect() // a new term, continuing at the safekeeper's flush_lsn
	pg.Run(t, "pgbench", "-n", "-t", "200", "-h", pg.SocketDir, "-p", strconv.Itoa(pg.Port), "-U", "postgres", "postgres")
	sb.WaitReplay(t, f.push().String(), replayTimeout)
	if got, want := sb.Exec(t, accountsQuery), pg.Exec(t, accountsQuery); got != want {
		t.Fatalf("after the safekeeper restart: standby %q, primary %q", got, want)
	}
	b, _ := os.ReadFile(sb.LogFile)
	if !strings.Contains(string(b), "started streaming WAL from primary at") {
		t.Fatalf("standby never streamed:\n%s", b)
	}
}

// TestConsumerFeedbackRelayAndRetention: a pageserver-style consumer
// (pglogrepl) sends 'z' and 'r'; its feedback reaches the proposer in
// SafeKeeperResponse; WAL below its remote_consistent_lsn is removed
// (TIMELINE_STATUS shows removed_up_to), and a START_REPLICATION there gets
// 58P01.
func TestConsumerFeedbackRelayAndRetention(t *testing.T) {
	pg := svPrimary(t)
	sk := harness.StartSafekeeper(t, 1, "--unsafe-no-fsync", "--retention-interval", "50ms", "--wal-keep-size", "0")
	f := newFeeder(t, pg, sk)
	f.holdTruncate = true // nothing removed before the consumer reports
	for i := 0; i < 4; i++ {
		pg.Exec(t, "create table if not exists c(x int, pad text); insert into c select g, repeat('z', 300) from generate_series(1, 2000) g; select pg_switch_wal();")
	}
	end := f.push()
	ctx := harness.Context(t, 60*time.Second)
	c := svConn(t, sk)
	if _, err := c.Exec(ctx, `CREATE_REPLICATION_SLOT "pageserver" PHYSICAL`).ReadAll(); err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(ctx, c, "pageserver", pglogrepl.LSN(f.start), pglogrepl.StartReplicationOptions{Timeline: 1, Mode: pglogrepl.PhysicalReplication}); err != nil {
		t.Fatal(err)
	}
	received := f.start
	for received < end {
		msg, err := c.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil || proto.LSN(x.WALStart) != received {
			t.Fatalf("XLogData at %s, want %s (%v)", proto.LSN(x.WALStart), received, err)
		}
		received += proto.LSN(len(x.WALData))
	}
	remote := f.start + 2*proto.LSN(f.seg) + 100
	z := pgwire.ConsumerFeedback{TimelineSize: 12345, ReceivedLSN: received, DiskConsistentLSN: received, RemoteConsistentLSN: remote, ReplyTime: pgwire.TimeToPG(time.Now())}
	c.Frontend().Send(&pgproto3.CopyData{Data: z.Append(nil)})
	if err := c.Frontend().Flush(); err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, c, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(received), WALFlushPosition: pglogrepl.LSN(remote)}); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 30*time.Second, "consumer feedback in SafeKeeperResponse", func() bool {
		r := f.heartbeat()
		return r.Consumer.RemoteConsistentLSN == remote && r.Consumer.ReceivedLSN == received && r.Consumer.TimelineSize == 12345
	})
	// Every peer has it all now (there are none): the consumer bounds
	// removal.
	f.send(&proto.SafeKeeperRequest{Sender: f.ballot, BeginLSN: f.pos, EndLSN: f.pos, CommitLSN: end, TruncateLSN: end})
	f.recv()
	want := (f.start + 2*proto.LSN(f.seg)).String()
	status := svConn(t, sk)
	harness.WaitFor(t, 30*time.Second, "removed_up_to "+want, func() bool {
		res, err := status.Exec(ctx, "TIMELINE_STATUS").ReadAll()
		if err != nil || len(res) != 1 || len(res[0].Rows) != 1 {
			return false
		}
		for i, fd := range res[0].FieldDescriptions {
			if fd.Name == "removed_up_to" {
				return string(res[0].Rows[0][i]) == want
			}
		}
		return false
	})
	late := svConn(t, sk)
	if _, err := late.Exec(ctx, `CREATE_REPLICATION_SLOT "late" PHYSICAL`).ReadAll(); err != nil {
		t.Fatal(err)
	}
	err := pglogrepl.StartReplication(ctx, late, "late", pglogrepl.LSN(f.start), pglogrepl.StartReplicationOptions{Timeline: 1, Mode: pglogrepl.PhysicalReplication})
	if err != nil {
		t.Fatalf("slot should be usable: %v", err) // CopyBoth comes first; the error follows
	}
	var pe *pgconn.PgError
	for {
		msg, err := late.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			pe = pgconn.ErrorResponseToPgError(e)
			break
		}
	}
	if !errors.As(error(pe), &pe) || pe.Code != pgwire.UndefinedFile || !strings.Contains(pe.Message, "has already been removed") {
		t.Fatalf("start in a removed segment: %+v", pe)
	}
}

// svNext returns the next message that is not ParameterStatus.
func svNext(t *testing.T, ctx context.Context, c *pgconn.PgConn) pgproto3.BackendMessage {
	t.Helper()
	for {
		m, err := c.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		if _, ok := m.(*pgproto3.ParameterStatus); !ok {
			return m
		}
	}
}

func svQuery(t *testing.T, c *pgconn.PgConn, q string) {
	t.Helper()
	c.Frontend().Send(&pgproto3.Query{String: q})
	if err := c.Frontend().Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestWalSenderTimeoutZeroDisablesIt: `run --wal-sender-timeout 0` means
// no timeout, as wal_sender_timeout = 0 does in PostgreSQL, not the default.
func TestWalSenderTimeoutZeroDisablesIt(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--wal-sender-timeout", "0"}, "0"},
		{nil, "1min"},
	} {
		sk := harness.StartSafekeeper(t, 1, tc.args...)
		c := svConn(t, sk)
		res, err := c.Exec(harness.Context(t, 10*time.Second), "SHOW wal_sender_timeout").ReadAll()
		if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != tc.want {
			t.Fatalf("run %q: SHOW wal_sender_timeout = %v (%v), want %s", tc.args, res, err, tc.want)
		}
	}
}

// TestStreamEdgeCasesOnBinary: against `safekeeper run` with a short
// --wal-sender-timeout: CopyDone then a second START_REPLICATION on the
// same connection (first byte exactly the requested LSN), a start ahead of
// commit (XX000 after 'W', connection usable), a reader that never replies
// is disconnected, one that replies only when asked stays.
func TestStreamEdgeCasesOnBinary(t *testing.T) {
	const timeout = time.Second
	pg := svPrimary(t)
	sk := harness.StartSafekeeper(t, 1, "--unsafe-no-fsync", "--wal-sender-timeout", timeout.String())
	f := newFeeder(t, pg, sk)
	pg.Exec(t, "create table e(x int); insert into e select generate_series(1, 5000)")
	end := f.push()
	ctx := harness.Context(t, 60*time.Second)

	c := svConn(t, sk)
	if res, err := c.Exec(ctx, "SHOW wal_sender_timeout").ReadAll(); err != nil || string(res[0].Rows[0][0]) != "1s" {
		t.Fatalf("SHOW wal_sender_timeout: %v, want 1s", err)
	}
	for _, from := range []proto.LSN{f.start, f.start + 12345} {
		svQuery(t, c, "START_REPLICATION "+from.String()+" TIMELINE 1")
		if _, ok := svNext(t, ctx, c).(*pgproto3.CopyBothResponse); !ok {
			t.Fatal("want CopyBothResponse")
		}
		pos := from
		for pos < end {
			if cd, ok := svNext(t, ctx, c).(*pgproto3.CopyData); ok && cd.Data[0] == 'w' {
				x, _ := pgwire.ParseXLogData(cd.Data)
				if x.DataStart != pos {
					t.Fatalf("XLogData at %s, want %s", x.DataStart, pos)
				}
				pos += proto.LSN(len(x.Data))
			}
		}
		c.Frontend().Send(&pgproto3.CopyDone{})
		c.Frontend().Flush()
		var tags []string
		for {
			switch m := svNext(t, ctx, c).(type) {
			case *pgproto3.CopyData:
				continue
			case *pgproto3.CopyDone:
				tags = append(tags, "CopyDone")
				continue
			case *pgproto3.CommandComplete:
				tags = append(tags, string(m.CommandTag))
				continue
			case *pgproto3.ReadyForQuery:
				tags = append(tags, "Z")
			default:
				t.Fatalf("unexpected %T", m)
			}
			break
		}
		if got := strings.Join(tags, ","); got != "CopyDone,START_STREAMING,START_REPLICATION,Z" {
			t.Fatalf("ending %s", got)
		}
	}
	svQuery(t, c, "START_REPLICATION 0/FF000000 TIMELINE 1")
	if _, ok := svNext(t, ctx, c).(*pgproto3.CopyBothResponse); !ok {
		t.Fatal("want CopyBothResponse before the error")
	}
	if e, ok := svNext(t, ctx, c).(*pgproto3.ErrorResponse); !ok || e.Code != pgwire.InternalError ||
		!strings.Contains(e.Message, "is ahead of the WAL flush position of this server") {
		t.Fatalf("ahead of commit: %+v", e)
	}
	if _, ok := svNext(t, ctx, c).(*pgproto3.ReadyForQuery); !ok {
		t.Fatal("want ReadyForQuery after the error")
	}
	if _, err := c.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll(); err != nil {
		t.Fatal(err)
	}

	silent, polite := svConn(t, sk), svConn(t, sk)
	// The server's clock for the silent reader starts when it begins the
	// stream, after this: a drop measured from here is never early.
	begun := time.Now()
	for _, s := range []*pgconn.PgConn{silent, polite} {
		svQuery(t, s, "START_REPLICATION "+end.String()+" TIMELINE 1")
		svNext(t, ctx, s)
	}
	silentGone := make(chan time.Duration, 1)
	go func() {
		for {
			if _, err := silent.ReceiveMessage(ctx); err != nil {
				silentGone <- time.Since(begun)
				return
			}
		}
	}()
	until := time.Now().Add(3 * timeout)
	for time.Now().Before(until) {
		cd, ok := svNext(t, ctx, polite).(*pgproto3.CopyData)
		if !ok || cd.Data[0] != 'k' {
			continue
		}
		k, err := pgwire.ParsePrimaryKeepalive(cd.Data)
		if err != nil {
			t.Fatal(err)
		}
		if k.ReplyRequested {
			r := pgwire.StandbyStatusUpdate{Write: k.WALEnd, Flush: k.WALEnd, SendTime: pgwire.TimeToPG(time.Now())}
			polite.Frontend().Send(&pgproto3.CopyData{Data: r.Append(nil)})
			polite.Frontend().Flush()
		}
	}
	select {
	case d := <-silentGone:
		if d < timeout {
			t.Fatalf("silent reader dropped after %v, before the %v timeout", d, timeout)
		}
	case <-ctx.Done():
		t.Fatal("silent reader never disconnected")
	}
	if !strings.Contains(sk.Log(), "terminating walsender process due to replication timeout") {
		t.Fatal("timeout not logged")
	}
	// The polite reader was read from (svNext fails the test on a closed
	// connection) until 3 timeouts had passed: it stayed connected.
}

// TestMidSegmentTimelineServedToStockClients: a timeline whose first byte
// lies inside a segment (as when a walproposer starts there, as Neon's
// does). Stock clients ask for the segment's start; the safekeeper serves
// it from its first byte — pages with valid headers and no record up to the
// timeline's start, then the timeline's WAL — so a hot standby streams from
// the segment's start and replays, and pg_receivewal writes the segment
// with the timeline's bytes, the primary's, from its start on.
func TestMidSegmentTimelineServedToStockClients(t *testing.T) {
	pg := svPrimary(t)
	sk := harness.StartSafekeeper(t, 1, "--unsafe-no-fsync")
	pg.Exec(t, "create table before_start(x int); insert into before_start select generate_series(1, 500)")
	// A hot standby streaming from the primary itself, to be pointed at
	// the safekeeper later, while its replay is inside the timeline's
	// first segment.
	sb := startStandby(t, pg, sk)
	pointAt(t, sb, pg.SocketDir, strconv.Itoa(pg.Port), "")
	// Start the timeline where the primary's WAL is now, inside a segment.
	insert := svLSN(t, pg.Exec(t, "select pg_current_wal_insert_lsn()"))
	if insert.SegmentOffset(pg.WALSegSize) < 2*8192 {
		pg.Exec(t, "insert into before_start select generate_series(1, 500)")
		insert = svLSN(t, pg.Exec(t, "select pg_current_wal_insert_lsn()"))
	}
	f := newFeederAt(t, pg, sk, insert)
	pg.Exec(t, "insert into before_start values (0)") // something committed, in the same segment
	at := f.push()
	segStart := f.start.SegmentStart(f.seg)
	if segStart == f.start || at.SegmentStart(f.seg) != segStart {
		t.Fatalf("the timeline %s..%s is not inside one segment", f.start, at)
	}
	sb.WaitReplay(t, at.String(), replayTimeout)

	// Pointed at the safekeeper, it asks for the segment's start: pages
	// with no record up to the timeline's start, then its WAL.
	host, port := skHostPort(sk)
	pointAt(t, sb, host, port, svOptions())
	pg.Exec(t, "insert into before_start select generate_series(1, 100)")
	sb.WaitReplay(t, f.push().String(), replayTimeout)
	if got, want := sb.Exec(t, "select count(*) from before_start"), pg.Exec(t, "select count(*) from before_start"); got != want {
		t.Fatalf("standby %q, primary %q", got, want)
	}
	if b, _ := os.ReadFile(sb.LogFile); !strings.Contains(string(b), "started streaming WAL from primary at "+segStart.String()) {
		t.Fatalf("the standby did not stream from %s, the start of the timeline's first segment:\n%s", segStart, b)
	}

	// pg_receivewal: the segment from its first byte.
	dir := pgtest.Dir(t, "svtest-")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := pg.Cmd(ctx, "pg_receivewal", "-D", dir, "-h", host, "-p", port, "-U", "postgres", "-v", "-d", "options='"+svOptions()+"'")
	var out harness.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := proto.SegmentFileName(1, segStart, f.seg)
	pg.Exec(t, "select pg_switch_wal()")
	f.push()
	harness.WaitFor(t, 60*time.Second, "pg_receivewal to complete "+first, func() bool {
		_, err := os.Stat(filepath.Join(dir, first))
		return err == nil
	})
	cmd.Process.Signal(syscall.SIGINT)
	cmd.Wait()
	got, err := os.ReadFile(filepath.Join(dir, first))
	if err != nil {
		t.Fatal(err)
	}
	primary, err := os.ReadFile(filepath.Join(pg.WALDir(), first))
	if err != nil {
		t.Fatal(err)
	}
	off := f.start - segStart
	if !bytes.Equal(got[off:], primary[off:]) {
		t.Fatalf("segment %s from the timeline's start %s on differs from the primary's", first, f.start)
	}
	if binary.LittleEndian.Uint16(got) != 0xD110 || binary.LittleEndian.Uint16(got[2:])&2 == 0 {
		t.Fatalf("segment %s does not open with a long page header: %x", first, got[:40])
	}

	t.Logf("timeline starting at %s (offset %d in its segment): pg_receivewal wrote %s, the standby replayed", f.start, off, first)
}
