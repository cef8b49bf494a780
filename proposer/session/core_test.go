package session

import (
	"errors"
	"testing"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
)

const (
	segSize = 1 << 20
	tlStart = proto.LSN(0x1000000) // a segment boundary
)

var us = proto.ID{0xcc}

func hist(pairs ...uint64) proto.TermHistory {
	var h proto.TermHistory
	for i := 0; i < len(pairs); i += 2 {
		h = append(h, proto.TermSwitch{Term: pairs[i], StartLSN: proto.LSN(pairs[i+1])})
	}
	return h
}

// info builds a SafeKeeperInfo with the given last_log_term (taken from h),
// flush_lsn and commit_lsn.
func info(voted uint64, flush, commit proto.LSN, h proto.TermHistory) *proto.SafeKeeperInfo {
	i := &proto.SafeKeeperInfo{
		ProtocolVersion: proto.ProtocolVersion, VotedFor: proto.Ballot{Term: voted, UUID: proto.ID{0xdd}},
		FlushLSN: flush, CommitLSN: commit, History: h.Upto(flush),
	}
	i.LastLogTerm = i.History.LastTerm()
	if len(h) > 0 {
		i.TimelineStartLSN = h[0].StartLSN
	}
	return i
}

// grant returns the verdict and fresh info a safekeeper in state g sends
// when it grants b.
func grant(b proto.Ballot, g *proto.SafeKeeperInfo) (*proto.VoteResponse, *proto.SafeKeeperInfo) {
	f := *g
	f.VotedFor = b
	return &proto.VoteResponse{VotedFor: b}, &f
}

// elect greets every safekeeper with gs, campaigns, and collects grants from
// those listed in voters (fresh info = greeting unless fresh overrides).
func elect(t *testing.T, gs []*proto.SafeKeeperInfo, voters []int, fresh map[int]*proto.SafeKeeperInfo, upstream proto.LSN) (*Core, *Election) {
	t.Helper()
	c := NewCore(len(gs), us)
	for i, g := range gs {
		if g != nil {
			if err := c.Greeted(i, g); err != nil {
				t.Fatal(err)
			}
		}
	}
	b, err := c.Campaign()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range voters {
		g := gs[i]
		if f, ok := fresh[i]; ok {
			g = f
		}
		v, f := grant(b, g)
		if _, err := c.Voted(i, v, f); err != nil {
			t.Fatal(err)
		}
	}
	e, err := c.Elect(upstream, tlStart)
	if err != nil {
		t.Fatal(err)
	}
	return c, e
}

const noUpstream = proto.LSN(1<<64 - 1)

func TestQuorumIsMajority(t *testing.T) {
	for n, q := range map[int]int{1: 1, 2: 2, 3: 2, 4: 3, 5: 3} {
		if got := NewCore(n, us).Quorum(); got != q {
			t.Errorf("n=%d: quorum %d, want %d", n, got, q)
		}
	}
	c := NewCore(3, us)
	c.Greeted(0, info(0, 0, 0, nil))
	if _, err := c.Campaign(); !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("campaign with 1 of 3 greetings: %v, want ErrNoQuorum", err)
	}
	c.Greeted(1, info(0, 0, 0, nil))
	b, err := c.Campaign()
	if err != nil {
		t.Fatal(err)
	}
	v, f := grant(b, info(0, 0, 0, nil))
	if q, _ := c.Voted(0, v, f); q {
		t.Fatal("one grant of three is not a quorum")
	}
	if _, err := c.Elect(noUpstream, tlStart); !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("Elect with one grant: %v, want ErrNoQuorum", err)
	}
	if q, _ := c.Voted(1, v, f); !q {
		t.Fatal("two grants of three are a quorum")
	}
}

func TestTermAboveEveryVotedTermSeen(t *testing.T) {
	c := NewCore(3, us)
	c.Greeted(0, info(4, 0, 0, nil))
	c.Greeted(1, info(9, 0, 0, nil))
	c.Greeted(2, info(2, 0, 0, nil))
	b, err := c.Campaign()
	if err != nil {
		t.Fatal(err)
	}
	if b.Term != 10 || b.UUID != us {
		t.Fatalf("ballot %v, want term 10 owned by us", b)
	}
}

func TestRefusedVoteDuringCampaignRetriesAboveShownTerm(t *testing.T) {
	c := NewCore(3, us)
	for i := range 3 {
		c.Greeted(i, info(1, 0, 0, nil))
	}
	b, _ := c.Campaign()
	_, err := c.Voted(2, &proto.VoteResponse{VotedFor: proto.Ballot{Term: 7, UUID: proto.ID{9}}}, nil)
	if !errors.Is(err, ErrVoteRefused) || errors.Is(err, ErrDeposed) {
		t.Fatalf("refusal before election: %v, want ErrVoteRefused", err)
	}
	// A new campaign (new Core per session in the driver, or the same one
	// here) goes above the term shown.
	c2 := NewCore(3, us)
	c2.ObserveTerm(7)
	for i := range 3 {
		c2.Greeted(i, info(1, 0, 0, nil))
	}
	b2, _ := c2.Campaign()
	if b2.Term != 8 || b.Term != 2 {
		t.Fatalf("terms %d then %d, want 2 then 8", b.Term, b2.Term)
	}
}

func TestDonorByLastLogTermNotVotedTerm(t *testing.T) {
	// sk0 voted for a high term but its WAL is from term 2; sk1's WAL is from
	// term 3 and shorter. The donor is sk1: voted_for.term says nothing
	// about the WAL a safekeeper holds.
	h2 := hist(1, uint64(tlStart), 2, uint64(tlStart)+0x100)
	h3 := hist(1, uint64(tlStart), 3, uint64(tlStart)+0x80)
	gs := []*proto.SafeKeeperInfo{
		info(8, tlStart+0x5000, 0, h2),
		info(3, tlStart+0x1000, 0, h3),
		nil,
	}
	_, e := elect(t, gs, []int{0, 1}, nil, noUpstream)
	if e.Donor != 1 {
		t.Fatalf("donor #%d, want #1 (highest last_log_term)", e.Donor)
	}
	if e.Term != 9 {
		t.Fatalf("term %d, want 9", e.Term)
	}
}

func TestDonorTieBrokenByFlushLSN(t *testing.T) {
	h := hist(1, uint64(tlStart))
	gs := []*proto.SafeKeeperInfo{info(1, tlStart+0x100, 0, h), info(1, tlStart+0x300, 0, h), info(1, tlStart+0x200, 0, h)}
	_, e := elect(t, gs, []int{0, 1, 2}, nil, noUpstream)
	if e.Donor != 1 || e.TermStartLSN != tlStart+0x300 {
		t.Fatalf("donor #%d term start %s, want #1 at %s", e.Donor, e.TermStartLSN, tlStart+0x300)
	}
}

func TestDonorFromFreshInfoNotGreeting(t *testing.T) {
	// Between greeting and vote sk0 received more WAL (rule 2 makes it
	// durable before the vote): the fresh info counts.
	h := hist(1, uint64(tlStart))
	gs := []*proto.SafeKeeperInfo{info(1, tlStart+0x100, 0, h), info(1, tlStart+0x200, 0, h), nil}
	fresh := map[int]*proto.SafeKeeperInfo{0: info(1, tlStart+0x900, 0, h)}
	_, e := elect(t, gs, []int{0, 1}, fresh, noUpstream)
	if e.Donor != 0 || e.TermStartLSN != tlStart+0x900 {
		t.Fatalf("donor #%d at %s, want #0 at its fresh flush %s", e.Donor, e.TermStartLSN, tlStart+0x900)
	}
}

func TestTermStartIsDonorFlushAndHistoryExtendsDonor(t *testing.T) {
	h := hist(1, uint64(tlStart), 3, uint64(tlStart)+0x1000)
	gs := []*proto.SafeKeeperInfo{info(3, tlStart+0x2000, 0, h), info(3, tlStart+0x2000, 0, h), nil}
	_, e := elect(t, gs, []int{0, 1}, nil, noUpstream)
	want := hist(1, uint64(tlStart), 3, uint64(tlStart)+0x1000, 4, uint64(tlStart)+0x2000)
	if e.TermStartLSN != tlStart+0x2000 || !e.History.Equal(want) || e.TimelineStartLSN != tlStart || e.NewTimeline {
		t.Fatalf("election %+v, want term start %s and history %v", e, tlStart+0x2000, want)
	}
}

func TestNewTimelineStartsAtDriverSegment(t *testing.T) {
	gs := []*proto.SafeKeeperInfo{info(0, 0, 0, nil), info(0, 0, 0, nil), info(0, 0, 0, nil)}
	c, e := elect(t, gs, []int{0, 1, 2}, nil, noUpstream)
	if !e.NewTimeline || e.TimelineStartLSN != tlStart || e.TermStartLSN != tlStart || !e.History.Equal(hist(1, uint64(tlStart))) {
		t.Fatalf("election %+v", e)
	}
	pe, err := c.ProposerElected(0)
	if err != nil || pe.StartStreamingAt != tlStart || pe.TimelineStartLSN != tlStart {
		t.Fatalf("ProposerElected %+v, %v", pe, err)
	}
}

func TestStartStreamingAtIsCommonPoint(t *testing.T) {
	// sk0: donor, terms 1,3. sk1: term 1 only, shorter. sk2: a losing term 2
	// that diverged from term 1 at tlStart+0x800 — it must restart there.
	h13 := hist(1, uint64(tlStart), 3, uint64(tlStart)+0x1000)
	gs := []*proto.SafeKeeperInfo{
		info(3, tlStart+0x3000, 0, h13),
		info(1, tlStart+0x900, 0, hist(1, uint64(tlStart))),
		info(2, tlStart+0x2000, 0, hist(1, uint64(tlStart), 2, uint64(tlStart)+0x800)),
	}
	c, _ := elect(t, gs, []int{0, 1, 2}, nil, noUpstream)
	want := []proto.LSN{tlStart + 0x3000, tlStart + 0x900, tlStart + 0x800}
	for i, w := range want {
		pe, err := c.ProposerElected(i)
		if err != nil {
			t.Fatal(err)
		}
		if pe.StartStreamingAt != w {
			t.Errorf("sk%d: start_streaming_at %s, want %s", i, pe.StartStreamingAt, w)
		}
		// The acceptor's own computation must agree (rule 4 refuses otherwise).
		if cp := gs[i].History.CommonPoint(gs[i].FlushLSN, pe.History); cp != pe.StartStreamingAt {
			t.Errorf("sk%d: acceptor computes %s", i, cp)
		}
	}
}

func TestCannotJoinBelowCommit(t *testing.T) {
	// sk2 diverged below its own commit_lsn (impossible for a correct
	// cluster, but the core must not send a ProposerElected it would refuse).
	gs := []*proto.SafeKeeperInfo{
		info(3, tlStart+0x3000, 0, hist(1, uint64(tlStart), 3, uint64(tlStart)+0x1000)),
		info(3, tlStart+0x3000, 0, hist(1, uint64(tlStart), 3, uint64(tlStart)+0x1000)),
		info(2, tlStart+0x2000, tlStart+0x1800, hist(1, uint64(tlStart), 2, uint64(tlStart)+0x800)),
	}
	c, _ := elect(t, gs, []int{0, 1, 2}, nil, noUpstream)
	if _, err := c.ProposerElected(2); !errors.Is(err, ErrCannotJoin) {
		t.Fatalf("got %v, want ErrCannotJoin", err)
	}
}

// streaming returns a core elected on 3 fresh safekeepers with
// ProposerElected sent to all.
func streaming(t *testing.T) *Core {
	t.Helper()
	gs := []*proto.SafeKeeperInfo{info(0, 0, 0, nil), info(0, 0, 0, nil), info(0, 0, 0, nil)}
	c, _ := elect(t, gs, []int{0, 1, 2}, nil, noUpstream)
	for i := range 3 {
		if _, err := c.ProposerElected(i); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func resp(term uint64, flush proto.LSN) *proto.SafeKeeperResponse {
	return &proto.SafeKeeperResponse{Term: term, FlushLSN: flush}
}

func TestCommitIsQuorumThHighestFlush(t *testing.T) {
	c := streaming(t)
	term := c.Ballot().Term
	c.Response(0, resp(term, tlStart+0x300))
	if c.CommitLSN() != 0 {
		t.Fatalf("commit %s with one response of three", c.CommitLSN())
	}
	adv, _ := c.Response(1, resp(term, tlStart+0x100))
	if !adv || c.CommitLSN() != tlStart+0x100 {
		t.Fatalf("commit %s (advanced %v), want %s: the 2nd highest of {300,100}", c.CommitLSN(), adv, tlStart+0x100)
	}
	c.Response(2, resp(term, tlStart+0x200))
	if c.CommitLSN() != tlStart+0x200 {
		t.Fatalf("commit %s, want %s: the 2nd highest of {300,100,200}", c.CommitLSN(), tlStart+0x200)
	}
	req := c.Request(tlStart+0x300, []byte{1, 2, 3})
	if req.CommitLSN != tlStart+0x200 || req.Sender != c.Ballot() || req.EndLSN != tlStart+0x303 {
		t.Fatalf("request %+v", req)
	}
}

func TestCommitNeverDecreases(t *testing.T) {
	c := streaming(t)
	term := c.Ballot().Term
	c.Response(0, resp(term, tlStart+0x300))
	c.Response(1, resp(term, tlStart+0x300))
	// sk1 restarts and reconnects, reporting less (it cannot durably lose
	// WAL, but the core must not trust a lower report to lower commit).
	c.Disconnected(1)
	c.Response(0, resp(term, tlStart+0x100))
	if c.CommitLSN() != tlStart+0x300 {
		t.Fatalf("commit %s went backwards", c.CommitLSN())
	}
}

func TestFlushBelowTermStartDoesNotCount(t *testing.T) {
	// Term 5 starts at the donor's flush 0x2000. sk1 and sk2 start lower;
	// their responses below 0x2000 do not make anything committed, even
	// though two safekeepers answered.
	h := hist(1, uint64(tlStart))
	gs := []*proto.SafeKeeperInfo{info(4, tlStart+0x2000, 0, h), info(4, tlStart+0x1000, 0, h), info(4, tlStart+0x1000, 0, h)}
	c, e := elect(t, gs, []int{0, 1, 2}, nil, noUpstream)
	for i := range 3 {
		c.ProposerElected(i)
	}
	c.Response(1, resp(e.Term, tlStart+0x1800))
	c.Response(2, resp(e.Term, tlStart+0x1900))
	if c.CommitLSN() != 0 {
		t.Fatalf("commit %s from flushes below term start %s", c.CommitLSN(), e.TermStartLSN)
	}
	c.Response(2, resp(e.Term, tlStart+0x2100))
	c.Response(0, resp(e.Term, tlStart+0x2000))
	if c.CommitLSN() != tlStart+0x2000 {
		t.Fatalf("commit %s, want term start %s once two are at or past it", c.CommitLSN(), tlStart+0x2000)
	}
}

func TestTruncateIsMinFlushOverAll(t *testing.T) {
	c := NewCore(3, us)
	c.Greeted(0, info(0, 0, 0, nil))
	c.Greeted(1, info(0, 0, 0, nil))
	b, _ := c.Campaign()
	for i := range 2 {
		v, f := grant(b, info(0, 0, 0, nil))
		c.Voted(i, v, f)
	}
	c.Elect(noUpstream, tlStart)
	c.ProposerElected(0)
	c.ProposerElected(1)
	c.Response(0, resp(b.Term, tlStart+0x500))
	c.Response(1, resp(b.Term, tlStart+0x400))
	if c.CommitLSN() != tlStart+0x400 || c.TruncateLSN() != 0 {
		t.Fatalf("commit %s truncate %s: truncate must stay 0 while sk2 was never heard from", c.CommitLSN(), c.TruncateLSN())
	}
	c.Greeted(2, info(0, tlStart+0x100, 0, hist(1, uint64(tlStart))))
	c.Response(0, resp(b.Term, tlStart+0x600))
	if c.TruncateLSN() != tlStart+0x100 {
		t.Fatalf("truncate %s, want the lowest flush %s", c.TruncateLSN(), tlStart+0x100)
	}
	if r := c.Request(tlStart+0x600, nil); r.TruncateLSN != tlStart+0x100 || r.BeginLSN != r.EndLSN {
		t.Fatalf("heartbeat %+v", r)
	}
}

func TestHigherTermInResponseDeposes(t *testing.T) {
	c := streaming(t)
	_, err := c.Response(1, resp(c.Ballot().Term+1, tlStart))
	var de *DeposedError
	if !errors.As(err, &de) || !errors.Is(err, ErrDeposed) || de.Term != c.Ballot().Term+1 || de.Safekeeper != 1 {
		t.Fatalf("got %v, want a DeposedError from sk1", err)
	}
}

func TestHigherTermInGreetingAfterElectionDeposes(t *testing.T) {
	c := streaming(t)
	c.Disconnected(2)
	if err := c.Greeted(2, info(c.Ballot().Term+3, 0, 0, nil)); !errors.Is(err, ErrDeposed) {
		t.Fatalf("got %v, want ErrDeposed", err)
	}
}

func TestRefusedVoteAfterElectionDeposes(t *testing.T) {
	c := streaming(t)
	c.Disconnected(2)
	c.Greeted(2, info(c.Ballot().Term, 0, 0, nil))
	_, err := c.Voted(2, &proto.VoteResponse{VotedFor: proto.Ballot{Term: c.Ballot().Term + 1}}, nil)
	if !errors.Is(err, ErrDeposed) {
		t.Fatalf("got %v, want ErrDeposed", err)
	}
}

func TestOneSafekeeperNeverCountsTwiceTowardQuorum(t *testing.T) {
	c := NewCore(3, proto.ID{1})
	a := info(0, 0, 0, nil)
	a.SafekeeperID = 7
	if err := c.Greeted(0, a); err != nil {
		t.Fatal(err)
	}
	b := info(0, 0, 0, nil)
	b.SafekeeperID = 7 // the same safekeeper behind a second address
	if err := c.Greeted(1, b); !errors.Is(err, ErrDuplicateSafekeeper) {
		t.Fatalf("got %v, want ErrDuplicateSafekeeper", err)
	}
	// Its own reconnection is fine.
	if err := c.Greeted(0, a); err != nil {
		t.Fatalf("reconnect of the same safekeeper: %v", err)
	}
}

func TestSameTermRefusalAfterElectionIsNotDeposal(t *testing.T) {
	// A late safekeeper voted for another candidate of our own term: that
	// candidate cannot have a quorum (we do), so we are not deposed; the
	// safekeeper only sits out the term.
	c := streaming(t)
	c.Disconnected(2)
	c.Greeted(2, info(c.Ballot().Term, 0, 0, nil))
	other := proto.Ballot{Term: c.Ballot().Term, UUID: proto.ID{0xee}}
	_, err := c.Voted(2, &proto.VoteResponse{VotedFor: other}, nil)
	if errors.Is(err, ErrDeposed) || !errors.Is(err, ErrCannotJoin) {
		t.Fatalf("got %v, want ErrCannotJoin and not ErrDeposed", err)
	}
}

func TestReconnectIsReGrantedWithSameBallotAndNewStart(t *testing.T) {
	c := streaming(t)
	b := c.Ballot()
	c.Response(0, resp(b.Term, tlStart+0x800))
	c.Disconnected(0)
	c.Greeted(0, info(b.Term, tlStart+0x800, 0, hist(b.Term, uint64(tlStart))))
	v, f := grant(b, info(b.Term, tlStart+0x800, 0, hist(b.Term, uint64(tlStart))))
	if _, err := c.Voted(0, v, f); err != nil {
		t.Fatal(err)
	}
	pe, err := c.ProposerElected(0)
	if err != nil || pe.StartStreamingAt != tlStart+0x800 || pe.Term != b.Term {
		t.Fatalf("re-elected: %+v %v, want start at its flush %s", pe, err, tlStart+0x800)
	}
}

func TestUpstreamBehindStartsTermAtCommit(t *testing.T) {
	// The primary lost WAL it had streamed (fsync off): it ends at 0x1800,
	// the donor has 0x3000 of which 0x1000 is committed. The term starts at
	// the committed point so the safekeepers' tail is truncated.
	h := hist(1, uint64(tlStart))
	gs := []*proto.SafeKeeperInfo{info(1, tlStart+0x3000, tlStart+0x1000, h), info(1, tlStart+0x2000, tlStart+0x800, h), nil}
	c, e := elect(t, gs, []int{0, 1}, nil, tlStart+0x1800)
	if e.TermStartLSN != tlStart+0x1000 || !e.History.Equal(hist(1, uint64(tlStart), 2, uint64(tlStart)+0x1000)) {
		t.Fatalf("election %+v", e)
	}
	pe, _ := c.ProposerElected(0)
	if pe.StartStreamingAt != tlStart+0x1000 {
		t.Fatalf("donor restarts at %s, want %s", pe.StartStreamingAt, tlStart+0x1000)
	}
	// Below the commit point: refuse to continue from this primary.
	c2 := NewCore(3, us)
	c2.Greeted(0, gs[0])
	c2.Greeted(1, gs[1])
	b, _ := c2.Campaign()
	for i := range 2 {
		v, f := grant(b, gs[i])
		c2.Voted(i, v, f)
	}
	if _, err := c2.Elect(tlStart+0x900, tlStart); !errors.Is(err, ErrUpstreamBehind) {
		t.Fatalf("got %v, want ErrUpstreamBehind", err)
	}
}

// TestCoreDrivesRealAcceptors runs the core against three real acceptors
// (in-memory storage) through two terms: a new timeline, WAL streamed to a
// quorum only, then a new term whose ProposerElected every acceptor accepts
// (the core's start points equal the acceptors' own) and whose commit_lsn
// the acceptors adopt.
func TestCoreDrivesRealAcceptors(t *testing.T) {
	si := proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: 7, PgTimeline: 1, WalSegSize: segSize, TenantID: proto.ID{1}, TimelineID: proto.ID{2}}
	var accs [3]*acceptor.Acceptor
	for i := range accs {
		a, err := acceptor.New(acceptor.Config{NodeID: uint64(i + 1)}, acceptor.NewState(&si), acceptor.NewMemStorage(acceptor.NewState(&si)))
		if err != nil {
			t.Fatal(err)
		}
		accs[i] = a
	}
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, 7)
	var wal []byte
	var ends []proto.LSN
	for range 20 {
		_, end := gen.Record(3000)
		ends = append(ends, end)
	}
	wal = gen.Take()

	term := func(live []int, upto proto.LSN) *Core {
		c := NewCore(3, us)
		for _, i := range live {
			g, err := accs[i].ServerInfo(&si)
			if err != nil {
				t.Fatal(err)
			}
			c.Greeted(i, g)
		}
		b, err := c.Campaign()
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range live {
			v, f, err := accs[i].RequestVote(&proto.RequestVote{Candidate: b})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Voted(i, v, f); err != nil {
				t.Fatal(err)
			}
		}
		e, err := c.Elect(noUpstream, tlStart)
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range live {
			pe, err := c.ProposerElected(i)
			if err != nil {
				t.Fatal(err)
			}
			if err := accs[i].ProposerElected(b, pe); err != nil {
				t.Fatalf("sk%d refuses ProposerElected: %v", i, err)
			}
			start := pe.StartStreamingAt
			for off := start; off < upto; {
				n := min(upto-off, 7000)
				req := c.Request(off, wal[off-tlStart:off-tlStart+n])
				if err := accs[i].Append(req); err != nil {
					t.Fatal(err)
				}
				off += n
			}
			r, _, err := accs[i].Flush()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Response(i, r); err != nil {
				t.Fatal(err)
			}
		}
		// A heartbeat carries commit_lsn to the acceptors.
		for _, i := range live {
			accs[i].Append(c.Request(0, nil))
			r, _, _ := accs[i].Flush()
			c.Response(i, r)
		}
		_ = e
		return c
	}
	// Term 1 on sk0 and sk1 up to a point inside a record.
	mid := ends[9] + 100
	c1 := term([]int{0, 1}, mid)
	if c1.CommitLSN() != ends[9] {
		t.Fatalf("term 1 commit %s, want the last record end %s", c1.CommitLSN(), ends[9])
	}
	// Term 2 on sk1 and sk2 (sk2 empty): the donor is sk1; sk2 starts at
	// the timeline start and gets everything.
	c2 := term([]int{1, 2}, ends[19])
	if e := c2.Election(); e.Donor != 1 || e.TermStartLSN != ends[9] || e.Term != 2 {
		t.Fatalf("term 2 election %+v", e)
	}
	if c2.CommitLSN() != ends[19] {
		t.Fatalf("term 2 commit %s, want %s", c2.CommitLSN(), ends[19])
	}
	for _, i := range []int{1, 2} {
		// The heartbeat's commit_lsn is in memory (persisted lazily).
		if st := accs[i].InMem(); st.CommitLSN != ends[19] || st.FlushLSN != ends[19] {
			t.Errorf("sk%d state flush %s commit %s", i, st.FlushLSN, st.CommitLSN)
		}
	}
	// Term 3 on all: sk0 (term 1 only, ends[9]) catches up from its flush.
	c3 := term([]int{0, 1, 2}, ends[19])
	if c3.StartStreamingAt(0) != ends[9] || c3.TruncateLSN() != ends[19] {
		t.Fatalf("sk0 start %s truncate %s", c3.StartStreamingAt(0), c3.TruncateLSN())
	}
}
