//go:build !linux

package netq

// Only Linux is asked here; elsewhere a batch ends with what is buffered,
// and writes go through the writer goroutines.
func inq(fd uintptr) (int, bool)  { return 0, false }
func outq(fd uintptr) (int, bool) { return 0, false }
