package fleet

import (
	"context"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// NodeStatus is one node as `safekeeper cluster status` shows it.
type NodeStatus struct {
	ID            uint64 `json:"id"`
	Zone          string `json:"zone"`
	AdvertisePG   string `json:"advertise_pg"`
	AdvertiseHTTP string `json:"advertise_http,omitempty"`
	Live          bool   `json:"live"`
	// Timelines is how many configurations name the node (members or new
	// members): what placement put there, whether or not it is live.
	Timelines int `json:"timelines"`
	// Capacity is what the node last reported; nil while it is down.
	Capacity *Capacity `json:"capacity,omitempty"`
}

// ZoneStatus counts a zone's nodes.
type ZoneStatus struct {
	Zone  string `json:"zone"`
	Nodes int    `json:"nodes"`
	Live  int    `json:"live"`
}

// QuorumLoss is a timeline with fewer live members than a majority of its
// members (or, while it changes, of its new members): no proposer can
// commit on it until members come back.
type QuorumLoss struct {
	Tenant     string   `json:"tenant_id"` // 32 hex digits
	Timeline   string   `json:"timeline_id"`
	Generation uint64   `json:"generation"`
	Members    []uint64 `json:"members"`
	NewMembers []uint64 `json:"new_members,omitempty"`
	// Live is the members (and new members) that are live.
	Live []uint64 `json:"live"`
}

// ClusterStatus is the fleet as read from etcd at one revision: what
// `safekeeper cluster status` prints and a controller's GET /v1/cluster
// answers.
type ClusterStatus struct {
	Revision    int64        `json:"revision"`
	Nodes       []NodeStatus `json:"nodes"`
	Zones       []ZoneStatus `json:"zones"`
	Timelines   int          `json:"timelines"`
	BelowQuorum []QuorumLoss `json:"below_quorum"`
	// Leader is the controller leader's campaign value (its advertised
	// HTTP address); "" when no controller runs.
	Leader string `json:"leader"`
	// Errors are keys that do not parse, each naming its key: left out of
	// the figures above.
	Errors []string `json:"errors"`
}

// LiveNodes and DownNodes count the nodes by state.
func (s ClusterStatus) LiveNodes() (live, down int) {
	for _, n := range s.Nodes {
		if n.Live {
			live++
		} else {
			down++
		}
	}
	return live, down
}

// Leader is the value of the controllers' election leader (the oldest
// key under ElectionPrefix, as concurrency.Election.Leader reads it), ""
// when there is none.
func (c *Client) Leader(ctx context.Context) (string, error) {
	octx, cancel := opCtx(ctx)
	defer cancel()
	resp, err := c.cli.Get(octx, c.ElectionPrefix(), clientv3.WithFirstCreate()...)
	if err != nil {
		return "", c.unavailable(err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

// Status reads the whole fleet at one revision: every node with the
// timelines its configurations give it, the zones, the timelines below
// quorum and the controller leader. Keys that do not parse go to Errors;
// only etcd unreachable is an error (wrapping ErrUnavailable).
func (c *Client) Status(ctx context.Context) (ClusterStatus, error) {
	nodes, rev, nodeErrs, err := c.nodes(ctx, 0)
	if err != nil {
		return ClusterStatus{}, err
	}
	tls, tlErrs, err := c.Timelines(ctx, rev)
	if err != nil {
		return ClusterStatus{}, err
	}
	octx, cancel := opCtx(ctx)
	lead, err := c.cli.Get(octx, c.ElectionPrefix(), append(clientv3.WithFirstCreate(), clientv3.WithRev(rev))...)
	cancel()
	if err != nil {
		return ClusterStatus{}, c.unavailable(err)
	}
	s := ClusterStatus{Revision: rev, Nodes: []NodeStatus{}, Zones: []ZoneStatus{}, BelowQuorum: []QuorumLoss{}, Errors: []string{}, Timelines: len(tls)}
	if len(lead.Kvs) > 0 {
		s.Leader = string(lead.Kvs[0].Value)
	}
	for _, e := range append(nodeErrs, tlErrs...) {
		s.Errors = append(s.Errors, e.Error())
	}
	live := map[uint64]bool{}
	held := map[uint64]int{}
	for _, e := range tls {
		for _, id := range e.Config.All() {
			held[id]++
		}
	}
	zones := map[string]*ZoneStatus{}
	for _, n := range nodes {
		ns := NodeStatus{ID: n.ID, Zone: n.Zone, AdvertisePG: n.PG, AdvertiseHTTP: n.HTTP, Live: n.Live(), Timelines: held[n.ID]}
		z := zones[n.Zone]
		if z == nil {
			z = &ZoneStatus{Zone: n.Zone}
			zones[n.Zone] = z
		}
		z.Nodes++
		if n.Live() {
			capacity := n.Status.Capacity
			ns.Capacity = &capacity
			live[n.ID] = true
			z.Live++
		}
		s.Nodes = append(s.Nodes, ns)
	}
	for _, z := range zones {
		s.Zones = append(s.Zones, *z)
	}
	slices.SortFunc(s.Zones, func(a, b ZoneStatus) int {
		switch {
		case a.Zone < b.Zone:
			return -1
		case a.Zone > b.Zone:
			return 1
		}
		return 0
	})
	for _, e := range tls {
		if !BelowQuorum(e.Config, live) {
			continue
		}
		q := QuorumLoss{Tenant: e.Tenant.String(), Timeline: e.Timeline.String(), Generation: e.Config.Generation,
			Members: e.Config.Members, NewMembers: e.Config.NewMembers, Live: []uint64{}}
		for _, id := range e.Config.All() {
			if live[id] {
				q.Live = append(q.Live, id)
			}
		}
		s.BelowQuorum = append(s.BelowQuorum, q)
	}
	return s, nil
}

// BelowQuorum reports whether fewer of cfg's members are live than a
// majority of them, or, while the membership changes, fewer of its new
// members than a majority of those (a joint configuration needs both).
func BelowQuorum(cfg Config, live map[uint64]bool) bool {
	short := func(ids []uint64) bool {
		n := 0
		for _, id := range ids {
			if live[id] {
				n++
			}
		}
		return n < len(ids)/2+1
	}
	return short(cfg.Members) || (len(cfg.NewMembers) > 0 && short(cfg.NewMembers))
}
