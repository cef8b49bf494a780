package test

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/test/harness"
)

const (
	segSize = 1 << 20
	tlStart = proto.LSN(0x2000000) // a segment boundary
	sysID   = 7300000000000000001
)

func TestMain(m *testing.M) { harness.Main(m) }

// tp is a test proposer on one connection.
type tp struct {
	t      *testing.T
	c      *proposer.Conn
	ctx    context.Context
	info   proto.ServerInfo
	ballot proto.Ballot
}

func tenant(n byte) proto.ID { return proto.ID{0xaa, n} }

func dial(t *testing.T, sk *harness.Safekeeper, tl byte) *tp {
	t.Helper()
	ctx := harness.Context(t, 60*time.Second)
	c, err := proposer.Dial(ctx, proposer.DialConfig{AllowTimelineCreation: true, Addr: sk.Addr, TenantID: tenant(1), TimelineID: proto.ID{0xbb, tl}, ApplicationName: "testproposer"})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return &tp{t: t, c: c, ctx: ctx, info: proto.ServerInfo{
		ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: sysID, TenantID: tenant(1), TimelineID: proto.ID{0xbb, tl},
		PgTimeline: 1, WalSegSize: segSize, ProposerUUID: proto.ID{0xcc}, WalEnd: tlStart,
	}}
}

func (p *tp) send(m proto.Message) {
	p.t.Helper()
	if err := p.c.Send(m); err != nil {
		p.t.Fatalf("send %T: %v", m, err)
	}
}

func (p *tp) recv() proto.Message {
	p.t.Helper()
	m, err := p.c.Recv(p.ctx)
	if err != nil {
		p.t.Fatalf("recv: %v", err)
	}
	return m
}

// recvErr expects an ErrorResponse with SQLSTATE code and then the
// connection closed by the server within a second.
func (p *tp) recvErr(code string) *pgconn.PgError {
	p.t.Helper()
	var pe *pgconn.PgError
	for {
		_, err := p.c.Recv(p.ctx)
		if errors.As(err, &pe) {
			break
		}
		if err != nil {
			p.t.Fatalf("want ErrorResponse %s, got %v", code, err)
		}
	}
	if pe.Code != code {
		p.t.Fatalf("SQLSTATE %s (%s), want %s", pe.Code, pe.Message, code)
	}
	ctx, cancel := context.WithTimeout(p.ctx, time.Second)
	defer cancel()
	if _, err := p.c.Recv(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		p.t.Fatalf("connection not closed within a second after ErrorResponse: %v", err)
	}
	return pe
}

func (p *tp) greet() *proto.SafeKeeperInfo {
	p.t.Helper()
	p.send(&p.info)
	info, ok := p.recv().(*proto.SafeKeeperInfo)
	if !ok {
		p.t.Fatal("greeting: want SafeKeeperInfo")
	}
	return info
}

// vote asks for b and returns the fresh SafeKeeperInfo of the grant.
func (p *tp) vote(b proto.Ballot) *proto.SafeKeeperInfo {
	p.t.Helper()
	p.send(&proto.RequestVote{Candidate: b})
	v, ok := p.recv().(*proto.VoteResponse)
	if !ok || v.VotedFor != b {
		p.t.Fatalf("vote for %v: verdict %+v", b, v)
	}
	info, ok := p.recv().(*proto.SafeKeeperInfo)
	if !ok || info.VotedFor != b {
		p.t.Fatalf("fresh info after grant: %+v", info)
	}
	p.ballot = b
	return info
}

func (p *tp) elected(start proto.LSN, h proto.TermHistory) {
	p.t.Helper()
	p.send(&proto.ProposerElected{Term: p.ballot.Term, StartStreamingAt: start, TimelineStartLSN: h[0].StartLSN, History: h})
}

func (p *tp) appendReq(begin proto.LSN, wal []byte, commit proto.LSN) *proto.SafeKeeperRequest {
	return &proto.SafeKeeperRequest{Sender: p.ballot, BeginLSN: begin, EndLSN: begin + proto.LSN(len(wal)), CommitLSN: commit, WAL: wal}
}

func (p *tp) resp() *proto.SafeKeeperResponse {
	p.t.Helper()
	r, ok := p.recv().(*proto.SafeKeeperResponse)
	if !ok {
		p.t.Fatal("want SafeKeeperResponse")
	}
	return r
}

func contains(l []proto.LSN, x proto.LSN) bool {
	for _, v := range l {
		if v == x {
			return true
		}
	}
	return false
}

func hist(pairs ...uint64) proto.TermHistory {
	var h proto.TermHistory
	for i := 0; i < len(pairs); i += 2 {
		h = append(h, proto.TermSwitch{Term: pairs[i], StartLSN: proto.LSN(pairs[i+1])})
	}
	return h
}

func node(term uint64, b byte) proto.Ballot { return proto.Ballot{Term: term, UUID: proto.ID{b}} }

// startTerm runs the whole handshake for a fresh timeline and returns the
// proposer ready to stream from tlStart.
func startTerm(t *testing.T, sk *harness.Safekeeper, tl byte, term uint64) *tp {
	p := dial(t, sk, tl)
	p.greet()
	p.vote(node(term, 1))
	p.elected(tlStart, hist(term, uint64(tlStart)))
	return p
}

func TestHandshakeAppendAndOrderlyEnd(t *testing.T) {
	sk := harness.StartSafekeeper(t, 3)
	p := dial(t, sk, 1)
	g := p.greet()
	if g.SafekeeperID != 3 || g.VotedFor.Term != 0 || g.TimelineStartLSN != 0 || g.FlushLSN != 0 || len(g.History) != 0 {
		t.Fatalf("greeting of a new timeline: %+v", g)
	}
	info := p.vote(node(1, 1))
	if info.LastLogTerm != 0 {
		t.Fatalf("fresh info %+v", info)
	}
	p.elected(tlStart, hist(1, uint64(tlStart)))

	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	var ends []proto.LSN
	begin := tlStart
	for _, n := range []int{10, 100, 9000, 40000, 3} {
		_, end := gen.Record(n)
		ends = append(ends, end)
		wal := gen.Take()
		p.send(p.appendReq(begin, wal, 0))
		begin += proto.LSN(len(wal))
	}
	// One response per request, in order; group commit may answer several
	// with the same, later flush_lsn, but never one that does not cover the
	// request or that lies inside a record.
	var last proto.LSN
	for i, want := range ends {
		r := p.resp()
		if r.Term != 1 || r.FlushLSN < want || r.FlushLSN < last || !contains(ends, r.FlushLSN) {
			t.Fatalf("response %d: %+v, want a record end ≥ %v", i, r, want)
		}
		last = r.FlushLSN
	}
	if last != ends[len(ends)-1] {
		t.Fatalf("last response flush %v, want %v", last, ends[len(ends)-1])
	}
	// A request whose WAL stops inside a record: flush_lsn stays at the
	// last complete record.
	_, end := gen.Record(20000)
	wal := gen.Take()
	p.send(p.appendReq(begin, wal[:5000], ends[len(ends)-1]))
	if r := p.resp(); r.FlushLSN != ends[len(ends)-1] || r.CommitLSN != ends[len(ends)-1] {
		t.Fatalf("partial record: %+v", r)
	}
	p.send(p.appendReq(begin+5000, wal[5000:], end))
	if r := p.resp(); r.FlushLSN != end || r.CommitLSN != end {
		t.Fatalf("completed record: %+v, want flush=commit=%v", r, end)
	}

	// Orderly end: CopyDone, CommandComplete, ReadyForQuery; the
	// connection is back in query mode.
	if err := p.c.End(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.c.Recv(p.ctx); !errors.Is(err, proposer.ErrStreamEnded) {
		t.Fatalf("after CopyDone: %v", err)
	}
	tag, err := p.c.Finish(p.ctx)
	sawCC := err == nil && tag == "START_WAL_PUSH"
	if !sawCC {
		t.Fatalf("after CopyDone: CommandComplete %q, %v; want START_WAL_PUSH then ReadyForQuery", tag, err)
	}

	// A second connection sees the durable state.
	q := dial(t, sk, 1)
	if g := q.greet(); g.FlushLSN != end || g.CommitLSN != end || g.VotedFor != node(1, 1) || g.LastLogTerm != 1 || g.TimelineStartLSN != tlStart {
		t.Fatalf("state after reconnect: %+v", g)
	}
}

func TestVoteRefusal(t *testing.T) {
	sk := harness.StartSafekeeper(t, 1)
	a := dial(t, sk, 1)
	a.greet()
	a.vote(node(5, 1))
	for _, b := range []proto.Ballot{node(5, 2), node(4, 9)} {
		p := dial(t, sk, 1)
		p.greet()
		p.send(&proto.RequestVote{Candidate: b})
		v, ok := p.recv().(*proto.VoteResponse)
		if !ok || v.VotedFor != node(5, 1) {
			t.Fatalf("refusal verdict %+v, want the stored vote 5/01", v)
		}
		p.recvErr("55P03")
	}
	// The same proposer reconnecting is granted again.
	r := dial(t, sk, 1)
	r.greet()
	r.vote(node(5, 1))
}

func TestElectedTruncatesDivergentTail(t *testing.T) {
	sk := harness.StartSafekeeper(t, 1)
	a := startTerm(t, sk, 1, 1)
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	_, end1 := gen.Record(100)
	w1 := gen.Take()
	a.send(a.appendReq(tlStart, w1, 0))
	_, end2 := gen.Record(200)
	a.send(a.appendReq(end1, gen.Take(), 0))
	a.resp()
	if r := a.resp(); r.FlushLSN != end2 {
		t.Fatalf("flush %v", r.FlushLSN)
	}
	// Proposer B of term 2 elects a donor that ended at end1.
	b := dial(t, sk, 1)
	if g := b.greet(); g.FlushLSN != end2 {
		t.Fatalf("greeting flush %v", g.FlushLSN)
	}
	b.vote(node(2, 2))
	h := hist(1, uint64(tlStart), 2, uint64(end1))
	b.elected(end1, h)
	// The safekeeper cut its WAL at end1: the next append must begin there.
	gen2 := xlogtest.NewGenerator(end1, segSize, 1, sysID)
	gen2.SetPrev(tlStart)
	_, end3 := gen2.Record(50)
	b.send(b.appendReq(end1, gen2.Take(), 0))
	if r := b.resp(); r.Term != 2 || r.FlushLSN != end3 {
		t.Fatalf("after truncation: %+v, want flush %v", r, end3)
	}
	c := dial(t, sk, 1)
	if g := c.greet(); g.FlushLSN != end3 || !g.History.Equal(h) || g.LastLogTerm != 2 {
		t.Fatalf("state: %+v", g)
	}

	// A mismatched start_streaming_at is refused with its own SQLSTATE and
	// changes nothing.
	d := dial(t, sk, 1)
	d.greet()
	d.vote(node(3, 3))
	d.elected(end1, hist(1, uint64(tlStart), 2, uint64(end1), 3, uint64(end3)))
	d.recvErr("22000")
	e := dial(t, sk, 1)
	if g := e.greet(); g.FlushLSN != end3 {
		t.Fatalf("refused ProposerElected changed flush to %v", g.FlushLSN)
	}
}

func TestRefusesTruncationBelowCommit(t *testing.T) {
	sk := harness.StartSafekeeper(t, 1)
	a := startTerm(t, sk, 1, 1)
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	_, end1 := gen.Record(100)
	_, end2 := gen.Record(100)
	a.send(a.appendReq(tlStart, gen.Take(), end2))
	if r := a.resp(); r.CommitLSN != end2 {
		t.Fatalf("commit %v", r.CommitLSN)
	}
	b := dial(t, sk, 1)
	b.greet()
	b.vote(node(2, 2))
	// A buggy proposer whose history claims term 2 started at end1, so
	// that this safekeeper agrees only up to end1, below its commit_lsn.
	b.elected(end1, hist(1, uint64(tlStart), 2, uint64(end1)))
	b.recvErr("55000")
}

func TestDeposedSender(t *testing.T) {
	sk := harness.StartSafekeeper(t, 1)
	a := startTerm(t, sk, 1, 1)
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	_, end1 := gen.Record(100)
	a.send(a.appendReq(tlStart, gen.Take(), 0))
	a.resp()
	b := dial(t, sk, 1)
	b.greet()
	b.vote(node(7, 2))
	gen.Record(100)
	a.send(a.appendReq(end1, gen.Take(), 0))
	if r := a.resp(); r.Term != 7 || r.FlushLSN != end1 {
		t.Fatalf("deposed sender got %+v, want term 7 and flush %v", r, end1)
	}
	// A stale ProposerElected is refused with the stale-term SQLSTATE.
	c := dial(t, sk, 1)
	c.greet()
	c.send(&proto.RequestVote{Candidate: node(3, 3)})
	if v := c.recv().(*proto.VoteResponse); v.VotedFor != node(7, 2) {
		t.Fatalf("verdict %+v", v)
	}
	c.recvErr("55P03")
}

func TestProtocolViolations(t *testing.T) {
	sk := harness.StartSafekeeper(t, 1)
	t.Run("out of order", func(t *testing.T) {
		p := dial(t, sk, 1)
		p.send(&proto.RequestVote{Candidate: node(1, 1)})
		p.recvErr("08P01")
	})
	t.Run("unknown tag", func(t *testing.T) {
		p := dial(t, sk, 1)
		p.c.SendRaw([]byte{'Q', 1, 2, 3})
		p.recvErr("08P01")
	})
	t.Run("wrong length", func(t *testing.T) {
		p := dial(t, sk, 1)
		p.c.SendRaw((&p.info).Encode(nil)[:20])
		p.recvErr("08P01")
	})
	t.Run("gap in WAL", func(t *testing.T) {
		p := startTerm(t, sk, 2, 1)
		gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
		gen.Record(10)
		p.send(p.appendReq(tlStart+8, gen.Take(), 0))
		p.recvErr("08P01")
	})
	t.Run("invalid WAL", func(t *testing.T) {
		p := startTerm(t, sk, 3, 1)
		p.send(p.appendReq(tlStart, make([]byte, 64), 0)) // zeros: no page header magic
		p.recvErr("08P01")
	})
	t.Run("startup options name another timeline", func(t *testing.T) {
		p := dial(t, sk, 4)
		p.info.TimelineID = proto.ID{0xbb, 5}
		p.send(&p.info)
		p.recvErr("08P01")
	})
	t.Run("incompatible server info", func(t *testing.T) {
		p := dial(t, sk, 1)
		p.greet()
		q := dial(t, sk, 1)
		q.info.SystemID++
		q.send(&q.info)
		q.recvErr("22023")
	})
	t.Run("a PostgreSQL other than 15", func(t *testing.T) {
		p := dial(t, sk, 6)
		p.info.PgVersion = 140010
		p.send(&p.info)
		p.recvErr("22023")
	})
	t.Run("garbage bytes on the socket", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 0; i < 20; i++ {
			nc, err := net.Dial("tcp", sk.Addr)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 1+rng.IntN(200))
			for j := range buf {
				buf[j] = byte(rng.UintN(256))
			}
			nc.Write(buf)
			nc.SetReadDeadline(time.Now().Add(15 * time.Second))
			io.Copy(io.Discard, nc) // the server answers or closes; never hangs
			nc.Close()
		}
	})
	// The server is still up and serving.
	p := startTerm(t, sk, 9, 1)
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	_, end := gen.Record(10)
	p.send(p.appendReq(tlStart, gen.Take(), 0))
	if r := p.resp(); r.FlushLSN != end {
		t.Fatalf("after bad input: %+v", r)
	}
}

func TestSSLRequestAnsweredN(t *testing.T) {
	sk := harness.StartSafekeeper(t, 1)
	host, port, _ := net.SplitHostPort(sk.Addr)
	ctx := harness.Context(t, 10*time.Second)
	// sslmode=prefer sends SSLRequest first and must fall back to plain.
	pg, err := pgconn.Connect(ctx, "host="+host+" port="+port+" user=x sslmode=prefer")
	if err != nil {
		t.Fatalf("sslmode=prefer: %v", err)
	}
	defer pg.Close(ctx)
	if v := pg.ParameterStatus("server_version"); v == "" || v[:3] != "15." {
		t.Fatalf("server_version %q", v)
	}
}

// TestKillNineLosesNothingAcknowledged streams pipelined requests, kills the
// safekeeper with SIGKILL at a random moment, restarts it and checks that
// flush_lsn covers everything that was acknowledged. Repeated with seeds.
func TestKillNineLosesNothingAcknowledged(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	sk := harness.StartSafekeeper(t, 1)
	var acked proto.LSN
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	startOf := map[proto.LSN]proto.LSN{} // record end -> record start, for xl_prev
	for round := 0; round < 4; round++ {
		p := dial(t, sk, 1)
		g := p.greet()
		if g.FlushLSN < acked {
			t.Fatalf("round %d: flush_lsn %v after SIGKILL, but %v was acknowledged", round, g.FlushLSN, acked)
		}
		term := uint64(round + 1)
		fresh := p.vote(node(term, 1))
		start := tlStart
		h := hist(term, uint64(tlStart))
		if fresh.TimelineStartLSN != 0 {
			start = fresh.FlushLSN
			h = append(fresh.History.Clone(), proto.TermSwitch{Term: term, StartLSN: start})
		}
		p.elected(start, h)
		if start != gen.Pos() {
			// Continue the generated stream from the safekeeper's end.
			gen = xlogtest.NewGenerator(start, segSize, 1, sysID)
			gen.SetPrev(startOf[start])
		}
		// Reader: collect acknowledgements.
		ackCh := make(chan proto.LSN, 1024)
		go func() {
			defer close(ackCh)
			for {
				m, err := p.c.Recv(context.Background())
				if err != nil {
					return
				}
				if r, ok := m.(*proto.SafeKeeperResponse); ok {
					ackCh <- r.FlushLSN
				}
			}
		}()
		killAfter := 50 + rng.IntN(400)
		begin := start
		for i := 0; ; i++ {
			if i == killAfter {
				sk.Kill()
				break
			}
			s, e := gen.Record(rng.IntN(3 * 8192))
			startOf[e] = s
			wal := gen.Take()
			for len(wal) > 0 {
				n := min(len(wal), proto.MaxWALPerRequest)
				if err := p.c.Send(p.appendReq(begin, wal[:n], 0)); err != nil {
					break
				}
				begin += proto.LSN(n)
				wal = wal[n:]
			}
		drain:
			for {
				select {
				case a, ok := <-ackCh:
					if !ok {
						break drain
					}
					acked = max(acked, a)
				default:
					break drain
				}
			}
		}
		for a := range ackCh {
			acked = max(acked, a)
		}
		p.c.Close()
		sk.Start()
		// The generator may be ahead of what survived; the next round
		// restarts it from the safekeeper's flush_lsn.
		gen = xlogtest.NewGenerator(0, segSize, 1, sysID)
	}
	p := dial(t, sk, 1)
	if g := p.greet(); g.FlushLSN < acked {
		t.Fatalf("final flush_lsn %v below acknowledged %v", g.FlushLSN, acked)
	}
	if acked <= tlStart {
		t.Fatal("nothing was acknowledged: the test did not test anything")
	}
}

func TestManyTimelinesAtOnce(t *testing.T) {
	sk := harness.StartSafekeeper(t, 1)
	const timelines, records = 20, 200
	errs := make(chan error, timelines)
	for i := 0; i < timelines; i++ {
		p := startTerm(t, sk, byte(10+i), 1)
		go func() {
			errs <- func() error {
				gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
				var ends []proto.LSN
				begin := tlStart
				for r := 0; r < records; r++ {
					_, end := gen.Record(100 + r*37%5000)
					ends = append(ends, end)
					wal := gen.Take()
					if err := p.c.Send(p.appendReq(begin, wal, 0)); err != nil {
						return err
					}
					begin += proto.LSN(len(wal))
				}
				// One response per request, in order, flush never behind
				// the request's own WAL... once durable it covers it.
				for r := 0; r < records; r++ {
					m, err := p.c.Recv(p.ctx)
					if err != nil {
						return err
					}
					resp, ok := m.(*proto.SafeKeeperResponse)
					if !ok || resp.FlushLSN < ends[r] {
						return errors.New("response does not cover its request")
					}
				}
				return nil
			}()
		}()
	}
	for i := 0; i < timelines; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func TestSIGTERMFlushesAnswersAndExitsZero(t *testing.T) {
	sk := harness.StartSafekeeper(t, 1)
	p := startTerm(t, sk, 1, 1)
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	begin := tlStart
	const n = 50
	for i := 0; i < n; i++ {
		gen.Record(1000)
		wal := gen.Take()
		p.send(p.appendReq(begin, wal, 0))
		begin += proto.LSN(len(wal))
	}
	// Every request sent before SIGTERM that the server read is answered;
	// then the stream ends with 57P01. Wait for the first answer so the
	// server has read at least part of the stream.
	first := p.resp()
	if err := sk.Stop(30 * time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v (want 0)", err)
	}
	last := first.FlushLSN
	got := 1
	for {
		m, err := p.c.Recv(p.ctx)
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code != "57P01" {
				t.Fatalf("stream ended with %v, want 57P01", err)
			}
			break
		}
		if r, ok := m.(*proto.SafeKeeperResponse); ok {
			last = r.FlushLSN
			got++
		}
	}
	sk.Start()
	q := dial(t, sk, 1)
	if g := q.greet(); g.FlushLSN < last {
		t.Fatalf("after SIGTERM and restart flush %v < acknowledged %v", g.FlushLSN, last)
	}
	t.Logf("%d of %d requests answered before shutdown", got, n)
}
