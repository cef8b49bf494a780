package harness

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// CreateTimeline creates a timeline on its safekeepers as an operator
// does before a new timeline's first `propose` (which does not create one
// unless given --create): `safekeeper timeline create`, reading the
// primary's identity from upstream. It fails the test unless the command
// exits 0, and returns its output.
func CreateTimeline(t testing.TB, upstream string, safekeepers []string, tenant, timeline string, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"timeline", "create", "--upstream", upstream, "--safekeepers", strings.Join(safekeepers, ","),
		"--tenant-id", tenant, "--timeline-id", timeline}, extra...)
	out, err := exec.CommandContext(ctx, Binary(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("safekeeper %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
