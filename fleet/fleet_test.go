package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/etcdtest"
	"github.com/safekeeper/safekeeper/test/tlstest"
)

func connect(t *testing.T, endpoints []string) *fleet.Client {
	t.Helper()
	c, err := fleet.Connect(fleet.ClientConfig{Endpoints: endpoints, Prefix: "/test-" + strings.ToLower(t.Name())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func register(t *testing.T, c *fleet.Client, id uint64, zone, instance string, ttl time.Duration) *fleet.Registration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.Register(ctx, fleet.RegisterConfig{
		Node:     fleet.Node{ID: id, Zone: zone, PG: fmt.Sprintf("10.0.0.%d:5454", id)},
		Instance: instance, TTL: ttl,
		Capacity: func() fleet.Capacity {
			return fleet.Capacity{MaxTimelines: 10000, DiskFreeBytes: 1 << 30, DiskTotalBytes: 2 << 30}
		},
	})
	if err != nil {
		t.Fatalf("register node %d: %v", id, err)
	}
	t.Cleanup(r.Close)
	return r
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (%s)", what, d, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func id(b ...byte) proto.ID {
	var x proto.ID
	copy(x[:], b)
	return x
}

func TestChoose(t *testing.T) {
	cands := []fleet.Candidate{
		{ID: 1, Zone: "a", Held: 2}, {ID: 2, Zone: "a", Held: 0},
		{ID: 3, Zone: "b", Held: 1, DiskFree: 10}, {ID: 4, Zone: "b", Held: 1, DiskFree: 20},
		{ID: 5, Zone: "c", Held: 5, MaxTimelines: 5}, {ID: 6, Zone: "c", Held: 3},
	}
	got, zones, err := fleet.Choose(cands, 3)
	if err != nil || zones != 3 || !slices.Equal(got, []uint64{2, 4, 6}) {
		t.Errorf("Choose = %v over %d zones, %v; want [2 4 6] (least loaded per zone, disk free breaking the tie, node 5 full) over 3", got, zones, err)
	}
	// Two zones for three replicas: as spread as possible.
	got, zones, err = fleet.Choose(cands[:4], 3)
	if err != nil || zones != 2 || !slices.Equal(got, []uint64{2, 4, 3}) {
		t.Errorf("Choose of zones a, b = %v over %d zones, %v; want [2 4 3] over 2", got, zones, err)
	}
	if _, _, err := fleet.Choose(cands[4:], 3); !errors.Is(err, fleet.ErrNoRoom) {
		t.Errorf("Choose of one node with room for 3 replicas: %v, want ErrNoRoom", err)
	}
}

func TestPlaceSpreadsAndBalancesConcurrentPlacements(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	zoneOf := map[uint64]string{}
	for i := uint64(1); i <= 6; i++ {
		zoneOf[i] = string(rune('a' + (i-1)%3))
		register(t, c, i, zoneOf[i], fmt.Sprintf("host%d:/data", i), 0)
	}
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := 0; w < 5; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := connect(t, etcd.Endpoints()) // one client per placer, as separate CLIs
			for i := w; i < n; i += 5 {
				p, err := c.Place(context.Background(), id(1), id(2, byte(i)), 3)
				if err == nil && !p.Created {
					err = fmt.Errorf("timeline %d: placed before", i)
				}
				if err != nil {
					errs <- err
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	tls, bad, err := c.Timelines(context.Background(), 0)
	if err != nil || len(bad) > 0 || len(tls) != n {
		t.Fatalf("Timelines: %d, bad %v, %v; want %d", len(tls), bad, err, n)
	}
	held := map[uint64]int{}
	for _, e := range tls {
		zones := map[string]bool{}
		for _, m := range e.Config.Members {
			zones[zoneOf[m]] = true
			held[m]++
		}
		if e.Config.Generation != 1 || len(e.Config.Members) != 3 || len(zones) != 3 {
			t.Errorf("%s: %v: want generation 1 and 3 members in 3 zones", e.Timeline, e.Config)
		}
	}
	lo, hi := n, 0
	for i := uint64(1); i <= 6; i++ {
		lo, hi = min(lo, held[i]), max(hi, held[i])
	}
	if hi-lo > 1 {
		t.Errorf("timelines per node %v: spread %d, want at most 1", held, hi-lo)
	}
	// Placing again answers the configuration there.
	p, err := c.Place(context.Background(), id(1), id(2, 7), 3)
	if err != nil || p.Created || len(p.Config.Members) != 3 {
		t.Errorf("Place again = %+v, %v; want the existing configuration, not created", p, err)
	}
}

func TestPlaceWithFewerZonesSaysSo(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	register(t, c, 1, "a", "h1", 0)
	register(t, c, 2, "a", "h2", 0)
	register(t, c, 3, "b", "h3", 0)
	p, err := c.Place(context.Background(), id(1), id(2), 3)
	if err != nil || !p.Created || p.Zones != 2 || !strings.Contains(p.Spread, "2 zones") {
		t.Fatalf("Place = %+v, %v; want created over 2 zones, said so", p, err)
	}
	if _, err := c.Place(context.Background(), id(1), id(3), 4); !errors.Is(err, fleet.ErrNoRoom) {
		t.Fatalf("Place of 4 replicas on 3 nodes: %v, want ErrNoRoom", err)
	}
}

func TestRegisterRefusesALiveDuplicate(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	first := register(t, c, 7, "a", "host-a:/data", 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.Register(ctx, fleet.RegisterConfig{Node: fleet.Node{ID: 7, Zone: "b", PG: "10.9.9.9:5454"}, Instance: "host-b:/data", TTL: 2 * time.Second})
	var dup *fleet.DuplicateError
	if !errors.As(err, &dup) || dup.PG != "10.0.0.7:5454" {
		t.Fatalf("second registration of id 7: %v, want a DuplicateError naming 10.0.0.7:5454", err)
	}
	t.Logf("refused after %v: %v", time.Since(start).Round(time.Millisecond), err)
	// The same instance again (a restart after a crash): takes over at once.
	lease := first.Lease()
	start = time.Now()
	again := register(t, c, 7, "a", "host-a:/data", 2*time.Second)
	if time.Since(start) > time.Second || again.Lease() == lease {
		t.Errorf("same instance: registered in %v with lease %x (old %x); want at once, a new lease", time.Since(start), again.Lease(), lease)
	}
}

func TestRegisterAfterADeadProcessWaitsForItsLease(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	// A process that died: its Status under a lease nobody keeps alive.
	raw := c.Etcd()
	ctx := context.Background()
	lease, err := raw.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Put(ctx, c.Prefix()+"/alive/8", `{"id":8,"instance":"old-host:/data","advertise_pg":"10.1.1.1:5454"}`, clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	register(t, c, 8, "a", "new-host:/data", 2*time.Second)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("registered after %v; want within the dead lease's 2 s TTL and a margin", d)
	}
}

func TestLostLeaseRegistersAgain(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	r := register(t, c, 3, "a", "h:/d", 2*time.Second)
	old := r.Lease()
	if _, err := c.Etcd().Revoke(context.Background(), old); err != nil { // as if it expired
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "registered again", func() (bool, string) {
		nodes, _, _, err := c.Nodes(context.Background())
		if err != nil || len(nodes) != 1 {
			return false, fmt.Sprint(nodes, err)
		}
		return nodes[0].Live() && r.Lease() != old, fmt.Sprintf("live %v lease %x", nodes[0].Live(), r.Lease())
	})
}

func TestCapacityUpdatesAreBoundedAndOnlyOnChange(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	var n atomic.Int64
	moving := atomic.Bool{}
	ctx := context.Background()
	r, err := c.Register(ctx, fleet.RegisterConfig{
		Node: fleet.Node{ID: 1, Zone: "a", PG: "h:1"}, Instance: "i", UpdateInterval: 200 * time.Millisecond,
		Capacity: func() fleet.Capacity {
			if moving.Load() {
				n.Add(1)
			}
			return fleet.Capacity{Timelines: int(n.Load()), DiskTotalBytes: 100}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	time.Sleep(time.Second) // unchanged: nothing written
	if w := r.Writes(); w != 1 {
		t.Errorf("unchanged capacity for 1 s: %d writes, want 1 (the registration)", w)
	}
	moving.Store(true)
	time.Sleep(time.Second) // changing at every call: one write per interval
	if w := r.Writes(); w < 3 || w > 8 {
		t.Errorf("capacity changing at every call for 1 s at a 200 ms interval: %d writes, want 3..8", w)
	}
}

func TestGarbageConfigIsRefusedNamingItsKey(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	for i := uint64(1); i <= 3; i++ {
		register(t, c, i, string(rune('a'+i)), fmt.Sprint(i), 0)
	}
	ctx := context.Background()
	p, err := c.Place(ctx, id(1), id(1), 3)
	if err != nil {
		t.Fatal(err)
	}
	key := c.TimelineKey(id(1), id(1))
	var got []fleet.Resolved
	var errs []error
	var mu sync.Mutex
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first, err := c.Resolve(ctx, id(1), id(1))
	if err != nil {
		t.Fatal(err)
	}
	go c.Watch(wctx, id(1), id(1), first, func(r fleet.Resolved) { mu.Lock(); got = append(got, r); mu.Unlock() },
		func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() })
	for _, garbage := range []string{`{"generation": 2, "members": [1, 2, 2]}`, `not json`, `{"generation": 2, "members": [1,2,3], "membres": [4]}`, `{"members": [1,2,3]}`} {
		if _, err := c.Etcd().Put(ctx, key, garbage); err != nil {
			t.Fatal(err)
		}
		_, _, err := c.Timeline(ctx, id(1), id(1))
		if !errors.Is(err, fleet.ErrBadConfig) || !strings.Contains(err.Error(), key) {
			t.Errorf("Timeline of %q: %v; want ErrBadConfig naming %s", garbage, err, key)
		}
		if _, err := c.Place(ctx, id(1), id(1), 3); !errors.Is(err, fleet.ErrBadConfig) {
			t.Errorf("Place over %q: %v; want ErrBadConfig (never overwritten)", garbage, err)
		}
	}
	waitFor(t, 10*time.Second, "the watcher to report the bad configuration", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(errs) > 0, fmt.Sprint(errs)
	})
	mu.Lock()
	if len(got) > 0 {
		t.Errorf("the watcher adopted %v from garbage; want the last valid kept", got)
	}
	mu.Unlock()
	// A valid change by compare-and-swap reaches the watcher.
	_, rev, _ := c.Timeline(ctx, id(1), id(1))
	_ = rev
	resp, err := c.Etcd().Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	next := fleet.Config{Generation: 2, Members: p.Config.Members, NewMembers: []uint64{1, 2, 3}}
	if ok, err := c.SwapConfig(ctx, id(1), id(1), resp.Kvs[0].ModRevision-1, next); ok || err != nil {
		t.Errorf("SwapConfig at a stale revision: %v, %v; want refused", ok, err)
	}
	if ok, err := c.SwapConfig(ctx, id(1), id(1), resp.Kvs[0].ModRevision, next); !ok || err != nil {
		t.Fatalf("SwapConfig: %v, %v", ok, err)
	}
	waitFor(t, 10*time.Second, "the watcher to see generation 2", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0 && got[len(got)-1].Config.Generation == 2, fmt.Sprint(got)
	})
}

func TestPlaceFenced(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	for i := uint64(1); i <= 3; i++ {
		register(t, c, i, string(rune('a'+i)), fmt.Sprint(i), 0)
	}
	fence := clientv3.Compare(clientv3.CreateRevision(c.Prefix()+"/controller/none"), ">", 0) // no such leader key
	if _, err := c.Place(context.Background(), id(1), id(1), 3, fence); !errors.Is(err, fleet.ErrFenced) {
		t.Fatalf("Place with a failed fence: %v, want ErrFenced", err)
	}
	if _, _, err := c.Timeline(context.Background(), id(1), id(1)); !errors.Is(err, fleet.ErrNoConfig) {
		t.Fatalf("after a fenced placement: %v, want no configuration", err)
	}
}

func TestUnavailableNamesEtcd(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	etcd.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := c.Place(ctx, id(1), id(1), 3)
	if !errors.Is(err, fleet.ErrUnavailable) || !strings.Contains(err.Error(), etcd.Endpoint()) {
		t.Fatalf("Place with etcd down: %v; want ErrUnavailable naming %s", err, etcd.Endpoint())
	}
}

func TestAssignRecordsTheMembersGiven(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	for i := uint64(1); i <= 4; i++ {
		register(t, c, i, "a", fmt.Sprint(i), 0)
	}
	ctx := context.Background()
	if _, err := c.Assign(ctx, id(1), id(1), []uint64{1, 2, 9}); !errors.Is(err, fleet.ErrNotMembers) || !strings.Contains(err.Error(), "node 9") {
		t.Fatalf("Assign with a node never registered: %v, want ErrNotMembers naming node 9", err)
	}
	p, err := c.Assign(ctx, id(1), id(1), []uint64{4, 2, 3})
	if err != nil || !p.Created || !slices.Equal(p.Config.Members, []uint64{4, 2, 3}) || p.Config.Generation != 1 {
		t.Fatalf("Assign = %+v, %v; want members [4 2 3] at generation 1", p, err)
	}
	if p, err := c.Assign(ctx, id(1), id(1), []uint64{4, 2, 3}); err != nil || p.Created {
		t.Errorf("Assign again: %+v, %v; want the same, not created", p, err)
	}
	if _, err := c.Assign(ctx, id(1), id(1), []uint64{1, 2, 3}); !errors.Is(err, fleet.ErrNotMembers) {
		t.Errorf("Assign of other members: %v, want ErrNotMembers", err)
	}
}

// TestConnectOverTLSWithAClientCertificate: etcd serving TLS and
// requiring client certificates (--client-cert-auth) is reached with
// --etcd-cacert, --etcd-cert and --etcd-key; without the client
// certificate, or trusting another CA, it is not.
func TestConnectOverTLSWithAClientCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir)
	srvCert, srvKey := filepath.Join(dir, "etcd.crt"), filepath.Join(dir, "etcd.key")
	cliCert, cliKey := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	ca.Issue(t, "etcd", srvCert, srvKey)
	ca.Issue(t, "safekeeper", cliCert, cliKey)
	etcd := etcdtest.StartTLS(t, etcdtest.TLS{CertFile: srvCert, KeyFile: srvKey, CAFile: ca.CertFile, ClientCertFile: cliCert, ClientKeyFile: cliKey})
	other := tlstest.NewCA(t, t.TempDir())
	for _, tc := range []struct {
		name string
		cfg  fleet.ClientConfig
		ok   bool
	}{
		{"CA and client certificate", fleet.ClientConfig{CACert: ca.CertFile, Cert: cliCert, Key: cliKey}, true},
		{"no client certificate", fleet.ClientConfig{CACert: ca.CertFile}, false},
		{"another CA", fleet.ClientConfig{CACert: other.CertFile, Cert: cliCert, Key: cliKey}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Endpoints, tc.cfg.Prefix = etcd.Endpoints(), "/tls"
			c, err := fleet.Connect(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _, _, err = c.Nodes(ctx)
			if tc.ok && err != nil {
				t.Fatalf("Nodes over TLS: %v", err)
			}
			if !tc.ok && !errors.Is(err, fleet.ErrUnavailable) {
				t.Fatalf("Nodes over TLS with %s: %v, want refused (ErrUnavailable)", tc.name, err)
			}
		})
	}
	if _, err := fleet.Connect(fleet.ClientConfig{Endpoints: etcd.Endpoints(), Cert: cliCert}); err == nil {
		t.Errorf("Connect with a certificate and no key: no error")
	}
}

// TestConnectWithEtcdAuthentication: with etcd's own authentication on, a
// user whose role grants the fleet's prefix registers and places; a wrong
// password is refused naming etcd.
func TestConnectWithEtcdAuthentication(t *testing.T) {
	etcd := etcdtest.Start(t)
	root := connect(t, etcd.Endpoints()).Etcd()
	ctx := context.Background()
	for _, step := range []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "fleet"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "fleet", "/auth/", clientv3.GetPrefixRangeEnd("/auth/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "safekeeper", "s3cret"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "safekeeper", "fleet"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("setting up etcd auth: %v", err)
		}
	}
	c, err := fleet.Connect(fleet.ClientConfig{Endpoints: etcd.Endpoints(), Prefix: "/auth", User: "safekeeper", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := uint64(1); i <= 3; i++ {
		r, err := c.Register(ctx, fleet.RegisterConfig{Node: fleet.Node{ID: i, Zone: fmt.Sprint(i), PG: "h:1"}, Instance: fmt.Sprint(i)})
		if err != nil {
			t.Fatalf("register as an authenticated user: %v", err)
		}
		defer r.Close()
	}
	if _, err := c.Place(ctx, id(1), id(1), 3); err != nil {
		t.Fatalf("place as an authenticated user: %v", err)
	}
	_, err = fleet.Connect(fleet.ClientConfig{Endpoints: etcd.Endpoints(), Prefix: "/auth", User: "safekeeper", Password: "wrong"})
	if err == nil {
		// clientv3 authenticates at its first request, not at New.
		c2, _ := fleet.Connect(fleet.ClientConfig{Endpoints: etcd.Endpoints(), Prefix: "/auth", User: "safekeeper", Password: "wrong"})
		defer c2.Close()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, _, _, err = c2.Nodes(cctx)
	}
	if err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("a wrong password: %v, want etcd's authentication failure", err)
	}
}

// TestRegisterAgainWritesTheNodeRecordOnlyWhenItChanged: a restart at the
// same addresses leaves nodes/<id> alone (proposers watch it); new
// addresses rewrite it.
func TestRegisterAgainWritesTheNodeRecordOnlyWhenItChanged(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	ctx := context.Background()
	modRev := func() int64 {
		resp, err := c.Etcd().Get(ctx, c.Prefix()+"/nodes/5")
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("nodes/5: %v %v", resp, err)
		}
		return resp.Kvs[0].ModRevision
	}
	r := register(t, c, 5, "a", "same", 0)
	first := modRev()
	r.Close()
	register(t, c, 5, "a", "same", 0)
	if got := modRev(); got != first {
		t.Errorf("registered again at the same addresses: nodes/5 rewritten (revision %d, was %d)", got, first)
	}
	r2, err := c.Register(ctx, fleet.RegisterConfig{Node: fleet.Node{ID: 5, Zone: "a", PG: "10.9.9.9:1"}, Instance: "same"})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if got := modRev(); got == first {
		t.Errorf("registered at a new address: nodes/5 not rewritten")
	}
}

// TestMigrationAndDrainRequests: a migration request is stored, listed,
// ended with a failure (kept, with it) or done (gone); a fenced end whose
// fence fails changes nothing; garbage under the prefix is named and left
// out; a drain mark is stored until cancelled, and placement skips the
// drained node.
func TestMigrationAndDrainRequests(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	ctx := context.Background()
	m := fleet.Migration{Tenant: id(1), Timeline: id(2), Members: []uint64{1, 2, 4}, From: []uint64{1, 2, 3}, Reason: "test"}
	rev, err := c.RequestMigration(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	m.Rev = rev
	if _, err := c.RequestMigration(ctx, fleet.Migration{Tenant: id(1), Timeline: id(3), Members: []uint64{1, 1}}); err == nil {
		t.Fatal("a migration to a member listed twice was stored")
	}
	got, ok, err := c.Migration(ctx, id(1), id(2))
	if err != nil || !ok || !fleet.SameMembers(got.Members, m.Members) || got.Reason != "test" || got.Error != "" || got.Rev != rev {
		t.Fatalf("Migration: %+v %v %v", got, ok, err)
	}
	if _, err := c.Etcd().Put(ctx, c.MigrationKey(id(1), id(9)), `{"members": [0]}`); err != nil {
		t.Fatal(err)
	}
	list, errs, err := c.Migrations(ctx)
	if err != nil || len(list) != 1 || len(errs) != 1 || !strings.Contains(errs[0].Error(), c.MigrationKey(id(1), id(9))) {
		t.Fatalf("Migrations: %+v, errs %v, %v", list, errs, err)
	}
	never := clientv3.Compare(clientv3.CreateRevision("/no/such/key"), ">", 0)
	if _, err := c.EndMigration(ctx, m, "", never); !errors.Is(err, fleet.ErrFenced) {
		t.Fatalf("EndMigration with a failing fence: %v, want ErrFenced", err)
	}
	// A request that replaced the one carried out is not ended with it.
	newer := m
	newer.Members = []uint64{1, 2, 5}
	if _, err := c.RequestMigration(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if replaced, err := c.EndMigration(ctx, m, "rolled back"); err != nil || !replaced {
		t.Fatalf("ending a replaced request: replaced %v, %v", replaced, err)
	}
	got, ok, _ = c.Migration(ctx, id(1), id(2))
	if !ok || got.Error != "" || !fleet.SameMembers(got.Members, newer.Members) {
		t.Fatalf("the newer request after the older one ended: %+v %v", got, ok)
	}
	if _, err := c.EndMigration(ctx, got, "rolled back"); err != nil {
		t.Fatal(err)
	}
	if got, ok, _ = c.Migration(ctx, id(1), id(2)); !ok || got.Error != "rolled back" {
		t.Fatalf("after a failure: %+v %v", got, ok)
	}
	if _, err := c.EndMigration(ctx, got, ""); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := c.Migration(ctx, id(1), id(2)); ok || err != nil {
		t.Fatalf("after done: still there (%v, %v)", ok, err)
	}

	for i, zone := range []string{"a", "b", "c", "a"} {
		register(t, c, uint64(i+1), zone, fmt.Sprint("i", i), 10*time.Second)
	}
	if err := c.RequestDrain(ctx, 1, 2); err != nil {
		t.Fatal(err)
	}
	if err := c.RequestDrain(ctx, 2, 0); err == nil {
		t.Fatal("a drain of 0 at a time was stored")
	}
	for i := 0; i < 4; i++ {
		p, err := c.Place(ctx, id(5), id(byte(10+i)), 3)
		if err != nil || slices.Contains(p.Config.Members, 1) {
			t.Fatalf("placement %d with node 1 drained: %+v, %v", i, p.Config, err)
		}
	}
	drains, _, err := c.Drains(ctx)
	if err != nil || len(drains) != 1 || drains[0].ID != 1 || drains[0].Parallel != 2 {
		t.Fatalf("Drains: %+v, %v", drains, err)
	}
	if err := c.CancelDrain(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if drains, _, _ := c.Drains(ctx); len(drains) != 0 {
		t.Fatalf("after cancel: %+v", drains)
	}
}
