package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/safekeeper/safekeeper/proto"
)

// Config is a timeline's configuration, as stored in its key and as the
// safekeepers and the proposer carry it (README_PROTO.md, "Membership and
// generations"): its generation and the node ids of its members, and while
// the membership changes the new members (a joint configuration).
// Generation 1 is the first in etcd.
type Config = proto.Configuration

// validConfig checks a configuration for etcd: proto's rules, from
// generation 1 on (generation 0, no configuration, has no key).
func validConfig(c Config) error {
	if c.Generation == 0 {
		return errors.New("generation 0: generations start at 1")
	}
	return c.Validate()
}

// strictJSON decodes one JSON value into v, refusing unknown fields and
// trailing data: a hand-edited key with a typo is refused, not half read.
func strictJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("data after the JSON value")
	}
	return nil
}

// ParseConfig parses a configuration key's value; the error names the key.
func ParseConfig(key string, b []byte) (Config, error) {
	var c Config
	if err := strictJSON(b, &c); err != nil {
		return Config{}, fmt.Errorf("%w: %s: %v", ErrBadConfig, key, err)
	}
	if err := validConfig(c); err != nil {
		return Config{}, fmt.Errorf("%w: %s: %v", ErrBadConfig, key, err)
	}
	return c, nil
}

var (
	// ErrNoConfig: the timeline has no configuration in etcd (it was never
	// created with `safekeeper timeline create --etcd-endpoints`, or an id
	// is mistyped).
	ErrNoConfig = errors.New("no configuration in etcd")
	// ErrBadConfig: a configuration key's value is not a valid
	// configuration (hand-edited).
	ErrBadConfig = errors.New("invalid configuration")
)

// Timeline reads the configuration of a timeline and its key's mod
// revision (the compare-and-swap's).
func (c *Client) Timeline(ctx context.Context, tenant, timeline proto.ID) (Config, int64, error) {
	key := c.TimelineKey(tenant, timeline)
	octx, cancel := opCtx(ctx)
	defer cancel()
	resp, err := c.cli.Get(octx, key)
	if err != nil {
		return Config{}, 0, c.unavailable(err)
	}
	if len(resp.Kvs) == 0 {
		return Config{}, 0, fmt.Errorf("%w at %s", ErrNoConfig, key)
	}
	cfg, err := ParseConfig(key, resp.Kvs[0].Value)
	return cfg, resp.Kvs[0].ModRevision, err
}

// SwapConfig replaces a timeline's configuration if its key is still at
// modRev (0: the key must not exist), with extra conditions (a
// controller's fence); it reports whether it did.
func (c *Client) SwapConfig(ctx context.Context, tenant, timeline proto.ID, modRev int64, cfg Config, fence ...clientv3.Cmp) (bool, error) {
	if err := validConfig(cfg); err != nil {
		return false, fmt.Errorf("fleet: %w", err)
	}
	key := c.TimelineKey(tenant, timeline)
	val, _ := json.Marshal(cfg)
	octx, cancel := opCtx(ctx)
	defer cancel()
	resp, err := c.cli.Txn(octx).If(append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", modRev)}, fence...)...).
		Then(clientv3.OpPut(key, string(val))).Commit()
	if err != nil {
		return false, c.unavailable(err)
	}
	return resp.Succeeded, nil
}

// TimelineEntry is one timeline's configuration as listed.
type TimelineEntry struct {
	Tenant, Timeline proto.ID
	Config           Config
}

// Timelines lists every timeline's configuration at revision rev (0: the
// newest). Keys that do not parse are returned as errs, each naming its
// key, and left out.
func (c *Client) Timelines(ctx context.Context, rev int64) (out []TimelineEntry, errs []error, err error) {
	octx, cancel := opCtx(ctx)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := c.cli.Get(octx, c.timelinesPrefix(), opts...)
	if err != nil {
		return nil, nil, c.unavailable(err)
	}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		ids := strings.Split(strings.TrimPrefix(key, c.timelinesPrefix()), "/")
		var e TimelineEntry
		var perr error
		if len(ids) != 2 {
			perr = fmt.Errorf("%w: %s: not <tenant>/<timeline>", ErrBadConfig, key)
		} else if e.Tenant, perr = proto.ParseID(ids[0]); perr == nil {
			e.Timeline, perr = proto.ParseID(ids[1])
		}
		if perr == nil {
			e.Config, perr = ParseConfig(key, kv.Value)
		} else if !errors.Is(perr, ErrBadConfig) {
			perr = fmt.Errorf("%w: %s: %v", ErrBadConfig, key, perr)
		}
		if perr != nil {
			errs = append(errs, perr)
			continue
		}
		out = append(out, e)
	}
	return out, errs, nil
}
