package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/safekeeper/safekeeper/proto"
)

// A Migration is a request to move a timeline to other members
// (`safekeeper timeline migrate`, a node drain, the replacement of a dead
// node), kept under <prefix>/migrations/<tenant>/<timeline> until the
// leading controller has carried it out (the key is deleted) or given up
// (Error is set). The request, not the controller's memory, is what makes
// a change resumable: another controller finds it and the configuration
// in etcd, and goes on from where they stand.
type Migration struct {
	Tenant   proto.ID `json:"-"`
	Timeline proto.ID `json:"-"`
	// Members are the node ids the timeline is to be on.
	Members []uint64 `json:"members"`
	// From are the members it had when the move was asked for: the ones to
	// tell of the final configuration, also when the controller that
	// wrote it died before it could.
	From []uint64 `json:"from,omitempty"`
	// Reason says who asked ("timeline migrate", "drain of node 3", "node
	// 3 dead for 30m0s").
	Reason string `json:"reason,omitempty"`
	// Error is why the controller gave up (the configuration was rolled
	// back to the old members); empty while it is under way.
	Error string `json:"error,omitempty"`
	// Rev is the request key's mod revision when it was read (0: no key):
	// EndMigration ends only that request, not one that replaced it.
	Rev int64 `json:"-"`
}

func (c *Client) migrationsPrefix() string { return c.prefix + "/migrations/" }

// MigrationKey is the key of timeline's migration request.
func (c *Client) MigrationKey(tenant, timeline proto.ID) string {
	return c.migrationsPrefix() + tenant.String() + "/" + timeline.String()
}

// RequestMigration asks for timeline to be moved to members, replacing a
// request that failed or is under way (a change under way is finished
// first either way: see README_PROTO.md, "Membership and generations").
// The members must be distinct and not 0. It returns the request's
// revision (Migration.Rev).
func (c *Client) RequestMigration(ctx context.Context, m Migration, fence ...clientv3.Cmp) (int64, error) {
	if err := validConfig(Config{Generation: 1, Members: m.Members}); err != nil {
		return 0, fmt.Errorf("fleet: migration of %s/%s: %w", m.Tenant, m.Timeline, err)
	}
	m.Error = ""
	val, _ := json.Marshal(m)
	octx, cancel := opCtx(ctx)
	defer cancel()
	resp, err := c.cli.Txn(octx).If(fence...).Then(clientv3.OpPut(c.MigrationKey(m.Tenant, m.Timeline), string(val))).Commit()
	if err != nil {
		return 0, c.unavailable(err)
	}
	if !resp.Succeeded {
		return 0, ErrFenced
	}
	return resp.Header.Revision, nil
}

// Migration reads timeline's migration request; ok is false when there is
// none (done, or never asked for).
func (c *Client) Migration(ctx context.Context, tenant, timeline proto.ID) (m Migration, ok bool, err error) {
	key := c.MigrationKey(tenant, timeline)
	octx, cancel := opCtx(ctx)
	defer cancel()
	resp, err := c.cli.Get(octx, key)
	if err != nil {
		return Migration{}, false, c.unavailable(err)
	}
	if len(resp.Kvs) == 0 {
		return Migration{}, false, nil
	}
	m, err = parseMigration(key, resp.Kvs[0].Value, tenant, timeline)
	m.Rev = resp.Kvs[0].ModRevision
	return m, err == nil, err
}

func parseMigration(key string, b []byte, tenant, timeline proto.ID) (Migration, error) {
	var m Migration
	if err := strictJSON(b, &m); err != nil {
		return Migration{}, fmt.Errorf("%w: %s: %v", ErrBadConfig, key, err)
	}
	if err := validConfig(Config{Generation: 1, Members: m.Members}); err != nil {
		return Migration{}, fmt.Errorf("%w: %s: %v", ErrBadConfig, key, err)
	}
	m.Tenant, m.Timeline = tenant, timeline
	return m, nil
}

// Migrations lists the migration requests. Keys that do not parse are
// returned as errs, each naming its key, and left out.
func (c *Client) Migrations(ctx context.Context) (out []Migration, errs []error, err error) {
	octx, cancel := opCtx(ctx)
	defer cancel()
	resp, err := c.cli.Get(octx, c.migrationsPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, c.unavailable(err)
	}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		ids := strings.Split(strings.TrimPrefix(key, c.migrationsPrefix()), "/")
		if len(ids) != 2 {
			errs = append(errs, fmt.Errorf("%w: %s: not <tenant>/<timeline>", ErrBadConfig, key))
			continue
		}
		t, err1 := proto.ParseID(ids[0])
		l, err2 := proto.ParseID(ids[1])
		if err1 != nil || err2 != nil {
			errs = append(errs, fmt.Errorf("%w: %s: bad ids", ErrBadConfig, key))
			continue
		}
		m, err := parseMigration(key, kv.Value, t, l)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.Rev = kv.ModRevision
		out = append(out, m)
	}
	return out, errs, nil
}

// EndMigration ends request m (as read, at m.Rev): deleted when it was
// carried out (failure ""), else kept with the failure for `timeline
// migrate` to show. A request that replaced m meanwhile is left alone
// (replaced true): the next pass carries it out.
func (c *Client) EndMigration(ctx context.Context, m Migration, failure string, fence ...clientv3.Cmp) (replaced bool, err error) {
	key := c.MigrationKey(m.Tenant, m.Timeline)
	op := clientv3.OpDelete(key)
	if failure != "" {
		m.Error = failure
		val, _ := json.Marshal(m)
		op = clientv3.OpPut(key, string(val))
	}
	octx, cancel := opCtx(ctx)
	defer cancel()
	cond := append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", m.Rev)}, fence...)
	resp, err := c.cli.Txn(octx).If(cond...).Then(op).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return false, c.unavailable(err)
	}
	if resp.Succeeded {
		return false, nil
	}
	var now int64
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		now = kvs[0].ModRevision
	}
	if now != m.Rev {
		return true, nil
	}
	return false, ErrFenced
}

// SwapConfigFenced is SwapConfig that tells a lost race (false, nil: the
// key moved on) from a lost leadership (ErrFenced: the key is still at
// modRev, the fence refused).
func (c *Client) SwapConfigFenced(ctx context.Context, tenant, timeline proto.ID, modRev int64, cfg Config, fence clientv3.Cmp) (bool, error) {
	ok, err := c.SwapConfig(ctx, tenant, timeline, modRev, cfg, fence)
	if err != nil || ok {
		return ok, err
	}
	_, rev, err := c.Timeline(ctx, tenant, timeline)
	if err != nil {
		return false, err
	}
	if rev == modRev {
		return false, ErrFenced
	}
	return false, nil
}

// SameMembers reports whether a and b name the same node ids, in any
// order.
func SameMembers(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for _, id := range a {
		if !slices.Contains(b, id) {
			return false
		}
	}
	return true
}
