package proposer

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto"
)

// discardUpstream is a replication connection whose peer reads and drops
// everything: the driver's standby status updates go nowhere.
func discardUpstream(t *testing.T) *upstream {
	t.Helper()
	client, server := net.Pipe()
	go io.Copy(io.Discard, server)
	t.Cleanup(func() { client.Close(); server.Close() })
	pcfg, err := pgconn.ParseConfig("host=127.0.0.1 user=test sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	pg, err := pgconn.Construct(&pgconn.HijackedConn{Conn: client, Config: pcfg, ParameterStatuses: map[string]string{}, TxStatus: 'I'})
	if err != nil {
		t.Fatal(err)
	}
	return &upstream{pg: pg}
}

// streamingSession is a driver of three safekeepers, elected on a new
// timeline at tlStart and streaming, with no IO except the discarded
// status updates: what the driver queues to safekeeper i is on outs[i].
func streamingSession(t *testing.T) (*driver, []chan []byte) {
	t.Helper()
	cfg, err := Config{Upstream: "host=127.0.0.1", Safekeepers: []string{"sk1:1", "sk2:1", "sk3:1"},
		TenantID: proto.ID{1}, TimelineID: proto.ID{2}, ProposerUUID: us}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s := newDriver(cfg, 0)
	s.up = discardUpstream(t)
	s.slot = newSlotKeeper(cfg.Upstream, cfg.SlotName, 0, s.log)
	var outs []chan []byte
	for i, sk := range s.sks {
		out := make(chan []byte, cfg.MaxInFlight+16)
		outs = append(outs, out)
		sk.gen, sk.out = 1, out
		r, err := s.sess.Greeted(i, info(0, 0, 0, nil))
		if err != nil {
			t.Fatal(err)
		}
		s.act(ctx, r)
	}
	b := s.sess.Core().Ballot()
	elect := false
	for i := range s.sks {
		v, f := grant(b, info(0, 0, 0, nil))
		for _, m := range []proto.Message{v, f} {
			r, err := s.sess.Receive(i, m)
			if err != nil {
				t.Fatal(err)
			}
			s.act(ctx, r)
			elect = elect || r.Elect
		}
	}
	if !elect {
		t.Fatal("a quorum granted, but the session did not ask for the election")
	}
	_, r, err := s.sess.Elect(^proto.LSN(0), tlStart)
	if err != nil {
		t.Fatal(err)
	}
	s.act(ctx, r)
	s.buf = newWALBuffer(tlStart)
	s.act(ctx, s.sess.PumpAll())
	for i := range outs {
		if m := queued(t, outs[i]); len(m) != 2 {
			t.Fatalf("safekeeper %d: %d messages after the election, want RequestVote and ProposerElected", i, len(m))
		} else if _, ok := m[1].(*proto.ProposerElected); !ok {
			t.Fatalf("safekeeper %d: %v after the election, want ProposerElected last", i, m)
		}
	}
	return s, outs
}

// queued decodes and removes everything queued on out.
func queued(t *testing.T, out chan []byte) []proto.Message {
	t.Helper()
	var ms []proto.Message
	for {
		select {
		case p := <-out:
			m, err := proto.DecodeProposerMessage(p)
			if err != nil {
				t.Fatal(err)
			}
			ms = append(ms, m)
		default:
			return ms
		}
	}
}

// respond delivers safekeeper i's SafeKeeperResponse with flush_lsn flush.
func respond(t *testing.T, s *driver, i int, flush proto.LSN) {
	t.Helper()
	r := &proto.SafeKeeperResponse{Term: s.sess.Core().Ballot().Term, FlushLSN: flush}
	if err := s.onSafekeeper(context.Background(), skEvent{sk: i, gen: s.sks[i].gen, msg: r}); err != nil {
		t.Fatal(err)
	}
}

// wantHeartbeat checks that ms is exactly one heartbeat carrying commit.
func wantHeartbeat(t *testing.T, who string, ms []proto.Message, at, commit proto.LSN) {
	t.Helper()
	if len(ms) != 1 {
		t.Fatalf("%s: %d messages queued (%v), want one heartbeat with commit_lsn %s", who, len(ms), ms, commit)
	}
	r, ok := ms[0].(*proto.SafeKeeperRequest)
	if !ok || r.BeginLSN != at || r.EndLSN != at || r.CommitLSN != commit {
		t.Fatalf("%s: queued %+v, want a heartbeat at %s with commit_lsn %s", who, ms[0], at, commit)
	}
}

// TestAdvancedCommitIsBroadcastAtOnce: the response that moves commit_lsn
// forward makes the driver queue a heartbeat carrying it to every
// safekeeper in the same pass, before any tick (readers of a safekeeper
// get WAL only up to its commit_lsn); a safekeeper whose commit heartbeat
// is still unanswered gets the next commit_lsn only after that answer.
func TestAdvancedCommitIsBroadcastAtOnce(t *testing.T) {
	s, outs := streamingSession(t)
	ctx := context.Background()
	end1 := tlStart + 1000
	if err := s.onUpstream(ctx, upstreamMsg{start: tlStart, wal: make([]byte, 1000)}); err != nil {
		t.Fatal(err)
	}
	for i := range outs {
		if ms := queued(t, outs[i]); len(ms) != 1 {
			t.Fatalf("safekeeper %d: %d messages, want the WAL request", i, len(ms))
		}
	}

	respond(t, s, 0, end1) // one of three: no quorum, commit_lsn stays
	for i := range outs {
		if ms := queued(t, outs[i]); len(ms) != 0 {
			t.Fatalf("safekeeper %d: %v queued before commit_lsn moved", i, ms)
		}
	}
	respond(t, s, 1, end1) // a quorum: commit_lsn = end1
	if s.sess.Core().CommitLSN() != end1 {
		t.Fatalf("commit_lsn %s, want %s", s.sess.Core().CommitLSN(), end1)
	}
	for i := range outs {
		// Safekeeper 3 has not answered its WAL yet; it gets the commit too.
		wantHeartbeat(t, s.cfg.Safekeepers[i], queued(t, outs[i]), end1, end1)
	}

	// More WAL; safekeeper 3 stays silent, so its commit heartbeat stays
	// unanswered while commit_lsn advances again.
	end2 := end1 + 500
	if err := s.onUpstream(ctx, upstreamMsg{start: end1, wal: make([]byte, 500)}); err != nil {
		t.Fatal(err)
	}
	for i := range outs {
		queued(t, outs[i])
	}
	for i := range 2 {
		respond(t, s, i, end1) // the heartbeat
		respond(t, s, i, end2) // the WAL
	}
	if s.sess.Core().CommitLSN() != end2 {
		t.Fatalf("commit_lsn %s, want %s", s.sess.Core().CommitLSN(), end2)
	}
	for i := range 2 {
		wantHeartbeat(t, s.cfg.Safekeepers[i], queued(t, outs[i]), end2, end2)
	}
	if ms := queued(t, outs[2]); len(ms) != 0 {
		t.Fatalf("safekeeper 3 got %v with its commit heartbeat unanswered, want nothing (no flooding)", ms)
	}
	respond(t, s, 2, end1) // its first WAL request: the heartbeat is still out
	if ms := queued(t, outs[2]); len(ms) != 0 {
		t.Fatalf("safekeeper 3 got %v with its commit heartbeat unanswered, want nothing", ms)
	}
	respond(t, s, 2, end1) // the heartbeat: now it gets the newer commit_lsn
	wantHeartbeat(t, s.cfg.Safekeepers[2], queued(t, outs[2]), end2, end2)
}

// TestDeposedErrorNamesTheSafekeeper: the error Run and Sync return names
// the safekeeper that showed the higher term by its configured address, with
// both terms (the core knows only indexes).
func TestDeposedErrorNamesTheSafekeeper(t *testing.T) {
	s, _ := streamingSession(t)
	if err := s.onUpstream(context.Background(), upstreamMsg{start: tlStart, wal: make([]byte, 100)}); err != nil {
		t.Fatal(err)
	}
	r := &proto.SafeKeeperResponse{Term: s.sess.Core().Ballot().Term + 3}
	err := s.onSafekeeper(context.Background(), skEvent{sk: 1, gen: s.sks[1].gen, msg: r})
	err = nameDeposed(err, s.cfg.Safekeepers)
	var de *DeposedError
	if !errors.As(err, &de) || !errors.Is(err, ErrDeposed) {
		t.Fatalf("got %v, want a *DeposedError", err)
	}
	want := "proposer: deposed: safekeeper sk2:1 is at term 4, above our term 1"
	if err.Error() != want {
		t.Fatalf("got %q, want %q", err, want)
	}
}

// TestRegrantedSafekeeperGetsBufferedWAL: WAL the primary sent while no
// safekeeper was connected waits in the buffer (nothing pumps it: no one
// streams). When the safekeepers reconnect and are granted the ballot
// again, each is sent that WAL at once — not only at the next WAL from the
// primary or response, which may never come while the full buffer has
// paused the primary's stream (TestEndToEnd hung so after kill -9 of every
// safekeeper and pg_switch_wal).
func TestRegrantedSafekeeperGetsBufferedWAL(t *testing.T) {
	s, outs := streamingSession(t)
	ctx := context.Background()
	for i := range outs {
		s.disconnect(s.sks[i])
	}
	if err := s.onUpstream(ctx, upstreamMsg{start: tlStart, wal: make([]byte, 3000)}); err != nil {
		t.Fatal(err)
	}
	b := s.sess.Core().Ballot()
	h := proto.TermHistory{{Term: b.Term, StartLSN: tlStart}}
	for i := range outs {
		out := make(chan []byte, s.cfg.MaxInFlight+16)
		outs[i] = out
		greeting := info(b.Term, tlStart, 0, h)
		greeting.VotedFor = b
		if err := s.onSafekeeper(ctx, skEvent{sk: i, gen: 2, info: greeting, out: out}); err != nil {
			t.Fatal(err)
		}
		v, f := grant(b, greeting)
		for _, m := range []proto.Message{v, f} {
			if err := s.onSafekeeper(ctx, skEvent{sk: i, gen: 2, msg: m}); err != nil {
				t.Fatal(err)
			}
		}
		ms := queued(t, out)
		var wal proto.LSN
		for _, m := range ms {
			if r, ok := m.(*proto.SafeKeeperRequest); ok {
				wal += r.EndLSN - r.BeginLSN
			}
		}
		if wal != 3000 {
			t.Fatalf("safekeeper %d re-granted: %d bytes of the buffered WAL sent (%v), want all 3000 at once", i, wal, ms)
		}
	}
}
