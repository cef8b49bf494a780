package proposer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proto"
)

// skEvent is what a safekeeper's connection goroutine reports to the owner:
// a new greeted connection (out non-nil), a message, or the connection's end
// (err non-nil). gen names the connection; the owner ignores events of a
// connection it already dropped.
type skEvent struct {
	sk, gen int
	info    *proto.SafeKeeperInfo // the greeting of a new connection
	out     chan []byte           // the new connection's writer queue
	msg     proto.Message
	err     error
	// refused: err is the safekeeper's refusal (a *RefusalError) of our
	// ServerInfo (rule 1: another cluster, major version, segment size or
	// an older PostgreSQL timeline) or of our TimelineHistory, which no
	// retry can fix; the link has stopped.
	refused bool
	// missing: err is the safekeeper's answer that it does not hold the
	// timeline, to a greeting that was not allowed to create it. The link
	// goes on: while another safekeeper is greeted (the timeline exists),
	// its next greeting creates it there (a replaced disk).
	missing bool
	// quiet (with out): the connection before this one ended for the same
	// reason as the one before it, and its warning was held back (see
	// warnLimiter). The owner logs this connection's progress (greeted,
	// vote granted, streaming, catching up) at debug level, so a
	// safekeeper refusing once a second does not log its reconnects at
	// info each time; the first connection, and the first reconnect after
	// each new reason, are logged at info.
	quiet bool
}

// skLinks runs one connection goroutine per safekeeper: dial, greet with
// ServerInfo, report, then forward every message to the owner until the
// connection fails; then reconnect with backoff. The backoff starts over
// only after a greeted connection that lasted at least bo.max: a
// safekeeper that greets and then refuses at once (its disk breaker
// tripped, FATAL 53100; the timeline being deleted) is retried at the
// longest backoff, not every bo.min. The owner writes through
// the connection's out queue (encoded payloads; closing it ends the writer)
// and never blocks on it: it keeps at most queueCap payloads queued.
type skLinks struct {
	addrs []string
	dial  client.DialConfig
	si    *proto.ServerInfo
	// hist, when set, follows every greeting: the PostgreSQL timeline
	// history of a promoted primary (README_PROTO.md).
	hist *proto.TimelineHistory
	// create lets every greeting create the timeline (propose --create,
	// sync --create). Without it a greeting may create it only while
	// holding (when not nil) is positive: another safekeeper's greeting
	// was answered on a connection still open, so the timeline is not a
	// mistyped id, and this safekeeper lost it (a replaced disk).
	create   bool
	holding  *atomic.Int32
	queueCap int
	bo       backoff
	log      *slog.Logger
	events   chan skEvent
	wg       sync.WaitGroup
	// stats, when set, shows each link's connection state (Run's; nil
	// for Sync).
	stats *Stats

	mu      sync.Mutex
	lastErr []error // per safekeeper: how its last connection ended (nil: none ended yet)
}

// noteEnd records how safekeeper i's last connection (or attempt) ended.
func (l *skLinks) noteEnd(i int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lastErr == nil {
		l.lastErr = make([]error, len(l.addrs))
	}
	l.lastErr[i] = err
}

// maxEndText bounds the text of one safekeeper's error in lastErrors.
const maxEndText = 200

// lastErrors names, for each safekeeper i for which which(i) is true, how
// its last connection ended — "addr: SQLSTATE message" for a refusal (a
// --tls-required safekeeper's 28000, --max-timelines' 53400, a revoked
// token's 28P01), the network error otherwise, "no answer yet" while its
// first attempt is still under way — joined with "; ", each bounded to
// maxEndText bytes. Errors that ended Sync or an election at a timeout
// carry it: the refusals were only in the log before.
func (l *skLinks) lastErrors(which func(i int) bool) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var parts []string
	for i, addr := range l.addrs {
		if !which(i) {
			continue
		}
		text := "no answer yet"
		if l.lastErr != nil && l.lastErr[i] != nil {
			text = endText(l.lastErr[i])
		}
		parts = append(parts, addr+": "+text)
	}
	return strings.Join(parts, "; ")
}

// endText is err in short: a server's refusal as its SQLSTATE and
// message, a network error as warnReason has it (operation and cause),
// cut to maxEndText bytes on a character boundary.
func endText(err error) string {
	var s string
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		s = pe.Code + " " + pe.Message
	} else {
		s = warnReason(err)
	}
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > maxEndText {
		cut := maxEndText
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

func (l *skLinks) start(ctx context.Context) {
	for i := range l.addrs {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.loop(ctx, i)
		}()
	}
}

func (l *skLinks) post(ctx context.Context, ev skEvent) bool {
	select {
	case l.events <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

func (l *skLinks) loop(ctx context.Context, i int) {
	bo := l.bo
	var warn warnLimiter
	quiet := false
	for gen := 1; ctx.Err() == nil; gen++ {
		l.stats.dialing(i)
		greetedAt, err := l.connection(ctx, i, gen, quiet)
		if ctx.Err() != nil {
			return
		}
		l.noteEnd(i, err)
		forGood := incompatible(err) // at the greeting, or the TimelineHistory after it
		l.stats.ended(i, err, forGood)
		if forGood {
			l.post(ctx, skEvent{sk: i, gen: gen, err: l.refusal(ctx, l.addrs[i], err), refused: true})
			return
		}
		if greetedAt.IsZero() && missingTimeline(err) {
			if !l.post(ctx, skEvent{sk: i, gen: gen, err: err, missing: true}) {
				return
			}
		}
		if !greetedAt.IsZero() && time.Since(greetedAt) >= bo.max {
			bo.reset()
		}
		d := bo.next()
		skipped, ok := warn.allow(warnReason(err), time.Now())
		// Only a safekeeper that greets and then fails the same way again
		// makes its reconnects quiet: one that could not be reached (down,
		// restarting, refusing) and now greets is news, at info.
		quiet = !ok && !greetedAt.IsZero()
		if ok {
			l.log.Warn("safekeeper connection ended; reconnecting", "safekeeper", l.addrs[i], "err", err, "retry_in", d, "same_before", skipped)
		} else {
			l.log.Debug("safekeeper connection ended; reconnecting", "safekeeper", l.addrs[i], "err", err, "retry_in", d)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// connection runs one connection to safekeeper i until it fails. It
// returns when the safekeeper greeted (zero if it did not). quiet goes
// with the greeting to the owner (skEvent.quiet).
func (l *skLinks) connection(ctx context.Context, i, gen int, quiet bool) (greetedAt time.Time, err error) {
	dc := l.dial
	dc.Addr = l.addrs[i]
	dc.AllowTimelineCreation = l.create || (l.holding != nil && l.holding.Load() > 0)
	c, err := client.Dial(ctx, dc)
	if err != nil {
		return time.Time{}, err
	}
	defer c.Close()
	if err := c.Send(l.si); err != nil {
		return time.Time{}, err
	}
	gctx, cancel := context.WithTimeout(ctx, dc.ConnectTimeout)
	m, err := c.Recv(gctx)
	cancel()
	if err != nil {
		return time.Time{}, fmt.Errorf("greeting: %w", err)
	}
	info, ok := m.(*proto.SafeKeeperInfo)
	if !ok {
		return time.Time{}, fmt.Errorf("greeting: got %T, want SafeKeeperInfo", m)
	}
	greetedAt = time.Now()
	l.stats.greeted(i, info.SafekeeperID)
	if l.holding != nil {
		l.holding.Add(1)
		defer l.holding.Add(-1)
	}
	if l.hist != nil {
		if err := c.Send(l.hist); err != nil {
			return greetedAt, err
		}
	}
	out := make(chan []byte, l.queueCap)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		c.WriteQueue(out, ctx.Done())
	}()
	defer func() { <-writerDone }() // the owner closes out after our final event
	if !l.post(ctx, skEvent{sk: i, gen: gen, info: info, out: out, quiet: quiet}) {
		c.Close()
		close(out) // the owner never got it
		return greetedAt, ctx.Err()
	}
	for {
		m, err := c.Recv(ctx)
		if err != nil {
			c.Close()
			if errors.Is(err, client.ErrStreamEnded) {
				err = fmt.Errorf("safekeeper ended the stream")
			}
			if !l.post(ctx, skEvent{sk: i, gen: gen, err: err}) {
				return greetedAt, ctx.Err() // the owner is gone; out is closed by the session
			}
			return greetedAt, err
		}
		if !l.post(ctx, skEvent{sk: i, gen: gen, msg: m}) {
			c.Close()
			return greetedAt, ctx.Err()
		}
	}
}

// repeatWarning is how often a link repeats its warning about a safekeeper
// it cannot keep connected while the reason stays the same; the attempts
// in between are logged at debug level. A new reason is warned at once.
const repeatWarning = time.Minute

// warnLimiter decides which of a link's "connection ended" lines are
// warnings: the first of each reason, and one a repeatWarning after.
type warnLimiter struct {
	reason  string
	at      time.Time
	skipped int // lines of the same reason since the last warning
}

// allow reports whether the line of reason at now is a warning, and how
// many lines of the same reason were not since the previous warning.
func (w *warnLimiter) allow(reason string, now time.Time) (skipped int, ok bool) {
	if reason == w.reason && now.Sub(w.at) < repeatWarning {
		w.skipped++
		return w.skipped, false
	}
	skipped = 0
	if reason == w.reason {
		skipped = w.skipped
	}
	w.reason, w.at, w.skipped = reason, now, 0
	return skipped, true
}

// warnReason is what makes two connection failures the same for
// warnLimiter: a server's refusal by severity, SQLSTATE and message (an
// authentication refusal, 28P01 or 28000, differs from a disk breaker's
// 53100); a network error by operation and cause, without the addresses
// (a new local port each time); otherwise the error's text.
func warnReason(err error) string {
	if err == nil {
		return ""
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Severity + " " + pe.Code + " " + pe.Message
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Op + ": " + fmt.Sprint(oe.Err)
	}
	return err.Error()
}
