package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// progress shows how far a long offline command (wal dump, wal export) is,
// on one line of stderr rewritten in place: bytes done of the total, the
// rate and the time left. It shows nothing unless stderr is a terminal, so
// logs and pipes stay clean. The zero of time is its creation.
type progress struct {
	w     io.Writer // nil: off
	total int64
	done  int64
	start time.Time
	last  time.Time
	shown bool
	now   func() time.Time
}

// progressEvery is how often the line is rewritten at most.
const progressEvery = 200 * time.Millisecond

// newProgress returns a progress for total bytes, writing to w only if w is
// a terminal.
func newProgress(w io.Writer, total int64) *progress {
	p := &progress{total: total, now: time.Now}
	if isTerminal(w) {
		p.w = w
	}
	p.start = p.now()
	return p
}

// isTerminal reports whether w is an *os.File on a terminal (TCGETS
// succeeds on it, as golang.org/x/term's IsTerminal checks).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// set records that done bytes are done and rewrites the line if it is due.
func (p *progress) set(done int64) {
	p.done = done
	if p.w == nil {
		return
	}
	now := p.now()
	if now.Sub(p.last) < progressEvery {
		return
	}
	p.last = now
	fmt.Fprintf(p.w, "\r\033[K%s", p.line(now))
	p.shown = true
}

// line is the progress text at now: "12.0 MiB / 64.0 MiB (18%), 30.1 MiB/s, ETA 2s".
func (p *progress) line(now time.Time) string {
	el := now.Sub(p.start).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(p.done) / el
	}
	s := fmt.Sprintf("%s / %s", mib(p.done), mib(p.total))
	if p.total > 0 {
		s += fmt.Sprintf(" (%d%%)", p.done*100/p.total)
	}
	s += fmt.Sprintf(", %s/s", mib(int64(rate)))
	if rate > 0 && p.total > p.done {
		eta := time.Duration(float64(p.total-p.done) / rate * float64(time.Second))
		s += fmt.Sprintf(", ETA %s", eta.Round(time.Second))
	}
	return s
}

// clear erases the line, if shown, so that other output starts at the
// line's start; the next set draws it again.
func (p *progress) clear() {
	if p.w != nil && p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
		p.last = time.Time{}
	}
}

// above wraps w (stdout, which may be the same terminal) so that the
// progress line is erased before anything is written to it.
func (p *progress) above(w io.Writer) io.Writer {
	if p.w == nil {
		return w
	}
	return writerFunc(func(b []byte) (int, error) {
		p.clear()
		return w.Write(b)
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// finish clears the line.
func (p *progress) finish() { p.clear() }

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
