package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/proto"
)

// reconcile is the leader's work loop, every ReconcileInterval until its
// term ends: it starts a move for each migration request and each joint
// configuration without one (MoveParallel at most at once), and asks for
// the moves that drain nodes and replace dead ones.
func (c *Controller) reconcile(ctx context.Context, t Term) {
	var mu sync.Mutex
	running := map[proto.TimelineKey]bool{}
	var wg sync.WaitGroup
	defer wg.Wait()
	deadSince := map[uint64]time.Time{}
	c.warned = map[string]time.Time{}
	tick := time.NewTicker(c.cfg.ReconcileInterval)
	defer tick.Stop()
	for {
		work, err := c.pending(ctx, deadSince)
		if err != nil && ctx.Err() == nil {
			c.log.Debug("reconcile: reading etcd failed", "err", err)
			// While etcd cannot be read no lease can be renewed either:
			// the time a node looks dead starts again once it can.
			clear(deadSince)
		}
		for _, m := range work {
			key := proto.TimelineKey{TenantID: m.Tenant, TimelineID: m.Timeline}
			mu.Lock()
			if running[key] || len(running) >= c.cfg.MoveParallel {
				mu.Unlock()
				continue
			}
			running[key] = true
			c.m.moving.Set(float64(len(running)))
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.runMove(ctx, t, m)
				mu.Lock()
				delete(running, key)
				c.m.moving.Set(float64(len(running)))
				mu.Unlock()
			}()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// runMove carries out m and ends its request with the outcome.
func (c *Controller) runMove(ctx context.Context, t Term, m fleet.Migration) {
	log := c.log.With("tenant_id", m.Tenant, "timeline_id", m.Timeline, "members", m.Members, "reason", m.Reason)
	log.Info("moving timeline")
	err := c.Lead(ctx, func(ctx context.Context, t Term) error { return c.move(ctx, t, m) })
	switch {
	case ctx.Err() != nil, errors.Is(err, ErrNotLeader), errors.Is(err, fleet.ErrFenced):
		return // the next leader goes on from what etcd holds
	case err == nil:
		c.m.moves.WithLabelValues("done").Inc()
		log.Info("timeline moved")
	default:
		c.m.moves.WithLabelValues("failed").Inc()
		log.Error("timeline move failed", "err", err)
	}
	failure := ""
	if err != nil {
		failure = err.Error()
	}
	var replaced bool
	if err := c.Lead(ctx, func(ctx context.Context, t Term) error {
		var err error
		replaced, err = c.cfg.Client.EndMigration(ctx, m, failure, t.Fence())
		return err
	}); err != nil {
		log.Warn("ending the migration request failed", "err", err)
	}
	if replaced {
		log.Info("the migration request was replaced while this move ran; the new one is carried out next")
	}
}

// pending reads the work in etcd: the migration requests not ended, the
// joint configurations without one, and, for nodes being drained or dead
// past DeadNodeTimeout, new requests moving their timelines (each drain's
// Parallel at a time, MoveParallel in all), which it writes.
func (c *Controller) pending(ctx context.Context, deadSince map[uint64]time.Time) ([]fleet.Migration, error) {
	cl := c.cfg.Client
	reqs, _, err := cl.Migrations(ctx)
	if err != nil {
		return nil, err
	}
	tls, _, err := cl.Timelines(ctx, 0)
	if err != nil {
		return nil, err
	}
	var work []fleet.Migration
	asked := map[proto.TimelineKey]bool{}
	underway := map[string]int{} // requests not ended, by reason
	for _, m := range reqs {
		asked[proto.TimelineKey{TenantID: m.Tenant, TimelineID: m.Timeline}] = true
		if m.Error == "" {
			work = append(work, m)
			underway[m.Reason]++
		}
	}
	// A joint configuration without a request: a change someone left
	// half done (a controller killed before it wrote its request, a hand
	// edit). Finish it.
	for _, e := range tls {
		k := proto.TimelineKey{TenantID: e.Tenant, TimelineID: e.Timeline}
		if e.Config.Joint() && !asked[k] {
			work = append(work, fleet.Migration{Tenant: e.Tenant, Timeline: e.Timeline, Members: e.Config.NewMembers, From: e.Config.Members,
				Reason: "a change found under way"})
			asked[k] = true
		}
	}
	// Nodes to empty: drained ones, and dead ones past DeadNodeTimeout.
	nodes, _, _, err := cl.Nodes(ctx)
	if err != nil {
		return work, err
	}
	drains, _, err := cl.Drains(ctx)
	if err != nil {
		return work, err
	}
	now := time.Now()
	leaving := map[uint64]string{}
	limit := map[string]int{} // moves at once, by reason
	for _, d := range drains {
		leaving[d.ID] = fmt.Sprintf("drain of node %d", d.ID)
		limit[leaving[d.ID]] = d.Parallel
	}
	for _, n := range nodes {
		if n.Live() {
			delete(deadSince, n.ID)
			continue
		}
		if _, ok := deadSince[n.ID]; !ok {
			deadSince[n.ID] = now
		}
		if c.cfg.DeadNodeTimeout > 0 && now.Sub(deadSince[n.ID]) >= c.cfg.DeadNodeTimeout {
			if _, draining := leaving[n.ID]; !draining {
				leaving[n.ID] = fmt.Sprintf("node %d dead for %v", n.ID, c.cfg.DeadNodeTimeout)
				limit[leaving[n.ID]] = c.cfg.MoveParallel
			}
		}
	}
	if len(leaving) == 0 {
		return work, nil
	}
	held := map[uint64]int{}
	for _, e := range tls {
		for _, id := range e.Config.All() {
			held[id]++
		}
	}
	zone := map[uint64]string{}
	for _, n := range nodes {
		zone[n.ID] = n.Zone
	}
	exclude := func(id uint64) bool { _, ok := leaving[id]; return ok }
	room := c.cfg.MoveParallel - len(work) // work holds the moves under way too
	for _, e := range tls {
		if room <= 0 {
			break
		}
		k := proto.TimelineKey{TenantID: e.Tenant, TimelineID: e.Timeline}
		if asked[k] || e.Config.Joint() {
			continue
		}
		members := slices.Clone(e.Config.Members)
		changed, reason := false, ""
		for i, id := range members {
			why, ok := leaving[id]
			if !ok || underway[why] >= limit[why] {
				continue
			}
			others := slices.Delete(slices.Clone(members), i, i+1)
			to, ok := replacement(nodes, held, exclude, others, zone[id])
			if !ok {
				c.warnEvery(fmt.Sprintf("full %s %d", k, id), "no live node can take a timeline off a leaving node (waiting for room)",
					"tenant_id", e.Tenant, "timeline_id", e.Timeline, "node", id, "why", why)
				continue
			}
			if z := zone[to]; z != zone[id] && slices.ContainsFunc(others, func(o uint64) bool { return zone[o] == z }) {
				c.warnEvery(fmt.Sprintf("spread %s %d", k, id), "moving a timeline off a leaving node puts two of its members in one zone: no live node with room in the leaving node's zone or a zone the timeline is not in",
					"tenant_id", e.Tenant, "timeline_id", e.Timeline, "node", id, "to", to, "zone", z, "why", why)
			}
			members[i], changed, reason = to, true, why
			held[to]++
		}
		if !changed {
			continue
		}
		m := fleet.Migration{Tenant: e.Tenant, Timeline: e.Timeline, Members: members, From: e.Config.Members, Reason: reason}
		if err := c.Lead(ctx, func(ctx context.Context, t Term) error {
			var err error
			m.Rev, err = c.cfg.Client.RequestMigration(ctx, m, t.Fence())
			return err
		}); err != nil {
			return work, err
		}
		c.log.Info("asked to move a timeline off a leaving node", "tenant_id", e.Tenant, "timeline_id", e.Timeline, "from", e.Config.Members, "to", members, "why", reason)
		work = append(work, m)
		asked[k] = true
		underway[reason]++
		room--
	}
	return work, nil
}

// warnEvery logs a warning at most once a minute per key (the reconcile
// pass runs every second).
func (c *Controller) warnEvery(key, msg string, args ...any) {
	if last, ok := c.warned[key]; ok && time.Since(last) < time.Minute {
		return
	}
	c.warned[key] = time.Now()
	c.log.Warn(msg, args...)
}
