package server

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"

	"github.com/safekeeper/safekeeper/proto"
)

// budget is Config.MaxBufferedWAL: the bytes of proposers' messages read
// (or being read) and not yet committed. A push reader takes a message's
// length before it reads the body; the timeline's owner gives it back after
// the group commit that took the message. Each tenant may hold at most half
// of it (tenantShare), so that one tenant's connections — a stalled or
// hostile proposer with a valid token among them — cannot hold all of it
// and stop every other tenant's ingest.
type budget struct {
	global *semaphore.Weighted
	share  int64 // per tenant

	mu      sync.Mutex
	tenants map[proto.ID]*semaphore.Weighted // created on first use, never removed (one per tenant)
}

func newBudget(total int64) *budget {
	share := min(max(total/2, proto.MaxWALPerRequest+1024), total)
	return &budget{global: semaphore.NewWeighted(total), share: share, tenants: map[proto.ID]*semaphore.Weighted{}}
}

func (b *budget) tenant(id proto.ID) *semaphore.Weighted {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.tenants[id]
	if !ok {
		s = semaphore.NewWeighted(b.share)
		b.tenants[id] = s
	}
	return s
}

// cost is what a message of n bytes takes.
func (b *budget) cost(n int) int64 { return min(int64(n), b.share) }

// acquire takes cost bytes for tenant: its share first, then the server's.
func (b *budget) acquire(ctx context.Context, tenant proto.ID, cost int64) error {
	t := b.tenant(tenant)
	if err := t.Acquire(ctx, cost); err != nil {
		return err
	}
	if err := b.global.Acquire(ctx, cost); err != nil {
		t.Release(cost)
		return err
	}
	return nil
}

func (b *budget) release(tenant proto.ID, cost int64) {
	b.global.Release(cost)
	b.tenant(tenant).Release(cost)
}
