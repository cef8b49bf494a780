package timeline

import (
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
)

type idleUser struct{}

func (idleUser) SetReadDeadline(time.Time) error { return nil }
func (idleUser) Close() error                    { return nil }

// TestCloseStopsATimelineBeingDeleted: Close returns only once every
// timeline it ran has stopped (persisted what it held), one whose delete
// waits for its connections included: the caller closes the database next.
func TestCloseStopsATimelineBeingDeleted(t *testing.T) {
	db := storeTimelines(t, 1)
	r := NewRegistry(db, Config{})
	key := proto.TimelineKey{TenantID: testTenant, TimelineID: proto.ID{0xbb, 0x10}}
	tl, err := r.Open(key)
	if err != nil {
		t.Fatal(err)
	}
	u := idleUser{}
	if err := tl.Bind(u); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := r.Delete(key, true); done <- err }()
	deadline := time.Now().Add(5 * time.Second)
	for len(r.Running()) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the delete did not take the timeline out of the registry")
		}
		time.Sleep(time.Millisecond)
	}
	r.Close()
	select {
	case <-tl.Done():
	default:
		t.Error("Close returned while the timeline being deleted still runs")
	}
	tl.Unbind(u)
	<-done
}
