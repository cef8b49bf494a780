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
	tenants map[proto.ID]*tenantBudget // the tenants holding or waiting for budget
}

// tenantBudget is one tenant's share; refs counts its acquires under way
// and held, and it is dropped when none is left (its share is then whole),
// so the map does not grow with tenant churn.
type tenantBudget struct {
	sem  *semaphore.Weighted
	refs int
}

func newBudget(total int64) *budget {
	share := min(max(total/2, proto.MaxWALPerRequest+1024), total)
	return &budget{global: semaphore.NewWeighted(total), share: share, tenants: map[proto.ID]*tenantBudget{}}
}

// ref returns tenant id's share, counting one more user of it.
func (b *budget) ref(id proto.ID) *semaphore.Weighted {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.tenants[id]
	if !ok {
		t = &tenantBudget{sem: semaphore.NewWeighted(b.share)}
		b.tenants[id] = t
	}
	t.refs++
	return t.sem
}

// unref undoes one ref of tenant id, after its bytes went back.
func (b *budget) unref(id proto.ID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.tenants[id]
	if t.refs--; t.refs == 0 {
		delete(b.tenants, id)
	}
}

// cost is what a message of n bytes takes.
func (b *budget) cost(n int) int64 { return min(int64(n), b.share) }

// acquire takes cost bytes for tenant: its share first, then the server's.
// Each acquire that succeeds is undone by one release.
func (b *budget) acquire(ctx context.Context, tenant proto.ID, cost int64) error {
	t := b.ref(tenant)
	if err := t.Acquire(ctx, cost); err != nil {
		b.unref(tenant)
		return err
	}
	if err := b.global.Acquire(ctx, cost); err != nil {
		t.Release(cost)
		b.unref(tenant)
		return err
	}
	return nil
}

func (b *budget) release(tenant proto.ID, cost int64) {
	b.global.Release(cost)
	b.mu.Lock()
	t := b.tenants[tenant].sem
	b.mu.Unlock()
	t.Release(cost)
	b.unref(tenant)
}
