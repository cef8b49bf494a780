package fleet

import (
	"context"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/safekeeper/safekeeper/proto"
)

// Resolved is a timeline's configuration with its members' records.
type Resolved struct {
	Config  Config
	Members []NodeView // in Config.All() order
}

// Addrs is the members' advertised PostgreSQL-protocol addresses, in
// Config.All() order. A member with no node record has no address: an
// error naming it.
func (r Resolved) Addrs() ([]string, error) {
	out := make([]string, 0, len(r.Members))
	for _, m := range r.Members {
		if m.PG == "" {
			return nil, fmt.Errorf("member %d of the timeline (%s) has never registered: no address for it", m.ID, r.Config)
		}
		out = append(out, m.PG)
	}
	return out, nil
}

// IDs are the members' node ids in the order of Addrs (Config.All()): the
// safekeeper_id expected at each address.
func (r Resolved) IDs() []uint64 { return r.Config.All() }

// HTTPAddrs is the members' advertised HTTP addresses ("" where none).
func (r Resolved) HTTPAddrs() []string {
	out := make([]string, len(r.Members))
	for i, m := range r.Members {
		out[i] = m.HTTP
	}
	return out
}

// Same reports whether r and o name the same configuration at the same
// addresses.
func (r Resolved) Same(o Resolved) bool {
	if r.Config.Generation != o.Config.Generation || !slices.Equal(r.Config.Members, o.Config.Members) ||
		!slices.Equal(r.Config.NewMembers, o.Config.NewMembers) || len(r.Members) != len(o.Members) {
		return false
	}
	for i := range r.Members {
		if r.Members[i].Node != o.Members[i].Node {
			return false
		}
	}
	return true
}

// Resolve reads a timeline's configuration and its members' records.
func (c *Client) Resolve(ctx context.Context, tenant, timeline proto.ID) (Resolved, error) {
	cfg, _, err := c.Timeline(ctx, tenant, timeline)
	if err != nil {
		return Resolved{}, err
	}
	nodes, _, _, err := c.Nodes(ctx)
	if err != nil {
		return Resolved{}, err
	}
	byID := map[uint64]NodeView{}
	for _, n := range nodes {
		byID[n.ID] = n
	}
	return Resolved{Config: cfg, Members: pick(byID, cfg.All())}, nil
}

// Watch follows a timeline's configuration and its members' records from
// last on, until ctx ends: fn gets every resolution that differs from the
// one before. A configuration that does not parse, or etcd unreachable,
// goes to onErr and the last valid resolution stays in force.
func (c *Client) Watch(ctx context.Context, tenant, timeline proto.ID, last Resolved, fn func(Resolved), onErr func(error)) {
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		tw := c.cli.Watch(wctx, c.TimelineKey(tenant, timeline))
		nw := c.cli.Watch(wctx, c.nodesPrefix(), clientv3.WithPrefix())
		check := func() {
			r, err := c.Resolve(ctx, tenant, timeline)
			if err != nil {
				if ctx.Err() == nil {
					onErr(err)
				}
				return
			}
			if !r.Same(last) {
				last = r
				fn(r)
			}
		}
		check() // what changed before the watches started
		for open := true; open && ctx.Err() == nil; {
			select {
			case <-ctx.Done():
			case resp, ok := <-tw:
				open = ok && resp.Err() == nil
				if open {
					check()
				}
			case resp, ok := <-nw:
				open = ok && resp.Err() == nil
				if open {
					check()
				}
			}
		}
		cancel()
		select { // a broken watch (no leader: etcd down): again shortly
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
