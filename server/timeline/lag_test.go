package timeline

import (
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
)

// TestLagTracker: the lag is the time since the newest sample a report
// passed; a report passing none keeps it; two fully replayed reports in a
// row clear it; a full buffer measures from the oldest sample kept.
func TestLagTracker(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	l := newLagTracker()
	if l.lag != [3]time.Duration{-1, -1, -1} {
		t.Fatalf("new tracker lags %v, want none", l.lag)
	}
	l.sent(100, at(0))
	l.sent(200, at(10))
	l.sent(150, at(20)) // not past the last sample: ignored
	l.sent(300, at(30))
	// write 200 (sent at 10), flush 100 (sent at 0), apply none yet.
	l.reported([3]proto.LSN{200, 100, 0}, 300, at(50))
	if want := [3]time.Duration{40 * time.Millisecond, 50 * time.Millisecond, -1}; l.lag != want {
		t.Fatalf("lags %v, want %v", l.lag, want)
	}
	// The same positions again: no new sample passed, the lags stay.
	l.reported([3]proto.LSN{200, 100, 0}, 300, at(70))
	if l.lag[0] != 40*time.Millisecond || l.lag[1] != 50*time.Millisecond {
		t.Fatalf("lags moved without progress: %v", l.lag)
	}
	// Everything replayed: lags measured, then cleared by the second such
	// report in a row.
	l.reported([3]proto.LSN{300, 300, 300}, 300, at(80))
	if want := [3]time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond}; l.lag != want {
		t.Fatalf("lags %v, want %v", l.lag, want)
	}
	l.reported([3]proto.LSN{300, 300, 300}, 300, at(1080))
	if l.lag != [3]time.Duration{-1, -1, -1} {
		t.Fatalf("lags after two fully replayed reports %v, want cleared", l.lag)
	}
	// A client far behind: the buffer keeps the newest lagSamples.
	for i := 0; i < lagSamples+10; i++ {
		l.sent(proto.LSN(1000+i), at(2000+i))
	}
	l.reported([3]proto.LSN{1000 + lagSamples + 9, 0, 0}, 1000+lagSamples+9, at(2000+lagSamples+9))
	if l.lag[0] != 0 {
		t.Fatalf("write lag %v, want 0 (the newest sample was just sent)", l.lag[0])
	}
	if l.n[1] != lagSamples {
		t.Fatalf("flush position has %d samples, want %d", l.n[1], lagSamples)
	}
	// Samples 1000..1009 were overwritten: 1005 passes none, 1010 is the
	// oldest kept.
	l.reported([3]proto.LSN{0, 1005, 0}, 1000+lagSamples+9, at(2000+lagSamples+9))
	if l.lag[1] != -1 {
		t.Fatalf("flush lag %v after a report below every sample kept, want none", l.lag[1])
	}
	l.reported([3]proto.LSN{0, 1010, 0}, 1000+lagSamples+9, at(2000+lagSamples+9))
	if want := time.Duration(lagSamples-1) * time.Millisecond; l.lag[1] != want {
		t.Fatalf("flush lag %v, want %v", l.lag[1], want)
	}
}
