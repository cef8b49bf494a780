package proposer

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/safekeeper/safekeeper/proposer/session"
	"github.com/safekeeper/safekeeper/proto"
)

// TestEveryEventIsLogged: each kind of session event has its own line (no
// kind falls to the generic one), and none stops the proposer. The
// not-a-member event stopped propose, sync and wal fetch with a panic
// before it had a line.
func TestEveryEventIsLogged(t *testing.T) {
	for k := session.EventKind(1); ; k++ {
		if strings.HasPrefix(k.String(), "EventKind(") {
			break
		}
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		ev := session.Event{Kind: k, Safekeeper: 0, Info: &proto.SafeKeeperInfo{}, Election: &session.Election{}}
		logEvents(log, []string{"sk1:5454"}, func(int) bool { return false }, []session.Event{ev})
		if buf.Len() == 0 || strings.Contains(buf.String(), `msg="session event"`) {
			t.Errorf("event %v: logged %q, want a line of its own", k, buf.String())
		}
	}
}
