package harness

import (
	"os"
	"strings"
)

// Tail returns the last n lines of s (a log, a command's output), without
// the final newline: what a failed test shows of a long log.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TailFile is Tail of the file at path; if it cannot be read, the error
// says why instead.
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return Tail(string(b), n)
}

// LastLine returns the last line of log that contains with, trimmed of
// surrounding white space; "" if there is none. With with "", it is the
// log's last line (the one a command that failed ends with).
func LastLine(log, with string) string {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], with) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}
