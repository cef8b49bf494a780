//go:build !linux

package pgwire

// outq: unknown here; a reader's own replies go through its writer.
func outq(fd uintptr) (int, bool) { return 0, false }

// inq: only Linux is asked; elsewhere a batch ends with what the read-ahead
// buffer holds.
func inq(fd uintptr) int { return 0 }
