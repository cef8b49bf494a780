package acceptor

import (
	"errors"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

func conf(gen uint64, members []uint64, newMembers ...uint64) proto.Configuration {
	return proto.Configuration{Generation: gen, Members: members, NewMembers: newMembers}
}

// greet sends a greeting of configuration c on connection conn and returns
// the SafeKeeperInfo.
func (f *sessionFixture) greet(conn ConnID, c proto.Configuration) *proto.SafeKeeperInfo {
	f.t.Helper()
	si := testInfo
	si.Configuration = c
	r := f.s.Step(conn, &si)
	f.want("greeting", r, int(conn), "info")
	return r.Out[0].Msg.(*proto.SafeKeeperInfo)
}

// TestRule9_GreetingAdoptsHigherGeneration: a greeting of a higher
// generation switches the safekeeper to its configuration durably before
// the answer; one of a lower generation is answered with the stored
// configuration and changes nothing; the same generation with other
// members is refused (a generation names one configuration).
func TestRule9_GreetingAdoptsHigherGeneration(t *testing.T) {
	f := newSessionFixture(t) // node 9
	g1 := conf(1, []uint64{7, 8, 9})
	if info := f.greet(1, g1); !info.Configuration.Equal(g1) {
		t.Fatalf("greeting of generation 1 answered with %s", info.Configuration)
	}
	if st, _, _ := f.mem.Durable(); !st.Configuration.Equal(g1) {
		t.Fatalf("durable configuration %s after the greeting, want %s", st.Configuration, g1)
	}
	if info := f.greet(2, proto.Configuration{}); !info.Configuration.Equal(g1) {
		t.Fatalf("greeting without a configuration answered with %s, want the stored %s", info.Configuration, g1)
	}
	si := testInfo
	si.Configuration = conf(1, []uint64{7, 8, 10})
	r := f.s.Step(3, &si)
	f.want("same generation, other members", r, 3, ErrConfigurationConflict)
	var ce *ConfigurationError
	if !errors.As(r.Out[0].Err, &ce) || !ce.Configuration.Equal(g1) {
		t.Fatalf("refusal %v does not carry the stored configuration", r.Out[0].Err)
	}
	g2 := conf(2, []uint64{7, 8, 9}, 7, 8, 10)
	if info := f.greet(4, g2); !info.Configuration.Equal(g2) {
		t.Fatalf("greeting of generation 2 answered with %s", info.Configuration)
	}
	f.greet(5, g1)
	if st, _, _ := f.mem.Durable(); !st.Configuration.Equal(g2) {
		t.Fatalf("a greeting of generation 1 moved the safekeeper back to %s", st.Configuration)
	}
}

// TestRule9_StaleConnectionIsRefused: a connection greeted in an older
// generation is refused its vote, and a streaming one its next request,
// once the safekeeper holds a newer configuration (SK001), with that
// configuration in the error; nothing it sends after is written.
func TestRule9_StaleConnectionIsRefused(t *testing.T) {
	f := newSessionFixture(t)
	g1 := conf(1, []uint64{7, 8, 9})
	f.greet(1, g1)
	b := ballot(1, 1)
	r := f.s.Step(1, &proto.RequestVote{Candidate: b})
	f.want("vote in generation 1", r, 1, "verdict", 1, "info")
	f.want("elected", f.s.Step(1, &proto.ProposerElected{Term: 1, StartStreamingAt: tlStart, TimelineStartLSN: tlStart, History: hist(1, tlStart)}))
	f.request(1, b, 1)
	f.want("flush", f.s.Flush(), 1, "response")
	// A proposer without a configuration greets, and asks for a vote.
	f.greet(2, proto.Configuration{})
	r = f.s.Step(2, &proto.RequestVote{Candidate: ballot(2, 2)})
	f.want("vote of generation 0", r, 2, ErrStaleGeneration)
	// The membership change pushes generation 2.
	g2 := conf(2, []uint64{7, 8, 9}, 7, 8, 10)
	_, cur, err := f.s.SetConfiguration(g2)
	if err != nil || !cur.Equal(g2) {
		t.Fatalf("SetConfiguration(%s): %s, %v", g2, cur, err)
	}
	flush := f.s.State().FlushLSN
	r = f.request(1, b, 1)
	f.want("request of generation 1", r, 1, ErrStaleGeneration)
	var ce *ConfigurationError
	if !errors.As(r.Out[0].Err, &ce) || !ce.Configuration.Equal(g2) {
		t.Fatalf("refusal %v does not carry generation 2's configuration", r.Out[0].Err)
	}
	f.s.Flush()
	if st := f.s.State(); st.FlushLSN != flush {
		t.Fatalf("flush_lsn moved from %s to %s on a refused request", flush, st.FlushLSN)
	}
	// A lower generation pushed later changes nothing.
	if _, cur, err := f.s.SetConfiguration(g1); err != nil || !cur.Equal(g2) {
		t.Fatalf("SetConfiguration(generation 1) after 2: %s, %v", cur, err)
	}
	// A proposer greeting in generation 2 votes.
	f.greet(3, g2)
	f.want("vote in generation 2", f.s.Step(3, &proto.RequestVote{Candidate: ballot(3, 3)}), 3, "verdict", 3, "info")
}

// TestRule9_RemovedMemberTakesNoPart: a safekeeper that is not a member of
// its configuration refuses votes (SK002), also from a proposer of that
// same generation.
func TestRule9_RemovedMemberTakesNoPart(t *testing.T) {
	f := newSessionFixture(t) // node 9
	f.greet(1, conf(3, []uint64{7, 8, 10}))
	f.want("vote of a non-member", f.s.Step(1, &proto.RequestVote{Candidate: ballot(1, 1)}), 1, ErrNotMember)
	if st := f.s.State(); st.VotedFor.Term != 0 {
		t.Fatalf("a non-member voted: %s", st.VotedFor)
	}
}

// TestRule9_OlderGenerationPlanted: with the planted bug that accepts an
// older generation, the stale connection's request is written: the rule's
// test fails without the rule.
func TestRule9_OlderGenerationPlanted(t *testing.T) {
	f := newSessionFixture(t)
	f.s.hooks.acceptOlderGeneration = true
	f.s.acc.hooks.acceptOlderGeneration = true
	g1 := conf(1, []uint64{7, 8, 9})
	f.greet(1, g1)
	b := ballot(1, 1)
	f.s.Step(1, &proto.RequestVote{Candidate: b})
	f.s.Step(1, &proto.ProposerElected{Term: 1, StartStreamingAt: tlStart, TimelineStartLSN: tlStart, History: hist(1, tlStart)})
	if _, _, err := f.s.SetConfiguration(conf(2, []uint64{7, 8, 9}, 7, 8, 10)); err != nil {
		t.Fatal(err)
	}
	f.request(1, b, 1)
	if r := f.s.Flush(); len(r.Out) != 1 || r.Out[0].Err != nil {
		t.Fatalf("planted bug: the stale request was not accepted: %+v", r.Out)
	}
}
