package timeline

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"

	"github.com/safekeeper/safekeeper/proto"
)

// Budget is Config.MaxBufferedWAL: the bytes of proposers' messages read
// (or being read) and not yet committed. A push reader takes a message's
// length before it reads the body; the timeline's owner gives it back after
// the group commit that took the message. Each tenant may hold at most half
// of it (tenantShare), so that one tenant's connections — a stalled or
// hostile proposer with a valid token among them — cannot hold all of it
// and stop every other tenant's ingest.
type Budget struct {
	global *semaphore.Weighted
	share  int64 // per tenant

	mu      sync.Mutex
	tenants map[proto.ID]*tenantBudget // the tenants holding or waiting for budget
}

// tenantBudget is one tenant's share. It is dropped once none of it is
// held and no acquire waits for it (its share is then whole), so the map
// does not grow with tenant churn. held counts bytes, not calls: the owner
// gives back a group commit's messages in one release.
type tenantBudget struct {
	sem     *semaphore.Weighted
	held    int64
	waiting int
}

// NewBudget is a budget of total bytes.
func NewBudget(total int64) *Budget {
	share := min(max(total/2, proto.MaxWALPerRequest+1024), total)
	return &Budget{global: semaphore.NewWeighted(total), share: share, tenants: map[proto.ID]*tenantBudget{}}
}

// Cost is what a message of n bytes takes.
func (b *Budget) Cost(n int) int64 { return min(int64(n), b.share) }

// Acquire takes cost bytes for tenant: its share first, then the
// server's. Release gives them back, in one call or in several summed.
func (b *Budget) Acquire(ctx context.Context, tenant proto.ID, cost int64) error {
	b.mu.Lock()
	t, ok := b.tenants[tenant]
	if !ok {
		t = &tenantBudget{sem: semaphore.NewWeighted(b.share)}
		b.tenants[tenant] = t
	}
	t.waiting++
	b.mu.Unlock()
	err := t.sem.Acquire(ctx, cost)
	if err == nil {
		if err = b.global.Acquire(ctx, cost); err != nil {
			t.sem.Release(cost)
		}
	}
	b.mu.Lock()
	t.waiting--
	if err == nil {
		t.held += cost
	}
	b.dropIdle(tenant, t)
	b.mu.Unlock()
	return err
}

// TryAcquire takes cost bytes for tenant as Acquire does, if it can
// without waiting, and reports whether it did.
func (b *Budget) TryAcquire(tenant proto.ID, cost int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.tenants[tenant]
	if !ok {
		t = &tenantBudget{sem: semaphore.NewWeighted(b.share)}
	}
	if !t.sem.TryAcquire(cost) {
		return false
	}
	if !b.global.TryAcquire(cost) {
		t.sem.Release(cost)
		return false
	}
	b.tenants[tenant] = t
	t.held += cost
	return true
}

// Release gives back what Acquire took.
func (b *Budget) Release(tenant proto.ID, cost int64) {
	b.global.Release(cost)
	b.mu.Lock()
	t := b.tenants[tenant]
	t.held -= cost
	if t.held < 0 {
		b.mu.Unlock()
		panic("timeline: WAL budget released more than was taken")
	}
	b.dropIdle(tenant, t)
	b.mu.Unlock()
	t.sem.Release(cost)
}

// dropIdle forgets t when nothing of it is held or waited for. b.mu held.
func (b *Budget) dropIdle(tenant proto.ID, t *tenantBudget) {
	if t.held == 0 && t.waiting == 0 {
		delete(b.tenants, tenant)
	}
}

// Tenants is how many tenants hold or wait for budget.
func (b *Budget) Tenants() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.tenants)
}
