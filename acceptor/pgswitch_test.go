package acceptor

import (
	"errors"
	"fmt"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
)

// TestPgTimelineSwitch: a proposer of a promoted primary (PostgreSQL
// timeline 2) switches the timeline on a safekeeper that holds timeline 1:
// its ServerInfo names timeline 2, its TimelineHistory says timeline 1
// ended at S; the vote's fresh state hides WAL past S (the old timeline's
// only), ProposerElected truncates it and records timeline 2 and its
// history in the same commit. Without the history the vote is refused; a
// history branching off below commit_lsn is refused; afterwards a primary
// of timeline 1 is refused.
func TestPgTimelineSwitch(t *testing.T) {
	mem := NewMemStorage(NewState(&testInfo))
	s, err := NewSession(Config{NodeID: 9}, NewState(&testInfo), mem)
	if err != nil {
		t.Fatal(err)
	}
	conn := ConnID(0)
	step := func(m proto.Message) Ready {
		t.Helper()
		r := s.Step(conn, m)
		if len(r.Out) == 0 {
			r = s.Flush()
		}
		return r
	}
	ended := func(r Ready, want error) {
		t.Helper()
		if !r.Ends(conn) {
			t.Fatalf("connection not ended: %+v", r.Out)
		}
		for _, o := range r.Out {
			if o.Err != nil && !errors.Is(o.Err, want) {
				t.Fatalf("ended with %v, want %v", o.Err, want)
			}
		}
	}
	// Timeline 1: WAL to end, committed up to commit.
	conn++
	b1 := ballot(1, 1)
	step(&testInfo)
	step(&proto.RequestVote{Candidate: b1})
	step(&proto.ProposerElected{Term: 1, StartStreamingAt: tlStart, TimelineStartLSN: tlStart, History: hist(1, tlStart)})
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, 7)
	var ends []proto.LSN
	for range 20 {
		_, e := gen.Record(200)
		ends = append(ends, e)
	}
	wal := gen.Take()
	commit, switchAt, end := ends[5], ends[10], ends[19]
	step(&proto.SafeKeeperRequest{Sender: b1, BeginLSN: tlStart, EndLSN: tlStart + proto.LSN(len(wal)), CommitLSN: commit, WAL: wal})
	s.End(conn)
	if st := s.State(); st.FlushLSN != end || st.CommitLSN != commit {
		t.Fatalf("timeline 1: flush %s commit %s", st.FlushLSN, st.CommitLSN)
	}
	tli2 := testInfo
	tli2.PgTimeline = 2
	history := func(at proto.LSN) *proto.TimelineHistory {
		return &proto.TimelineHistory{PgTimeline: 2, Content: []byte(fmt.Sprintf("1\t%s\tno recovery target specified\n", at))}
	}
	b2 := ballot(2, 2)

	// No history: the vote is refused.
	conn++
	step(&tli2)
	ended(step(&proto.RequestVote{Candidate: b2}), ErrIncompatible)
	// A history branching off below commit_lsn: refused.
	conn++
	step(&tli2)
	ended(step(history(ends[2])), ErrIncompatible)

	// The switch.
	conn++
	step(&tli2)
	step(history(switchAt))
	r := step(&proto.RequestVote{Candidate: b2})
	var info *proto.SafeKeeperInfo
	for _, o := range r.Out {
		if i, ok := o.Msg.(*proto.SafeKeeperInfo); ok {
			info = i
		}
	}
	if info == nil || info.FlushLSN != switchAt || info.LastLogTerm != 1 {
		t.Fatalf("fresh state for timeline 2: %+v; want flush_lsn cut at the switch %s", info, switchAt)
	}
	r = step(&proto.ProposerElected{Term: 2, StartStreamingAt: switchAt, TimelineStartLSN: tlStart, History: hist(1, tlStart, 2, switchAt)})
	if r.Ends(conn) {
		t.Fatalf("ProposerElected of the switch refused: %+v", r.Out)
	}
	st, _, _ := mem.Durable()
	if st.PgTimeline != 2 || string(st.PgHistory) != string(history(switchAt).Content) || st.FlushLSN != switchAt {
		t.Fatalf("after the switch: TLI %d, history %q, flush %s", st.PgTimeline, st.PgHistory, st.FlushLSN)
	}
	s.End(conn)

	// A primary of timeline 1 is refused now.
	conn++
	ended(step(&testInfo), ErrIncompatible)
	// Timeline 2 again, with the same history: no switch, fine.
	conn++
	step(&tli2)
	step(history(switchAt))
	if r := step(&proto.RequestVote{Candidate: ballot(3, 3)}); r.Ends(conn) {
		t.Fatalf("a proposer of timeline 2 with its history refused: %+v", r.Out)
	}
}
