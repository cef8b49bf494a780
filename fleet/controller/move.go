package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/httpapi"
)

// Moving timelines between safekeepers (README_PROTO.md, "Membership and
// generations"; docs/operations.md, "Moving timelines"). The leader carries
// out every migration request in etcd (fleet.Migration), a few at a time,
// and finishes any joint configuration it finds without one. Each move:
//
//  1. the new members copy the timeline from a live old member
//     (POST /v1/pull_timeline), before they count toward any quorum, so
//     that the commits that will wait for them wait only for the WAL
//     written since;
//  2. the joint configuration (generation + 1: the old members and the new
//     ones) is written to etcd by compare-and-swap under the election's
//     fence;
//  3. it is pushed to every old and new member (PUT .../membership); the
//     answers of a majority of the old members give the sync position
//     (the highest (last_log_term, flush_lsn)) and the sync term (the
//     highest term): WAL up to there may have been committed without the
//     new members;
//  4. the new members' terms are raised to the sync term (POST
//     .../term_bump), so that a proposer elected by them alone later picks
//     a term above every earlier one;
//  5. once a majority of the new members reports the sync position (they
//     catch up from the proposer, which adopted the joint configuration),
//     the final configuration (generation + 2: the new members) is written
//     the same way and pushed to all, so the removed members learn it and
//     refuse the timeline (SK002);
//  6. if the new members do not catch up within CatchUpTimeout, the change
//     is rolled back instead: generation + 2 with the old members (safe:
//     in the joint configuration every commit had an old majority).
//
// Every step starts from what etcd holds, so a controller killed between
// any two is replaced by one that goes on from there.

// Safekeeper is what the controller asks of a safekeeper's HTTP API
// (server/httpapi.Client has these methods).
type Safekeeper interface {
	SetMembership(ctx context.Context, key proto.TimelineKey, conf proto.Configuration) (*httpapi.MembershipSwitch, []byte, error)
	TermBump(ctx context.Context, key proto.TimelineKey, term uint64) (*httpapi.TermBumpResponse, error)
	PullTimeline(ctx context.Context, key proto.TimelineKey, from string) (*httpapi.PullResponse, error)
}

// errRaced: the configuration moved on under a step; the move starts over
// from what etcd holds.
var errRaced = errors.New("the timeline's configuration changed meanwhile")

// position is a safekeeper's (last_log_term, flush_lsn), ordered.
type position struct {
	term  uint64
	flush proto.LSN
}

func (p position) atLeast(o position) bool {
	return p.term > o.term || (p.term == o.term && p.flush >= o.flush)
}

func (p position) String() string {
	return fmt.Sprintf("(last_log_term %d, flush_lsn %s)", p.term, p.flush)
}

func majority(n int) int { return n/2 + 1 }

// move carries out m in term t: it returns nil once the timeline's
// configuration is m.Members alone, or the reason it gave up (a
// catch-up that timed out is rolled back first).
func (c *Controller) move(ctx context.Context, t Term, m fleet.Migration) error {
	cl := c.cfg.Client
	key := proto.TimelineKey{TenantID: m.Tenant, TimelineID: m.Timeline}
	deadline := time.Now().Add(c.cfg.CatchUpTimeout)
	log := c.log.With("tenant_id", m.Tenant, "timeline_id", m.Timeline)
	wait := 200 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.Done():
				return ErrNotLeader
			case <-time.After(wait):
			}
			wait = min(2*wait, 2*time.Second)
		}
		cfg, rev, err := cl.Timeline(ctx, m.Tenant, m.Timeline)
		if err != nil {
			if errors.Is(err, fleet.ErrNoConfig) || errors.Is(err, fleet.ErrBadConfig) {
				return err
			}
			log.Warn("move: reading the configuration failed; retrying", "err", err)
			continue
		}
		nodes, _, _, err := cl.Nodes(ctx)
		if err != nil {
			log.Warn("move: reading the nodes failed; retrying", "err", err)
			continue
		}
		byID := map[uint64]fleet.NodeView{}
		for _, n := range nodes {
			byID[n.ID] = n
		}
		switch {
		case !cfg.Joint() && fleet.SameMembers(cfg.Members, m.Members):
			// Done. Tell the members and the old ones again (the final
			// push of a controller that died right after its write may
			// not have reached them; a configuration they hold already
			// changes nothing).
			c.push(ctx, key, cfg, slices.Concat(cfg.Members, m.From), byID)
			return nil
		case !cfg.Joint():
			if err := c.prepull(ctx, key, cfg, m.Members, byID); err != nil {
				if time.Now().After(deadline) {
					return fmt.Errorf("the new members could not copy the timeline: %w (nothing was changed)", err)
				}
				log.Warn("move: copying the timeline to the new members failed; retrying", "err", err)
				continue
			}
			joint := fleet.Config{Generation: cfg.Generation + 1, Members: cfg.Members, NewMembers: m.Members}
			ok, err := cl.SwapConfigFenced(ctx, m.Tenant, m.Timeline, rev, joint, t.Fence())
			if err != nil {
				if errors.Is(err, fleet.ErrFenced) {
					return err
				}
				log.Warn("move: writing the joint configuration failed; retrying", "err", err)
				continue
			}
			if ok {
				c.m.moveSteps.WithLabelValues("joint").Inc()
				log.Info("joint configuration written", "generation", joint.Generation, "members", joint.Members, "new_members", joint.NewMembers, "reason", m.Reason)
			}
			wait = 0
		default:
			err := c.finish(ctx, t, key, cfg, rev, byID, deadline, log)
			switch {
			case err == nil, errors.Is(err, errRaced):
				wait = 0
			case errors.Is(err, fleet.ErrFenced), errors.Is(err, errRolledBack):
				return err
			default:
				log.Warn("move: retrying", "err", err)
			}
		}
	}
}

// newMembersDownGrace is how long a move waits, once fewer than a
// majority of its new members hold a lease in etcd, before it rolls back:
// the commits of a joint configuration wait for a new majority.
const newMembersDownGrace = 15 * time.Second

// errRolledBack: the new members did not catch up in time; the old
// members are the configuration again.
var errRolledBack = errors.New("rolled back to the old members")

// prepull has every new member that is not an old one copy the timeline
// from a live old member.
func (c *Controller) prepull(ctx context.Context, key proto.TimelineKey, cfg fleet.Config, members []uint64, byID map[uint64]fleet.NodeView) error {
	var src fleet.NodeView
	for _, id := range cfg.Members {
		if n, ok := byID[id]; ok && n.Live() && n.PG != "" {
			src = n
			break
		}
	}
	for _, id := range members {
		if slices.Contains(cfg.Members, id) {
			continue
		}
		n, ok := byID[id]
		switch {
		case !ok || n.HTTP == "":
			return fmt.Errorf("new member %d has no advertised HTTP address", id)
		case src.ID == 0:
			return fmt.Errorf("no old member of %s is live to copy the timeline from", cfg)
		}
		res, err := c.cfg.Safekeeper(n.HTTP).PullTimeline(ctx, key, src.PG)
		if err != nil {
			return fmt.Errorf("node %d pulling from node %d: %w", id, src.ID, err)
		}
		if !res.Existed {
			c.m.moveSteps.WithLabelValues("pull").Inc()
			c.log.Info("new member copied the timeline", "tenant_id", key.TenantID, "timeline_id", key.TimelineID, "node", id, "from", src.ID,
				"flush_lsn", res.FlushLSN, "term", res.Term)
		}
	}
	return nil
}

// push sends conf to the nodes ids and returns the answers of those that
// answered.
func (c *Controller) push(ctx context.Context, key proto.TimelineKey, conf fleet.Config, ids []uint64, byID map[uint64]fleet.NodeView) map[uint64]*httpapi.MembershipSwitch {
	out := map[uint64]*httpapi.MembershipSwitch{}
	for _, id := range ids {
		n, ok := byID[id]
		if !ok || n.HTTP == "" {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, _, err := c.cfg.Safekeeper(n.HTTP).SetMembership(pctx, key, conf)
		cancel()
		if err != nil {
			c.log.Debug("pushing a configuration failed", "node", id, "generation", conf.Generation, "err", err)
			continue
		}
		out[id] = res
	}
	return out
}

// finish drives joint configuration cfg (at mod revision rev) to its new
// members, or rolls it back after deadline.
func (c *Controller) finish(ctx context.Context, t Term, key proto.TimelineKey, cfg fleet.Config, rev int64, byID map[uint64]fleet.NodeView,
	deadline time.Time, log interface{ Info(string, ...any) }) error {
	cl := c.cfg.Client
	answers := c.push(ctx, key, cfg, cfg.All(), byID)
	var sync position
	var syncTerm uint64
	old := 0
	for id, a := range answers {
		if a.Configuration.Generation > cfg.Generation {
			return errRaced
		}
		if slices.Contains(cfg.Members, id) {
			old++
			syncTerm = max(syncTerm, a.Term)
			if p := (position{a.LastLogTerm, a.FlushLSN}); p.atLeast(sync) {
				sync = p
			}
		}
	}
	if old < majority(len(cfg.Members)) {
		if time.Now().After(deadline) {
			return c.rollback(ctx, t, key, cfg, rev, byID, fmt.Sprintf("only %d of the old members %v answered", old, cfg.Members))
		}
		return fmt.Errorf("%d of the old members %v answered the joint configuration, a majority is %d", old, cfg.Members, majority(len(cfg.Members)))
	}
	for _, id := range cfg.NewMembers {
		if n, ok := byID[id]; ok && n.HTTP != "" && !slices.Contains(cfg.Members, id) {
			if _, err := c.cfg.Safekeeper(n.HTTP).TermBump(ctx, key, syncTerm); err != nil {
				c.log.Warn("term bump of a new member failed", "tenant_id", key.TenantID, "timeline_id", key.TimelineID, "node", id, "term", syncTerm, "err", err)
			}
		}
	}
	var downSince time.Time // since when too few new members are live
	for {
		if nodes, _, _, err := cl.Nodes(ctx); err == nil {
			live := 0
			for _, n := range nodes {
				if n.Live() && slices.Contains(cfg.NewMembers, n.ID) {
					live++
				}
			}
			switch {
			case live >= majority(len(cfg.NewMembers)):
				downSince = time.Time{}
			case downSince.IsZero():
				downSince = time.Now()
			case time.Since(downSince) >= newMembersDownGrace:
				// They cannot catch up while down, and the commits wait
				// for them: give the timeline back to the old members now
				// rather than at the catch-up timeout.
				return c.rollback(ctx, t, key, cfg, rev, byID, fmt.Sprintf("%d of the new members %v are live (a majority is %d) for %v",
					live, cfg.NewMembers, majority(len(cfg.NewMembers)), newMembersDownGrace))
			}
		}
		caught := 0
		for _, a := range c.push(ctx, key, cfg, cfg.NewMembers, byID) {
			if a.Configuration.Generation > cfg.Generation {
				return errRaced
			}
			if (position{a.LastLogTerm, a.FlushLSN}).atLeast(sync) && a.Term >= syncTerm {
				caught++
			}
		}
		if caught >= majority(len(cfg.NewMembers)) {
			break
		}
		if time.Now().After(deadline) {
			return c.rollback(ctx, t, key, cfg, rev, byID, fmt.Sprintf("%d of the new members %v reached the sync position %s within %v, a majority is %d",
				caught, cfg.NewMembers, sync, c.cfg.CatchUpTimeout, majority(len(cfg.NewMembers))))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.Done():
			return ErrNotLeader
		case <-time.After(200 * time.Millisecond):
		}
	}
	final := fleet.Config{Generation: cfg.Generation + 1, Members: cfg.NewMembers}
	ok, err := cl.SwapConfigFenced(ctx, key.TenantID, key.TimelineID, rev, final, t.Fence())
	if err != nil {
		return err
	}
	if !ok {
		return errRaced
	}
	c.m.moveSteps.WithLabelValues("final").Inc()
	log.Info("final configuration written", "generation", final.Generation, "members", final.Members, "removed", removed(cfg))
	c.push(ctx, key, final, cfg.All(), byID)
	return nil
}

// removed are the members of joint configuration cfg that are not new
// members.
func removed(cfg fleet.Config) []uint64 {
	var out []uint64
	for _, id := range cfg.Members {
		if !slices.Contains(cfg.NewMembers, id) {
			out = append(out, id)
		}
	}
	return out
}

// rollback writes generation + 1 of joint configuration cfg with its old
// members, pushes it, and returns errRolledBack with why.
func (c *Controller) rollback(ctx context.Context, t Term, key proto.TimelineKey, cfg fleet.Config, rev int64, byID map[uint64]fleet.NodeView, why string) error {
	back := fleet.Config{Generation: cfg.Generation + 1, Members: cfg.Members}
	ok, err := c.cfg.Client.SwapConfigFenced(ctx, key.TenantID, key.TimelineID, rev, back, t.Fence())
	if err != nil {
		return err
	}
	if !ok {
		return errRaced
	}
	c.m.moveSteps.WithLabelValues("rollback").Inc()
	c.log.Warn("membership change rolled back", "tenant_id", key.TenantID, "timeline_id", key.TimelineID, "generation", back.Generation,
		"members", back.Members, "why", why)
	c.push(ctx, key, back, cfg.All(), byID)
	return fmt.Errorf("%w (generation %d): %s", errRolledBack, back.Generation, why)
}

// candidate orders the nodes a timeline may move to.
type candidate struct {
	fleet.NodeView
	held int
}

// replacement chooses the node to take dead's place in a timeline whose
// members are others: a live node that is not a member, not draining and
// not dead, in dead's zone if one has room, else in a zone no other member
// is in, else any; the least loaded first (timelines held, then disk free).
func replacement(nodes []fleet.NodeView, held map[uint64]int, exclude func(uint64) bool, others []uint64, deadZone string) (uint64, bool) {
	zones := map[string]bool{}
	byID := map[uint64]fleet.NodeView{}
	for _, n := range nodes {
		byID[n.ID] = n
	}
	for _, id := range others {
		zones[byID[id].Zone] = true
	}
	var cands []candidate
	for _, n := range nodes {
		if !n.Live() || slices.Contains(others, n.ID) || exclude(n.ID) {
			continue
		}
		if n.Status.MaxTimelines > 0 && held[n.ID] >= n.Status.MaxTimelines {
			continue
		}
		cands = append(cands, candidate{NodeView: n, held: held[n.ID]})
	}
	rank := func(c candidate) int {
		switch {
		case c.Zone == deadZone:
			return 0
		case !zones[c.Zone]:
			return 1
		}
		return 2
	}
	slices.SortFunc(cands, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(a.held, b.held), cmp.Compare(b.Status.DiskFreeBytes, a.Status.DiskFreeBytes), cmp.Compare(a.ID, b.ID))
	})
	if len(cands) == 0 {
		return 0, false
	}
	return cands[0].ID, true
}
