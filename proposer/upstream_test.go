package proposer

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
)

// fakePrimary is a primary on 127.0.0.1 that refuses every connection with
// SQLSTATE code: at the startup (like an unknown role) or, with atSlot, when
// asked to create the replication slot (like an invalid slot name). It
// counts the connections it accepted.
func fakePrimary(t *testing.T, code string, atSlot bool) (addr string, conns *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	conns = new(atomic.Int32)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				servePrimary(c, code, atSlot)
			}()
		}
	}()
	return l.Addr().String(), conns
}

func servePrimary(c net.Conn, code string, atSlot bool) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	be := pgproto3.NewBackend(c, c)
	if _, err := be.ReceiveStartupMessage(); err != nil {
		return
	}
	refuse := &pgproto3.ErrorResponse{Severity: "FATAL", Code: code, Message: "refused by the test primary"}
	if !atSlot {
		be.Send(refuse)
		be.Flush()
		return
	}
	refuse.Severity = "ERROR"
	serveIdentify(be, refuse)
}

// countHandler counts the log records with message msg.
type countHandler struct {
	msg string
	n   *atomic.Int32
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// TestPermanentUpstreamErrorsStopRun: a refusal by the primary that
// reconnecting cannot heal (unknown role, wrong password, missing database,
// invalid slot name) ends Run at once with ErrUpstreamRejected; one the
// primary leaves by itself (starting up, shutting down, too many
// connections) or a refused connection is retried.
func TestPermanentUpstreamErrorsStopRun(t *testing.T) {
	refused := harness.RefusedAddr(t) // nobody listens there

	for _, tc := range []struct {
		name      string
		code      string
		atSlot    bool
		permanent bool
	}{
		{"unknown role", "28000", false, true},
		{"wrong password", "28P01", false, true},
		{"database does not exist", "3D000", false, true},
		{"invalid slot name", "42602", true, true},
		{"starting up", "57P03", false, false},
		{"shutting down", "57P01", false, false},
		{"too many connections", "53300", false, false},
		{"connection refused", "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, conns := refused, (*atomic.Int32)(nil)
			if tc.code != "" {
				addr, conns = fakePrimary(t, tc.code, tc.atSlot)
			}
			host, port, _ := net.SplitHostPort(addr)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan error, 1)
			retries := new(atomic.Int32)
			go func() {
				done <- Run(ctx, Config{
					Upstream:    "host=" + host + " port=" + port + " user=nobody sslmode=disable",
					Safekeepers: []string{refused}, TenantID: proto.ID{1}, TimelineID: proto.ID{2},
					// Without Create the slot is made only once a
					// safekeeper holds the timeline; none answers here.
					Create:       tc.atSlot,
					ReconnectMin: time.Millisecond, ReconnectMax: 5 * time.Millisecond,
					Logger: slog.New(&countHandler{msg: "proposer session ended; reconnecting and starting a new term", n: retries}),
				})
			}()
			if tc.permanent {
				select {
				case err := <-done:
					var pe *pgconn.PgError
					if !errors.Is(err, ErrUpstreamRejected) || !errors.As(err, &pe) || pe.Code != tc.code {
						t.Fatalf("Run: %v, want ErrUpstreamRejected with SQLSTATE %s", err, tc.code)
					}
					if n := conns.Load(); n != 1 {
						t.Fatalf("%d connections to the primary, want 1 (no retry)", n)
					}
				case <-ctx.Done():
					t.Fatalf("Run still retrying SQLSTATE %s after %d connections", tc.code, conns.Load())
				}
				return
			}
			deadline := time.Now().Add(5 * time.Second)
			for retries.Load() < 3 {
				select {
				case err := <-done:
					t.Fatalf("Run stopped on a retryable error: %v", err)
				case <-time.After(5 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatalf("Run did not reconnect 3 times within 5s (%d)", retries.Load())
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run after cancel: %v", err)
			}
		})
	}
}
