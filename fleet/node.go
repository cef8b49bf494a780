package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Node is a safekeeper's record: who it is and where to reach it. It has
// no lease: it stays when the process is gone.
type Node struct {
	ID   uint64 `json:"id"`
	Zone string `json:"zone"`
	// PG is the advertised host:port of the PostgreSQL-protocol listener
	// (proposers and readers dial it); HTTP that of the HTTP API, if any.
	PG   string `json:"advertise_pg"`
	HTTP string `json:"advertise_http,omitempty"`
}

func (n Node) validate() error {
	switch {
	case n.ID == 0:
		return errors.New("id 0")
	case n.Zone == "" || strings.ContainsAny(n.Zone, " \t\n/"):
		return fmt.Errorf("zone %q: want a name without spaces or slashes", n.Zone)
	case n.PG == "":
		return errors.New("no advertise_pg address")
	}
	return nil
}

// Capacity is what a node reports of its load.
type Capacity struct {
	Timelines      int    `json:"timelines"`
	MaxTimelines   int    `json:"max_timelines"`
	DiskFreeBytes  uint64 `json:"disk_free_bytes"`
	DiskTotalBytes uint64 `json:"disk_total_bytes"`
}

// moved reports whether c differs from o enough to be written again: a
// timeline more or less, another limit, or 1% of the disk.
func (c Capacity) moved(o Capacity) bool {
	if c.Timelines != o.Timelines || c.MaxTimelines != o.MaxTimelines || c.DiskTotalBytes != o.DiskTotalBytes {
		return true
	}
	d := int64(c.DiskFreeBytes) - int64(o.DiskFreeBytes)
	return d < 0 && -d > int64(c.DiskTotalBytes/100) || d > int64(c.DiskTotalBytes/100)
}

// Status is a live node's entry, under its lease: gone when the lease is.
type Status struct {
	ID uint64 `json:"id"`
	// Instance names the process's data: host and data directory. Two
	// live processes cannot share one (bbolt locks the file), so a Status
	// of the same instance is an earlier run's.
	Instance     string    `json:"instance"`
	PG           string    `json:"advertise_pg"`
	RegisteredAt time.Time `json:"registered_at"`
	Version      string    `json:"version,omitempty"`
	Capacity
}

// DuplicateError is a registration refused because another live process
// holds the node id.
type DuplicateError struct {
	ID       uint64
	PG       string // the other's advertised address
	Instance string
}

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("node id %d is registered by another live safekeeper at %s (%s): each safekeeper needs its own --id",
		e.ID, e.PG, e.Instance)
}

// RegisterConfig is a node's registration.
type RegisterConfig struct {
	Node     Node
	Instance string
	Version  string
	// TTL is the lease's time to live (--etcd-lease-ttl): a process gone
	// this long is no longer live. Default 10 s, at least 2 s.
	TTL time.Duration
	// Capacity reports the node's load; called at registration and every
	// UpdateInterval (default 5 s). The Status is rewritten only when it
	// moved (Capacity.moved).
	Capacity       func() Capacity
	UpdateInterval time.Duration
	Logger         *slog.Logger
}

// Registration is a node registered in etcd and kept alive.
type Registration struct {
	c      *Client
	cfg    RegisterConfig
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	lease  clientv3.LeaseID
	status Status
	writes int // Status writes, for tests and metrics
}

// Register registers cfg.Node (see the package comment) and keeps it
// registered until Close. It fails with a *DuplicateError when another
// live process holds the id, and with an error wrapping ErrUnavailable when
// etcd does not answer.
func (c *Client) Register(ctx context.Context, cfg RegisterConfig) (*Registration, error) {
	if err := cfg.Node.validate(); err != nil {
		return nil, fmt.Errorf("fleet: node: %w", err)
	}
	if cfg.TTL == 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.TTL < 2*time.Second {
		return nil, fmt.Errorf("fleet: lease TTL %v: want at least 2s", cfg.TTL)
	}
	if cfg.UpdateInterval <= 0 {
		cfg.UpdateInterval = 5 * time.Second
	}
	if cfg.Capacity == nil {
		cfg.Capacity = func() Capacity { return Capacity{} }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Registration{c: c, cfg: cfg, done: make(chan struct{})}
	if err := r.register(ctx); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.run(rctx)
	return r, nil
}

// register grants a lease and writes the Node and the Status under it.
func (r *Registration) register(ctx context.Context) error {
	c, id := r.c, r.cfg.Node.ID
	node, _ := json.Marshal(r.cfg.Node)
	for {
		octx, cancel := opCtx(ctx)
		lease, err := c.cli.Grant(octx, int64((r.cfg.TTL+time.Second-1)/time.Second))
		cancel()
		if err != nil {
			return c.unavailable(err)
		}
		st := Status{ID: id, Instance: r.cfg.Instance, PG: r.cfg.Node.PG, RegisteredAt: time.Now().UTC().Truncate(time.Millisecond),
			Version: r.cfg.Version, Capacity: r.cfg.Capacity()}
		val, _ := json.Marshal(st)
		put := []clientv3.Op{clientv3.OpPut(c.aliveKey(id), string(val), clientv3.WithLease(lease.ID))}
		// The node's record only when it changed: proposers watch it.
		octx, cancel = opCtx(ctx)
		cur, err := c.cli.Get(octx, c.nodeKey(id))
		cancel()
		if err != nil {
			c.revoke(lease.ID)
			return c.unavailable(err)
		}
		if len(cur.Kvs) == 0 || !bytes.Equal(cur.Kvs[0].Value, node) {
			put = append(put, clientv3.OpPut(c.nodeKey(id), string(node)))
		}
		octx, cancel = opCtx(ctx)
		resp, err := c.cli.Txn(octx).If(clientv3.Compare(clientv3.CreateRevision(c.aliveKey(id)), "=", 0)).
			Then(put...).Else(clientv3.OpGet(c.aliveKey(id))).Commit()
		cancel()
		if err != nil {
			c.revoke(lease.ID)
			return c.unavailable(err)
		}
		if resp.Succeeded {
			r.mu.Lock()
			r.lease, r.status = lease.ID, st
			r.writes++
			r.mu.Unlock()
			return nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			c.revoke(lease.ID)
			continue // gone meanwhile
		}
		kv := kvs[0]
		var other Status
		if err := json.Unmarshal(kv.Value, &other); err == nil && other.Instance == r.cfg.Instance && r.cfg.Instance != "" {
			// An earlier run of this instance: take its place.
			octx, cancel = opCtx(ctx)
			resp, err := c.cli.Txn(octx).If(clientv3.Compare(clientv3.ModRevision(c.aliveKey(id)), "=", kv.ModRevision)).Then(put...).Commit()
			cancel()
			if err != nil {
				c.revoke(lease.ID)
				return c.unavailable(err)
			}
			if !resp.Succeeded {
				c.revoke(lease.ID)
				continue
			}
			c.revoke(clientv3.LeaseID(kv.Lease))
			r.mu.Lock()
			r.lease, r.status = lease.ID, st
			r.writes++
			r.mu.Unlock()
			r.cfg.Logger.Info("registered in etcd in place of this instance's earlier run", "node_id", id, "instance", r.cfg.Instance)
			return nil
		}
		c.revoke(lease.ID)
		if err := c.waitGone(ctx, kv.Key, clientv3.LeaseID(kv.Lease), other, id); err != nil {
			return err
		}
	}
}

// waitGone waits until another instance's Status goes (its lease expires:
// a dead process) and returns nil, or fails with a *DuplicateError once the
// lease has outlived its granted TTL from the first look (its process keeps
// it alive: etcd reports the time left in whole seconds, too coarse to see
// a keepalive directly).
func (c *Client) waitGone(ctx context.Context, key []byte, lease clientv3.LeaseID, other Status, id uint64) error {
	dup := &DuplicateError{ID: id, PG: other.PG, Instance: other.Instance}
	var deadline time.Time
	for {
		octx, cancel := opCtx(ctx)
		ttl, err := c.cli.TimeToLive(octx, lease)
		cancel()
		if err != nil {
			return c.unavailable(err)
		}
		if ttl.TTL <= 0 {
			return nil // expired or revoked
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(time.Duration(ttl.GrantedTTL)*time.Second + time.Second)
		} else if time.Now().After(deadline) {
			return dup
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (waiting for node id %d's registration by %s to expire)", ctx.Err(), id, other.PG)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (c *Client) revoke(id clientv3.LeaseID) {
	if id == 0 {
		return
	}
	ctx, cancel := opCtx(context.Background())
	defer cancel()
	c.cli.Revoke(ctx, id)
}

// run keeps the lease alive, rewrites the Status when the capacity moved,
// and registers again when the lease is lost.
func (r *Registration) run(ctx context.Context) {
	defer close(r.done)
	log := r.cfg.Logger
	tick := time.NewTicker(r.cfg.UpdateInterval)
	defer tick.Stop()
	for ctx.Err() == nil {
		r.mu.Lock()
		lease := r.lease
		r.mu.Unlock()
		kctx, kcancel := context.WithCancel(ctx)
		ka, err := r.c.cli.KeepAlive(kctx, lease)
		if err != nil {
			kcancel()
			log.Warn("etcd lease keepalive failed", "node_id", r.cfg.Node.ID, "err", r.c.unavailable(err))
		} else {
			r.keep(ctx, ka, tick.C)
			kcancel()
		}
		if ctx.Err() != nil {
			return
		}
		// The lease is gone: register again as soon as etcd answers.
		log.Warn("etcd lease lost; registering again", "node_id", r.cfg.Node.ID, "lease_ttl", r.cfg.TTL.String())
		for wait := 250 * time.Millisecond; ctx.Err() == nil; wait = min(2*wait, 5*time.Second) {
			err := r.register(ctx)
			if err == nil {
				log.Info("registered in etcd again", "node_id", r.cfg.Node.ID)
				break
			}
			if ctx.Err() == nil {
				log.Warn("etcd registration failed; retrying", "node_id", r.cfg.Node.ID, "err", err, "retry_in", wait.String())
			}
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
	}
}

// keep consumes keepalive answers until the lease is lost (the channel
// closes) and updates the Status on each tick.
func (r *Registration) keep(ctx context.Context, ka <-chan *clientv3.LeaseKeepAliveResponse, tick <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case resp, ok := <-ka:
			if !ok || resp == nil || resp.TTL <= 0 {
				return
			}
		case <-tick:
			if err := r.update(ctx); err != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("etcd capacity update failed", "node_id", r.cfg.Node.ID, "err", err)
			}
		}
	}
}

// update rewrites the Status if the capacity moved, only while this
// registration's lease holds the key.
func (r *Registration) update(ctx context.Context) error {
	cap := r.cfg.Capacity()
	r.mu.Lock()
	st, lease := r.status, r.lease
	r.mu.Unlock()
	if !cap.moved(st.Capacity) {
		return nil
	}
	st.Capacity = cap
	val, _ := json.Marshal(st)
	key := r.c.aliveKey(r.cfg.Node.ID)
	octx, cancel := opCtx(ctx)
	defer cancel()
	resp, err := r.c.cli.Txn(octx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", lease)).
		Then(clientv3.OpPut(key, string(val), clientv3.WithLease(lease))).Commit()
	if err != nil {
		return r.c.unavailable(err)
	}
	if resp.Succeeded {
		r.mu.Lock()
		r.status = st
		r.writes++
		r.mu.Unlock()
	}
	return nil
}

// Writes is how many times the Status was written.
func (r *Registration) Writes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writes
}

// Lease is the current lease.
func (r *Registration) Lease() clientv3.LeaseID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease
}

// Close stops keeping the registration and revokes the lease: the node is
// no longer live at once (its Node record stays).
func (r *Registration) Close() {
	r.cancel()
	<-r.done
	r.c.revoke(r.Lease())
}

// NodeView is a node as the fleet sees it: its record and, while it is
// live, its Status.
type NodeView struct {
	Node
	Status *Status `json:"status,omitempty"`
}

// Live reports whether the node holds a lease.
func (v NodeView) Live() bool { return v.Status != nil }

// Nodes reads every node's record and status at one revision, in id order,
// and that revision. Records that do not parse are returned as errs (each
// naming its key) and left out.
func (c *Client) Nodes(ctx context.Context) (nodes []NodeView, rev int64, errs []error, err error) {
	return c.nodes(ctx, 0)
}

// nodes is Nodes at revision rev (0: the newest).
func (c *Client) nodes(ctx context.Context, rev int64) (nodes []NodeView, _ int64, errs []error, err error) {
	octx, cancel := opCtx(ctx)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := c.cli.Get(octx, c.nodesPrefix(), opts...)
	if err != nil {
		return nil, 0, nil, c.unavailable(err)
	}
	rev = resp.Header.Revision
	alive, err := c.cli.Get(octx, c.alivePrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return nil, 0, nil, c.unavailable(err)
	}
	byID := map[uint64]*NodeView{}
	for _, kv := range resp.Kvs {
		var n Node
		if err := strictJSON(kv.Value, &n); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", kv.Key, err))
			continue
		}
		if err := n.validate(); err != nil || strconv.FormatUint(n.ID, 10) != strings.TrimPrefix(string(kv.Key), c.nodesPrefix()) {
			errs = append(errs, fmt.Errorf("%s: not a node record of its id: %v", kv.Key, err))
			continue
		}
		byID[n.ID] = &NodeView{Node: n}
	}
	for _, kv := range alive.Kvs {
		var st Status
		if err := json.Unmarshal(kv.Value, &st); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", kv.Key, err))
			continue
		}
		if v := byID[st.ID]; v != nil {
			v.Status = &st
		}
	}
	for _, v := range byID {
		nodes = append(nodes, *v)
	}
	slices.SortFunc(nodes, func(a, b NodeView) int { return compareU64(a.ID, b.ID) })
	return nodes, rev, errs, nil
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
