package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestStaleBuildsAreRemoved: the build directory of a test process that is
// gone (killed by go test's -timeout, say) is removed by the next Main; one
// of a live process is left alone.
func TestStaleBuildsAreRemoved(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-test", binDirPrefix, dead.Process.Pid))
	live := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-test", binDirPrefix, os.Getpid()))
	for _, d := range []string{stale, live} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "safekeeper"), []byte("x"), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
	}
	removeStaleBuilds()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the build directory of exited process %d is still there (%v)", dead.Process.Pid, err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the build directory of the running test process was removed: %v", err)
	}
}
