package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTail: the last n lines, without the final newline; all of a shorter
// log; a file's, or why it could not be read.
func TestTail(t *testing.T) {
	log := "a\nb\nc\nd\n\n"
	for _, tc := range []struct {
		n    int
		want string
	}{{1, "d"}, {2, "c\nd"}, {4, "a\nb\nc\nd"}, {10, "a\nb\nc\nd"}} {
		if got := Tail(log, tc.n); got != tc.want {
			t.Errorf("Tail(%q, %d) = %q, want %q", log, tc.n, got, tc.want)
		}
	}
	if got := Tail("no newline", 3); got != "no newline" {
		t.Errorf("Tail of one line without a newline = %q", got)
	}
	path := filepath.Join(t.TempDir(), "x.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := TailFile(path, 2); got != "c\nd" {
		t.Errorf("TailFile = %q, want %q", got, "c\nd")
	}
	if got := TailFile(path+".missing", 2); !strings.Contains(got, "no such file") {
		t.Errorf("TailFile of a missing file = %q, want the error", got)
	}
}

// TestLastLine: the last line holding the string, trimmed; "" when none
// does; with "", the log's last line.
func TestLastLine(t *testing.T) {
	log := "level=INFO msg=deposed term=1\n  level=INFO msg=deposed term=2  \nlevel=INFO msg=waiting\nsafekeeper: refused\n"
	for _, tc := range []struct{ with, want string }{
		{"deposed", "level=INFO msg=deposed term=2"},
		{"waiting", "level=INFO msg=waiting"},
		{"", "safekeeper: refused"},
		{"nowhere", ""},
	} {
		if got := LastLine(log, tc.with); got != tc.want {
			t.Errorf("LastLine(log, %q) = %q, want %q", tc.with, got, tc.want)
		}
	}
	if got := LastLine("", ""); got != "" {
		t.Errorf("LastLine of an empty log = %q", got)
	}
}
