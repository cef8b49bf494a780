package timeline

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
)

// storeTimelines opens a database in a new directory holding n timelines
// of testTenant (timeline ids 0xbb,0x10+i), created and never written.
func storeTimelines(t *testing.T, n int) *storage.DB {
	t.Helper()
	db, err := storage.Open(filepath.Join(t.TempDir(), "safekeeper.db"), storage.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for i := range n {
		if _, err := db.CreateTimeline(acceptor.NewState(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018,
			SystemID: 7300000000000000042, TenantID: testTenant, TimelineID: proto.ID{0xbb, byte(0x10 + i)}, PgTimeline: 1, WalSegSize: 1 << 20})); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

// TestCloseDuringOpenAtStart: Stop and Close while the opens at start are
// under way wait for the opens in progress (the database stays in use
// under them), start no other, and stop the owners of those that opened.
func TestCloseDuringOpenAtStart(t *testing.T) {
	const n = 12 // more than openAtStartWorkers
	db := storeTimelines(t, n)
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	defer release()
	entered := make(chan struct{}, n)
	var mu sync.Mutex
	started := 0
	r := NewRegistry(db, Config{Hooks: Hooks{BeforeOpen: func(proto.TimelineKey) {
		mu.Lock()
		started++
		mu.Unlock()
		entered <- struct{}{}
		<-gate
	}}})
	r.OpenStored()
	for range openAtStartWorkers {
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the opens at start did not begin")
		}
	}
	closed := make(chan struct{})
	go func() {
		r.Stop()
		r.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while opens at start were under way")
	case <-time.After(200 * time.Millisecond):
	}
	release()
	<-closed
	mu.Lock()
	defer mu.Unlock()
	if started != openAtStartWorkers {
		t.Errorf("%d opens began, want the %d under way at the stop and no more", started, openAtStartWorkers)
	}
	tls := r.Running()
	if len(tls) != openAtStartWorkers {
		t.Errorf("%d timelines open, want the %d whose open was under way", len(tls), openAtStartWorkers)
	}
	for _, tl := range tls {
		select {
		case <-tl.stopped:
		default:
			t.Errorf("Close returned with timeline %s's owner running", tl.Key())
		}
	}
	if _, err := r.Open(proto.TimelineKey{TenantID: testTenant, TimelineID: proto.ID{0xbb, 0x10 + n - 1}}); err != ErrStopped {
		t.Errorf("an open after Stop: %v, want ErrStopped", err)
	}
}

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
	for deadline := time.Now().Add(5 * time.Second); len(r.Running()) != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) { // polled: the delete has no hook to wait on
			t.Fatal("the delete did not take the timeline out of the registry")
		}
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
