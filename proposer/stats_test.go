package proposer

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proposer/session"
	"github.com/safekeeper/safekeeper/proto"
)

// wantLinks checks the links' states in a Status.
func wantLinks(t *testing.T, st Status, want ...LinkState) {
	t.Helper()
	for i, w := range want {
		if got := st.Safekeepers[i].State; got != w {
			t.Errorf("safekeeper %d (%s): %s, want %s", i+1, st.Safekeepers[i].Addr, got, w)
		}
	}
}

// TestStatsFollowTheSession: what the driver publishes while it streams —
// the term, each link's state, flush_lsn and responses, commit_lsn and the
// positions reported to the primary, the primary's end of WAL, and the lag
// in bytes and time — follows the session: the lag is the wait of the
// oldest WAL received and not yet on a quorum, gone once a quorum has it
// and growing again while the quorum is lost, and the state says
// streaming until fewer than a quorum of links stream.
func TestStatsFollowTheSession(t *testing.T) {
	s, _ := streamingSession(t)
	ctx := context.Background()
	now := time.Unix(5000, 0)
	s.now = func() time.Time { return now }
	st := s.stats
	// What run and the link goroutines do around the session the helper
	// set up: the primary connected, each link greeted, the election.
	st.primaryConnected(tlStart)
	for i := range s.sks {
		st.greeted(i, uint64(11+i))
	}
	st.elected.Store(true)
	s.publishLinks()
	s.sendStatus(true)

	snap := st.Snapshot(now)
	if snap.State != StateStreaming || snap.Reason != "" || snap.Term != 1 || snap.Quorum != 2 {
		t.Fatalf("elected: state %s (%q), term %d, quorum %d; want streaming, term 1, quorum 2", snap.State, snap.Reason, snap.Term, snap.Quorum)
	}
	wantLinks(t, snap, LinkStreaming, LinkStreaming, LinkStreaming)
	for i, l := range snap.Safekeepers {
		if l.Addr != s.cfg.Safekeepers[i] || l.ID != uint64(11+i) || l.FlushLSN != tlStart {
			t.Errorf("link %d: %+v, want %s, id %d, flush_lsn %s", i, l, s.cfg.Safekeepers[i], 11+i, tlStart)
		}
	}

	// WAL comes; 300 ms later one safekeeper answered: no quorum yet.
	end1 := tlStart + 1000
	if err := s.onUpstream(ctx, client.StreamMsg{Start: tlStart, WAL: make([]byte, 1000), ServerEnd: end1 + 24}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(300 * time.Millisecond)
	respond(t, s, 0, end1)
	snap = st.Snapshot(now)
	if snap.PrimaryFlushLSN != end1+24 || snap.Lag != 300*time.Millisecond || snap.CommitLSN != 0 {
		t.Fatalf("one response: primary at %s, lag %v, commit_lsn %s; want %s, 300ms, 0/0", snap.PrimaryFlushLSN, snap.Lag, snap.CommitLSN, end1+24)
	}
	respond(t, s, 1, end1) // a quorum: commit_lsn moves, the primary is told
	snap = st.Snapshot(now)
	if snap.CommitLSN != end1 || snap.FlushLSN != end1 || snap.WriteLSN != end1 || snap.Lag != 0 || snap.LagBytes != 24 {
		t.Fatalf("a quorum answered: commit_lsn %s, flush %s, write %s, lag %v, %d bytes; want %s, %s, %s, 0, 24",
			snap.CommitLSN, snap.FlushLSN, snap.WriteLSN, snap.Lag, snap.LagBytes, end1, end1, end1)
	}
	for i, want := range []struct {
		flush     proto.LSN
		responses uint64
	}{{end1, 1}, {end1, 1}, {tlStart, 0}} {
		if l := snap.Safekeepers[i]; l.FlushLSN != want.flush || l.Responses != want.responses {
			t.Errorf("link %d: flush_lsn %s, %d responses; want %s, %d", i, l.FlushLSN, l.Responses, want.flush, want.responses)
		}
	}

	// Two safekeepers lost, one after the other: a quorum, then none.
	lost := errors.New("read: connection reset by peer")
	for _, i := range []int{2, 1} {
		s.disconnect(s.sks[i])
		st.ended(i, lost, false) // the link goroutine sees its end
	}
	snap = st.Snapshot(now)
	wantLinks(t, snap, LinkStreaming, LinkDown, LinkDown)
	if snap.State != StateNoQuorum || !strings.Contains(snap.Reason, "1 of 3 safekeepers streaming, a quorum is 2") ||
		!strings.Contains(snap.Reason, s.cfg.Safekeepers[1]+" down: read: connection reset by peer") {
		t.Fatalf("quorum lost: %s (%q)", snap.State, snap.Reason)
	}
	// WAL goes on arriving; no quorum holds it, so its wait grows.
	if err := s.onUpstream(ctx, client.StreamMsg{Start: end1, WAL: make([]byte, 500)}); err != nil {
		t.Fatal(err)
	}
	respond(t, s, 0, end1+500)
	for _, wait := range []time.Duration{time.Second, 3 * time.Second} {
		snap = st.Snapshot(now.Add(wait))
		if snap.Lag != wait || snap.LagBytes != 500 || snap.FlushLSN != end1 {
			t.Fatalf("%v without a quorum: lag %v, %d bytes, flush %s; want %v, 500, %s", wait, snap.Lag, snap.LagBytes, snap.FlushLSN, wait, end1)
		}
	}
}

// TestStatsStates: the proposer's state, /readyz's answer, from its
// parts: waiting for another proposer's lease, the primary connecting or
// unreachable (its error), electing, and between two sessions after one
// that ended for another reason than the primary.
func TestStatsStates(t *testing.T) {
	st := NewStats([]string{"a:1", "b:1", "c:1"})
	now := time.Now()
	want := func(state State, reason string) {
		t.Helper()
		snap := st.Snapshot(now)
		if snap.State != state || !strings.Contains(snap.Reason, reason) {
			t.Fatalf("state %s (%q), want %s (%q)", snap.State, snap.Reason, state, reason)
		}
	}
	want(StateNoPrimary, "connecting to the primary")
	st.waitingFor(LiveProposer{Addr: "10.0.0.7:41760", Term: 4, Safekeeper: "a:1"}, true)
	want(StateWaitingLease, "the proposer of term 4 at 10.0.0.7:41760")
	st.waitingFor(LiveProposer{}, false)
	st.primaryFailed(errors.New("FATAL: the database system is starting up (SQLSTATE 57P03)"))
	want(StateNoPrimary, "no primary connection: FATAL: the database system is starting up (SQLSTATE 57P03)")
	st.primaryConnected(tlStart)
	st.greeted(0, 1)
	st.links[0].phase.Store(int32(session.PhaseVoting))
	want(StateNoQuorum, "electing: 1 of 3 safekeepers connected, a quorum is 2")
	st.sessionEnded(ErrVoteRefused)
	want(StateNoQuorum, "the last term ended (proposer: vote refused)")
	wantLinks(t, st.Snapshot(now), LinkDown, LinkDown, LinkDown)
	st.primaryConnected(tlStart)
	want(StateNoQuorum, "electing: 0 of 3")
}

// TestWALWaitsKeepTheOldest: the arrival times are kept in LSN order and
// forgotten once flushed; WAL re-sent keeps the time it first came; with
// the ring full the newest sample is overwritten, so the oldest stays exact.
func TestWALWaitsKeepTheOldest(t *testing.T) {
	var w walWaits
	t0 := time.Unix(100, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	if !w.arrived(1000, at(0)) || w.arrived(2000, at(1)) || w.arrived(1500, at(2)) {
		t.Fatal("arrived: only the first arrival into an empty record is the oldest; re-sent WAL is not recorded")
	}
	if got := w.flushed(999); !got.Equal(at(0)) {
		t.Fatalf("flushed below the first: oldest %v, want %v", got, at(0))
	}
	if got := w.flushed(1000); !got.Equal(at(1)) {
		t.Fatalf("flushed to the first: oldest %v, want %v", got, at(1))
	}
	if got := w.flushed(5000); !got.IsZero() {
		t.Fatalf("all flushed: oldest %v, want none", got)
	}
	if w.arrived(4000, at(3)) || w.n != 0 {
		t.Fatal("WAL below what was reported flushed (re-sent in a new session) recorded as waiting")
	}
	for i := range walWaitSamples + 10 {
		w.arrived(proto.LSN(10000+i), at(10+i))
	}
	if w.n != walWaitSamples {
		t.Fatalf("%d samples kept, want %d", w.n, walWaitSamples)
	}
	if got := w.flushed(10000); !got.Equal(at(11)) {
		t.Fatalf("full ring: after the first, oldest %v, want %v", got, at(11))
	}
	if got := w.flushed(proto.LSN(10000 + walWaitSamples - 2)); !got.Equal(at(10 + walWaitSamples + 9)) {
		t.Fatalf("full ring: the newest sample holds the last arrival, got %v", got)
	}
	// A primary that came back behind (rewound, or replaced): WAL above its
	// end is forgotten; WAL below it still waits, since it first came.
	w = walWaits{}
	for i, end := range []proto.LSN{100, 200, 300, 400} {
		w.arrived(end, at(i))
	}
	if got := w.truncate(250); !got.Equal(at(0)) || w.n != 3 || w.ring[2].end != 250 {
		t.Fatalf("truncate(250): oldest %v, %d samples, last ends at %s; want %v, 3, 250", got, w.n, w.ring[2].end, at(0))
	}
	if got := w.flushed(250); !got.IsZero() {
		t.Fatalf("flushed to the new end: %v still waits", got)
	}
	w.arrived(500, at(9))
	if got := w.truncate(50); !got.IsZero() || w.n != 0 {
		t.Fatalf("truncate below what was flushed: oldest %v, %d samples; want none", got, w.n)
	}
}

// TestLinkStatsCountRefusalsAndReconnects: a safekeeper that refuses three
// connections with FATAL 53300 and then greets is counted — three refusals
// of 53300, three reconnects — and shown streaming with the id it greeted
// with once its connection is in the term again.
func TestLinkStatsCountRefusalsAndReconnects(t *testing.T) {
	const refusals = 3
	addr := fakeSafekeeper(t, func(n int, c net.Conn, be *pgproto3.Backend) {
		if n <= refusals {
			refuse(be, "53300")
			return
		}
		if greet(be) {
			grantVotes(be, nil)
		}
	})
	s, _ := streamingSessionLog(t, nil, addr)
	s.disconnect(s.sks[2])
	ctx, stop := linkToSafekeeper3(s)
	defer stop()
	deadline := time.After(30 * time.Second)
	for s.stats.Snapshot(time.Now()).Safekeepers[2].State != LinkStreaming {
		select {
		case ev := <-s.links.events:
			if err := s.onSafekeeper(ctx, ev); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatalf("the safekeeper is not streaming again within 30 s: %+v", s.stats.Snapshot(time.Now()).Safekeepers[2])
		}
	}
	l := s.stats.Snapshot(time.Now()).Safekeepers[2]
	if l.Refusals["53300"] != refusals || len(l.Refusals) != 1 || l.Reconnects != refusals || !strings.Contains(l.LastError, "53300") {
		t.Fatalf("link after %d refusals: %+v; want %d refusals of 53300, %d reconnects, the last error 53300", refusals, l, refusals, refusals)
	}
}
