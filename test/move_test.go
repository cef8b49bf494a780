package test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/etcdtest"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// TestMoveTimelineUnderLoad: a timeline protecting a real primary under
// pgbench and a ledger of acknowledged single-row commits moves from
// safekeepers {1,2,3} to {1,2,4} (timeline migrate --from 3 --to 4), then
// to {4,5,6} (every member replaced), and in the middle of the second move
// — while its joint configuration stands — the controller and safekeeper 1
// are killed with SIGKILL; a second controller finishes the move. Then
// every acknowledged row is on the primary and on a hot standby fed by the
// final members, the final members' exported segments are byte-identical
// to the primary's, and the removed members refuse the timeline. The
// longest time without an acknowledged commit during each move is logged.
func TestMoveTimelineUnderLoad(t *testing.T) {
	etcd := etcdtest.Start(t).Endpoints()
	sks, ec := fleetOf(t, etcd, 6, 3)
	byID := map[uint64]*harness.Safekeeper{}
	for _, sk := range sks {
		byID[sk.ID] = sk
	}
	pg := pgtest.Start(t, pgtest.Options{Conf: []string{"wal_sender_timeout = '20s'", "wal_keep_size = '1GB'"}})
	tenant, timeline := "f1ee7000000000000000000000000005", "f1ee7000000000000000000000000051"
	tid, lid := mustID(t, tenant), mustID(t, timeline)
	if code, out, errOut := harness.Run(t, append([]string{"timeline", "create", "--tenant-id", tenant, "--timeline-id", timeline,
		"--members", "1,2,3", "--upstream", pg.ConnString()}, etcdArgs(etcd)...)...); code != 0 {
		t.Fatalf("timeline create: exit %d\n%s%s", code, out, errOut)
	}
	prop := harness.StartProcess(t, "proposer", append([]string{"propose", "--upstream", pg.ConnString(), "--tenant-id", tenant,
		"--timeline-id", timeline, "--application-name", "proposer"}, etcdArgs(etcd)...)...)
	pg.Exec(t, "ALTER SYSTEM SET synchronous_standby_names = 'proposer'")
	pg.Exec(t, "SELECT pg_reload_conf()")
	harness.WaitSyncStandby(t, pg, prop, "proposer", 60*time.Second)
	pg.Exec(t, "CREATE TABLE ledger (id int PRIMARY KEY, note text)")
	bench := func(args ...string) []string {
		return append(append([]string{"-h", pg.SocketDir, "-p", strconv.Itoa(pg.Port), "-U", "postgres"}, args...), "postgres")
	}
	pg.Run(t, "pgbench", bench("-i", "-s", "1", "-q")...)
	ctl, _ := startController(t, "controller-1", etcd, "--catch-up-timeout", "3m")

	pgbCtx, pgbCancel := context.WithCancel(context.Background())
	defer pgbCancel()
	pgb := pg.Cmd(pgbCtx, "pgbench", bench("-n", "-c", "2", "-j", "1", "-T", "600")...)
	var pgbOut strings.Builder
	pgb.Stdout, pgb.Stderr = &pgbOut, &pgbOut
	if err := pgb.Start(); err != nil {
		t.Fatal(err)
	}
	pgbDone := make(chan error, 1)
	go func() { pgbDone <- pgb.Wait() }()
	led := startLedger(t, pg)
	harness.WaitFor(t, 30*time.Second, "100 ledger rows acknowledged", func() bool { return led.count() >= 100 })

	// Move 1: one member replaced.
	from := time.Now()
	code, out, errOut := harness.Run(t, append([]string{"timeline", "migrate", "--tenant-id", tenant, "--timeline-id", timeline,
		"--from", "3", "--to", "4", "--timeout", "2m"}, etcdArgs(etcd)...)...)
	if code != 0 {
		t.Fatalf("timeline migrate --from 3 --to 4: exit %d\n%s%s\ncontroller:\n%s", code, out, errOut, harness.TailFile(ctl.LogPath, 40))
	}
	n, gap, _ := led.window(from, time.Now())
	t.Logf("move {1,2,3} → {1,2,4} in %v: %d commits acknowledged, the longest gap %v\n%s", time.Since(from).Round(time.Millisecond), n, gap, out)
	cfg, _, err := ec.Timeline(context.Background(), tid, lid)
	if err != nil || cfg.Joint() || !fleet.SameMembers(cfg.Members, []uint64{1, 2, 4}) || cfg.Generation != 3 {
		t.Fatalf("after move 1: %s, %v; want generation 3, members [1 2 4]", cfg, err)
	}
	harness.WaitFor(t, 30*time.Second, "100 more ledger rows", func() bool { return led.count() >= n+100 })

	// Move 2: every member replaced; the controller and safekeeper 1 are
	// killed while the joint configuration stands.
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	watch := ec.Etcd().Watch(wctx, ec.TimelineKey(tid, lid))
	from = time.Now()
	if code, out, errOut := harness.Run(t, append([]string{"timeline", "migrate", "--tenant-id", tenant, "--timeline-id", timeline,
		"--members", "4,5,6", "--no-wait"}, etcdArgs(etcd)...)...); code != 0 {
		t.Fatalf("timeline migrate --members 4,5,6: exit %d\n%s%s", code, out, errOut)
	}
	var joint fleet.Config
	deadline := time.After(2 * time.Minute)
	for joint.Generation == 0 {
		select {
		case wr := <-watch:
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				c, err := fleet.ParseConfig(string(ev.Kv.Key), ev.Kv.Value)
				if err != nil {
					t.Fatal(err)
				}
				if !c.Joint() {
					t.Fatalf("the second move went to %s before the test saw its joint configuration", c)
				}
				joint = c
			}
		case <-deadline:
			t.Fatalf("no joint configuration within 2 minutes\ncontroller:\n%s", harness.TailFile(ctl.LogPath, 40))
		}
	}
	ctl.Kill()
	byID[1].Kill()
	t.Logf("killed the controller and safekeeper 1 in %s", joint)
	if c, _, err := ec.Timeline(context.Background(), tid, lid); err != nil || c.Generation != joint.Generation {
		t.Fatalf("the configuration moved on before the kills: %s, %v", c, err)
	}
	ctl2, _ := startController(t, "controller-2", etcd, "--catch-up-timeout", "3m")
	byID[1].Start()
	harness.WaitFor(t, 3*time.Minute, "the second controller to finish the move to {4,5,6}", func() bool {
		c, _, err := ec.Timeline(context.Background(), tid, lid)
		_, asked, merr := ec.Migration(context.Background(), tid, lid)
		return err == nil && merr == nil && !asked && !c.Joint() && fleet.SameMembers(c.Members, []uint64{4, 5, 6})
	})
	n2, gap2, _ := led.window(from, time.Now())
	t.Logf("move {1,2,4} → {4,5,6} with the kills in %v: %d commits acknowledged, the longest gap %v", time.Since(from).Round(time.Millisecond), n2, gap2)
	if !strings.Contains(ctl2.Log(), "final configuration written") {
		t.Errorf("the second controller did not finish the move:\n%s", harness.TailFile(ctl2.LogPath, 40))
	}
	harness.WaitFor(t, 30*time.Second, "100 more ledger rows on the final members", func() bool { return led.count() >= n+n2+100 })

	// The load ends; everything acknowledged is there.
	led.halt()
	pgbCancel()
	<-pgbDone
	acked := led.count()
	if led.err != nil {
		t.Fatalf("the ledger stopped: %v", led.err)
	}
	if got := pg.Exec(t, "SELECT count(*) FROM ledger WHERE id BETWEEN 1 AND "+strconv.Itoa(acked)); got != strconv.Itoa(acked) {
		t.Fatalf("the primary has %s of the %d acknowledged rows", got, acked)
	}
	pg.Exec(t, "SELECT pg_switch_wal()")
	pg.Exec(t, "INSERT INTO ledger VALUES (0, 'after the switch')")
	flush := flushLSN(t, pg)
	for _, id := range []uint64{4, 5, 6} {
		harness.WaitFor(t, 60*time.Second, fmt.Sprintf("member %d to hold the primary's WAL", id), func() bool {
			l, err := proto.ParseLSN(byID[id].TimelineStatus(t, tenant, timeline)["flush_lsn"])
			return err == nil && l >= flush
		})
	}
	standby := harness.StartStandby(t, pg, byID[5], harness.StandbyOptions{Tenant: tenant, Timeline: timeline})
	t.Cleanup(func() {
		if t.Failed() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			rl, err := standby.Query(ctx, "SELECT pg_last_wal_receive_lsn()::text || ' ' || pg_last_wal_replay_lsn()::text || ' ' || (SELECT count(*) FROM ledger)::text")
			t.Logf("standby log:\n%s\nstandby receive/replay/rows: %s %v; acked %d\nsafekeeper 5 status: %v", harness.TailFile(standby.LogFile, 30), rl, err, acked,
				byID[5].TimelineStatus(t, tenant, timeline))
		}
	})
	harness.WaitFor(t, 60*time.Second, "the standby fed by safekeeper 5 to replay every acknowledged row", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got, err := standby.Query(ctx, "SELECT count(*) FROM ledger WHERE id BETWEEN 1 AND "+strconv.Itoa(acked))
		return err == nil && got == strconv.Itoa(acked)
	})
	// The removed members know they are removed: each holds a
	// configuration without itself (they refuse a proposer, SK002).
	for _, id := range []uint64{1, 2, 3} {
		code, out, errOut := harness.Run(t, "timeline", "show", "--json", "--http", byID[id].HTTPAddr, "--tenant-id", tenant, "--timeline-id", timeline)
		var st struct {
			Configuration *proto.Configuration `json:"configuration"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Configuration == nil {
			t.Fatalf("timeline show on removed member %d: exit %d\n%s%s", id, code, out, errOut)
		}
		if st.Configuration.IsMember(id) || st.Configuration.Generation < 3 {
			t.Errorf("removed member %d holds %s", id, st.Configuration)
		}
	}
	// The final members' segments are the primary's, byte for byte.
	seg := pg.Exec(t, "SELECT pg_walfile_name(pg_current_wal_lsn())")
	compared := 0
	for _, id := range []uint64{4, 5, 6} {
		if err := byID[id].Stop(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if code, _, stderr := harness.Run(t, "wal", "export", "--data-dir", byID[id].DataDir, "--tenant-id", tenant, "--timeline-id", timeline,
			"--output", dir); code != 0 {
			t.Fatalf("wal export of member %d: exit %d: %s", id, code, stderr)
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range ents {
			name := e.Name()
			if len(name) != 24 || name >= seg {
				continue // partial, history, or the segment being written
			}
			want, err := os.ReadFile(filepath.Join(pg.WALDir(), name))
			if err != nil {
				continue // recycled by the primary
			}
			got, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if sha256.Sum256(got) != sha256.Sum256(want) {
				t.Errorf("member %d: segment %s differs from the primary's", id, name)
			}
			n++
		}
		if n == 0 {
			t.Errorf("member %d: no complete segment exported to compare", id)
		}
		compared += n
	}
	t.Logf("%d acknowledged rows on the primary and the standby; %d segments of the final members compared with the primary's", acked, compared)
}
