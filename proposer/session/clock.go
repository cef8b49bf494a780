package session

// The session reads no clock: time comes in through Session.Tick, as a
// reading of the caller's clock. These are the types of that clock, in
// nanoseconds like package time's, so that the caller converts with a
// plain conversion (proposer.Run ticks with the monotonic time since the
// process started; the simulation with its virtual time).

// Instant is a reading of the caller's monotonic clock, in nanoseconds
// since an origin of the caller's choosing.
type Instant int64

// Duration is a span of the caller's clock, in nanoseconds (as
// time.Duration).
type Duration int64

// Millisecond is one millisecond.
const Millisecond Duration = 1_000_000

// Add is t moved by d.
func (t Instant) Add(d Duration) Instant { return t + Instant(d) }

// Sub is the span from u to t.
func (t Instant) Sub(u Instant) Duration { return Duration(t - u) }
