package test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/test/etcdtest"
	"github.com/safekeeper/safekeeper/test/harness"
)

// configLog records every configuration written under the fleet's
// timelines prefix, in order, from a watch.
type configLog struct {
	mu       sync.Mutex
	configs  map[string][]fleet.Config // by key
	written  []written                 // all, in order
	maxJoint int                       // most timelines in a joint configuration at once
	joint    map[string]bool
	errs     []error
}

type written struct {
	cfg fleet.Config
	at  time.Time
}

// quorumLive reports whether each group of cfg (members, and new members
// during a change) has a majority of live nodes.
func quorumLive(cfg fleet.Config, live func(uint64) bool) bool {
	for _, g := range cfg.Groups() {
		n := 0
		for _, id := range g {
			if live(id) {
				n++
			}
		}
		if n < len(g)/2+1 {
			return false
		}
	}
	return true
}

func watchConfigs(t *testing.T, ec *fleet.Client) *configLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &configLog{configs: map[string][]fleet.Config{}, joint: map[string]bool{}}
	done := make(chan struct{})
	prefix := ec.Prefix() + "/timelines/"
	ch := ec.Etcd().Watch(ctx, prefix, clientv3.WithPrefix())
	go func() {
		defer close(done)
		for wr := range ch {
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				key := string(ev.Kv.Key)
				c, err := fleet.ParseConfig(key, ev.Kv.Value)
				l.mu.Lock()
				if err != nil {
					l.errs = append(l.errs, err)
				} else {
					l.configs[key] = append(l.configs[key], c)
					l.written = append(l.written, written{c, time.Now()})
					l.joint[key] = c.Joint()
					n := 0
					for _, j := range l.joint {
						if j {
							n++
						}
					}
					l.maxJoint = max(l.maxJoint, n)
				}
				l.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// TestNodeDrainAndDeadNodeReplacement: `node drain --id 1 --parallel 3`
// moves the 20 timelines node 1 holds to node 4 (its zone's other node),
// never more than three at once, every configuration on the way one
// whose members (and new members) are live; placement puts no new
// timeline on the drained node. Then node 2 is killed for good: with
// --dead-node-timeout 30s the controller moves its timelines to node 5,
// the live node of its zone.
func TestNodeDrainAndDeadNodeReplacement(t *testing.T) {
	etcd := etcdtest.Start(t).Endpoints()
	sks, ec := fleetOf(t, etcd, 6, 3) // zones: z0 {1,4}, z1 {2,5}, z2 {3,6}
	tenant := "f1ee7000000000000000000000000006"
	var timelines []string
	for i := 0; i < 20; i++ {
		tl := fmt.Sprintf("f1ee70000000000000000000000006%02x", i)
		members := "1,2,3"
		if i%2 == 1 {
			members = "1,5,6"
		}
		if code, out, errOut := harness.Run(t, append([]string{"timeline", "create", "--tenant-id", tenant, "--timeline-id", tl,
			"--members", members, "--system-id", "7312345678901234567"}, etcdArgs(etcd)...)...); code != 0 {
			t.Fatalf("timeline create %s: exit %d\n%s%s", tl, code, out, errOut)
		}
		timelines = append(timelines, tl)
	}
	log := watchConfigs(t, ec)
	startController(t, "controller", etcd, "--dead-node-timeout", "30s", "--move-parallel", "4")

	code, out, errOut := harness.Run(t, append([]string{"node", "drain", "--id", "1", "--parallel", "3", "--timeout", "3m"}, etcdArgs(etcd)...)...)
	if code != 0 {
		t.Fatalf("node drain --id 1: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "node 1 drained") {
		t.Fatalf("node drain output: %s", out)
	}
	for _, tl := range timelines {
		cfg, _, err := ec.Timeline(context.Background(), mustID(t, tenant), mustID(t, tl))
		if err != nil || cfg.Joint() || cfg.IsMember(1) || !cfg.IsMember(4) {
			t.Fatalf("timeline %s after the drain: %s, %v; want node 4 in place of 1", tl, cfg, err)
		}
	}
	log.mu.Lock()
	maxJoint, errs := log.maxJoint, log.errs
	changes := 0
	for _, cs := range log.configs {
		changes += len(cs)
	}
	log.mu.Unlock()
	if len(errs) > 0 {
		t.Fatalf("configurations that do not parse: %v", errs)
	}
	if maxJoint > 3 || maxJoint < 1 {
		t.Errorf("at most %d timelines were moving at once, want 1 to 3 (--parallel 3)", maxJoint)
	}
	if changes != 40 {
		t.Errorf("%d configurations written for 20 moves, want 40 (joint and final each)", changes)
	}
	// A new placement avoids the drained node.
	for i := 0; i < 3; i++ {
		tl := fmt.Sprintf("f1ee70000000000000000000000006f%x", i)
		if code, out, errOut := harness.Run(t, append([]string{"timeline", "create", "--tenant-id", tenant, "--timeline-id", tl,
			"--system-id", "7312345678901234567"}, etcdArgs(etcd)...)...); code != 0 {
			t.Fatalf("timeline create %s: exit %d\n%s%s", tl, code, out, errOut)
		}
		if cfg, _, err := ec.Timeline(context.Background(), mustID(t, tenant), mustID(t, tl)); err != nil || cfg.IsMember(1) {
			t.Fatalf("timeline %s placed on the drained node: %s, %v", tl, cfg, err)
		}
	}

	// Node 2 dies for good.
	sks[1].Kill()
	killed := time.Now()
	harness.WaitFor(t, 2*time.Minute, "the timelines of dead node 2 moved to node 5", func() bool {
		for i, tl := range timelines {
			if i%2 == 1 {
				continue // on {4,5,6}
			}
			cfg, _, err := ec.Timeline(context.Background(), mustID(t, tenant), mustID(t, tl))
			if err != nil || cfg.Joint() || cfg.IsMember(2) || !cfg.IsMember(5) {
				return false
			}
		}
		return true
	})
	if d := time.Since(killed); d < 30*time.Second {
		t.Errorf("node 2's timelines moved %v after it died, before --dead-node-timeout 30s", d.Round(time.Millisecond))
	}
	// No timeline was ever below its quorum: every configuration written
	// had a live majority of each of its groups (node 2 counted dead from
	// its kill on).
	log.mu.Lock()
	for _, w := range log.written {
		if !quorumLive(w.cfg, func(id uint64) bool { return id != 2 || w.at.Before(killed) }) {
			t.Errorf("configuration %s, written %v after the kill, has no live majority", w.cfg, w.at.Sub(killed))
		}
	}
	log.mu.Unlock()
	t.Logf("node 1 drained (at most %d moving at once); node 2's timelines replaced %v after it died", maxJoint, time.Since(killed).Round(time.Second))
}
