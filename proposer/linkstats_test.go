package proposer

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proposer/client"
)

// TestResponseGapCountsOnlyWaits: the gap runs from the request that found
// nothing outstanding (or from the previous response, while requests stay
// outstanding) to the next response; idle time with nothing outstanding
// and a connection's unanswered tail are not gaps.
func TestResponseGapCountsOnlyWaits(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var g responseGap
	g.sent(at(0))
	g.sent(at(10))              // a second request: the wait still began at 0
	g.answered(at(40), true)    // 40 ms; one still outstanding
	g.answered(at(100), false)  // 60 ms since the previous response
	g.sent(at(5000))            // idle 4.9 s: not a gap
	g.answered(at(5090), false) // 90 ms
	if g.max != 90*time.Millisecond || g.responses != 3 || g.late != 0 {
		t.Fatalf("after three waits of 40, 60, 90 ms: max %v, responses %d, late %d; want 90ms, 3, 0", g.max, g.responses, g.late)
	}
	g.sent(at(6000))
	g.disconnected()           // the connection ended with the request unanswered
	g.sent(at(9000))           // a new connection
	g.answered(at(9150), true) // 150 ms: over the protocol's 100 ms
	g.answered(at(9170), false)
	if g.max != 150*time.Millisecond || g.responses != 5 || g.late != 1 {
		t.Fatalf("max %v, responses %d, late %d; want 150ms (not the 3 s across the reconnect), 5, 1", g.max, g.responses, g.late)
	}
	var total responseGap
	total.add(responseGap{max: 20 * time.Millisecond, responses: 7})
	total.add(g)
	if total.max != 150*time.Millisecond || total.responses != 12 || total.late != 1 {
		t.Fatalf("add: %+v", total)
	}
}

// TestDriverMeasuresResponseGaps: the driver records each queued
// SafeKeeperRequest and each SafeKeeperResponse with its clock, per
// safekeeper, so the longest wait for a response is what the responses'
// timing made it.
func TestDriverMeasuresResponseGaps(t *testing.T) {
	s, outs := streamingSession(t)
	ctx := context.Background()
	now := time.Unix(2000, 0)
	s.now = func() time.Time { return now }
	advance := func(d time.Duration) { now = now.Add(d) }

	end1 := tlStart + 1000
	if err := s.onUpstream(ctx, client.StreamMsg{Start: tlStart, WAL: make([]byte, 1000)}); err != nil {
		t.Fatal(err)
	}
	for i := range outs {
		queued(t, outs[i])
	}
	advance(30 * time.Millisecond)
	respond(t, s, 0, end1) // safekeeper 1 answers after 30 ms
	advance(90 * time.Millisecond)
	respond(t, s, 1, end1)                    // safekeeper 2 after 120 ms: late; commit_lsn moves
	s.act(ctx, s.sess.Tick(sessionTime(now))) // the commit tick: heartbeats go out
	for i := range outs {
		queued(t, outs[i])
	}
	advance(10 * time.Millisecond)
	respond(t, s, 0, end1) // safekeeper 1's commit heartbeat, 10 ms after it was sent

	want := []responseGap{
		{max: 30 * time.Millisecond, responses: 2},
		{max: 120 * time.Millisecond, responses: 1, late: 1},
		{}, // safekeeper 3 never answered
	}
	for i, w := range want {
		g := s.sks[i].gap
		if g.max != w.max || g.responses != w.responses || g.late != w.late {
			t.Errorf("safekeeper %d: max %v, responses %d, late %d; want %v, %d, %d", i, g.max, g.responses, g.late, w.max, w.responses, w.late)
		}
	}
	if s.sks[2].gap.waiting.IsZero() {
		t.Error("safekeeper 3 has requests outstanding, but no wait is running")
	}
	s.disconnect(s.sks[2])
	if !s.sks[2].gap.waiting.IsZero() {
		t.Error("safekeeper 3's wait survived its disconnection")
	}

	var buf bytes.Buffer
	logLinkStats(slog.New(slog.NewTextHandler(&buf, nil)), s.cfg.Safekeepers, []responseGap{s.sks[0].gap, s.sks[1].gap})
	for _, line := range []string{
		`msg="safekeeper link stats" safekeeper=sk1:1 responses=2 max_response_gap=30ms late_responses=0`,
		`msg="safekeeper link stats" safekeeper=sk2:1 responses=1 max_response_gap=120ms late_responses=1`,
	} {
		if !strings.Contains(buf.String(), line) {
			t.Errorf("log lacks %q:\n%s", line, buf.String())
		}
	}
}
