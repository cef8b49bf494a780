package session

import (
	"errors"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

// memWAL is a WALSource over one in-memory WAL from tlStart.
type memWAL struct{ wal []byte }

func (m *memWAL) WAL(_ int, lsn proto.LSN, limit int) []byte {
	if lsn < tlStart || lsn >= m.End() {
		return nil
	}
	d := m.wal[lsn-tlStart:]
	return d[:min(len(d), limit)]
}

func (m *memWAL) End() proto.LSN { return tlStart + proto.LSN(len(m.wal)) }

func newTestSession(n, inflight int, src WALSource) *Session {
	return New(Config{N: n, UUID: us, MaxInFlight: inflight, HeartbeatInterval: 200 * Millisecond}, src)
}

// sends lists, per safekeeper, the types of the messages r sends.
func sendsTo(r Ready, i int) []string {
	var out []string
	for _, m := range r.Sends {
		if m.To == i {
			switch m.Msg.(type) {
			case *proto.RequestVote:
				out = append(out, "vote")
			case *proto.ProposerElected:
				out = append(out, "elected")
			case *proto.SafeKeeperRequest:
				out = append(out, "request")
			default:
				out = append(out, "?")
			}
		}
	}
	return out
}

// mustReady returns a function that fails t on a Session error.
func mustReady(t *testing.T) func(Ready, error) Ready {
	return func(r Ready, err error) Ready {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
}

// electSession greets every safekeeper of s (none has WAL), has the first
// `voters` grant, and elects on a new timeline at tlStart.
func electSession(t *testing.T, s *Session, voters int) Ready {
	t.Helper()
	must := mustReady(t)
	for i := range s.links {
		must(s.Greeted(i, info(0, 0, 0, nil)))
	}
	var elect bool
	for i := range voters {
		v, f := grant(s.Core().Ballot(), info(0, 0, 0, nil))
		must(s.Receive(i, v))
		r := must(s.Receive(i, f))
		elect = elect || r.Elect
	}
	if !elect {
		t.Fatal("a quorum granted, but the session did not ask for the election")
	}
	_, r, err := s.Elect(^proto.LSN(0), tlStart)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSessionCampaignsOnceAQuorumGreeted: no vote is asked before a quorum
// greeted (the term must be above every term a quorum saw); then every
// greeted safekeeper is asked, and one greeting later is asked at once.
func TestSessionCampaignsOnceAQuorumGreeted(t *testing.T) {
	must := mustReady(t)
	s := newTestSession(3, 4, &memWAL{})
	if r := must(s.Greeted(0, info(3, 0, 0, nil))); len(r.Sends) != 0 {
		t.Fatalf("one greeting of three: %v sent", r.Sends)
	}
	r := must(s.Greeted(1, info(5, 0, 0, nil)))
	if len(sendsTo(r, 0)) != 1 || len(sendsTo(r, 1)) != 1 || s.Core().Ballot().Term != 6 {
		t.Fatalf("a quorum greeted: %v, ballot %s; want a vote asked of both, term 6", r.Sends, s.Core().Ballot())
	}
	if got := sendsTo(must(s.Greeted(2, info(0, 0, 0, nil))), 2); len(got) != 1 || got[0] != "vote" {
		t.Fatalf("a late greeting: %v, want its vote asked", got)
	}
}

// TestSessionElectsAndStartsLateVoters: a quorum of grants asks for the
// election; Elect sends ProposerElected to the voters; a safekeeper granted
// afterwards gets its ProposerElected and the WAL there is at once.
func TestSessionElectsAndStartsLateVoters(t *testing.T) {
	must := mustReady(t)
	src := &memWAL{}
	s := newTestSession(3, 4, src)
	r := electSession(t, s, 2)
	for i := range 2 {
		if got := sendsTo(r, i); len(got) != 1 || got[0] != "elected" {
			t.Fatalf("safekeeper %d after the election: %v, want ProposerElected", i, got)
		}
	}
	if len(sendsTo(r, 2)) != 0 || s.Streaming(2) {
		t.Fatal("the safekeeper that did not vote was started")
	}
	src.wal = make([]byte, 1000)
	v, f := grant(s.Core().Ballot(), info(0, 0, 0, nil))
	must(s.Receive(2, v))
	if got := sendsTo(must(s.Receive(2, f)), 2); len(got) != 2 || got[0] != "elected" || got[1] != "request" {
		t.Fatalf("a late voter: %v, want ProposerElected then the WAL", got)
	}
}

// TestSessionBoundsThePipeline: at most MaxInFlight requests are
// unanswered per safekeeper; each response lets one more go.
func TestSessionBoundsThePipeline(t *testing.T) {
	must := mustReady(t)
	src := &memWAL{}
	s := newTestSession(3, 2, src)
	electSession(t, s, 3)
	src.wal = make([]byte, 5*proto.MaxWALPerRequest)
	if got := sendsTo(s.PumpAll(), 0); len(got) != 2 {
		t.Fatalf("with 5 requests of WAL and MaxInFlight 2: %v sent", got)
	}
	r := must(s.Receive(0, &proto.SafeKeeperResponse{Term: s.Core().Ballot().Term, FlushLSN: tlStart + proto.MaxWALPerRequest}))
	if got := sendsTo(r, 0); len(got) != 1 {
		t.Fatalf("after one response: %v sent, want one more request", got)
	}
}

// TestSessionBoundsTheBytesNotYetDurable: WAL sent to a safekeeper beyond
// its last answered request (a response means that request's WAL is
// durable there) stays within MaxInFlightBytes, however many requests
// MaxInFlight allows, so its disk queue and the wait for its next response
// stay short; each response lets as much go as it answered. It counts
// answered requests, not flush_lsn: an XLOG_SWITCH record ends only after
// its segment's padding, so flush_lsn stands still for up to 16 MiB while
// requests are answered, and that padding must still stream at full speed.
func TestSessionBoundsTheBytesNotYetDurable(t *testing.T) {
	must := mustReady(t)
	src := &memWAL{}
	const req = proto.MaxWALPerRequest
	s := New(Config{N: 3, UUID: us, MaxInFlight: 256, MaxInFlightBytes: 3 * req, HeartbeatInterval: 200 * Millisecond}, src)
	electSession(t, s, 3)
	src.wal = make([]byte, 20*req)
	if got := sendsTo(s.PumpAll(), 0); len(got) != 3 {
		t.Fatalf("20 requests of WAL, MaxInFlightBytes of 3: %d sent, want 3", len(got))
	}
	term := s.Core().Ballot().Term
	sent := 3
	// flush_lsn stuck at the start (a record longer than everything sent),
	// yet every response answers a request: one more goes for each.
	for range 10 {
		got := sendsTo(must(s.Receive(0, &proto.SafeKeeperResponse{Term: term, FlushLSN: tlStart})), 0)
		if len(got) != 1 {
			t.Fatalf("a response to one request of %d sent let %d go, want 1", sent, len(got))
		}
		sent++
		if s.InFlight(0) != 3 {
			t.Fatalf("%d requests unanswered, want the bound's 3", s.InFlight(0))
		}
	}
	// A safekeeper not yet answering gets nothing more however long it waits.
	if got := sendsTo(s.PumpAll(), 0); len(got) != 0 {
		t.Fatalf("with the bound's worth unanswered a pump sent %d", len(got))
	}
}

// TestSessionDropsAConnectionThatBreaksTheProtocol: a message with no place
// in the protocol (a response before any request) drops that connection
// only: Ready.Drop names it and the session has forgotten it.
func TestSessionDropsAConnectionThatBreaksTheProtocol(t *testing.T) {
	s := newTestSession(3, 4, &memWAL{})
	electSession(t, s, 3)
	r, err := s.Receive(1, &proto.SafeKeeperResponse{Term: s.Core().Ballot().Term, FlushLSN: tlStart})
	if err != nil || len(r.Drop) != 1 || r.Drop[0] != 1 || s.Streaming(1) || s.Core().Granted(1) {
		t.Fatalf("unexpected response: %+v, %v; want safekeeper 1 dropped and forgotten", r, err)
	}
	if !s.Streaming(0) || !s.Streaming(2) {
		t.Fatal("the other connections were dropped too")
	}
}

// TestSessionRefusedVoteEndsTheCampaign: during the campaign, a vote
// refused with a higher ballot ends the session (ErrVoteRefused), so the
// next one campaigns above it.
func TestSessionRefusedVoteEndsTheCampaign(t *testing.T) {
	must := mustReady(t)
	s := newTestSession(3, 4, &memWAL{})
	for i := range 3 {
		must(s.Greeted(i, info(0, 0, 0, nil)))
	}
	_, err := s.Receive(0, &proto.VoteResponse{VotedFor: proto.Ballot{Term: 9, UUID: proto.ID{0xee}}})
	if !errors.Is(err, ErrVoteRefused) || s.Core().MaxTermSeen() != 9 {
		t.Fatalf("refused vote: %v, max term seen %d; want ErrVoteRefused and term 9 remembered", err, s.Core().MaxTermSeen())
	}
}

// TestSessionTickSendsHeartbeats: an idle streaming safekeeper gets a
// heartbeat once HeartbeatInterval passed since its last request, not more
// often.
func TestSessionTickSendsHeartbeats(t *testing.T) {
	must := mustReady(t)
	s := newTestSession(3, 4, &memWAL{})
	electSession(t, s, 3)
	t0 := Instant(1000).Add(1000 * Millisecond)
	if got := sendsTo(s.Tick(t0), 0); len(got) != 1 || got[0] != "request" {
		t.Fatalf("first tick after the election: %v, want a heartbeat", got)
	}
	respondAll := func() {
		for i := range 3 {
			must(s.Receive(i, &proto.SafeKeeperResponse{Term: s.Core().Ballot().Term, FlushLSN: tlStart}))
		}
	}
	respondAll()
	// The responses moved commit_lsn to the timeline start: the next tick
	// carries it at once, whatever the interval.
	if got := sendsTo(s.Tick(t0.Add(50*Millisecond)), 0); len(got) != 1 {
		t.Fatalf("tick after commit_lsn moved: %v, want a heartbeat carrying it", got)
	}
	respondAll()
	if got := sendsTo(s.Tick(t0.Add(150*Millisecond)), 0); len(got) != 0 {
		t.Fatalf("100 ms after the last: %v, want nothing (interval 200 ms)", got)
	}
	if got := sendsTo(s.Tick(t0.Add(300*Millisecond)), 0); len(got) != 1 {
		t.Fatalf("250 ms after the last: %v, want a heartbeat", got)
	}
}
