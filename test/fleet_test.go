package test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/etcdtest"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// fleetOf starts n safekeepers registered in etcd, safekeeper i in zone
// z<(i-1)%zones>, and waits until all are live there.
func fleetOf(t *testing.T, etcd []string, n, zones int, extra ...string) ([]*harness.Safekeeper, *fleet.Client) {
	t.Helper()
	var sks []*harness.Safekeeper
	for i := 1; i <= n; i++ {
		args := append([]string{"--etcd-endpoints", strings.Join(etcd, ","), "--zone", fmt.Sprintf("z%d", (i-1)%zones), "--etcd-lease-ttl", "2s"}, extra...)
		sks = append(sks, harness.StartSafekeeper(t, uint64(i), args...))
	}
	ec, err := fleet.Connect(fleet.ClientConfig{Endpoints: etcd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ec.Close() })
	waitLive(t, ec, n)
	return sks, ec
}

// waitLive waits until n nodes are live in etcd.
func waitLive(t *testing.T, ec *fleet.Client, n int) []fleet.NodeView {
	t.Helper()
	var nodes []fleet.NodeView
	harness.WaitFor(t, 30*time.Second, fmt.Sprintf("%d safekeepers live in etcd", n), func() bool {
		var err error
		nodes, _, _, err = ec.Nodes(context.Background())
		live := 0
		for _, v := range nodes {
			if v.Live() {
				live++
			}
		}
		return err == nil && live == n
	})
	return nodes
}

func etcdArgs(etcd []string) []string {
	return []string{"--etcd-endpoints", strings.Join(etcd, ",")}
}

// TestFleetPlacesTimelinesAcrossZones: six safekeepers in three zones
// register in etcd; fifty timelines created with `timeline create
// --etcd-endpoints` land on three members each, in three distinct zones,
// with at most one timeline of difference between the most and the least
// loaded nodes, and each member holds its timelines.
func TestFleetPlacesTimelinesAcrossZones(t *testing.T) {
	etcd := etcdtest.Start(t).Endpoints()
	sks, ec := fleetOf(t, etcd, 6, 3)
	nodes, _, _, err := ec.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range nodes {
		if v.PG != sks[i].Addr || v.HTTP != sks[i].HTTPAddr || v.Zone != fmt.Sprintf("z%d", i%3) {
			t.Errorf("node %d registered as %+v; want advertise_pg %s, advertise_http %s, zone z%d", v.ID, v.Node, sks[i].Addr, sks[i].HTTPAddr, i%3)
		}
	}
	zoneOf := map[uint64]string{}
	addrOf := map[uint64]string{}
	for _, v := range nodes {
		zoneOf[v.ID], addrOf[v.ID] = v.Zone, v.PG
	}
	tenant := "f1ee7000000000000000000000000001"
	held := map[uint64]int{}
	for i := 0; i < 50; i++ {
		timeline := fmt.Sprintf("f1ee70000000000000000000000001%02x", i)
		code, out, errOut := harness.Run(t, append([]string{"timeline", "create", "--json", "--tenant-id", tenant, "--timeline-id", timeline,
			"--system-id", "7312345678901234567"}, etcdArgs(etcd)...)...)
		if code != 0 {
			t.Fatalf("timeline create %d: exit %d\n%s%s", i, code, out, errOut)
		}
		var res struct {
			Generation  uint64   `json:"generation"`
			Members     []uint64 `json:"members"`
			Placed      bool     `json:"placed"`
			Safekeepers []struct {
				Safekeeper string `json:"safekeeper"`
				Holds      bool   `json:"holds"`
			} `json:"safekeepers"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("timeline create %d: %v\n%s", i, err, out)
		}
		zones := map[string]bool{}
		for j, m := range res.Members {
			zones[zoneOf[m]] = true
			held[m]++
			if j >= len(res.Safekeepers) || res.Safekeepers[j].Safekeeper != addrOf[m] || !res.Safekeepers[j].Holds {
				t.Errorf("timeline %d: member %d at %s: create answered %+v", i, m, addrOf[m], res.Safekeepers)
			}
		}
		if !res.Placed || res.Generation != 1 || len(res.Members) != 3 || len(zones) != 3 {
			t.Errorf("timeline %d: %+v; want placed, generation 1, 3 members in 3 zones", i, res)
		}
	}
	lo, hi := 50, 0
	for _, v := range nodes {
		lo, hi = min(lo, held[v.ID]), max(hi, held[v.ID])
	}
	if hi-lo > 1 {
		t.Errorf("timelines per node %v: %d between the most and the least loaded, want at most 1", held, hi-lo)
	}
	// Each safekeeper holds exactly the timelines placed on it, and says so
	// in its registration once its capacity is written again.
	for _, sk := range sks {
		// The HTTP CLI finds the node's API through etcd too.
		code, out, errOut := harness.Run(t, append([]string{"timeline", "list", "--json", "--node-id", fmt.Sprint(sk.ID)}, etcdArgs(etcd)...)...)
		if code != 0 {
			t.Fatalf("timeline list on %d: %d %s", sk.ID, code, errOut)
		}
		if n := strings.Count(out, tenant); n != held[sk.ID] {
			t.Errorf("safekeeper %d holds %d timelines, placement put %d there", sk.ID, n, held[sk.ID])
		}
	}
	harness.WaitFor(t, 30*time.Second, "every registration to report its timelines", func() bool {
		nodes, _, _, err := ec.Nodes(context.Background())
		if err != nil {
			return false
		}
		for _, v := range nodes {
			if !v.Live() || v.Status.Timelines != held[v.ID] {
				return false
			}
		}
		return true
	})

	// timeline members prints the configuration; creating again keeps it.
	timeline := "f1ee7000000000000000000000000100"
	code, out, errOut := harness.Run(t, append([]string{"timeline", "members", "--json", "--tenant-id", tenant, "--timeline-id", timeline}, etcdArgs(etcd)...)...)
	var m struct {
		Generation uint64   `json:"generation"`
		Members    []uint64 `json:"members"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &m) != nil || m.Generation != 1 || len(m.Members) != 3 {
		t.Fatalf("timeline members: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = harness.Run(t, append([]string{"timeline", "create", "--json", "--tenant-id", tenant, "--timeline-id", timeline,
		"--system-id", "7312345678901234567"}, etcdArgs(etcd)...)...)
	if code != 0 || !strings.Contains(out, `"placed":false`) || !strings.Contains(out, fmt.Sprintf(`"members":[%d,%d,%d]`, m.Members[0], m.Members[1], m.Members[2])) {
		t.Errorf("timeline create again: exit %d, %s; want the same members, not placed again", code, out)
	}
	// A timeline never created: members and propose refuse it (exit 4),
	// pointing at timeline create; nothing is placed.
	unknown := "f1ee70000000000000000000000000ff"
	code, _, errOut = harness.Run(t, append([]string{"timeline", "members", "--tenant-id", tenant, "--timeline-id", unknown}, etcdArgs(etcd)...)...)
	if code != 4 || !strings.Contains(errOut, "timeline create") {
		t.Errorf("timeline members of an unknown timeline: exit %d, %s; want 4 pointing at timeline create", code, errOut)
	}
	code, _, errOut = harness.Run(t, append([]string{"propose", "--upstream", "host=127.0.0.1 port=1 user=x", "--tenant-id", tenant, "--timeline-id", unknown}, etcdArgs(etcd)...)...)
	if code != 4 || !strings.Contains(errOut, "no configuration in etcd") || !strings.Contains(errOut, "timeline create") {
		t.Errorf("propose of an unknown timeline: exit %d, %s; want 4 pointing at timeline create", code, errOut)
	}
	if _, _, err := ec.Timeline(context.Background(), mustID(t, tenant), mustID(t, unknown)); err == nil {
		t.Errorf("propose of an unknown timeline placed it")
	}
}

func mustID(t *testing.T, s string) proto.ID {
	t.Helper()
	id, err := proto.ParseID(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestFleetProposerFindsItsSafekeepers: a proposer given only
// --etcd-endpoints and the ids protects a real primary (its commits wait
// for a quorum of the members placed in etcd, as with static addresses),
// sync and wal fetch find the members the same way, and a configuration
// changed in etcd is taken up without restarting the proposer.
func TestFleetProposerFindsItsSafekeepers(t *testing.T) {
	etcd := etcdtest.Start(t).Endpoints()
	sks, ec := fleetOf(t, etcd, 4, 4)
	pg := pgtest.Start(t, pgtest.Options{Conf: []string{"wal_sender_timeout = '20s'"}})
	tenant, timeline := "f1ee7000000000000000000000000002", "f1ee7000000000000000000000000002"
	code, out, errOut := harness.Run(t, append([]string{"timeline", "create", "--tenant-id", tenant, "--timeline-id", timeline,
		"--upstream", pg.ConnString()}, etcdArgs(etcd)...)...)
	if code != 0 {
		t.Fatalf("timeline create: exit %d\n%s%s", code, out, errOut)
	}
	cfg, _, err := ec.Timeline(context.Background(), mustID(t, tenant), mustID(t, timeline))
	if err != nil {
		t.Fatal(err)
	}
	byID := map[uint64]*harness.Safekeeper{}
	for _, sk := range sks {
		byID[sk.ID] = sk
	}
	var spare *harness.Safekeeper
	for _, sk := range sks {
		if !slices.Contains(cfg.Members, sk.ID) {
			spare = sk
		}
	}
	prop := harness.StartProcess(t, "proposer", append([]string{"propose", "--upstream", pg.ConnString(), "--tenant-id", tenant,
		"--timeline-id", timeline, "--application-name", "proposer"}, etcdArgs(etcd)...)...)
	pg.Exec(t, "ALTER SYSTEM SET synchronous_standby_names = 'proposer'")
	pg.Exec(t, "SELECT pg_reload_conf()")
	harness.WaitSyncStandby(t, pg, prop, "proposer", 60*time.Second)
	pg.Exec(t, "CREATE TABLE ledger (id int PRIMARY KEY, v text)")
	pg.Exec(t, "INSERT INTO ledger SELECT g, 'x' FROM generate_series(1, 1000) g")
	flush := flushLSN(t, pg)
	for _, id := range cfg.Members {
		harness.WaitFor(t, 30*time.Second, fmt.Sprintf("member %d to hold the commit", id), func() bool {
			st := byID[id].TimelineStatus(t, tenant, timeline)
			l, err := proto.ParseLSN(st["flush_lsn"])
			return err == nil && l >= flush
		})
	}
	if _, out, _ := harness.Run(t, "timeline", "list", "--http", spare.HTTPAddr); strings.Contains(out, timeline) {
		t.Errorf("safekeeper %d, not a member, holds the timeline: %s", spare.ID, out)
	}

	// Two members down: no quorum, a commit waits.
	byID[cfg.Members[1]].Kill()
	byID[cfg.Members[2]].Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, err = pg.Query(ctx, "INSERT INTO ledger VALUES (1001, 'waits')")
	cancel()
	if err == nil {
		t.Fatalf("a commit returned with one member of three up: the proposer did not wait for a quorum of %v", cfg.Members)
	}
	byID[cfg.Members[1]].Start()
	byID[cfg.Members[2]].Start()
	pg.Exec(t, "SET statement_timeout = '60s'; INSERT INTO ledger VALUES (1002, 'after')")

	// wal fetch finds the members through etcd.
	pg.Exec(t, "SELECT pg_switch_wal()") // a segment wholly after the timeline's start
	pg.Exec(t, "SET statement_timeout = '60s'; INSERT INTO ledger VALUES (1007, 'in the segment fetched')")
	seg := pg.Exec(t, "SELECT pg_walfile_name(pg_current_wal_lsn())")
	pg.Exec(t, "SELECT pg_switch_wal()")
	pg.Exec(t, "SET statement_timeout = '60s'; INSERT INTO ledger VALUES (1003, 'next segment')")
	dst := t.TempDir() + "/" + seg
	code, out, errOut = harness.Run(t, append(append([]string{"wal", "fetch", "--tenant-id", tenant, "--timeline-id", timeline}, etcdArgs(etcd)...), seg, dst)...)
	if code != 0 {
		t.Fatalf("wal fetch --etcd-endpoints %s: exit %d\n%s%s", seg, code, out, errOut)
	}
	if got, want := fileSHA(t, dst), fileSHA(t, filepath.Join(pg.WALDir(), seg)); got != want {
		t.Errorf("wal fetch --etcd-endpoints %s: not the primary's segment", seg)
	}

	// A new configuration in etcd (the spare in place of the third
	// member): the proposer streams to it without a restart.
	out3 := cfg.Members[2]
	next := fleet.Config{Generation: cfg.Generation + 1, Members: []uint64{cfg.Members[0], cfg.Members[1], spare.ID}}
	_, rev, _ := ec.Timeline(context.Background(), mustID(t, tenant), mustID(t, timeline))
	if ok, err := ec.SwapConfig(context.Background(), mustID(t, tenant), mustID(t, timeline), rev, next); !ok || err != nil {
		t.Fatalf("SwapConfig: %v %v", ok, err)
	}
	pg.Exec(t, "SET statement_timeout = '60s'; INSERT INTO ledger VALUES (1004, 'new members')")
	flush = flushLSN(t, pg)
	harness.WaitFor(t, 60*time.Second, fmt.Sprintf("safekeeper %d, the new member, to hold the commit", spare.ID), func() bool {
		code, out, _ := harness.Run(t, "timeline", "show", "--json", "--http", spare.HTTPAddr, "--tenant-id", tenant, "--timeline-id", timeline)
		var st struct {
			FlushLSN string `json:"flush_lsn"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
			return false // not created there yet
		}
		l, err := proto.ParseLSN(st.FlushLSN)
		return err == nil && l >= flush
	})
	// The old member up and the new one down, with a second member down:
	// under the old configuration that would be a quorum (the first member
	// and the old one), under the new one it is not, and the commit waits.
	spare.Kill()
	byID[cfg.Members[1]].Kill()
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Second)
	_, err = pg.Query(ctx, "INSERT INTO ledger VALUES (1005, 'waits')")
	cancel()
	if err == nil {
		t.Fatalf("a commit returned with members %d and %d up: the proposer still counts safekeeper %d, no longer a member",
			cfg.Members[0], out3, out3)
	}
	spare.Start()
	pg.Exec(t, "SET statement_timeout = '60s'; INSERT INTO ledger VALUES (1006, 'quorum of the new members')")
	byID[cfg.Members[1]].Start()
	// A hand-edited key that does not parse: the proposer keeps the last
	// valid configuration (commits go on), and says which key is wrong.
	key := ec.TimelineKey(mustID(t, tenant), mustID(t, timeline))
	good, err := ec.Etcd().Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ec.Etcd().Put(context.Background(), key, `{"generation": 3, "members": [1, 2], "membres": [4]}`); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 30*time.Second, "the proposer to report the bad configuration", func() bool {
		return strings.Contains(prop.Log(), "timeline configuration not readable from etcd") && strings.Contains(prop.Log(), key)
	})
	pg.Exec(t, "SET statement_timeout = '60s'; INSERT INTO ledger VALUES (1008, 'after the bad key')")
	if _, err := ec.Etcd().Put(context.Background(), key, string(good.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}
	if exited, code := prop.Exited(); exited {
		t.Fatalf("the proposer exited (%d): a configuration change must not need a restart", code)
	}
	if !strings.Contains(prop.Log(), "configuration changed in etcd") {
		t.Errorf("the proposer's log does not say it took up the new configuration")
	}
	// The two commits that waited and were cancelled are there too: a
	// cancelled wait for synchronous replication leaves the transaction
	// committed locally (PostgreSQL warns so).
	if got := pg.Exec(t, "SELECT count(*) FROM ledger"); got != "1008" {
		t.Errorf("ledger holds %s rows, want 1008", got)
	}
	// sync finds the new members through etcd too (the proposer stopped:
	// sync would depose it).
	flush = flushLSN(t, pg)
	if err := prop.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = harness.Run(t, append([]string{"sync", "--json", "--tenant-id", tenant, "--timeline-id", timeline}, etcdArgs(etcd)...)...)
	var synced struct {
		CommitLSN string `json:"commit_lsn"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &synced) != nil {
		t.Fatalf("sync --etcd-endpoints: exit %d\n%s%s", code, out, errOut)
	}
	if l, err := proto.ParseLSN(synced.CommitLSN); err != nil || l < flush {
		t.Errorf("sync --etcd-endpoints: commit_lsn %s, want at least the primary's flush %s", synced.CommitLSN, flush)
	}
	// timeline pull finds a peer through etcd: a member's new, empty disk
	// (the member itself stopped, so the first it may try refuses).
	if err := byID[cfg.Members[0]].Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = harness.Run(t, append([]string{"timeline", "pull", "--json", "--data-dir", t.TempDir(), "--tenant-id", tenant,
		"--timeline-id", timeline}, etcdArgs(etcd)...)...)
	var pulled struct {
		From     string `json:"from"`
		FlushLSN string `json:"flush_lsn"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &pulled) != nil {
		t.Fatalf("timeline pull --etcd-endpoints: exit %d\n%s%s", code, out, errOut)
	}
	if l, err := proto.ParseLSN(pulled.FlushLSN); err != nil || l < flush || pulled.From == byID[cfg.Members[0]].Addr {
		t.Errorf("timeline pull --etcd-endpoints: %+v; want a live member's WAL up to %s", pulled, flush)
	}
}

// TestFleetRegistration: a second process with a live node's id exits 2
// naming the first's address; a safekeeper paused past its lease's TTL
// is no longer live, and registers again once it runs.
func TestFleetRegistration(t *testing.T) {
	etcd := etcdtest.Start(t).Endpoints()
	sks, ec := fleetOf(t, etcd, 1, 1)
	code, _, errOut := harness.Run(t, append([]string{"run", "--id", "1", "--zone", "z9", "--listen-pg", "127.0.0.1:0", "--listen-http", "",
		"--data-dir", t.TempDir(), "--etcd-lease-ttl", "2s"}, etcdArgs(etcd)...)...)
	if code != 2 || !strings.Contains(errOut, sks[0].Addr) {
		t.Fatalf("a second safekeeper with id 1: exit %d, %s; want 2 naming %s", code, errOut, sks[0].Addr)
	}
	// Paused past the TTL: not live; resumed: live again.
	if err := syscall.Kill(sks[0].PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 20*time.Second, "the paused safekeeper's lease to expire", func() bool {
		nodes, _, _, err := ec.Nodes(context.Background())
		return err == nil && len(nodes) == 1 && !nodes[0].Live()
	})
	if err := syscall.Kill(sks[0].PID(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitLive(t, ec, 1)
	if !strings.Contains(sks[0].Log(), "registering again") {
		t.Errorf("the resumed safekeeper's log does not say it registered again")
	}
	// Without --etcd-endpoints the fleet flags are refused.
	code, _, errOut = harness.Run(t, "run", "--id", "5", "--zone", "z1", "--data-dir", t.TempDir())
	if code != 2 || !strings.Contains(errOut, "--etcd-endpoints") {
		t.Errorf("run --zone without etcd: exit %d, %s; want 2", code, errOut)
	}
}

func fileSHA(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestFleetSafekeeperStartsWhileEtcdIsDown: a safekeeper started while
// etcd does not answer serves at once (its timelines' proposers know its
// address) and registers once etcd is back, without a restart.
func TestFleetSafekeeperStartsWhileEtcdIsDown(t *testing.T) {
	srv := etcdtest.Start(t)
	etcd := srv.Endpoints()
	ec, err := fleet.Connect(fleet.ClientConfig{Endpoints: etcd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ec.Close() })
	srv.Stop()
	sk := harness.StartSafekeeper(t, 1, "--etcd-endpoints", strings.Join(etcd, ","), "--zone", "z0", "--etcd-lease-ttl", "2s")
	if !strings.Contains(sk.Log(), "etcd unavailable at start; serving") {
		t.Errorf("the safekeeper's log does not say it serves without etcd:\n%s", harness.Tail(sk.Log(), 10))
	}
	if code, _, errOut := harness.Run(t, "status", "--http", sk.HTTPAddr); code != 0 {
		t.Fatalf("status of the safekeeper started without etcd: exit %d %s", code, errOut)
	}
	srv.Start()
	srv.WaitHealthy()
	nodes := waitLive(t, ec, 1)
	if nodes[0].PG != sk.Addr {
		t.Errorf("registered %+v, want advertise_pg %s", nodes[0].Node, sk.Addr)
	}
}
