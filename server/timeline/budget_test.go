package timeline

import (
	"context"
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

// TestBudgetForgetsIdleTenants: a tenant's share is kept only while it
// holds or waits for budget, so tenant churn does not grow the map; a
// share dropped and made again is whole.
func TestBudgetForgetsIdleTenants(t *testing.T) {
	b := NewBudget(4 << 20)
	ctx := context.Background()
	for i := range 100 {
		id := proto.ID{0xee, byte(i)}
		if err := b.Acquire(ctx, id, b.share); err != nil {
			t.Fatal(err)
		}
		b.Release(id, b.share)
	}
	// One that waits and gives up, one that holds.
	held := proto.ID{0xee, 0xff}
	if err := b.Acquire(ctx, held, b.share); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.Acquire(cctx, held, 1); err == nil {
		t.Fatal("an acquire over the tenant's share succeeded")
	}
	if n := len(b.tenants); n != 1 {
		t.Fatalf("%d tenants remembered, want 1 (the one holding budget)", n)
	}
	b.Release(held, b.share)
	if n := len(b.tenants); n != 0 {
		t.Fatalf("%d tenants remembered after every release, want 0", n)
	}
	if err := b.Acquire(ctx, held, b.share); err != nil {
		t.Fatalf("the whole share again: %v", err)
	}
	b.Release(held, b.share)
	// The owner gives back a group commit's messages in one release.
	for range 3 {
		if err := b.Acquire(ctx, held, 1000); err != nil {
			t.Fatal(err)
		}
	}
	b.Release(held, 3000)
	if n := len(b.tenants); n != 0 {
		t.Fatalf("%d tenants remembered after one release of three acquires, want 0", n)
	}
}
