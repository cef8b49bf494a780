package proposer

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// attr returns the value of r's attribute key.
func attr(r slog.Record, key string) slog.Value {
	var v slog.Value
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

// TestPrimaryOutageWarnsOnceThenEveryMinute: a primary down for 150
// attempts a second apart is warned about at the first attempt and then
// once a minute, each repeat with the attempts held back since the last
// (same_before) and how long the primary has been down; the others are at
// debug. Its return is one info line with how long it was gone. A new
// outage afterwards is warned about at once.
func TestPrimaryOutageWarnsOnceThenEveryMinute(t *testing.T) {
	log := newLogRecords()
	o := primaryOutage{log: slog.New(log)}
	t0 := time.Unix(10000, 0)
	refused := &pgconn.PgError{Severity: "FATAL", Code: "57P03", Message: "the database system is starting up"}
	for i := range 150 {
		o.failed(t0.Add(time.Duration(i)*time.Second), refused, 3, time.Second)
	}
	o.back(t0.Add(150 * time.Second))
	var warned []slog.Record
	debug := 0
	for _, r := range *log.recs {
		switch {
		case r.Message == sessionEndedMsg && r.Level == slog.LevelWarn:
			warned = append(warned, r)
		case r.Message == sessionEndedMsg && r.Level == slog.LevelDebug:
			debug++
		}
	}
	if len(warned) != 3 || debug != 147 {
		t.Fatalf("150 failed attempts in 150 s: %d warnings, %d at debug; want 3 (at 0, 60 and 120 s), 147", len(warned), debug)
	}
	for i, r := range warned {
		downFor, skipped := attr(r, "primary_down_for").Duration(), attr(r, "same_before").Int64()
		wantSkipped := int64(59)
		if i == 0 {
			wantSkipped = 0
		}
		if downFor != time.Duration(i)*time.Minute || skipped != wantSkipped {
			t.Errorf("warning %d: primary_down_for %v, same_before %d; want %v, %d", i+1, downFor, skipped, time.Duration(i)*time.Minute, wantSkipped)
		}
	}
	var backs []slog.Record
	for _, r := range *log.recs {
		if r.Message == "the primary is back" {
			backs = append(backs, r)
		}
	}
	if len(backs) != 1 || backs[0].Level != slog.LevelInfo || attr(backs[0], "down_for").Duration() != 150*time.Second ||
		attr(backs[0], "failed_attempts").Int64() != 150 {
		t.Fatalf("the primary's return: %v; want one info line, down_for 2m30s, failed_attempts 150", backs)
	}
	// The next outage, seconds later, with the same reason: news again.
	o.failed(t0.Add(155*time.Second), refused, 4, time.Second)
	if last := (*log.recs)[len(*log.recs)-1]; last.Level != slog.LevelWarn || attr(last, "primary_down_for").Duration() != 0 {
		t.Fatalf("a new outage: %v %v, want a warning, primary_down_for 0", last.Level, last.Message)
	}
}

// switchablePrimary is a primary on 127.0.0.1 that refuses every
// connection with FATAL 57P03 (starting up) while up is false, and
// otherwise answers what a session asks before it greets the safekeepers
// (IDENTIFY_SYSTEM, the SHOWs, CREATE_REPLICATION_SLOT); everything else
// gets an error. refusals counts the connections refused.
func switchablePrimary(t *testing.T) (addr string, up *atomic.Bool, refusals *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	up, refusals = new(atomic.Bool), new(atomic.Int32)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				be := pgproto3.NewBackend(c, c)
				if _, err := be.ReceiveStartupMessage(); err != nil {
					return
				}
				if !up.Load() {
					refusals.Add(1)
					be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "57P03", Message: "the database system is starting up"})
					be.Flush()
					return
				}
				serveIdentify(be, nil)
			}()
		}
	}()
	return l.Addr().String(), up, refusals
}

// serveIdentify answers a replication connection's IDENTIFY_SYSTEM, SHOW
// wal_segment_size, SHOW server_version_num and CREATE_REPLICATION_SLOT as
// a PostgreSQL 15 primary at 0/1000000 would (the slot refused with
// slotErr when it is not nil), and any other query with an error.
func serveIdentify(be *pgproto3.Backend, slotErr *pgproto3.ErrorResponse) {
	be.Send(&pgproto3.AuthenticationOk{})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	be.Flush()
	rows := func(cols []string, vals ...string) {
		var fds []pgproto3.FieldDescription
		var row [][]byte
		for i, col := range cols {
			fds = append(fds, pgproto3.FieldDescription{Name: []byte(col), DataTypeOID: 25})
			row = append(row, []byte(vals[i]))
		}
		be.Send(&pgproto3.RowDescription{Fields: fds})
		be.Send(&pgproto3.DataRow{Values: row})
		be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
	}
	for {
		m, err := be.Receive()
		if err != nil {
			return
		}
		q, ok := m.(*pgproto3.Query)
		if !ok {
			return
		}
		switch {
		case q.String == "IDENTIFY_SYSTEM":
			rows([]string{"systemid", "timeline", "xlogpos", "dbname"}, "7300000000000000001", "1", "0/1000000", "")
		case q.String == "SHOW wal_segment_size":
			rows([]string{"wal_segment_size"}, "16MB")
		case q.String == "SHOW server_version_num":
			rows([]string{"server_version_num"}, "150000")
		case strings.HasPrefix(q.String, "CREATE_REPLICATION_SLOT") && slotErr != nil:
			be.Send(slotErr)
		case strings.HasPrefix(q.String, "CREATE_REPLICATION_SLOT"):
			rows([]string{"slot_name", "consistent_point", "snapshot_name", "output_plugin"}, "proposer", "0/1000000", "", "")
		default:
			be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "XX000", Message: "unexpected " + q.String})
		}
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		if be.Flush() != nil {
			return
		}
	}
}

// TestRunLogsAnUnreachablePrimaryOnce: Run against a primary that refuses
// (57P03) attempt after attempt, retried every few milliseconds, warns
// once, logs the other attempts at debug, and shows the primary as
// unreachable in its Stats with the primary's error; when the primary
// answers again, one info line says it is back, with the failed attempts
// and how long it was gone, and Stats no longer says no_primary.
func TestRunLogsAnUnreachablePrimaryOnce(t *testing.T) {
	addr, up, refusals := switchablePrimary(t)
	nobody := fakeSafekeeper(t, func(n int, c net.Conn, be *pgproto3.Backend) { refuse(be, "57P03") })
	host, port, _ := net.SplitHostPort(addr)
	log := newLogRecords()
	stats := NewStats([]string{nobody})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			Upstream:    "host=" + host + " port=" + port + " user=postgres sslmode=disable",
			Safekeepers: []string{nobody}, TenantID: [16]byte{1}, TimelineID: [16]byte{2},
			ReconnectMin: time.Millisecond, ReconnectMax: 5 * time.Millisecond, ProposerLease: -1,
			Create: true, // no safekeeper answers: the session goes on to the slot without asking them for the timeline
			Logger: slog.New(log), Stats: stats,
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond) // polling a condition, with a deadline
		}
	}
	const attempts = 20
	waitFor("20 refused attempts", func() bool { return refusals.Load() >= attempts })
	snap := stats.Snapshot(time.Now())
	if snap.State != StateNoPrimary || !strings.Contains(snap.Reason, "57P03") {
		t.Fatalf("while the primary refuses: state %s (%q), want no_primary with its 57P03", snap.State, snap.Reason)
	}
	up.Store(true)
	waitFor("the session to reach the primary", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		for _, r := range *log.recs {
			if r.Message == "connected to primary" {
				return true
			}
		}
		return false
	})
	var warned, debug int
	var back slog.Record
	log.mu.Lock()
	for _, r := range *log.recs {
		switch {
		case r.Message == sessionEndedMsg && r.Level == slog.LevelWarn:
			warned++
		case r.Message == sessionEndedMsg:
			debug++
		case r.Message == "the primary is back":
			back = r
		}
	}
	log.mu.Unlock()
	failed := int64(refusals.Load())
	if warned != 1 || int64(warned+debug) != failed {
		t.Errorf("%d attempts refused: %d warnings, %d lines at debug; want 1 warning and the rest at debug", failed, warned, debug)
	}
	if back.Message == "" {
		t.Errorf("the session reached the primary after %d refused attempts, and no line says the primary is back", failed)
	} else if back.Level != slog.LevelInfo || attr(back, "failed_attempts").Int64() != failed || attr(back, "down_for").Duration() <= 0 {
		t.Errorf("the primary's return: %v %q failed_attempts=%v down_for=%v; want info, %d attempts and how long", back.Level, back.Message,
			attr(back, "failed_attempts"), attr(back, "down_for"), failed)
	}
	if snap := stats.Snapshot(time.Now()); snap.State == StateNoPrimary {
		t.Errorf("the primary is back, but Stats says %s (%q)", snap.State, snap.Reason)
	}
}

// TestStandbyAsUpstreamIsNeverProposedFor: a server in recovery (a hot
// standby: in_hot_standby on at connection start) named as --upstream is
// not a primary. Run never greets a safekeeper for it — it would win the
// timeline's term and the real primary's commits would wait — and says why,
// once, retrying in case the standby is promoted.
func TestStandbyAsUpstreamIsNeverProposedFor(t *testing.T) {
	var standbyConns atomic.Int32
	standby := fakeSafekeeper(t, func(n int, c net.Conn, be *pgproto3.Backend) { // a fake server: here a standby
		standbyConns.Add(1)
		be.Send(&pgproto3.ParameterStatus{Name: "in_hot_standby", Value: "on"})
		serveIdentify(be, nil)
	})
	var greeted atomic.Int32
	sk := fakeSafekeeper(t, func(n int, c net.Conn, be *pgproto3.Backend) { greeted.Add(1) })
	host, port, _ := net.SplitHostPort(standby)
	log := newLogRecords()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			Upstream:    "host=" + host + " port=" + port + " user=postgres sslmode=disable",
			Safekeepers: []string{sk}, TenantID: [16]byte{1}, TimelineID: [16]byte{2},
			ReconnectMin: time.Millisecond, ReconnectMax: 5 * time.Millisecond, ProposerLease: -1,
			Create: true, // nothing stops it before the safekeepers but the standby check
			Logger: slog.New(log),
		})
	}()
	waitUntil(t, 10*time.Second, "Run to try the standby 5 times", func() bool { return standbyConns.Load() >= 5 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	if n := standbyConns.Load(); n < 5 {
		t.Fatalf("Run connected to the standby %d times in 10 s; want it to retry", n)
	}
	if n := greeted.Load(); n != 0 {
		t.Fatalf("Run connected to a safekeeper %d times for a standby", n)
	}
	var warned int
	log.mu.Lock()
	recs := append([]slog.Record(nil), *log.recs...)
	log.mu.Unlock()
	for _, r := range recs {
		if r.Message == sessionEndedMsg && r.Level == slog.LevelWarn {
			warned++
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "err" && !strings.Contains(a.Value.String(), "standby in recovery") {
					t.Errorf("the warning's error %q does not say the upstream is a standby", a.Value)
				}
				return true
			})
		}
	}
	if warned != 1 {
		t.Fatalf("%d warnings about the standby; want 1", warned)
	}
}

// waitUntil polls cond until it holds or d passes (then the test fails).
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, with a deadline
	}
}
