package server

import (
	"sync/atomic"
	"testing"
)

// TestOwnerPublishesOnlyDurableChanges: the owner hands readers a new state
// (and wakes every walsender) only when a commit changed it, not for every
// staged request: a stream of requests committed in batches costs at most
// one publication per commit.
func TestOwnerPublishesOnlyDurableChanges(t *testing.T) {
	var pubs atomic.Uint64
	s := startHookedServer(t, t.TempDir(), nil, hooks{onPublish: func() { pubs.Add(1) }})
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	// Requests sent back to back: the owner takes several per batch.
	p.push(400, 8000, 0)
	p.push(400, 8000, 0)
	commits := s.db.Stats().Commits
	n := pubs.Load()
	if n == 0 || n > commits {
		t.Fatalf("%d publications for %d commits: want at least one, at most one per commit", n, commits)
	}
	t.Logf("%d publications, %d commits, %d requests", n, commits, 2*(400*8000/131072+1))
}
