package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/safekeeper/safekeeper/proto"
)

// DefaultReplicas is the members of a new timeline (--replicas).
const DefaultReplicas = 3

// Candidate is a live node as placement weighs it.
type Candidate struct {
	ID   uint64
	Zone string
	// Held is the timelines whose configuration names the node (members
	// or new members): what placement has put there, known at once, where
	// the node's own count lags by an update.
	Held         int
	MaxTimelines int // 0: no limit
	DiskFree     uint64
}

// ErrNoRoom: fewer live nodes with room than the replicas asked for.
var ErrNoRoom = errors.New("not enough live safekeepers with room")

// Choose picks replicas members among cands: in distinct zones while there
// are zones left, the least loaded first (fewest timelines held, then the
// most disk free, then the lowest id). It returns them in that order and
// how many zones they span.
func Choose(cands []Candidate, replicas int) ([]uint64, int, error) {
	if replicas < 1 {
		return nil, 0, fmt.Errorf("fleet: %d replicas: want at least 1", replicas)
	}
	var room []Candidate
	for _, c := range cands {
		if c.MaxTimelines <= 0 || c.Held < c.MaxTimelines {
			room = append(room, c)
		}
	}
	slices.SortFunc(room, func(a, b Candidate) int {
		return cmp.Or(cmp.Compare(a.Held, b.Held), cmp.Compare(b.DiskFree, a.DiskFree), cmp.Compare(a.ID, b.ID))
	})
	var out []uint64
	zones := map[string]bool{}
	picked := map[uint64]bool{}
	for _, distinct := range []bool{true, false} {
		for _, c := range room {
			if len(out) == replicas {
				break
			}
			if picked[c.ID] || (distinct && zones[c.Zone]) {
				continue
			}
			out, picked[c.ID], zones[c.Zone] = append(out, c.ID), true, true
		}
	}
	if len(out) < replicas {
		return nil, 0, fmt.Errorf("%w: %d of %d live safekeepers have room for one more timeline, %d replicas asked",
			ErrNoRoom, len(room), len(cands), replicas)
	}
	return out, len(zones), nil
}

// Placement is the outcome of Place.
type Placement struct {
	Config  Config
	Created bool // false: the timeline had a configuration already
	Zones   int  // the distinct zones of the members (when Created)
	// Spread explains a placement over fewer zones than replicas.
	Spread string
	// Members are the member nodes as read at placement.
	Members []NodeView
	// Skipped are configuration or node keys that did not parse, each
	// naming its key: placement went on without them.
	Skipped []error
}

// ErrFenced: a fenced write was refused because the fence no longer holds
// (a controller that lost its leadership).
var ErrFenced = errors.New("fenced: no longer the leader")

// Place creates a timeline's configuration (generation 1) with members
// chosen by Choose among the live nodes, unless it has one already (then
// it returns that one, Created false: creating twice is harmless). The
// write is a transaction on the timeline key being absent and on the
// placement key not having moved since the nodes and configurations were
// read, plus fence (a controller's leadership); it is retried when another
// placement came between.
func (c *Client) Place(ctx context.Context, tenant, timeline proto.ID, replicas int, fence ...clientv3.Cmp) (Placement, error) {
	return c.place(ctx, tenant, timeline, func(cands []Candidate, _ map[uint64]NodeView) ([]uint64, int, error) {
		return Choose(cands, replicas)
	}, replicas, fence)
}

// ErrNotMembers: an explicit placement names nodes that never registered,
// or the timeline is placed on other members already.
var ErrNotMembers = errors.New("not the timeline's members")

// Assign is Place with the members given (an existing timeline brought
// into the fleet on the nodes that hold it, or an operator's choice):
// each must have registered (live or not). A timeline placed on these
// members already answers Created false; on others, ErrNotMembers.
func (c *Client) Assign(ctx context.Context, tenant, timeline proto.ID, members []uint64, fence ...clientv3.Cmp) (Placement, error) {
	if err := validConfig(Config{Generation: 1, Members: members}); err != nil {
		return Placement{}, fmt.Errorf("fleet: members: %w", err)
	}
	p, err := c.place(ctx, tenant, timeline, func(_ []Candidate, byID map[uint64]NodeView) ([]uint64, int, error) {
		zones := map[string]bool{}
		for _, id := range members {
			n, ok := byID[id]
			if !ok {
				return nil, 0, fmt.Errorf("%w: node %d has never registered in etcd", ErrNotMembers, id)
			}
			zones[n.Zone] = true
		}
		return slices.Clone(members), len(zones), nil
	}, len(members), fence)
	if err == nil && !p.Created && !slices.Equal(p.Config.Members, members) {
		return p, fmt.Errorf("%w: %s/%s is placed on %s already, not on %v", ErrNotMembers, tenant, timeline, p.Config, members)
	}
	return p, err
}

func (c *Client) place(ctx context.Context, tenant, timeline proto.ID, choose func([]Candidate, map[uint64]NodeView) ([]uint64, int, error), replicas int, fence []clientv3.Cmp) (Placement, error) {
	key := c.TimelineKey(tenant, timeline)
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return Placement{}, err
		}
		octx, cancel := opCtx(ctx)
		resp, err := c.cli.Get(octx, c.placementKey())
		cancel()
		if err != nil {
			return Placement{}, c.unavailable(err)
		}
		rev := resp.Header.Revision
		var placeRev int64
		if len(resp.Kvs) > 0 {
			placeRev = resp.Kvs[0].ModRevision
		}
		nodes, _, nodeErrs, err := c.nodes(ctx, rev)
		if err != nil {
			return Placement{}, err
		}
		tls, tlErrs, err := c.Timelines(ctx, rev)
		if err != nil {
			return Placement{}, err
		}
		byID := map[uint64]NodeView{}
		for _, n := range nodes {
			byID[n.ID] = n
		}
		held := map[uint64]int{}
		for _, e := range tls {
			if e.Tenant == tenant && e.Timeline == timeline {
				return Placement{Config: e.Config, Members: pick(byID, e.Config.All())}, nil
			}
			for _, id := range e.Config.All() {
				held[id]++
			}
		}
		drains, _, err := c.drains(ctx, rev)
		if err != nil {
			return Placement{}, err
		}
		drained := map[uint64]bool{}
		for _, d := range drains {
			drained[d.ID] = true
		}
		var cands []Candidate
		for _, n := range nodes {
			if n.Live() && !drained[n.ID] {
				cands = append(cands, Candidate{ID: n.ID, Zone: n.Zone, Held: held[n.ID], MaxTimelines: n.Status.MaxTimelines, DiskFree: n.Status.DiskFreeBytes})
			}
		}
		ids, zones, err := choose(cands, byID)
		if err != nil {
			return Placement{}, err
		}
		cfg := Config{Generation: 1, Members: ids}
		val, _ := json.Marshal(cfg)
		cond := append([]clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
			clientv3.Compare(clientv3.ModRevision(c.placementKey()), "=", placeRev),
		}, fence...)
		octx, cancel = opCtx(ctx)
		tx, err := c.cli.Txn(octx).If(cond...).
			Then(clientv3.OpPut(key, string(val)), clientv3.OpPut(c.placementKey(), tenant.String()+"/"+timeline.String())).
			Else(clientv3.OpGet(key), clientv3.OpGet(c.placementKey())).Commit()
		cancel()
		if err != nil {
			return Placement{}, c.unavailable(err)
		}
		if tx.Succeeded {
			p := Placement{Config: cfg, Created: true, Zones: zones, Members: pick(byID, ids), Skipped: append(nodeErrs, tlErrs...)}
			if zones < replicas {
				p.Spread = fmt.Sprintf("the %d members span %d zones: fewer zones than replicas have live safekeepers with room", replicas, zones)
			}
			return p, nil
		}
		// Who moved? Neither key: the fence failed.
		kk, pk := tx.Responses[0].GetResponseRange().Kvs, tx.Responses[1].GetResponseRange().Kvs
		pkRev := int64(0)
		if len(pk) > 0 {
			pkRev = pk[0].ModRevision
		}
		if len(kk) > 0 {
			// The timeline has a key: another placement made it, or it is
			// there unparsed (garbage is refused, never overwritten).
			cfg, err := ParseConfig(key, kk[0].Value)
			if err != nil {
				return Placement{}, err
			}
			return Placement{Config: cfg, Members: pick(byID, cfg.All())}, nil
		}
		if pkRev == placeRev {
			return Placement{}, ErrFenced
		}
		if attempt >= 200 {
			return Placement{}, fmt.Errorf("fleet: placement of %s/%s kept losing to other placements", tenant, timeline)
		}
		// Another placement came between: again after a random pause, so
		// that placers racing each other spread out.
		select {
		case <-ctx.Done():
			return Placement{}, ctx.Err()
		case <-time.After(time.Duration(rand.Int64N(int64(min(time.Millisecond<<min(attempt, 8), 200*time.Millisecond))) + 1)):
		}
	}
}

func pick(byID map[uint64]NodeView, ids []uint64) []NodeView {
	out := make([]NodeView, 0, len(ids))
	for _, id := range ids {
		if n, ok := byID[id]; ok {
			out = append(out, n)
		} else {
			out = append(out, NodeView{Node: Node{ID: id}})
		}
	}
	return out
}
