package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Drain marks a node to be emptied (`safekeeper node drain`): the leading
// controller moves every timeline off it, a few at a time, and placement
// puts no new timeline on it. The mark stays (under
// <prefix>/drains/<id>) until `node drain --cancel`: a decommissioned node
// must not fill up again.
type Drain struct {
	ID uint64 `json:"id"`
	// Parallel is how many of its timelines may be moving at once.
	Parallel    int       `json:"parallel"`
	RequestedAt time.Time `json:"requested_at"`
}

func (c *Client) drainsPrefix() string      { return c.prefix + "/drains/" }
func (c *Client) drainKey(id uint64) string { return c.drainsPrefix() + strconv.FormatUint(id, 10) }

// RequestDrain marks node id to be drained, parallel timelines at a time.
func (c *Client) RequestDrain(ctx context.Context, id uint64, parallel int) error {
	if id == 0 || parallel < 1 {
		return fmt.Errorf("fleet: drain of node %d, %d at a time: want a node id and at least 1", id, parallel)
	}
	val, _ := json.Marshal(Drain{ID: id, Parallel: parallel, RequestedAt: time.Now().UTC()})
	octx, cancel := opCtx(ctx)
	defer cancel()
	if _, err := c.cli.Put(octx, c.drainKey(id), string(val)); err != nil {
		return c.unavailable(err)
	}
	return nil
}

// CancelDrain removes node id's drain mark (the moves already made stay).
func (c *Client) CancelDrain(ctx context.Context, id uint64) error {
	octx, cancel := opCtx(ctx)
	defer cancel()
	if _, err := c.cli.Delete(octx, c.drainKey(id)); err != nil {
		return c.unavailable(err)
	}
	return nil
}

// Drains lists the drained nodes. Keys that do not parse are returned as
// errs, each naming its key, and left out.
func (c *Client) Drains(ctx context.Context) (out []Drain, errs []error, err error) {
	return c.drains(ctx, 0)
}

func (c *Client) drains(ctx context.Context, rev int64) (out []Drain, errs []error, err error) {
	octx, cancel := opCtx(ctx)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := c.cli.Get(octx, c.drainsPrefix(), opts...)
	if err != nil {
		return nil, nil, c.unavailable(err)
	}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		var d Drain
		id, perr := strconv.ParseUint(strings.TrimPrefix(key, c.drainsPrefix()), 10, 64)
		if perr == nil {
			perr = strictJSON(kv.Value, &d)
		}
		if perr == nil && d.ID != id {
			perr = fmt.Errorf("id %d in the key of node %d", d.ID, id)
		}
		if perr == nil && d.Parallel < 1 {
			perr = fmt.Errorf("parallel %d: want at least 1", d.Parallel)
		}
		if perr != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %v", ErrBadConfig, key, perr))
			continue
		}
		out = append(out, d)
	}
	return out, errs, nil
}
