package session

import (
	"errors"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

// jointCore is a core over four safekeepers with ids 1..4 (index i has id
// i+1), in the joint configuration {1,2,3} → {1,2,4}, every one greeted
// with an empty timeline.
func jointCore(t *testing.T, h Hooks) *Core {
	t.Helper()
	conf := proto.Configuration{Generation: 2, Members: []uint64{1, 2, 3}, NewMembers: []uint64{1, 2, 4}}
	c := NewCore(4, us)
	c.Configure(conf, nil)
	c.SetHooks(h)
	for i := range 4 {
		g := info(0, 0, 0, nil)
		g.SafekeeperID, g.Configuration = uint64(i+1), conf
		if err := c.Greeted(i, g); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// TestJointElectionNeedsBothMajorities: in a joint configuration grants
// are counted per set: a majority of the old members and a majority of the
// new ones.
func TestJointElectionNeedsBothMajorities(t *testing.T) {
	for _, c := range []struct {
		ids  []int
		want bool
	}{
		{[]int{1, 4}, false},   // new majority {1,4}, old only {1}
		{[]int{2, 3}, false},   // old majority {2,3}, new only {2}
		{[]int{3, 4}, false},   // one of each
		{[]int{1, 2}, true},    // both sets' majority
		{[]int{1, 3, 4}, true}, // old {1,3}, new {1,4}
		{[]int{2, 3, 4}, true}, // old {2,3}, new {2,4}
		{[]int{1, 2, 3}, true}, // old all, new {1,2}
		{[]int{3}, false},      //
		{[]int{1, 2, 3, 4}, true},
	} {
		core := jointCore(t, Hooks{})
		b, err := core.Campaign()
		if err != nil {
			t.Fatal(err)
		}
		var quorum bool
		for _, id := range c.ids {
			g := info(0, 0, 0, nil)
			g.SafekeeperID = uint64(id)
			v, f := grant(b, g)
			if quorum, err = core.Voted(id-1, v, f); err != nil {
				t.Fatal(err)
			}
		}
		if quorum != c.want {
			t.Errorf("grants from %v: quorum %v, want %v", c.ids, quorum, c.want)
		}
		if _, err := core.Elect(noUpstream, tlStart); (err == nil) != c.want {
			t.Errorf("grants from %v: Elect: %v", c.ids, err)
		}
	}
}

// TestJointCommitNeedsBothMajorities: commit_lsn moves only to what a
// majority of each set has flushed; with the planted bug that counts the
// new members only, it moves on {1, 4} alone.
func TestJointCommitNeedsBothMajorities(t *testing.T) {
	for _, planted := range []bool{false, true} {
		core := jointCore(t, Hooks{NewMembersOnly: planted})
		b, _ := core.Campaign()
		for i := range 4 {
			g := info(0, 0, 0, nil)
			g.SafekeeperID = uint64(i + 1)
			v, f := grant(b, g)
			if _, err := core.Voted(i, v, f); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := core.Elect(noUpstream, tlStart); err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			if _, err := core.ProposerElected(i); err != nil {
				t.Fatal(err)
			}
		}
		end := tlStart + 0x1000
		respond := func(id int, flush proto.LSN) {
			if _, err := core.Response(id-1, &proto.SafeKeeperResponse{Term: b.Term, FlushLSN: flush}); err != nil {
				t.Fatal(err)
			}
		}
		for id := 1; id <= 4; id++ {
			respond(id, tlStart)
		}
		respond(1, end)
		respond(4, end) // a majority of {1,2,4}; of {1,2,3} only 1
		if got := core.CommitLSN(); (got == end) != planted {
			t.Fatalf("planted %v: commit_lsn %s after ids 1 and 4 flushed %s", planted, got, end)
		}
		respond(3, end) // now {1,3} of the old set too
		if got := core.CommitLSN(); got != end {
			t.Fatalf("planted %v: commit_lsn %s after ids 1, 3, 4 flushed %s", planted, got, end)
		}
	}
}

// TestNewerConfigurationEndsTheSession: a greeting showing a newer
// generation is a *ConfigurationError carrying it; one from another
// safekeeper than the configuration expects at the index is
// ErrWrongSafekeeper; a non-member does not count toward a quorum.
func TestNewerConfigurationEndsTheSession(t *testing.T) {
	g1 := proto.Configuration{Generation: 1, Members: []uint64{1, 2, 3}}
	c := NewCore(3, us)
	c.Configure(g1, []uint64{1, 2, 3})
	g := info(4, 0, 0, nil)
	g.SafekeeperID = 1
	g.Configuration = proto.Configuration{Generation: 2, Members: []uint64{1, 2, 3}, NewMembers: []uint64{1, 2, 4}}
	err := c.Greeted(0, g)
	var ce *ConfigurationError
	if !errors.As(err, &ce) || !errors.Is(err, ErrNewerConfiguration) || !ce.Configuration.Equal(g.Configuration) || ce.Ours != 1 {
		t.Fatalf("greeting of generation 2: %v", err)
	}
	if c.MaxTermSeen() != 4 {
		t.Fatalf("the term of the greeting with the newer configuration is not kept: %d", c.MaxTermSeen())
	}
	g = info(0, 0, 0, nil)
	g.SafekeeperID, g.Configuration = 7, g1
	if err := c.Greeted(1, g); !errors.Is(err, ErrWrongSafekeeper) {
		t.Fatalf("safekeeper 7 at the address of 2: %v", err)
	}
	// Static addresses (no ids expected), one of them not a member.
	c = NewCore(3, us)
	c.Configure(proto.Configuration{Generation: 1, Members: []uint64{1, 2, 9}}, nil)
	for i, id := range []uint64{1, 2, 3} {
		g := info(0, 0, 0, nil)
		g.SafekeeperID, g.Configuration = id, proto.Configuration{Generation: 1, Members: []uint64{1, 2, 9}}
		if err := c.Greeted(i, g); err != nil {
			t.Fatal(err)
		}
	}
	if c.Member(2) || !c.Member(0) {
		t.Fatalf("membership by id wrong: %v %v", c.Member(0), c.Member(2))
	}
	if c.HasQuorum(func(i int) bool { return i != 1 }) {
		t.Fatal("ids 1 and 3 make a quorum of {1, 2, 9}; 3 is not a member")
	}
	if !c.HasQuorum(func(i int) bool { return i != 2 }) {
		t.Fatal("ids 1 and 2 do not make a quorum of {1, 2, 9}")
	}
}
