package acceptor

import (
	"errors"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
)

// sessionFixture drives one Session over a MemStorage behind a switch that
// makes every write fail, like a full disk.
type sessionFixture struct {
	t     *testing.T
	mem   *MemStorage
	disk  *switchStorage
	s     *Session
	gen   *xlogtest.Generator
	write proto.LSN // where the next request begins
}

// switchStorage fails every commit (and drops what was staged for it)
// while full is set.
type switchStorage struct {
	*MemStorage
	full    bool
	dropped bool
}

var errDiskFull = errors.New("test: no space left on device")

func (d *switchStorage) WriteWAL(lsn proto.LSN, data []byte) error {
	if d.full {
		d.dropped = true
		return nil
	}
	return d.MemStorage.WriteWAL(lsn, data)
}

func (d *switchStorage) TruncateWAL(lsn proto.LSN) error {
	if d.full {
		d.dropped = true
		return nil
	}
	return d.MemStorage.TruncateWAL(lsn)
}

func (d *switchStorage) Commit(st State) error {
	if d.full || d.dropped {
		d.dropped = false
		return errDiskFull
	}
	return d.MemStorage.Commit(st)
}

func newSessionFixture(t *testing.T) *sessionFixture {
	t.Helper()
	st := NewState(&testInfo)
	f := &sessionFixture{t: t, mem: NewMemStorage(st)}
	f.disk = &switchStorage{MemStorage: f.mem}
	s, err := NewSession(Config{NodeID: 9}, st, f.disk)
	if err != nil {
		t.Fatal(err)
	}
	f.s = s
	f.gen = xlogtest.NewGenerator(tlStart, segSize, 1, 7)
	f.write = tlStart
	return f
}

// want checks that r sends exactly the messages of types msgs (nil for an
// error) to the connections conns, in order.
func (f *sessionFixture) want(what string, r Ready, outs ...any) {
	f.t.Helper()
	if len(r.Out) != len(outs)/2 {
		f.t.Fatalf("%s: %d outputs %+v, want %d", what, len(r.Out), r.Out, len(outs)/2)
	}
	for i := range r.Out {
		c, kind := outs[2*i].(int), outs[2*i+1]
		o := r.Out[i]
		if o.Conn != ConnID(c) {
			f.t.Fatalf("%s: output %d to conn %d, want conn %d", what, i, o.Conn, c)
		}
		switch k := kind.(type) {
		case error:
			if !errors.Is(o.Err, k) {
				f.t.Fatalf("%s: output %d: %v / %v, want an error wrapping %v", what, i, o.Msg, o.Err, k)
			}
		case string:
			if o.Err != nil || describeMsg(o.Msg) != k {
				f.t.Fatalf("%s: output %d: %v / %v, want %s", what, i, o.Msg, o.Err, k)
			}
		}
	}
}

func describeMsg(m proto.Message) string {
	switch m.(type) {
	case *proto.SafeKeeperInfo:
		return "info"
	case *proto.VoteResponse:
		return "verdict"
	case *proto.SafeKeeperResponse:
		return "response"
	}
	return "?"
}

// open greets, votes and elects b (whose term starts the timeline) on
// connection c.
func (f *sessionFixture) open(c ConnID, b proto.Ballot) {
	f.t.Helper()
	si := testInfo
	f.want("greeting", f.s.Step(c, &si), int(c), "info")
	r := f.s.Step(c, &proto.RequestVote{Candidate: b})
	f.want("vote", r, int(c), "verdict", int(c), "info")
	info := r.Out[1].Msg.(*proto.SafeKeeperInfo)
	h := hist(b.Term, tlStart)
	start := tlStart
	if info.TimelineStartLSN != 0 {
		start = info.History.CommonPoint(info.FlushLSN, h)
	}
	f.want("elected", f.s.Step(c, &proto.ProposerElected{Term: b.Term, StartStreamingAt: start, TimelineStartLSN: tlStart, History: h}))
}

// request stages one request of n records on c.
func (f *sessionFixture) request(c ConnID, b proto.Ballot, n int) Ready {
	f.t.Helper()
	for range n {
		f.gen.Record(200)
	}
	wal := f.gen.Take()
	m := &proto.SafeKeeperRequest{Sender: b, BeginLSN: f.write, EndLSN: f.write + proto.LSN(len(wal)), CommitLSN: f.write, WAL: wal}
	f.write = m.EndLSN
	return f.s.Step(c, m)
}

// TestSessionGroupCommit: requests of several connections are only staged;
// Flush commits them in one step and answers each, in order, and only then
// hands out the new state (rule 6).
func TestSessionGroupCommit(t *testing.T) {
	f := newSessionFixture(t)
	b := ballot(1, 1)
	f.open(1, b)
	commits := f.mem.Commits()
	for i := range 3 {
		if r := f.request(1, b, 2); len(r.Out) != 0 || r.State != nil {
			t.Fatalf("request %d answered or published before the commit: %+v", i, r)
		}
	}
	if f.s.Pending() != 3 || f.mem.Commits() != commits {
		t.Fatalf("pending %d, commits %d → %d: staged requests must not commit", f.s.Pending(), commits, f.mem.Commits())
	}
	r := f.s.Flush()
	f.want("flush", r, 1, "response", 1, "response", 1, "response")
	if f.mem.Commits() != commits+1 || r.State == nil || r.State.FlushLSN != f.write {
		t.Fatalf("flush: %d commits (want one), state %+v", f.mem.Commits()-commits, r.State)
	}
	if st, _, _ := f.mem.Durable(); st.FlushLSN != r.Out[0].Msg.(*proto.SafeKeeperResponse).FlushLSN {
		t.Fatalf("response flush_lsn %s, durable %s", r.Out[0].Msg.(*proto.SafeKeeperResponse).FlushLSN, st.FlushLSN)
	}
	// Nothing staged: nothing committed, nothing handed out.
	if r := f.s.Flush(); len(r.Out) != 0 || r.State != nil || f.mem.Commits() != commits+1 {
		t.Fatalf("empty flush: %+v", r)
	}
}

// TestSessionOtherMessagesAnswerStagedFirst: a message that is not a request
// first commits and answers what is staged on every connection, so replies
// stay in order (here: a second proposer's greeting).
func TestSessionOtherMessagesAnswerStagedFirst(t *testing.T) {
	f := newSessionFixture(t)
	b := ballot(1, 1)
	f.open(1, b)
	f.request(1, b, 1)
	si := testInfo
	r := f.s.Step(2, &si)
	f.want("greeting with a request staged", r, 1, "response", 2, "info")
	if info := r.Out[1].Msg.(*proto.SafeKeeperInfo); info.FlushLSN != f.write {
		t.Fatalf("greeting reports flush_lsn %s, want the staged WAL's end %s", info.FlushLSN, f.write)
	}
}

// TestSessionMessageOrder: each connection must go ServerInfo, RequestVote,
// ProposerElected, then requests (rule 8); a message out of order ends that
// connection, after its staged requests are answered, and nothing more from
// it is processed.
func TestSessionMessageOrder(t *testing.T) {
	f := newSessionFixture(t)
	b := ballot(1, 1)
	if _, err := Greeting(&proto.RequestVote{Candidate: b}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("Greeting(RequestVote) = %v, want ErrProtocol", err)
	}
	f.want("request first", f.s.Step(7, &proto.SafeKeeperRequest{Sender: b}), 7, ErrProtocol)
	f.want("after the error", f.s.Step(7, &proto.SafeKeeperRequest{Sender: b}))

	f.open(1, b)
	f.request(1, b, 1)
	si := testInfo
	f.want("second greeting on a connection", f.s.Step(1, &si), 1, "response", 1, ErrProtocol)
	if r := f.request(1, b, 1); len(r.Out) != 0 || f.s.Pending() != 0 {
		t.Fatalf("a request after the error was staged: %+v, pending %d", r, f.s.Pending())
	}
}

// TestSessionEndFlushes: the end of a connection makes what it sent durable
// and answers it (rule 7).
func TestSessionEndFlushes(t *testing.T) {
	f := newSessionFixture(t)
	b := ballot(1, 1)
	f.open(1, b)
	f.request(1, b, 3)
	r := f.s.End(1)
	f.want("end", r, 1, "response")
	if st, _, _ := f.mem.Durable(); st.FlushLSN != f.write || r.State == nil {
		t.Fatalf("after End: durable flush_lsn %s, want %s; state handed out: %v", st.FlushLSN, f.write, r.State != nil)
	}
}

// TestSessionStorageFailureAndRebuild: a failed commit ends every waiting
// connection with the storage error and nothing of it is acknowledged;
// greetings are refused while the disk cannot write; the first greeting
// after it can rebuilds the acceptor from what is durable, which then
// accepts WAL where the durable WAL ends.
func TestSessionStorageFailureAndRebuild(t *testing.T) {
	f := newSessionFixture(t)
	b := ballot(1, 1)
	f.open(1, b)
	f.request(1, b, 1)
	f.s.Flush()
	durable := f.write
	f.open(2, b) // the same proposer on a second connection
	f.request(1, b, 1)
	f.request(2, b, 1)
	f.disk.full = true
	f.request(1, b, 1)
	r := f.s.Flush()
	f.want("failed commit", r, 1, ErrStorage, 2, ErrStorage)
	if f.s.Broken() == nil || r.State != nil || !errors.Is(r.Failed, errDiskFull) {
		t.Fatalf("after a failed commit: broken %v, state handed out %v, failed %v", f.s.Broken(), r.State, r.Failed)
	}
	si := testInfo
	if r := f.s.Step(3, &si); r.Failed != nil || r.Recovered {
		t.Fatalf("greeting while full: failure reported again (%v) or recovered (%v)", r.Failed, r.Recovered)
	} else {
		f.want("greeting while full", r, 3, ErrStorage)
	}

	f.disk.full = false
	r = f.s.Step(4, &si)
	f.want("greeting after the disk recovered", r, 4, "info")
	if f.s.Broken() != nil || !r.Recovered || r.State == nil || r.State.FlushLSN != durable {
		t.Fatalf("rebuilt: broken %v, recovered %v, state %+v, want flush_lsn %s", f.s.Broken(), r.Recovered, r.State, durable)
	}
	if info := r.Out[0].Msg.(*proto.SafeKeeperInfo); info.FlushLSN != durable {
		t.Fatalf("rebuilt greeting reports flush_lsn %s, want %s", info.FlushLSN, durable)
	}
	// The same proposer reconnects and goes on from the durable end.
	f.gen = xlogtest.NewGenerator(tlStart, segSize, 1, 7)
	f.gen.Record(200)
	f.gen.Take()
	f.write = durable
	f.s.Step(4, &proto.RequestVote{Candidate: b})
	f.s.Step(4, &proto.ProposerElected{Term: 1, StartStreamingAt: durable, TimelineStartLSN: tlStart, History: hist(1, tlStart)})
	f.request(4, b, 1)
	f.want("request after the rebuild", f.s.Flush(), 4, "response")
}

// TestSessionOpensBrokenWhenStorageCannotWrite: the session's first write
// (the cut above flush_lsn) fails, as on a full disk after a restart: the
// session starts broken, reports the durable state, refuses greetings, and
// recovers at the first greeting once the disk writes again.
func TestSessionOpensBrokenWhenStorageCannotWrite(t *testing.T) {
	st := NewState(&testInfo)
	disk := &switchStorage{MemStorage: NewMemStorage(st), full: true}
	s, err := NewSession(Config{NodeID: 9}, st, disk)
	if err != nil || !errors.Is(s.Broken(), ErrStorage) {
		t.Fatalf("NewSession on a full disk: %v, broken %v", err, s.Broken())
	}
	si := testInfo
	if r := s.Step(1, &si); len(r.Out) != 1 || !errors.Is(r.Out[0].Err, ErrStorage) {
		t.Fatalf("greeting while full: %+v", r)
	}
	disk.full = false
	if r := s.Step(2, &si); len(r.Out) != 1 || r.Out[0].Err != nil || s.Broken() != nil {
		t.Fatalf("greeting after the disk recovered: %+v, broken %v", r, s.Broken())
	}
}
