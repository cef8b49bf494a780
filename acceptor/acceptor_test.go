package acceptor

import (
	"bytes"
	"errors"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
)

const segSize = 1 << 20

// tlStart is where the test timelines' WAL starts: a segment boundary.
const tlStart = proto.LSN(0x1000000)

var testInfo = proto.ServerInfo{
	ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: 7, PgTimeline: 1, WalSegSize: segSize,
	TenantID: proto.ID{1}, TimelineID: proto.ID{2},
}

// hist builds a term history from (term, start_lsn) pairs.
func hist(pairs ...any) proto.TermHistory {
	var h proto.TermHistory
	for i := 0; i < len(pairs); i += 2 {
		h = append(h, proto.TermSwitch{Term: toU64(pairs[i]), StartLSN: proto.LSN(toU64(pairs[i+1]))})
	}
	return h
}

func toU64(v any) uint64 {
	switch x := v.(type) {
	case int:
		return uint64(x)
	case proto.LSN:
		return uint64(x)
	case uint64:
		return x
	}
	panic(v)
}

func ballot(term uint64, b byte) proto.Ballot { return proto.Ballot{Term: term, UUID: proto.ID{b}} }

type fixture struct {
	t     *testing.T
	store *MemStorage
	a     *Acceptor
	gen   *xlogtest.Generator
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	st := NewState(&testInfo)
	f := &fixture{t: t, store: NewMemStorage(st)}
	f.reboot()
	f.gen = xlogtest.NewGenerator(tlStart, segSize, 1, 7)
	return f
}

// reboot drops everything staged and rebuilds the acceptor from what is
// durable, as a restart after kill -9 would.
func (f *fixture) reboot() {
	f.t.Helper()
	f.store.Crash()
	st, _, _ := f.store.Durable()
	a, err := New(Config{NodeID: 9}, st, f.store)
	if err != nil {
		f.t.Fatalf("New: %v", err)
	}
	f.a = a
}

func (f *fixture) vote(b proto.Ballot) *proto.SafeKeeperInfo {
	f.t.Helper()
	v, info, err := f.a.RequestVote(&proto.RequestVote{Candidate: b})
	if err != nil || v.VotedFor != b {
		f.t.Fatalf("vote for %v: %v %v", b, v, err)
	}
	return info
}

// elect votes for b and sends ProposerElected with history h, starting where
// the acceptor computes (the proposer's rule 3 from the fresh info).
func (f *fixture) elect(b proto.Ballot, h proto.TermHistory) proto.LSN {
	f.t.Helper()
	info := f.vote(b)
	start := h[0].StartLSN
	if info.TimelineStartLSN != 0 {
		start = info.History.CommonPoint(info.FlushLSN, h)
	}
	if err := f.a.ProposerElected(b, &proto.ProposerElected{Term: b.Term, StartStreamingAt: start, TimelineStartLSN: h[0].StartLSN, History: h}); err != nil {
		f.t.Fatalf("ProposerElected: %v", err)
	}
	return start
}

// appendWAL stages wal from the write position and flushes it.
func (f *fixture) appendWAL(b proto.Ballot, wal []byte, commit proto.LSN) *proto.SafeKeeperResponse {
	f.t.Helper()
	begin := f.a.WriteLSN()
	if err := f.a.Append(&proto.SafeKeeperRequest{Sender: b, BeginLSN: begin, EndLSN: begin + proto.LSN(len(wal)), CommitLSN: commit, WAL: wal}); err != nil {
		f.t.Fatalf("Append: %v", err)
	}
	resp, n, err := f.a.Flush()
	if err != nil || n != 1 {
		f.t.Fatalf("Flush: n=%d %v", n, err)
	}
	return resp
}

func TestRule1_ServerInfoMustMatchTimeline(t *testing.T) {
	f := newFixture(t)
	info, err := f.a.ServerInfo(&testInfo)
	if err != nil || info.SafekeeperID != 9 || info.VotedFor.Term != 0 || info.TimelineStartLSN != 0 {
		t.Fatalf("greeting: %+v %v", info, err)
	}
	for name, mut := range map[string]func(*proto.ServerInfo){
		"system_id":    func(m *proto.ServerInfo) { m.SystemID++ },
		"pg major":     func(m *proto.ServerInfo) { m.PgVersion = 160001 },
		"wal_seg_size": func(m *proto.ServerInfo) { m.WalSegSize = 16 << 20 },
		"timeline_id":  func(m *proto.ServerInfo) { m.TimelineID = proto.ID{3} },
	} {
		m := testInfo
		mut(&m)
		if _, err := f.a.ServerInfo(&m); !errors.Is(err, ErrIncompatible) {
			t.Errorf("%s: err %v, want ErrIncompatible", name, err)
		}
	}
	m := testInfo
	m.PgVersion = 150002 // minor upgrade is fine
	if _, err := f.a.ServerInfo(&m); err != nil {
		t.Errorf("minor version change refused: %v", err)
	}
}

func TestRule2_VoteStrictTermSameNodeRegranted(t *testing.T) {
	f := newFixture(t)
	f.vote(ballot(5, 1))
	if st, _, _ := f.store.Durable(); st.VotedFor != ballot(5, 1) {
		t.Fatalf("vote not durable when RequestVote returned: %v", st.VotedFor)
	}
	f.vote(ballot(5, 1)) // the same proposer reconnecting
	for _, b := range []proto.Ballot{ballot(5, 2), ballot(5, 0), ballot(4, 9)} {
		v, info, err := f.a.RequestVote(&proto.RequestVote{Candidate: b})
		if !errors.Is(err, ErrVoteRefused) || info != nil || v.VotedFor != ballot(5, 1) {
			t.Errorf("vote for %v: verdict %v info %v err %v; want refusal showing 5/01", b, v, info, err)
		}
	}
	info := f.vote(ballot(6, 0))
	if info.VotedFor != ballot(6, 0) {
		t.Fatalf("fresh state after grant has voted_for %v", info.VotedFor)
	}
}

func TestRule2_VoteMakesReceivedWALDurableFirst(t *testing.T) {
	f := newFixture(t)
	b := ballot(1, 1)
	f.elect(b, hist(1, tlStart))
	f.gen.Record(100)
	_, end := f.gen.Record(200)
	wal := f.gen.Take()
	if err := f.a.Append(&proto.SafeKeeperRequest{Sender: b, BeginLSN: tlStart, EndLSN: tlStart + proto.LSN(len(wal)), WAL: wal}); err != nil {
		t.Fatal(err)
	}
	info := f.vote(ballot(2, 2))
	if info.FlushLSN != end {
		t.Fatalf("vote reported flush_lsn %v, want %v (staged WAL made durable first)", info.FlushLSN, end)
	}
	if st, _, w := f.store.Durable(); st.FlushLSN != end || !bytes.Equal(w, wal) {
		t.Fatalf("durable flush %v, %d bytes", st.FlushLSN, len(w))
	}
}

func TestRule4_ProposerElectedTruncatesAtCommonPoint(t *testing.T) {
	f := newFixture(t)
	b1 := ballot(1, 1)
	f.elect(b1, hist(1, tlStart))
	_, end1 := f.gen.Record(100)
	f.appendWAL(b1, f.gen.Take(), 0)
	f.gen.Record(300)
	f.appendWAL(b1, f.gen.Take(), 0) // the donor never got this one
	// A new proposer whose donor ended at end1: this safekeeper must cut
	// its WAL there.
	b2 := ballot(2, 2)
	f.vote(b2)
	h := hist(1, tlStart, 2, end1)
	pe := &proto.ProposerElected{Term: 2, StartStreamingAt: end1, TimelineStartLSN: tlStart, History: h}
	if err := f.a.ProposerElected(b2, pe); err != nil {
		t.Fatal(err)
	}
	st, start, wal := f.store.Durable()
	if start+proto.LSN(len(wal)) != end1 || st.FlushLSN != end1 || !st.History.Equal(h) {
		t.Fatalf("after truncation: WAL ends %v flush %v history %v; want end %v", start+proto.LSN(len(wal)), st.FlushLSN, st.History, end1)
	}
	if f.a.WriteLSN() != end1 {
		t.Fatalf("write position %v", f.a.WriteLSN())
	}
}

func TestRule4_ProposerElectedRefusesMismatchedStart(t *testing.T) {
	f := newFixture(t)
	b1 := ballot(1, 1)
	f.elect(b1, hist(1, tlStart))
	_, end := f.gen.Record(100)
	f.appendWAL(b1, f.gen.Take(), 0)
	before, _, walBefore := f.store.Durable()
	// A duplicated or late ProposerElected of the same term must not cut
	// the WAL back to its old start.
	err := f.a.ProposerElected(b1, &proto.ProposerElected{Term: 1, StartStreamingAt: tlStart, TimelineStartLSN: tlStart, History: hist(1, tlStart)})
	if !errors.Is(err, ErrCommonPointMismatch) {
		t.Fatalf("err %v, want ErrCommonPointMismatch", err)
	}
	after, _, walAfter := f.store.Durable()
	if after.FlushLSN != end || after.FlushLSN != before.FlushLSN || !bytes.Equal(walBefore, walAfter) {
		t.Fatal("refused ProposerElected changed durable WAL")
	}
}

// TestRule4_LateProposerElectedWithoutTheCheck shows what the common-point
// check of rule 4 prevents, with it planted away (hooks.go): the same late
// ProposerElected truncates WAL the acceptor acknowledged.
func TestRule4_LateProposerElectedWithoutTheCheck(t *testing.T) {
	f := newFixture(t)
	a, err := newAcceptor(Config{NodeID: 9}, f.a.State(), f.store, hooks{skipCommonPointCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	f.a = a
	b1 := ballot(1, 1)
	f.elect(b1, hist(1, tlStart))
	f.gen.Record(100)
	if resp := f.appendWAL(b1, f.gen.Take(), 0); resp.FlushLSN <= tlStart {
		t.Fatalf("acknowledged flush_lsn %s", resp.FlushLSN)
	}
	if err := f.a.ProposerElected(b1, &proto.ProposerElected{Term: 1, StartStreamingAt: tlStart, TimelineStartLSN: tlStart, History: hist(1, tlStart)}); err != nil {
		t.Fatalf("planted: %v", err)
	}
	if st, _, _ := f.store.Durable(); st.FlushLSN != tlStart {
		t.Fatalf("planted: durable flush_lsn %s, want the acknowledged WAL truncated to %s", st.FlushLSN, tlStart)
	}
}

func TestRule4_ProposerElectedRefusesTruncationBelowCommit(t *testing.T) {
	f := newFixture(t)
	b1 := ballot(1, 1)
	f.elect(b1, hist(1, tlStart))
	_, end1 := f.gen.Record(100)
	_, end2 := f.gen.Record(100)
	f.appendWAL(b1, f.gen.Take(), end2)
	if st := f.a.State(); st.CommitLSN != end2 {
		t.Fatalf("commit %v", st.CommitLSN)
	}
	b2 := ballot(2, 2)
	f.vote(b2)
	// A (buggy or hostile) proposer claiming the divergence at end1, below commit.
	h := hist(1, tlStart, 2, end1)
	err := f.a.ProposerElected(b2, &proto.ProposerElected{Term: 2, StartStreamingAt: end1, TimelineStartLSN: tlStart, History: h})
	if !errors.Is(err, ErrTruncateCommitted) {
		t.Fatalf("err %v, want ErrTruncateCommitted", err)
	}
	if st, _, _ := f.store.Durable(); st.FlushLSN != end2 {
		t.Fatalf("flush %v after refusal", st.FlushLSN)
	}
}

func TestRule4_ProposerElectedNeedsTheVote(t *testing.T) {
	f := newFixture(t)
	f.vote(ballot(3, 1))
	pe := func(term uint64) *proto.ProposerElected {
		return &proto.ProposerElected{Term: term, StartStreamingAt: tlStart, TimelineStartLSN: tlStart, History: hist(term, tlStart)}
	}
	if err := f.a.ProposerElected(ballot(2, 1), pe(2)); !errors.Is(err, ErrStaleTerm) {
		t.Errorf("lower term: %v", err)
	}
	if err := f.a.ProposerElected(ballot(4, 1), pe(4)); !errors.Is(err, ErrProtocol) {
		t.Errorf("term never voted for: %v", err)
	}
	if err := f.a.ProposerElected(ballot(3, 2), pe(3)); !errors.Is(err, ErrProtocol) {
		t.Errorf("term owned by another uuid: %v", err)
	}
}

func TestRule5_ContiguousAppendsOnly(t *testing.T) {
	f := newFixture(t)
	b := ballot(1, 1)
	f.elect(b, hist(1, tlStart))
	f.gen.Record(64)
	wal := f.gen.Take()
	end := tlStart + proto.LSN(len(wal))
	for name, begin := range map[string]proto.LSN{"gap": tlStart + 8, "rewrite before": tlStart - 8} {
		err := f.a.Append(&proto.SafeKeeperRequest{Sender: b, BeginLSN: begin, EndLSN: begin + proto.LSN(len(wal)), WAL: wal})
		if !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v", name, err)
		}
	}
	f.appendWAL(b, wal, 0)
	if err := f.a.Append(&proto.SafeKeeperRequest{Sender: b, BeginLSN: tlStart, EndLSN: end, WAL: wal}); !errors.Is(err, ErrProtocol) {
		t.Errorf("rewrite of acknowledged WAL: %v", err)
	}
	// A heartbeat's begin_lsn is not checked.
	if err := f.a.Append(&proto.SafeKeeperRequest{Sender: b, BeginLSN: 5, EndLSN: 5, CommitLSN: end}); err != nil {
		t.Errorf("heartbeat: %v", err)
	}
	if _, n, _ := f.a.Flush(); n != 1 || f.a.InMem().CommitLSN != end {
		t.Errorf("heartbeat answered %d times, commit_lsn in memory %s; want 1, %s", n, f.a.InMem().CommitLSN, end)
	}
}

// Rule 5 with lazy persistence: a commit_lsn or truncate_lsn that comes
// without WAL is kept in memory, not committed; what is reported to a
// proposer stays the durable value (so it never decreases, also across
// restarts); Persist, the next WAL commit, a vote and an election store it;
// a crash before that brings back the durable value, at or below flush_lsn.
func TestRule5_CommitWithoutWALPersistedLazily(t *testing.T) {
	f := newFixture(t)
	b := ballot(1, 1)
	f.elect(b, hist(1, tlStart))
	f.gen.Record(100)
	f.gen.Record(100)
	wal := f.gen.Take()
	end := tlStart + proto.LSN(len(wal))
	f.appendWAL(b, wal, 0)
	heartbeat := func(commit, trunc proto.LSN) *proto.SafeKeeperResponse {
		t.Helper()
		if err := f.a.Append(&proto.SafeKeeperRequest{Sender: b, BeginLSN: end, EndLSN: end, CommitLSN: commit, TruncateLSN: trunc}); err != nil {
			t.Fatal(err)
		}
		resp, n, err := f.a.Flush()
		if err != nil || n != 1 {
			t.Fatalf("Flush: n=%d %v", n, err)
		}
		return resp
	}

	commits := f.store.Commits()
	resp := heartbeat(end, end-10)
	if got := f.store.Commits(); got != commits {
		t.Fatalf("a heartbeat carrying only commit_lsn made %d commits, want none", got-commits)
	}
	if resp.CommitLSN != 0 || f.a.Info().CommitLSN != 0 {
		t.Fatalf("reported commit_lsn %s / %s before it is durable, want the durable 0/0", resp.CommitLSN, f.a.Info().CommitLSN)
	}
	if in := f.a.InMem(); in.CommitLSN != end || in.TruncateLSN != end-10 || !f.a.Unpersisted() {
		t.Fatalf("in memory: commit %s truncate %s unpersisted %v; want %s, %s, true", in.CommitLSN, in.TruncateLSN, f.a.Unpersisted(), end, end-10)
	}
	// A proposer's commit_lsn above flush_lsn is capped there, in memory too.
	heartbeat(end+1000, 0)
	if in := f.a.InMem(); in.CommitLSN != end {
		t.Fatalf("commit_lsn in memory %s above flush_lsn %s", in.CommitLSN, end)
	}

	// A crash loses it: the durable commit_lsn comes back.
	f.reboot()
	if st := f.a.InMem(); st.CommitLSN != 0 || f.a.Unpersisted() {
		t.Fatalf("after a crash: commit_lsn %s, unpersisted %v; want the durable 0/0", st.CommitLSN, f.a.Unpersisted())
	}

	// Persist stores it; then it is reported.
	f.elect(ballot(2, 1), hist(1, tlStart, 2, end))
	b = ballot(2, 1)
	heartbeat(end, 0)
	if err := f.a.Persist(); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := f.store.Durable(); st.CommitLSN != end || f.a.Unpersisted() {
		t.Fatalf("after Persist the disk has commit_lsn %s, want %s", st.CommitLSN, end)
	}
	if resp := heartbeat(end, 0); resp.CommitLSN != end {
		t.Fatalf("response after Persist reports commit_lsn %s, want %s", resp.CommitLSN, end)
	}

	// A vote and an election carry it with them.
	f.gen.Record(100)
	wal = f.gen.Take()
	f.appendWAL(b, wal, 0)
	end2 := end + proto.LSN(len(wal))
	heartbeat(end2, 0)
	f.vote(ballot(3, 1))
	if st, _, _ := f.store.Durable(); st.CommitLSN != end2 {
		t.Fatalf("a vote did not persist commit_lsn %s (disk: %s)", end2, st.CommitLSN)
	}
	// And the next WAL commit carries a commit_lsn learned before it.
	f.elect(ballot(4, 1), hist(1, tlStart, 2, end, 4, end2))
	b = ballot(4, 1)
	f.gen.Record(100)
	wal = f.gen.Take()
	end3 := end2 + proto.LSN(len(wal))
	f.appendWAL(b, wal, 0)
	heartbeat(end3, 0)
	f.gen.Record(100)
	f.appendWAL(b, f.gen.Take(), 0)
	if st, _, _ := f.store.Durable(); st.CommitLSN != end3 {
		t.Fatalf("the WAL commit did not persist commit_lsn %s (disk: %s)", end3, st.CommitLSN)
	}
}

func TestRule5_AppendBeforeElectedIsAViolation(t *testing.T) {
	f := newFixture(t)
	b := ballot(1, 1)
	f.vote(b)
	err := f.a.Append(&proto.SafeKeeperRequest{Sender: b, BeginLSN: tlStart, EndLSN: tlStart})
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("err %v", err)
	}
}

func TestRule5_CommitLSNRule(t *testing.T) {
	f := newFixture(t)
	b := ballot(1, 1)
	f.elect(b, hist(1, tlStart))
	_, end1 := f.gen.Record(100)
	// commit above flush is capped at flush
	resp := f.appendWAL(b, f.gen.Take(), end1+1000)
	if resp.CommitLSN != end1 || resp.FlushLSN != end1 {
		t.Fatalf("resp %+v, want commit = flush = %v", resp, end1)
	}
	// a lower commit from the proposer never lowers it
	_, end2 := f.gen.Record(100)
	resp = f.appendWAL(b, f.gen.Take(), tlStart)
	if resp.CommitLSN != end2 {
		t.Fatalf("commit %v, want %v (earlier proposer commit, capped at the new flush)", resp.CommitLSN, end2)
	}
	if st, _, _ := f.store.Durable(); st.CommitLSN != end2 {
		t.Fatalf("commit_lsn not durable with the WAL: %v", st.CommitLSN)
	}
}

func TestRule5_DeposedSenderGetsHigherTerm(t *testing.T) {
	f := newFixture(t)
	old := ballot(1, 1)
	f.elect(old, hist(1, tlStart))
	_, end := f.gen.Record(100)
	f.appendWAL(old, f.gen.Take(), 0)
	f.vote(ballot(2, 2))
	f.gen.Record(100)
	wal := f.gen.Take()
	if err := f.a.Append(&proto.SafeKeeperRequest{Sender: old, BeginLSN: end, EndLSN: end + proto.LSN(len(wal)), WAL: wal}); err != nil {
		t.Fatal(err)
	}
	resp, n, err := f.a.Flush()
	if err != nil || n != 1 || resp.Term != 2 || resp.FlushLSN != end {
		t.Fatalf("deposed response %+v n=%d err=%v", resp, n, err)
	}
	if _, start, w := f.store.Durable(); start+proto.LSN(len(w)) != end {
		t.Fatal("deposed sender's WAL was written")
	}
}

func TestRule5_SameTermOtherUUIDIsAViolation(t *testing.T) {
	f := newFixture(t)
	f.elect(ballot(1, 1), hist(1, tlStart))
	err := f.a.Append(&proto.SafeKeeperRequest{Sender: ballot(1, 2), BeginLSN: tlStart, EndLSN: tlStart})
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("err %v", err)
	}
}

func TestRule6_FlushLSNIsRecordAligned(t *testing.T) {
	f := newFixture(t)
	b := ballot(1, 1)
	f.elect(b, hist(1, tlStart))
	_, end1 := f.gen.Record(50)
	_, end2 := f.gen.Record(20000) // spans pages
	wal := f.gen.Take()
	cut := int(end1-tlStart) + 100 // inside the second record
	resp := f.appendWAL(b, wal[:cut], 0)
	if resp.FlushLSN != end1 {
		t.Fatalf("flush %v with a partial record, want %v", resp.FlushLSN, end1)
	}
	resp = f.appendWAL(b, wal[cut:], 0)
	if resp.FlushLSN != end2 {
		t.Fatalf("flush %v, want %v", resp.FlushLSN, end2)
	}
}

func TestRule6_OneResponsePerRequest(t *testing.T) {
	f := newFixture(t)
	b := ballot(1, 1)
	f.elect(b, hist(1, tlStart))
	for i := 0; i < 5; i++ {
		f.gen.Record(40 + i)
		wal := f.gen.Take()
		begin := f.a.WriteLSN()
		if err := f.a.Append(&proto.SafeKeeperRequest{Sender: b, BeginLSN: begin, EndLSN: begin + proto.LSN(len(wal)), WAL: wal}); err != nil {
			t.Fatal(err)
		}
	}
	commits := f.store.Commits()
	resp, n, err := f.a.Flush()
	if err != nil || n != 5 || resp.FlushLSN != f.gen.Pos() {
		t.Fatalf("n=%d flush=%v err=%v", n, resp.FlushLSN, err)
	}
	if f.store.Commits() != commits+1 {
		t.Fatalf("group commit took %d commits, want 1", f.store.Commits()-commits)
	}
}

func TestRule8_ViolationChangesNothingDurable(t *testing.T) {
	f := newFixture(t)
	b := ballot(1, 1)
	f.elect(b, hist(1, tlStart))
	f.gen.Record(100)
	f.appendWAL(b, f.gen.Take(), 0)
	before, _, wal := f.store.Durable()
	zeros := make([]byte, 64) // xl_tot_len 0 where a record must start
	begin := f.a.WriteLSN()
	if err := f.a.Append(&proto.SafeKeeperRequest{Sender: b, BeginLSN: begin, EndLSN: begin + 64, WAL: zeros}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("invalid WAL: err %v, want ErrProtocol", err)
	}
	if _, _, err := f.a.Flush(); err != nil {
		t.Fatalf("acceptor unusable after a refused request: %v", err)
	}
	f.reboot()
	after, _, wal2 := f.store.Durable()
	if after.FlushLSN != before.FlushLSN || !bytes.Equal(wal, wal2) {
		t.Fatal("durable WAL changed")
	}
}

func TestStorageFailureIsSticky(t *testing.T) {
	f := newFixture(t)
	b := ballot(1, 1)
	f.elect(b, hist(1, tlStart))
	f.gen.Record(100)
	wal := f.gen.Take()
	if err := f.a.Append(&proto.SafeKeeperRequest{Sender: b, BeginLSN: tlStart, EndLSN: tlStart + proto.LSN(len(wal)), WAL: wal}); err != nil {
		t.Fatal(err)
	}
	f.store.FailCommit = errors.New("disk full")
	if _, _, err := f.a.Flush(); !errors.Is(err, ErrStorage) {
		t.Fatalf("err %v", err)
	}
	if _, _, err := f.a.RequestVote(&proto.RequestVote{Candidate: ballot(2, 1)}); !errors.Is(err, ErrStorage) {
		t.Fatalf("after failure: %v", err)
	}
	if st, _, _ := f.store.Durable(); st.FlushLSN != tlStart {
		t.Fatal("failed commit acknowledged")
	}
}

func TestLastLogTermAndHistoryCutAtFlush(t *testing.T) {
	f := newFixture(t)
	b1 := ballot(1, 1)
	f.elect(b1, hist(1, tlStart))
	_, end := f.gen.Record(100)
	f.appendWAL(b1, f.gen.Take(), 0)
	info := f.vote(ballot(4, 2))
	if info.LastLogTerm != 1 || len(info.History) != 1 {
		t.Fatalf("info %+v", info)
	}
	// Adopt a history whose last term starts above this safekeeper's WAL:
	// it is cut from reports until WAL reaches it.
	h := hist(1, tlStart, 4, end)
	if err := f.a.ProposerElected(ballot(4, 2), &proto.ProposerElected{Term: 4, StartStreamingAt: end, TimelineStartLSN: tlStart, History: h}); err != nil {
		t.Fatal(err)
	}
	info = f.a.Info()
	if info.LastLogTerm != 4 || !info.History.Equal(h) {
		t.Fatalf("after election at own flush: %+v", info)
	}
}

func TestRebootKeepsVoteAndTruncation(t *testing.T) {
	f := newFixture(t)
	b1 := ballot(1, 1)
	f.elect(b1, hist(1, tlStart))
	_, end1 := f.gen.Record(100)
	f.appendWAL(b1, f.gen.Take(), 0)
	f.gen.Record(100)
	f.appendWAL(b1, f.gen.Take(), 0)
	b2 := ballot(2, 2)
	f.vote(b2)
	h := hist(1, tlStart, 2, end1)
	if err := f.a.ProposerElected(b2, &proto.ProposerElected{Term: 2, StartStreamingAt: end1, TimelineStartLSN: tlStart, History: h}); err != nil {
		t.Fatal(err)
	}
	f.reboot()
	// no double vote in term 2
	if _, _, err := f.a.RequestVote(&proto.RequestVote{Candidate: ballot(2, 3)}); !errors.Is(err, ErrVoteRefused) {
		t.Fatalf("after reboot a second proposer got term 2: %v", err)
	}
	// no forgotten truncation
	st, start, wal := f.store.Durable()
	if st.FlushLSN != end1 || start+proto.LSN(len(wal)) != end1 || !st.History.Equal(h) {
		t.Fatalf("after reboot: flush %v WAL end %v history %v", st.FlushLSN, start+proto.LSN(len(wal)), st.History)
	}
	if f.a.WriteLSN() != end1 {
		t.Fatalf("write position %v", f.a.WriteLSN())
	}
}

func TestRebootDiscardsWALPastFlush(t *testing.T) {
	f := newFixture(t)
	b := ballot(1, 1)
	f.elect(b, hist(1, tlStart))
	_, end1 := f.gen.Record(100)
	f.gen.Record(30000)
	wal := f.gen.Take()
	f.appendWAL(b, wal[:int(end1-tlStart)+500], 0) // durable, but a partial record past flush
	if _, start, w := f.store.Durable(); start+proto.LSN(len(w)) == end1 {
		t.Fatal("setup: partial record should be durable")
	}
	f.reboot()
	st, start, w := f.store.Durable()
	if st.FlushLSN != end1 || start+proto.LSN(len(w)) != end1 || f.a.WriteLSN() != end1 {
		t.Fatalf("after reboot: flush %v WAL end %v write %v, want all %v", st.FlushLSN, start+proto.LSN(len(w)), f.a.WriteLSN(), end1)
	}
	// The proposer resumes from flush_lsn after re-election.
	f.elect(ballot(1, 1), hist(1, tlStart))
	if f.a.WriteLSN() != end1 {
		t.Fatalf("resume at %v", f.a.WriteLSN())
	}
}

// TestRule4_EmptySafekeeperJoinsLate: a safekeeper that holds no WAL may be
// told to start at a later segment boundary (its peers removed what lies
// before): it holds the timeline from there, as if it had removed the
// rest, and takes WAL from that point. Not inside a segment, and not once
// it holds WAL.
func TestRule4_EmptySafekeeperJoinsLate(t *testing.T) {
	f := newFixture(t)
	b1 := ballot(1, 1)
	f.vote(b1)
	join := tlStart + 3*segSize
	inside := &proto.ProposerElected{Term: 1, StartStreamingAt: join + 8, TimelineStartLSN: tlStart, History: hist(1, tlStart)}
	if err := f.a.ProposerElected(b1, inside); !errors.Is(err, ErrCommonPointMismatch) {
		t.Fatalf("a late start inside a segment: %v, want ErrCommonPointMismatch", err)
	}
	if err := f.a.ProposerElected(b1, &proto.ProposerElected{Term: 1, StartStreamingAt: join, TimelineStartLSN: tlStart, History: hist(1, tlStart)}); err != nil {
		t.Fatalf("an empty safekeeper joining at %s: %v", join, err)
	}
	st, _, _ := f.store.Durable()
	if st.FlushLSN != join || st.RemovedUpTo != join || st.TimelineStartLSN != tlStart || f.a.WriteLSN() != join {
		t.Fatalf("after joining at %s: flush %s, removed_up_to %s, start %s, write %s", join, st.FlushLSN, st.RemovedUpTo, st.TimelineStartLSN, f.a.WriteLSN())
	}
	gen := xlogtest.NewGenerator(join, segSize, 1, 7)
	_, end := gen.Record(300)
	if r := f.appendWAL(b1, gen.Take(), 0); r.FlushLSN != end {
		t.Fatalf("flush %s after WAL from the join point, want %s", r.FlushLSN, end)
	}
	// Holding WAL now: a later start is refused as any mismatch.
	b2 := ballot(2, 2)
	f.vote(b2)
	err := f.a.ProposerElected(b2, &proto.ProposerElected{Term: 2, StartStreamingAt: join + segSize, TimelineStartLSN: tlStart, History: hist(1, tlStart, 2, join+segSize)})
	if !errors.Is(err, ErrCommonPointMismatch) {
		t.Fatalf("a safekeeper holding WAL told to start later: %v, want ErrCommonPointMismatch", err)
	}
}
