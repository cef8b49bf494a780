package proposer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proto"
)

// fakeSafekeeper accepts connections on 127.0.0.1 and serves the n-th
// (from 1) with serve, which starts right after the startup message.
func fakeSafekeeper(t *testing.T, serve func(n int, c net.Conn, be *pgproto3.Backend)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var conns atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n := int(conns.Add(1))
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				be := pgproto3.NewBackend(c, c)
				if _, err := be.ReceiveStartupMessage(); err != nil {
					return
				}
				serve(n, c, be)
			}()
		}
	}()
	return l.Addr().String()
}

// greet takes the startup, START_WAL_PUSH and the ServerInfo, and answers
// with a SafeKeeperInfo: the connection is greeted.
func greet(be *pgproto3.Backend) bool {
	be.Send(&pgproto3.AuthenticationOk{})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if be.Flush() != nil {
		return false
	}
	if m, err := be.Receive(); err != nil {
		return false
	} else if q, ok := m.(*pgproto3.Query); !ok || !strings.HasPrefix(q.String, "START_WAL_PUSH") {
		return false
	}
	be.Send(&pgproto3.CopyBothResponse{})
	if be.Flush() != nil {
		return false
	}
	if m, err := be.Receive(); err != nil {
		return false
	} else if _, ok := m.(*pgproto3.CopyData); !ok {
		return false
	}
	be.Send(&pgproto3.CopyData{Data: (&proto.SafeKeeperInfo{ProtocolVersion: proto.ProtocolVersion}).Encode(nil)})
	return be.Flush() == nil
}

func refuse(be *pgproto3.Backend, code string) {
	be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: code, Message: "refused by the test safekeeper (" + code + ")"})
	be.Flush()
}

// reconnectLine is one "safekeeper connection ended; reconnecting" record.
type reconnectLine struct {
	level   slog.Level
	retryIn time.Duration
	err     error
}

// reconnectLog sends every reconnect line to lines.
type reconnectLog struct{ lines chan reconnectLine }

func (h reconnectLog) Enabled(context.Context, slog.Level) bool { return true }
func (h reconnectLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "safekeeper connection ended; reconnecting" {
		return nil
	}
	ln := reconnectLine{level: r.Level}
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "retry_in":
			ln.retryIn = a.Value.Duration()
		case "err":
			ln.err, _ = a.Value.Any().(error)
		}
		return true
	})
	select {
	case h.lines <- ln:
	default:
	}
	return nil
}
func (h reconnectLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h reconnectLog) WithGroup(string) slog.Handler      { return h }

// runLink runs one safekeeper link to addr with backoff bo, with an owner
// that only closes each connection's writer queue after its end (as the
// driver does), and returns its reconnect lines.
func runLink(t *testing.T, addr string, bo backoff) <-chan reconnectLine {
	t.Helper()
	lines := make(chan reconnectLine, 100)
	l := &skLinks{
		addrs: []string{addr}, si: &proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, TenantID: proto.ID{1}, TimelineID: proto.ID{2}},
		queueCap: 16, bo: bo, log: slog.New(reconnectLog{lines}), events: make(chan skEvent, 16),
		dial: client.DialConfig{TenantID: proto.ID{1}, TimelineID: proto.ID{2}, ConnectTimeout: 5 * time.Second},
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.start(ctx)
	ownerDone := make(chan struct{})
	go func() {
		defer close(ownerDone)
		outs := map[int]chan []byte{}
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-l.events:
				if ev.out != nil {
					outs[ev.gen] = ev.out
				} else if ev.err != nil && outs[ev.gen] != nil {
					close(outs[ev.gen])
					delete(outs, ev.gen)
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); l.wg.Wait(); <-ownerDone })
	return lines
}

// nextLines waits for n reconnect lines, up to a deadline.
func nextLines(t *testing.T, lines <-chan reconnectLine, n int, within time.Duration) []reconnectLine {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	var got []reconnectLine
	for len(got) < n {
		select {
		case ln := <-lines:
			got = append(got, ln)
		case <-deadline.C:
			t.Fatalf("%d reconnect lines within %v, want %d: %+v", len(got), within, n, got)
		}
	}
	return got
}

// TestLinkBacksOffWhenGreetedConnectionsEndAtOnce: a safekeeper that
// greets and then refuses at once (FATAL 53100, its disk breaker tripped)
// is retried with the backoff growing to the longest, 1 s — not every
// 100 ms as if each greeting were a recovery — and warned about once; the
// backoff starts over only after a connection that lasted the longest
// backoff (the 3rd here, held 1.2 s).
func TestLinkBacksOffWhenGreetedConnectionsEndAtOnce(t *testing.T) {
	addr := fakeSafekeeper(t, func(n int, c net.Conn, be *pgproto3.Backend) {
		if !greet(be) {
			return
		}
		if n == 3 {
			// A connection that lasts: wait for a message the link never
			// sends (nothing owns the session), then refuse.
			c.SetReadDeadline(time.Now().Add(1200 * time.Millisecond))
			be.Receive()
		}
		refuse(be, "53100")
	})
	lines := runLink(t, addr, backoff{min: defaultReconnectMin, max: defaultReconnectMax})
	got := nextLines(t, lines, 8, 30*time.Second)
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, // greeted, refused at once: no reset
		100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}
	var retries []time.Duration
	for _, ln := range got {
		retries = append(retries, ln.retryIn)
	}
	if !slices.Equal(retries, want) {
		t.Errorf("retry_in of attempts 1..8: %v, want %v", retries, want)
	}
	for i, ln := range got {
		var pe *pgconn.PgError
		if !errors.As(ln.err, &pe) || pe.Code != "53100" {
			t.Fatalf("attempt %d: err %v, want the safekeeper's 53100", i+1, ln.err)
		}
		if wantLevel := map[bool]slog.Level{true: slog.LevelWarn, false: slog.LevelDebug}[i == 0]; ln.level != wantLevel {
			t.Errorf("attempt %d: logged at %v, want %v (the same refusal is warned about once a minute)", i+1, ln.level, wantLevel)
		}
	}
}

// TestLinkWarnsAtOnceWhenTheRefusalChanges: repeated refusals for the same
// reason are warned about once (the rest at debug level), but a new
// reason — an authentication refusal turning from 28P01 into 28000 — is
// warned about at the attempt that brings it.
func TestLinkWarnsAtOnceWhenTheRefusalChanges(t *testing.T) {
	addr := fakeSafekeeper(t, func(n int, c net.Conn, be *pgproto3.Backend) {
		if n <= 3 {
			refuse(be, "28P01")
		} else {
			refuse(be, "28000")
		}
	})
	lines := runLink(t, addr, backoff{min: time.Millisecond, max: 5 * time.Millisecond})
	got := nextLines(t, lines, 5, 30*time.Second)
	for i, want := range []struct {
		code  string
		level slog.Level
	}{{"28P01", slog.LevelWarn}, {"28P01", slog.LevelDebug}, {"28P01", slog.LevelDebug}, {"28000", slog.LevelWarn}, {"28000", slog.LevelDebug}} {
		var pe *pgconn.PgError
		if !errors.As(got[i].err, &pe) || pe.Code != want.code || got[i].level != want.level {
			t.Errorf("attempt %d: %v at %v, want %s at %v", i+1, got[i].err, got[i].level, want.code, want.level)
		}
	}
}

// TestWarnLimiterRepeatsOnceAMinute: the same reason is warned about again
// a repeatWarning after the last warning, with the count of lines it
// skipped; network errors that differ only in the local port are the same
// reason.
func TestWarnLimiterRepeatsOnceAMinute(t *testing.T) {
	var w warnLimiter
	t0 := time.Unix(1000, 0)
	reset := func(port int) error {
		return &net.OpError{Op: "read", Net: "tcp", Source: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port},
			Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5454}, Err: syscall.ECONNRESET}
	}
	steps := []struct {
		err     error
		at      time.Duration
		ok      bool
		skipped int
	}{
		{reset(40000), 0, true, 0},
		{reset(40001), time.Second, false, 1},
		{reset(40002), 59 * time.Second, false, 2},
		{reset(40003), 60 * time.Second, true, 2},
		{&pgconn.PgError{Severity: "FATAL", Code: "28P01", Message: "password authentication failed"}, 61 * time.Second, true, 0},
		{reset(40004), 62 * time.Second, true, 0},
	}
	for i, s := range steps {
		skipped, ok := w.allow(warnReason(s.err), t0.Add(s.at))
		if ok != s.ok || skipped != s.skipped {
			t.Errorf("step %d (%v at %v): warn %v, skipped %d; want %v, %d", i+1, s.err, s.at, ok, skipped, s.ok, s.skipped)
		}
	}
}

// TestLastErrorsNameEachSafekeeperBounded: the "not connected" part of a
// timeout's error names each safekeeper's last end as SQLSTATE and message
// (a network error by operation and cause), one still dialling as "no
// answer yet", and cuts a long message, so a safekeeper's text cannot
// flood the one line sync prints.
func TestLastErrorsNameEachSafekeeperBounded(t *testing.T) {
	l := &skLinks{addrs: []string{"sk1:5454", "sk2:5454", "sk3:5454", "sk4:5454"}}
	l.noteEnd(0, fmt.Errorf("proposer: connect: %w", &pgconn.PgError{Severity: "FATAL", Code: "53400", Message: "too many timelines: --max-timelines 2 reached"}))
	l.noteEnd(1, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	l.noteEnd(3, &pgconn.PgError{Severity: "FATAL", Code: "28P01", Message: strings.Repeat("é", 1000)})
	got := l.lastErrors(func(i int) bool { return true })
	parts := strings.Split(got, "; ")
	if len(parts) != 4 || parts[0] != "sk1:5454: 53400 too many timelines: --max-timelines 2 reached" ||
		parts[1] != "sk2:5454: dial: connection refused" || parts[2] != "sk3:5454: no answer yet" ||
		!strings.HasPrefix(parts[3], "sk4:5454: 28P01 éé") || len(parts[3]) > len("sk4:5454: ")+maxEndText+len("…") || !utf8.ValidString(parts[3]) {
		t.Fatalf("lastErrors: %q", got)
	}
	if got := l.lastErrors(func(i int) bool { return i == 1 }); got != "sk2:5454: dial: connection refused" {
		t.Fatalf("lastErrors of safekeeper 2 only: %q", got)
	}
}
