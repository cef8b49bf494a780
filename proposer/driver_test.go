package proposer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proto"
)

// discardUpstream is a replication connection whose peer reads and drops
// everything: the driver's standby status updates go nowhere.
func discardUpstream(t *testing.T) *client.Replication {
	t.Helper()
	ours, server := net.Pipe()
	go io.Copy(io.Discard, server)
	t.Cleanup(func() { ours.Close(); server.Close() })
	pcfg, err := pgconn.ParseConfig("host=127.0.0.1 user=test sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	pg, err := pgconn.Construct(&pgconn.HijackedConn{Conn: ours, Config: pcfg, ParameterStatuses: map[string]string{}, TxStatus: 'I'})
	if err != nil {
		t.Fatal(err)
	}
	return client.NewReplication(pg)
}

// streamingSession is a driver of three safekeepers, elected on a new
// timeline at tlStart and streaming, with no IO except the discarded
// status updates: what the driver queues to safekeeper i is on outs[i].
func streamingSession(t *testing.T) (*driver, []chan []byte) {
	t.Helper()
	return streamingSessionLog(t, nil, "sk3:1")
}

// streamingSessionLog is streamingSession logging to log, with the third
// safekeeper at sk3.
func streamingSessionLog(t *testing.T, log *slog.Logger, sk3 string) (*driver, []chan []byte) {
	t.Helper()
	cfg, err := Config{Upstream: "host=127.0.0.1", Safekeepers: []string{"sk1:1", "sk2:1", sk3},
		TenantID: proto.ID{1}, TimelineID: proto.ID{2}, ProposerUUID: us, Logger: log}.withDefaults()
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

// TestAdvancedCommitRidesOnWALOrComesSoon: the response that moves
// commit_lsn forward queues nothing by itself. The next WAL carries the new
// commit_lsn to every safekeeper in its AppendRequest, and then the driver's
// commit tick adds nothing; with no WAL, that tick (commitHeartbeatDelay
// later) sends each idle safekeeper a heartbeat with it (readers of a
// safekeeper get WAL only up to its commit_lsn).
func TestAdvancedCommitRidesOnWALOrComesSoon(t *testing.T) {
	s, outs := streamingSession(t)
	ctx := context.Background()
	// The session's clock: every tick below is commitHeartbeatDelay after
	// the last request, far inside the heartbeat interval.
	t0 := time.Unix(3000, 0)
	s.act(ctx, s.sess.Tick(sessionTime(t0)))
	for i := range outs {
		queued(t, outs[i])
	}
	commitTick := func() {
		<-s.commitTick
		s.commitTick = nil
		s.act(ctx, s.sess.Tick(sessionTime(t0.Add(commitHeartbeatDelay))))
	}
	end1 := tlStart + 1000
	if err := s.onUpstream(ctx, client.StreamMsg{Start: tlStart, WAL: make([]byte, 1000)}); err != nil {
		t.Fatal(err)
	}
	for i := range outs {
		if ms := queued(t, outs[i]); len(ms) != 1 {
			t.Fatalf("safekeeper %d: %d messages, want the WAL request", i, len(ms))
		}
	}
	respond(t, s, 0, end1) // one of three: no quorum, commit_lsn stays
	if s.commitTick != nil {
		t.Fatal("commit tick armed before commit_lsn moved")
	}
	respond(t, s, 1, end1) // a quorum: commit_lsn = end1
	if s.sess.Core().CommitLSN() != end1 {
		t.Fatalf("commit_lsn %s, want %s", s.sess.Core().CommitLSN(), end1)
	}
	for i := range outs {
		if ms := queued(t, outs[i]); len(ms) != 0 {
			t.Fatalf("safekeeper %d: %v queued at once, want nothing until WAL or the commit tick", i, ms)
		}
	}
	if s.commitTick == nil {
		t.Fatal("commit_lsn advanced, but no commit tick is armed")
	}

	// WAL comes first: it carries commit_lsn, and the tick sends nothing.
	end2 := end1 + 500
	if err := s.onUpstream(ctx, client.StreamMsg{Start: end1, WAL: make([]byte, 500)}); err != nil {
		t.Fatal(err)
	}
	for i := range outs {
		ms := queued(t, outs[i])
		if r, ok := ms[0].(*proto.SafeKeeperRequest); len(ms) != 1 || !ok || r.CommitLSN != end1 || r.EndLSN != end2 {
			t.Fatalf("safekeeper %d: %v, want the WAL request carrying commit_lsn %s", i, ms, end1)
		}
	}
	commitTick()
	for i := range outs {
		if ms := queued(t, outs[i]); len(ms) != 0 {
			t.Fatalf("safekeeper %d: the commit tick sent %v though the WAL request carried commit_lsn", i, ms)
		}
	}

	// No WAL follows: the commit tick brings it to every safekeeper.
	for i := range 2 {
		respond(t, s, i, end2)
	}
	if s.sess.Core().CommitLSN() != end2 || s.commitTick == nil {
		t.Fatalf("commit_lsn %s (want %s), commit tick armed: %v", s.sess.Core().CommitLSN(), end2, s.commitTick != nil)
	}
	commitTick()
	for i := range outs {
		wantHeartbeat(t, s.cfg.Safekeepers[i], queued(t, outs[i]), end2, end2)
	}
}

// TestDeposedErrorNamesTheSafekeeper: the error Run and Sync return names
// the safekeeper that showed the higher term by its configured address, with
// both terms (the core knows only indexes).
func TestDeposedErrorNamesTheSafekeeper(t *testing.T) {
	s, _ := streamingSession(t)
	if err := s.onUpstream(context.Background(), client.StreamMsg{Start: tlStart, WAL: make([]byte, 100)}); err != nil {
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
	if err := s.onUpstream(ctx, client.StreamMsg{Start: tlStart, WAL: make([]byte, 3000)}); err != nil {
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

// logRecords keeps every record logged through it.
type logRecords struct {
	mu   *sync.Mutex
	recs *[]slog.Record
}

func newLogRecords() logRecords { return logRecords{mu: new(sync.Mutex), recs: new([]slog.Record)} }

func (h logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h logRecords) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, r.Clone())
	return nil
}
func (h logRecords) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logRecords) WithGroup(string) slog.Handler      { return h }

// records returns the records so far whose message is msg (any, if "")
// and whose "safekeeper" attribute is sk.
func (h logRecords) records(msg, sk string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range *h.recs {
		if msg != "" && r.Message != msg {
			continue
		}
		match := false
		r.Attrs(func(a slog.Attr) bool {
			match = match || (a.Key == "safekeeper" && a.Value.String() == sk)
			return true
		})
		if match {
			out = append(out, r)
		}
	}
	return out
}

// TestRefusingSafekeeperLogsOnceNotPerRetry: a safekeeper whose disk
// breaker refuses WAL greets, grants the vote, takes ProposerElected and
// answers the first WAL with FATAL 53100, once per reconnect. Over 8
// refusals the driver logs one warning, naming the 53100 each time (not
// the reset its unread WAL caused, which made the reason alternate), and
// the connection's progress lines (greeted, vote granted, streaming) are
// at info for the first connection and the first reconnect only, not once
// more per retry.
func TestRefusingSafekeeperLogsOnceNotPerRetry(t *testing.T) {
	const refusals = 8
	addr := fakeSafekeeper(t, func(n int, c net.Conn, be *pgproto3.Backend) {
		if !greet(be) {
			return
		}
		grantVotes(be, func(r *proto.SafeKeeperRequest) bool {
			if len(r.WAL) == 0 {
				return true
			}
			be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "53100", Message: "could not write WAL: the disk breaker is tripped"})
			be.Flush()
			return false // closed with the rest of the WAL unread: a reset
		})
	})
	log := newLogRecords()
	s, _ := streamingSessionLog(t, slog.New(log), addr)
	if err := s.buf.add(tlStart, make([]byte, 4*proto.MaxWALPerRequest)); err != nil {
		t.Fatal(err)
	}
	s.disconnect(s.sks[2]) // from here on a real connection to the fake safekeeper
	before := len(log.records("", addr))
	ctx, stop := linkToSafekeeper3(s)
	defer stop()
	const ended = "safekeeper connection ended; reconnecting"
	deadline := time.After(30 * time.Second)
	for len(log.records(ended, addr)) < refusals {
		select {
		case ev := <-s.links.events:
			if err := s.onSafekeeper(ctx, ev); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatalf("%d refusals within 30 s, want %d", len(log.records(ended, addr)), refusals)
		}
	}
	for i, r := range log.records(ended, addr)[:refusals] {
		var err error
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" {
				err, _ = a.Value.Any().(error)
			}
			return true
		})
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "53100" {
			t.Errorf("refusal %d: logged with %v, want the safekeeper's 53100", i+1, err)
		}
		if want := map[bool]slog.Level{true: slog.LevelWarn, false: slog.LevelDebug}[i == 0]; r.Level != want {
			t.Errorf("refusal %d: logged at %v, want %v", i+1, r.Level, want)
		}
	}
	var info []string
	for _, r := range log.records("", addr)[before:] {
		if r.Level == slog.LevelInfo {
			info = append(info, r.Message)
		}
	}
	if len(info) != 6 {
		t.Errorf("%d info lines over %d refusals: %q; want the 3 of the first connection and the 3 of the first reconnect (greeted, vote granted, streaming)", len(info), refusals, info)
	}
}

// TestReconnectAfterAnOutageIsLoggedAtInfo: a safekeeper that refuses
// before greeting (down, restarting) for several attempts, with the same
// reason each time and so one warning, and then greets: that connection's
// lines are at info, so the last word about it is not that it is down.
func TestReconnectAfterAnOutageIsLoggedAtInfo(t *testing.T) {
	const outage = 4
	addr := fakeSafekeeper(t, func(n int, c net.Conn, be *pgproto3.Backend) {
		if n <= outage {
			be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "57P03", Message: "the database system is starting up"})
			be.Flush()
			return
		}
		if greet(be) {
			grantVotes(be, nil)
		}
	})
	log := newLogRecords()
	s, _ := streamingSessionLog(t, slog.New(log), addr)
	s.disconnect(s.sks[2]) // from here on a real connection to the fake safekeeper
	greetedBefore := len(log.records("safekeeper greeted", addr))
	ctx, stop := linkToSafekeeper3(s)
	defer stop()
	deadline := time.After(30 * time.Second)
	for len(log.records("safekeeper greeted", addr)) == greetedBefore {
		select {
		case ev := <-s.links.events:
			if err := s.onSafekeeper(ctx, ev); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("the safekeeper never greeted after its outage")
		}
	}
	ended := log.records("safekeeper connection ended; reconnecting", addr)
	warned := 0
	for _, r := range ended {
		if r.Level == slog.LevelWarn {
			warned++
		}
	}
	if len(ended) != outage || warned != 1 {
		t.Errorf("%d refusals logged, %d as warnings; want %d, 1", len(ended), warned, outage)
	}
	if r := log.records("safekeeper greeted", addr)[greetedBefore]; r.Level != slog.LevelInfo {
		t.Errorf("the greeting after the outage logged at %v, want INFO", r.Level)
	}
}

// grantVotes serves a greeted connection of a fake safekeeper: it grants
// every vote and hands each SafeKeeperRequest to onRequest (nil: take it),
// until onRequest returns false or the connection ends.
func grantVotes(be *pgproto3.Backend, onRequest func(*proto.SafeKeeperRequest) bool) {
	for {
		m, err := be.Receive()
		if err != nil {
			return
		}
		cd, ok := m.(*pgproto3.CopyData)
		if !ok {
			return
		}
		pm, err := proto.DecodeProposerMessage(cd.Data)
		if err != nil {
			return
		}
		switch pm := pm.(type) {
		case *proto.RequestVote:
			v, f := grant(pm.Candidate, info(0, 0, 0, nil))
			be.Send(&pgproto3.CopyData{Data: v.Encode(nil)})
			be.Send(&pgproto3.CopyData{Data: f.Encode(nil)})
			if be.Flush() != nil {
				return
			}
		case *proto.SafeKeeperRequest:
			if onRequest != nil && !onRequest(pm) {
				return
			}
		}
	}
}

// linkToSafekeeper3 gives driver s a real link to its third safekeeper
// (a fake one, after s.disconnect), whose events the test hands to
// s.onSafekeeper; stop ends it.
func linkToSafekeeper3(s *driver) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	s.links = &skLinks{
		addrs: s.cfg.Safekeepers, si: &proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, TenantID: proto.ID{1}, TimelineID: proto.ID{2}},
		queueCap: s.cfg.MaxInFlight + 16, bo: backoff{min: time.Millisecond, max: 5 * time.Millisecond}, log: s.log, stats: s.stats,
		events: make(chan skEvent, 16), dial: client.DialConfig{TenantID: proto.ID{1}, TimelineID: proto.ID{2}, ConnectTimeout: 5 * time.Second},
	}
	s.links.wg.Add(1)
	go func() { defer s.links.wg.Done(); s.links.loop(ctx, 2) }()
	return ctx, func() { cancel(); s.links.wg.Wait() }
}

// TestMissingTimelineOnAQuorumEndsTheSession: safekeepers answering a
// greeting not allowed to create the timeline that they do not hold end
// the session with ErrNoTimeline once they are a quorum and none holds it,
// naming them; while fewer answered so, or once one safekeeper greeted
// and is still connected (the timeline exists: the others create it at
// their next greeting), the
// session goes on.
func TestMissingTimelineOnAQuorumEndsTheSession(t *testing.T) {
	addrs := []string{"sk1:5454", "sk2:5454", "sk3:5454"}
	cfg, err := Config{Upstream: "-", Safekeepers: addrs, TenantID: proto.ID{1}, TimelineID: proto.ID{2}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	missing := func(sk int) skEvent {
		return skEvent{sk: sk, gen: 1, missing: true, err: &pgconn.PgError{Severity: "FATAL", Code: "42704", Message: "timeline does not exist"}}
	}
	for _, exists := range []bool{false, true} {
		s := newDriver(cfg, 0)
		if exists {
			s.holding.Add(1)
		}
		s.links = &skLinks{addrs: addrs}
		if err := s.onSafekeeper(context.Background(), missing(0)); err != nil {
			t.Fatalf("exists=%v: one safekeeper without the timeline ended the session: %v", exists, err)
		}
		err := s.onSafekeeper(context.Background(), missing(2))
		switch {
		case exists && err != nil:
			t.Fatalf("a quorum without the timeline, but another safekeeper holds it: %v; want the session to go on", err)
		case !exists && (!errors.Is(err, ErrNoTimeline) || !strings.Contains(err.Error(), "sk1:5454, sk3:5454")):
			t.Fatalf("a quorum without the timeline, none holding it: %v; want ErrNoTimeline naming sk1 and sk3", err)
		}
	}
}
