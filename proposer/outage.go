package proposer

import (
	"context"
	"log/slog"
	"time"
)

// primaryOutage keeps the log readable while the primary cannot be
// reached. Run retries it every ReconnectMax (1 s), and every failed
// session used to log a warning; now the first failure of an outage, and
// of each new reason, is a warning, the same reason again within
// repeatWarning (a minute) is logged at debug, and once a minute the
// warning comes again with the attempts held back since the last one
// (same_before, as a safekeeper link's warnings count them) and how long
// the primary has been gone (primary_down_for). When a session reaches the
// primary again, one info line says so, with how long it was gone. Owned by
// Run's goroutine (the sessions' owner).
type primaryOutage struct {
	log      *slog.Logger
	warn     warnLimiter
	since    time.Time // the first failure of the outage; zero while the primary answers
	attempts int       // sessions that failed on the primary since
}

// sessionEndedMsg is the line of a session's end (Run).
const sessionEndedMsg = "proposer session ended; reconnecting and starting a new term"

// failed logs, at now, the end of a session that failed on the primary
// with err; term is the session's term, retryIn the backoff before the
// next one.
func (o *primaryOutage) failed(now time.Time, err error, term uint64, retryIn time.Duration) {
	if o.since.IsZero() {
		o.since = now
	}
	o.attempts++
	skipped, warn := o.warn.allow(warnReason(err), now)
	level := slog.LevelDebug
	if warn {
		level = slog.LevelWarn
	}
	o.log.Log(context.Background(), level, sessionEndedMsg, "err", err, "term", term, "retry_in", retryIn,
		"primary_down_for", now.Sub(o.since).Round(time.Millisecond), "same_before", skipped)
}

// back logs, at now, that a session reached the primary again after an
// outage (nothing if there was none), and ends the outage.
func (o *primaryOutage) back(now time.Time) {
	if o == nil || o.since.IsZero() {
		return
	}
	o.log.Info("the primary is back", "down_for", now.Sub(o.since).Round(time.Millisecond), "failed_attempts", o.attempts)
	*o = primaryOutage{log: o.log}
}
