package server

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
)

// TestPgTimelineSwitchServed: after a proposer of a promoted primary
// switched the timeline to PostgreSQL timeline 2 at S, the safekeeper
// serves it as a walsender of that primary: IDENTIFY_SYSTEM says 2,
// TIMELINE_HISTORY 2 is the history file as sent, TIMELINE_HISTORY 1 is a
// missing file; a stream on timeline 1 ends at S with CopyDone and the
// next-timeline result set (two CommandCompletes), a start at S gets the
// result set without COPY, a start past S is not in the history; a stream
// on timeline 2 goes through S, and below the timeline's start names the
// removed segment for timeline 1, whose WAL it is; a primary of timeline 1
// is refused.
func TestPgTimelineSwitchServed(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	wal1, _ := p.push(30, 2000, 0)
	switchAt := p.pos // the promoted standby replayed all of it
	p.c.Close()
	// A standby following timeline 1 while the switch happens.
	live := newStream(t, addr)
	live.start(fmt.Sprintf("START_REPLICATION %s TIMELINE 1", tStart))
	live.readWAL(tStart, switchAt)

	// The proposer of the promoted primary, term 2, timeline 2.
	content := []byte(fmt.Sprintf("1\t%s\tno recovery target specified\n", switchAt))
	q := newTestPush2(t, addr, switchAt, content)
	wal2, _ := q.push(30, 2000, 0)
	end := q.pos
	// Its stream ends at the switch: no byte of timeline 2 on it.
	for {
		m := live.msg()
		if _, ok := m.(*pgproto3.CopyDone); ok {
			break
		}
		if cd, ok := m.(*pgproto3.CopyData); ok && cd.Data[0] == 'w' {
			t.Fatal("WAL past the switch sent on a timeline 1 stream")
		}
	}
	live.c.Frontend().Send(&pgproto3.CopyDone{})
	live.c.Frontend().Flush()
	expectNextTimeline(t, live, switchAt)

	c := replConnect(t, addr, false, "")
	if row := oneRow(t, must(exec(t, c, "IDENTIFY_SYSTEM")), nil, "systemid", "timeline", "xlogpos", "dbname"); row[1] != "2" {
		t.Fatalf("IDENTIFY_SYSTEM timeline %s, want 2", row[1])
	}
	row := oneRow(t, must(exec(t, c, "TIMELINE_HISTORY 2")), nil, "filename", "content")
	if row[0] != "00000002.history" || row[1] != string(content) {
		t.Fatalf("TIMELINE_HISTORY 2 = %q", row)
	}
	_, err := exec(t, c, "TIMELINE_HISTORY 1")
	wantCode(t, err, pgwire.UndefinedFile)

	// Timeline 1 from its start: up to S, then its end.
	st := newStream(t, addr)
	st.start(fmt.Sprintf("START_REPLICATION %s TIMELINE 1", tStart))
	if got := st.readWAL(tStart, switchAt); !bytes.Equal(got, wal1) {
		t.Fatal("timeline 1's WAL differs")
	}
	for {
		if _, ok := st.msg().(*pgproto3.CopyDone); ok {
			break
		}
	}
	st.c.Frontend().Send(&pgproto3.CopyDone{})
	st.c.Frontend().Flush()
	expectNextTimeline(t, st, switchAt)
	// The connection goes on: at S, no COPY at all.
	st.query(fmt.Sprintf("START_REPLICATION %s TIMELINE 1", switchAt))
	expectNextTimeline(t, st, switchAt)
	// Past S: not in the history.
	st.query(fmt.Sprintf("START_REPLICATION %s TIMELINE 1", switchAt+8))
	e := st.expect("ErrorResponse").(*pgproto3.ErrorResponse)
	if !strings.Contains(e.Message, "is not in this server's history") || !strings.Contains(e.Detail, "forked from timeline 1 at "+switchAt.String()) {
		t.Fatalf("start past the switch: %q / %q", e.Message, e.Detail)
	}
	st.expect("ReadyForQuery")

	// Below the timeline's start, on timeline 2: 58P01 naming the segment
	// as pg_wal does, for the timeline its WAL belongs to (1), not 2.
	before := newStream(t, addr)
	before.start(fmt.Sprintf("START_REPLICATION %s TIMELINE 2", tStart-tSeg))
	if e := before.expect("ErrorResponse").(*pgproto3.ErrorResponse); e.Code != pgwire.UndefinedFile ||
		e.Message != "requested WAL segment "+proto.SegmentFileName(1, tStart-tSeg, tSeg)+" has already been removed" {
		t.Fatalf("timeline 2 below the timeline's start: %s %q, want 58P01 naming timeline 1's segment", e.Code, e.Message)
	}

	// Timeline 2 from the segment start: through S.
	t2 := newStream(t, addr)
	t2.start(fmt.Sprintf("START_REPLICATION %s TIMELINE 2", tStart))
	if got := t2.readWAL(tStart, end); !bytes.Equal(got, append(append([]byte(nil), wal1...), wal2...)) {
		t.Fatal("timeline 2's WAL differs")
	}

	// The old primary's proposer (timeline 1) is refused.
	old, err := dialPush(t, addr)
	if err != nil {
		t.Fatal(err)
	}
	old.send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
		TimelineID: tTimeline, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xcc, 9}, WalEnd: end})
	if _, err := old.c.Recv(old.ctx); err == nil || !strings.Contains(err.Error(), "22023") {
		t.Fatalf("a proposer of timeline 1 after the switch: %v, want 22023", err)
	}
}

func expectNextTimeline(t *testing.T, st *stream, at lsn) {
	t.Helper()
	st.expect("RowDescription")
	dr := st.expect("DataRow").(*pgproto3.DataRow)
	if len(dr.Values) != 2 || string(dr.Values[0]) != "2" || string(dr.Values[1]) != at.String() {
		t.Fatalf("next timeline row %q, want 2, %s", dr.Values, at)
	}
	for _, tag := range []string{"START_STREAMING", "START_REPLICATION"} {
		if cc := st.expect("CommandComplete").(*pgproto3.CommandComplete); string(cc.CommandTag) != tag {
			t.Fatalf("CommandComplete %q, want %s", cc.CommandTag, tag)
		}
	}
	st.expect("ReadyForQuery")
}

// newTestPush2 is newTestPush for a proposer of PostgreSQL timeline 2 in
// term 2, switching the timeline at at with the given history file.
func newTestPush2(t *testing.T, addr string, at lsn, content []byte) *testPush {
	t.Helper()
	p, err := dialPush(t, addr)
	if err != nil {
		t.Fatal(err)
	}
	p.ballot = proto.Ballot{Term: 2, UUID: proto.ID{0xcc, 2}}
	p.pos = at
	p.send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
		TimelineID: tTimeline, PgTimeline: 2, WalSegSize: tSeg, ProposerUUID: p.ballot.UUID, WalEnd: at})
	p.recv()
	p.send(&proto.TimelineHistory{PgTimeline: 2, Content: content})
	p.send(&proto.RequestVote{Candidate: p.ballot})
	p.recv()
	if info := p.recv().(*proto.SafeKeeperInfo); info.FlushLSN != at {
		t.Fatalf("fresh state for timeline 2: flush %s, want %s", info.FlushLSN, at)
	}
	p.send(&proto.ProposerElected{Term: 2, StartStreamingAt: at, TimelineStartLSN: tStart,
		History: proto.TermHistory{{Term: 1, StartLSN: tStart}, {Term: 2, StartLSN: at}}})
	p.gen = xlogtest.NewGenerator(at, tSeg, 2, tSysID)
	return p
}

// dialPush opens a WAL push connection for a test proposer.
func dialPush(t *testing.T, addr string) (*testPush, error) {
	t.Helper()
	ctx := testCtx(t)
	c, err := proposer.Dial(ctx, proposer.DialConfig{AllowTimelineCreation: true, Addr: addr, TenantID: tTenant, TimelineID: tTimeline})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return &testPush{t: t, ctx: ctx, c: c}, nil
}
