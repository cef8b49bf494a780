package sim

import (
	"bytes"
	"errors"
	"testing"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proposer/session"
	"github.com/safekeeper/safekeeper/proto"
)

// Scenario tests at the pure level (real acceptors on MemStorage, the real
// proposer core, no network), one per protocol rule they protect.

const ruleTL = proto.LSN(0x2000000)

var ruleSI = proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: 0x5afe, TenantID: proto.ID{1},
	TimelineID: proto.ID{2}, PgTimeline: 1, WalSegSize: segSize}

type ruleSK struct {
	acc  *acceptor.Acceptor
	disk *disk
}

func ruleCluster(t *testing.T, n int) []*ruleSK {
	t.Helper()
	var sks []*ruleSK
	for i := range n {
		st := acceptor.NewState(&ruleSI)
		d := newDisk(st)
		a, err := acceptor.New(acceptor.Config{NodeID: uint64(i + 1)}, st, d)
		if err != nil {
			t.Fatal(err)
		}
		sks = append(sks, &ruleSK{a, d})
	}
	return sks
}

// ruleTerm runs one proposer term by hand: greet and ask the votes of the
// safekeepers in voters, elect, send each its ProposerElected, and stream
// nrec new records of this term to those in writers (a subset of voters),
// then a heartbeat so they learn commit_lsn. It returns the core and the
// ProposerElected messages it sent.
func ruleTerm(t *testing.T, w *walStore, sks []*ruleSK, uuid byte, voters, writers []int, nrec int) (*session.Core, map[int]*proto.ProposerElected) {
	t.Helper()
	return ruleTermIn(t, w, sks, proto.Configuration{}, uuid, voters, writers, nrec)
}

// ruleTermIn is ruleTerm for a proposer in configuration conf (safekeeper
// i has id i+1).
func ruleTermIn(t *testing.T, w *walStore, sks []*ruleSK, conf proto.Configuration, uuid byte, voters, writers []int, nrec int) (*session.Core, map[int]*proto.ProposerElected) {
	t.Helper()
	c := ruleCampaign(t, sks, conf, uuid, voters)
	b := c.Ballot()
	for _, i := range voters {
		v, fresh, err := sks[i].acc.RequestVote(&proto.RequestVote{Candidate: b})
		if err != nil {
			t.Fatalf("sk%d refuses %s: %v", i, b, err)
		}
		if _, err := c.Voted(i, v, fresh); err != nil {
			t.Fatal(err)
		}
	}
	e, err := c.Elect(^proto.LSN(0), ruleTL)
	if err != nil {
		t.Fatal(err)
	}
	prev, err := w.prevRecord(e.History, e.TermStartLSN)
	if err != nil {
		t.Fatal(err)
	}
	log := w.startTerm(e.Term, e.TermStartLSN, prev)
	for range nrec {
		log.record(500)
	}
	pes := map[int]*proto.ProposerElected{}
	for _, i := range voters {
		pe, err := c.ProposerElected(i)
		if err != nil {
			t.Fatal(err)
		}
		if err := sks[i].acc.ProposerElected(b, pe); err != nil {
			t.Fatalf("sk%d refuses ProposerElected: %v", i, err)
		}
		pes[i] = pe
	}
	for _, i := range writers {
		for off := pes[i].StartStreamingAt; off < log.end(); {
			n := min(log.end()-off, 3000) // requests end inside records
			wal, err := w.read(e.History, off, off+n)
			if err != nil {
				t.Fatal(err)
			}
			if err := sks[i].acc.Append(c.Request(off, wal)); err != nil {
				t.Fatal(err)
			}
			off += n
		}
		r, _, err := sks[i].acc.Flush()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Response(i, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range writers {
		sks[i].acc.Append(c.Request(0, nil))
		r, _, _ := sks[i].acc.Flush()
		c.Response(i, r)
	}
	return c, pes
}

// ruleCampaign greets the safekeepers greeted in configuration conf
// (safekeeper i has id i+1) and campaigns: the core's ballot is above
// every term they showed.
func ruleCampaign(t *testing.T, sks []*ruleSK, conf proto.Configuration, uuid byte, greeted []int) *session.Core {
	t.Helper()
	c := session.NewCore(len(sks), proto.ID{uuid})
	ids := make([]uint64, len(sks))
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	c.Configure(conf, ids)
	si := ruleSI
	si.Configuration = conf
	for _, i := range greeted {
		info, err := sks[i].acc.ServerInfo(&si)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Greeted(i, info); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Campaign(); err != nil {
		t.Fatal(err)
	}
	return c
}

// Rule 4: a duplicated or late ProposerElected from the same term never
// removes WAL. The acceptor recomputes the common point itself and refuses
// a start_streaming_at that differs from it: here, starts the proposer sent
// on earlier connections (the timeline start, and sk0's commit_lsn), below
// WAL sk0 acknowledged since. (acceptor.TestRule4_LateProposerElectedWithoutTheCheck
// shows what the check prevents, with it planted away.)
func TestRuleDuplicateOrLateProposerElectedNeverRemovesWAL(t *testing.T) {
	w := newWALStore(segSize, ruleSI.SystemID)
	sks := ruleCluster(t, 3)
	c, pes := ruleTerm(t, w, sks, 0xa1, []int{0, 1, 2}, []int{0, 1, 2}, 40)
	sk := sks[0]
	// More WAL to sk0, acknowledged but not yet known committed.
	log := w.byTerm[c.Ballot().Term]
	from := log.end()
	for range 10 {
		log.record(700)
	}
	more, _ := w.read(c.Election().History, from, log.end())
	if err := sk.acc.Append(c.Request(from, more)); err != nil {
		t.Fatal(err)
	}
	r, _, _ := sk.acc.Flush()
	before := sk.acc.State()
	_, _, walBefore := sk.disk.mem.Durable()
	if before.CommitLSN <= ruleTL || r.FlushLSN != log.end() || before.FlushLSN <= before.CommitLSN {
		t.Fatalf("setup: flush %s commit %s", before.FlushLSN, before.CommitLSN)
	}
	for _, start := range []proto.LSN{pes[0].StartStreamingAt, before.CommitLSN} {
		late := *pes[0]
		late.StartStreamingAt = start
		err := sk.acc.ProposerElected(c.Ballot(), &late)
		after := sk.acc.State()
		_, _, walAfter := sk.disk.mem.Durable()
		if !errors.Is(err, acceptor.ErrCommonPointMismatch) {
			t.Fatalf("late ProposerElected with start %s: %v, want ErrCommonPointMismatch", start, err)
		}
		if !sameState(&before, &after) || !bytes.Equal(walBefore, walAfter) {
			t.Fatalf("a refused ProposerElected changed the acceptor: flush %s → %s", before.FlushLSN, after.FlushLSN)
		}
	}
	// A duplicate whose start is the common point (the same proposer
	// reconnecting) is accepted and removes nothing.
	dup := *pes[0]
	dup.StartStreamingAt = before.FlushLSN
	if err := sk.acc.ProposerElected(c.Ballot(), &dup); err != nil {
		t.Fatalf("ProposerElected at the common point: %v", err)
	}
	_, _, walDup := sk.disk.mem.Durable()
	n := before.FlushLSN - ruleTL
	if st := sk.acc.State(); st.FlushLSN != before.FlushLSN || st.CommitLSN != before.CommitLSN || !bytes.Equal(walDup[:n], walBefore[:n]) {
		t.Fatalf("re-sent ProposerElected removed WAL: flush %s → %s", before.FlushLSN, st.FlushLSN)
	}
}

// Rule 3: the donor is chosen by (last_log_term, flush_lsn), not by the
// current term. sk0 lags: its WAL is from term 1 (a long uncommitted tail)
// but it voted for term 3, a campaign that never won; sk1 holds term 2's
// committed WAL. The term-4 proposer elected by sk0 and sk1 must continue
// sk1's WAL: choosing sk0 (higher voted term, higher flush_lsn) would
// truncate committed WAL on sk1.
func TestRuleDonorIsChosenByLastLogTermNotCurrentTerm(t *testing.T) {
	w := newWALStore(segSize, ruleSI.SystemID)
	sks := ruleCluster(t, 3)
	// Term 1: everyone gets 5 records; then sk0 alone gets a long tail.
	c1, _ := ruleTerm(t, w, sks, 0xa1, []int{0, 1, 2}, []int{0, 1, 2}, 5)
	e1 := c1.Election()
	l1 := w.byTerm[e1.Term]
	from := l1.end()
	for range 60 {
		l1.record(500)
	}
	tail, _ := w.read(e1.History, from, l1.end())
	if err := sks[0].acc.Append(c1.Request(from, tail)); err != nil {
		t.Fatal(err)
	}
	sks[0].acc.Flush()
	// Term 2 on sk1 and sk2 only: 10 records, committed.
	c2, _ := ruleTerm(t, w, sks, 0xa2, []int{1, 2}, []int{1, 2}, 10)
	committed := c2.CommitLSN()
	_, _, sk1WAL := sks[1].disk.mem.Durable()
	// Term 3: a campaign that wins only sk0's vote.
	info, _ := sks[0].acc.ServerInfo(&ruleSI)
	if _, _, err := sks[0].acc.RequestVote(&proto.RequestVote{Candidate: proto.Ballot{Term: 3, UUID: proto.ID{0xa3}}}); err != nil {
		t.Fatal(err)
	}
	s0, s1 := sks[0].acc.State(), sks[1].acc.State()
	if s0.VotedFor.Term != 3 || s0.LastLogTerm() != 1 || s0.FlushLSN <= s1.FlushLSN || s1.LastLogTerm() != 2 || info.FlushLSN != s0.FlushLSN {
		t.Fatalf("setup: sk0 voted %d last_log_term %d flush %s; sk1 last_log_term %d flush %s",
			s0.VotedFor.Term, s0.LastLogTerm(), s0.FlushLSN, s1.LastLogTerm(), s1.FlushLSN)
	}
	// Term 4, elected by sk0 and sk1.
	c4, pes := ruleTerm(t, w, sks, 0xa4, []int{0, 1}, []int{0, 1}, 3)
	e4 := c4.Election()
	if e4.Donor != 1 || e4.TermStartLSN != s1.FlushLSN {
		t.Fatalf("donor sk%d term start %s: want sk1 (last_log_term 2) at %s", e4.Donor, e4.TermStartLSN, s1.FlushLSN)
	}
	if pes[0].StartStreamingAt != w.byTerm[e1.Term].ends[4] {
		t.Errorf("sk0 restarts at %s, want the end of its last common term-1 record %s", pes[0].StartStreamingAt, w.byTerm[e1.Term].ends[4])
	}
	// The committed term-2 WAL is intact on sk1 and now also on sk0.
	_, _, now1 := sks[1].disk.mem.Durable()
	_, start0, now0 := sks[0].disk.mem.Durable()
	n := committed - ruleTL
	if start0 != ruleTL || !bytes.Equal(now1[:n], sk1WAL[:n]) || !bytes.Equal(now0[:n], sk1WAL[:n]) {
		t.Fatalf("committed WAL below %s changed", committed)
	}
	if st := sks[0].acc.State(); st.FlushLSN != sks[1].acc.State().FlushLSN || st.LastLogTerm() != 4 {
		t.Fatalf("sk0 flush %s last_log_term %d, want sk1's %s and 4", st.FlushLSN, st.LastLogTerm(), sks[1].acc.State().FlushLSN)
	}
}

// Rule 9, the change (README_PROTO.md, "Membership and generations", its
// term bump): before the final configuration is written, the new
// members are raised to the sync term, the highest term a majority of the
// old members answered the joint configuration with. Without it, a term
// that a proposer of the old configuration won just before the change (its
// voters switched right after voting) is unknown to a majority of the new
// members, and a proposer of the final configuration elected by them wins
// it again: two proposers in one term (invariant 2), whose WAL a later
// election cannot tell apart where their terms start at the same LSN. The
// simulation found it (seed 1671; docs/correctness.md, section 3).
//
// {1,2,3} → {1,2,4}: term 1 writes on all three; B (generation 1) wins
// term 2 with the votes of 1 and 3; the joint configuration reaches 1 and 2
// (answering terms 2 and 1: sync term 2) and 4; 1 and 2 are at the sync
// position, so the final configuration {1,2,4} may be written; C, in it,
// greets 2 and 4.
func TestRuleChangeRaisesNewMembersToTheSyncTerm(t *testing.T) {
	for _, bump := range []bool{false, true} {
		w := newWALStore(segSize, ruleSI.SystemID)
		sks := ruleCluster(t, 4)
		g1 := proto.Configuration{Generation: 1, Members: []uint64{1, 2, 3}}
		for _, i := range []int{0, 1, 2} {
			if _, err := sks[i].acc.SetConfiguration(g1); err != nil {
				t.Fatal(err)
			}
		}
		ruleTermIn(t, w, sks, g1, 0xa1, []int{0, 1, 2}, []int{0, 1, 2}, 5)
		b := ruleCampaign(t, sks, g1, 0xb2, []int{0, 2}).Ballot()
		for _, i := range []int{0, 2} {
			if _, _, err := sks[i].acc.RequestVote(&proto.RequestVote{Candidate: b}); err != nil {
				t.Fatalf("sk%d refuses %s: %v", i, b, err)
			}
		}
		joint := proto.Configuration{Generation: 2, Members: []uint64{1, 2, 3}, NewMembers: []uint64{1, 2, 4}}
		var syncTerm uint64
		for _, i := range []int{0, 1, 3} {
			if _, err := sks[i].acc.SetConfiguration(joint); err != nil {
				t.Fatal(err)
			}
			if i != 3 {
				syncTerm = max(syncTerm, sks[i].acc.State().VotedFor.Term)
			}
		}
		if syncTerm != b.Term || b.Term != 2 {
			t.Fatalf("setup: B's ballot %s, sync term %d", b, syncTerm)
		}
		if bump {
			if _, err := sks[3].acc.TermBump(syncTerm); err != nil {
				t.Fatal(err)
			}
		}
		final := proto.Configuration{Generation: 3, Members: []uint64{1, 2, 4}}
		for _, i := range []int{0, 1, 3} {
			if _, err := sks[i].acc.SetConfiguration(final); err != nil {
				t.Fatal(err)
			}
		}
		c := ruleCampaign(t, sks, final, 0xc3, []int{1, 3}).Ballot()
		if bump {
			if c.Term <= b.Term {
				t.Fatalf("with the term bump, C campaigns in term %d, not above B's %d", c.Term, b.Term)
			}
			continue
		}
		// Without it: C campaigns in B's term, and 2 and 4 grant it.
		if c.Term != b.Term {
			t.Fatalf("without the term bump C campaigns in term %d; the scenario needs B's %d", c.Term, b.Term)
		}
		for _, i := range []int{1, 3} {
			if _, _, err := sks[i].acc.RequestVote(&proto.RequestVote{Candidate: c}); err != nil {
				t.Fatalf("without the term bump sk%d refuses %s: %v", i, c, err)
			}
		}
	}
}
