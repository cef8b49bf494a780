package timeline

import (
	"time"

	"github.com/safekeeper/safekeeper/proto"
)

// lagTracker measures a reader's write, flush and replay lag in time as
// PostgreSQL's walsender does (walsender.c, LagTracker): each send records
// (end LSN, time); when the client reports a position, the lag is the time
// since the newest sample at or below it was sent. A position that passed
// no new sample leaves the lag as it was. Once the client reports twice in
// a row that it replayed everything sent (its status interval firing on an
// idle stream), the lags are cleared, so that a caught-up reader does not
// show a stale lag until more WAL flows: pg_stat_replication shows NULL
// then, and so does the HTTP API.
//
// It is simpler than PostgreSQL's (no interpolation between samples); the
// stream's goroutine writes samples and the reader goroutine reads them,
// both under the walReader's mu.
type lagTracker struct {
	buf  [lagSamples]lagSample
	head int // next write
	// read[i] is the next sample position i (write, flush, apply) reads.
	read [3]int
	n    [3]int // samples not yet read by position i
	// lag[i] is the last measured lag, < 0 when none (cleared or never).
	lag              [3]time.Duration
	fullyAppliedLast bool
}

type lagSample struct {
	lsn proto.LSN
	at  int64 // unix nanoseconds
}

// lagSamples bounds the samples kept (16 bytes each, per reader): when the
// client falls further behind, the oldest are overwritten and the lag is
// measured from the oldest kept, an underestimate, as in PostgreSQL (whose
// LAG_TRACKER_BUFFER_SIZE is 8192). A sample per send of up to 128 KiB
// covers at least 1024 sends.
const lagSamples = 1024

func newLagTracker() lagTracker {
	return lagTracker{lag: [3]time.Duration{-1, -1, -1}}
}

func newLagTrackerPtr() *lagTracker {
	l := newLagTracker()
	return &l
}

// seconds returns lag i in seconds, nil when there is none.
func (l *lagTracker) seconds(i int) *float64 {
	if l == nil || l.lag[i] < 0 {
		return nil
	}
	s := l.lag[i].Seconds()
	return &s
}

// sent records that WAL up to lsn was sent at now.
func (l *lagTracker) sent(lsn proto.LSN, now time.Time) {
	last := (l.head + lagSamples - 1) % lagSamples
	if l.n[0] > 0 || l.n[1] > 0 || l.n[2] > 0 {
		if l.buf[last].lsn >= lsn {
			return
		}
	}
	l.buf[l.head] = lagSample{lsn: lsn, at: now.UnixNano()}
	l.head = (l.head + 1) % lagSamples
	for i := range l.n {
		if l.n[i] == lagSamples { // full: the oldest is overwritten
			l.read[i] = (l.read[i] + 1) % lagSamples
		} else {
			l.n[i]++
		}
	}
}

// reported takes a status update's write, flush and apply positions (0:
// not reported) at now; sent is the end of what was sent.
func (l *lagTracker) reported(pos [3]proto.LSN, sent proto.LSN, now time.Time) {
	clear := false
	if pos[2] != 0 && pos[2] >= sent {
		clear = l.fullyAppliedLast
		l.fullyAppliedLast = true
	} else {
		l.fullyAppliedLast = false
	}
	for i, p := range pos {
		var at int64
		for p != 0 && l.n[i] > 0 && l.buf[l.read[i]].lsn <= p {
			at = l.buf[l.read[i]].at
			l.read[i] = (l.read[i] + 1) % lagSamples
			l.n[i]--
		}
		switch {
		case at != 0:
			l.lag[i] = now.Sub(time.Unix(0, at))
		case clear:
			l.lag[i] = -1
		}
	}
}
