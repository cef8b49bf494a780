package proposer

import (
	"log/slog"
	"time"
)

// responseDeadline is the protocol's bound on a safekeeper's silence
// (README_PROTO.md, SafeKeeperResponse): under a steady stream of
// requests a response must go out at least every 100 ms.
const responseDeadline = 100 * time.Millisecond

// responseGap measures, for one safekeeper, how long its connections kept
// the proposer waiting: the longest time from the moment a
// SafeKeeperRequest was outstanding — since the previous SafeKeeperResponse,
// or since the request sent when none was — to the next SafeKeeperResponse.
// Idle time with nothing outstanding does not count. The driver feeds it
// (it owns the clock; the times come in as arguments) when its owner
// goroutine queues a request and handles a response, so a delay on the
// proposer's side (an owner starved of CPU) counts too: the figure is an
// upper bound on the safekeeper's silence.
type responseGap struct {
	waiting   time.Time     // start of the current wait; zero: nothing outstanding
	max       time.Duration // longest wait that ended in a response
	responses int64         // SafeKeeperResponses received while streaming
	late      int64         // of them, those that ended a wait over responseDeadline
}

// sent records a SafeKeeperRequest queued at now.
func (g *responseGap) sent(now time.Time) {
	if g.waiting.IsZero() {
		g.waiting = now
	}
}

// answered records a SafeKeeperResponse received at now; outstanding tells
// whether requests are still unanswered after it.
func (g *responseGap) answered(now time.Time, outstanding bool) {
	g.responses++
	if !g.waiting.IsZero() {
		d := now.Sub(g.waiting)
		g.max = max(g.max, d)
		if d > responseDeadline {
			g.late++
		}
	}
	g.waiting = time.Time{}
	if outstanding {
		g.waiting = now
	}
}

// disconnected forgets the wait of a connection that ended: what it never
// answered is not a gap between responses.
func (g *responseGap) disconnected() { g.waiting = time.Time{} }

// add folds another session's figures for the same safekeeper into g.
func (g *responseGap) add(o responseGap) {
	g.max = max(g.max, o.max)
	g.responses += o.responses
	g.late += o.late
}

// logLinkStats logs one "safekeeper link stats" line per safekeeper: how
// many SafeKeeperResponses Run received from it, the longest wait for one
// (max_response_gap) and how many waits exceeded the protocol's 100 ms
// (late_responses). Run logs them when it returns; the benchmark harness
// (test/bench/e2e) reads them from the log after SIGTERM.
func logLinkStats(log *slog.Logger, names []string, gaps []responseGap) {
	for i, g := range gaps {
		log.Info("safekeeper link stats", "safekeeper", names[i], "responses", g.responses,
			"max_response_gap", g.max.Round(time.Microsecond), "late_responses", g.late)
	}
}
