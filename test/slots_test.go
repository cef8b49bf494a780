package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// slotsOn returns the persistent slots a safekeeper's HTTP API shows for
// the timeline, by name: their restart_lsn.
func slotsOn(t *testing.T, sk *harness.Safekeeper, tenant, timeline proto.ID) map[string]proto.LSN {
	t.Helper()
	resp, err := http.Get("http://" + sk.HTTPAddr + "/v1/tenant/" + tenant.String() + "/timeline/" + timeline.String())
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var tl struct {
		Slots []struct {
			Name       string    `json:"slot_name"`
			Temporary  bool      `json:"temporary"`
			RestartLSN proto.LSN `json:"restart_lsn"`
		} `json:"slots"`
		RetentionReason string `json:"retention_reason"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&tl) != nil {
		return nil
	}
	out := map[string]proto.LSN{}
	for _, s := range tl.Slots {
		if !s.Temporary {
			out[s.Name] = s.RestartLSN
		}
	}
	return out
}

// TestSlotOnEverySafekeeper: a persistent replication slot created on one
// safekeeper of a timeline exists on all of them, its restart_lsn following
// the reader's confirmed position wherever it reads, so that it survives
// the loss of that safekeeper's disk:
//   - pg_receivewal creates slot "archiver" on safekeeper 1 and streams;
//     safekeepers 2 and 3 get the slot, at the restart_lsn safekeeper 1
//     has, and their retention keeps the WAL from there;
//   - safekeeper 1's disk is replaced and `timeline pull` refills it from
//     safekeeper 2: the slot comes with it;
//   - pg_receivewal re-pointed at safekeeper 2, into an empty directory,
//     resumes at the slot's position (READ_REPLICATION_SLOT), not at the
//     end of WAL;
//   - the slot dropped on safekeeper 3 is dropped on all of them.
func TestSlotOnEverySafekeeper(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Options{WALSegSizeMB: 1, Conf: []string{"wal_keep_size = '64MB'"}})
	// --wal-keep-size 0: the slot alone holds WAL below commit_lsn.
	sks := harness.StartSafekeepers(t, 3, "--wal-keep-size", "0")
	addrs := harness.Addrs(sks)
	upstream := pg.ConnString()
	ten, tl := tenant(1), proto.ID{0xbb, 0x40}
	harness.CreateTimeline(t, upstream, addrs, ten.String(), tl.String())
	prop := harness.StartProposer(t, harness.ProposerOptions{Upstream: upstream, Safekeepers: addrs, Tenant: ten.String(), Timeline: tl.String()})
	app := "proposer_" + tl.String()
	harness.WaitFor(t, 60*time.Second, "the proposer to stream", func() bool {
		prop.CheckRunning()
		out, err := pg.Query(t.Context(), "select state from pg_stat_replication where application_name = '"+app+"'")
		return err == nil && out == "streaming"
	})
	pg.Exec(t, "create table slot_w(x int, pad text); insert into slot_w select g, repeat('w', 200) from generate_series(1, 2000) g")
	opts := fmt.Sprintf("options='-c tenant_id=%s -c timeline_id=%s'", ten, tl)
	hostPort := func(sk *harness.Safekeeper) []string {
		h, p, _ := strings.Cut(sk.Addr, ":")
		return []string{"-h", h, "-p", p}
	}
	pg.Run(t, "pg_receivewal", append(hostPort(sks[0]), "-U", "postgres", "-d", opts, "--slot", "archiver", "--create-slot")...)

	// pg_receivewal streams from safekeeper 1 with the slot.
	archive := pgtest.Dir(t, "archive-")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rw := pg.Cmd(ctx, "pg_receivewal", append(hostPort(sks[0]), "-U", "postgres", "-d", opts, "--slot", "archiver", "-D", archive, "--no-loop", "--synchronous")...)
	var rwOut harness.SyncBuffer
	rw.Stdout, rw.Stderr = &rwOut, &rwOut
	if err := rw.Start(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		pg.Exec(t, "insert into slot_w select g, repeat('x', 200) from generate_series(1, 3000) g; select pg_switch_wal()")
	}
	written, err := proto.ParseLSN(pg.Exec(t, "select pg_current_wal_flush_lsn()"))
	if err != nil {
		t.Fatal(err)
	}
	var restart proto.LSN
	harness.WaitFor(t, 60*time.Second, "the slot to advance on safekeeper 1 to "+written.String()+" and be the same on 2 and 3", func() bool {
		r1 := slotsOn(t, sks[0], ten, tl)["archiver"]
		if r1 < written.SegmentStart(pg.WALSegSize) { // pg_receivewal --synchronous confirms what it wrote
			return false
		}
		for _, sk := range sks[1:] {
			if slotsOn(t, sk, ten, tl)["archiver"] != r1 {
				return false
			}
		}
		restart = r1
		return true
	})
	t.Logf("slot archiver at %s on all three safekeepers", restart)
	rw.Process.Signal(syscall.SIGINT)
	rw.Wait()

	// More WAL, past the slot: every safekeeper keeps the WAL from the
	// slot's restart_lsn (--wal-keep-size 0: the slot alone holds it).
	for range 3 {
		pg.Exec(t, "insert into slot_w select g, repeat('y', 200) from generate_series(1, 3000) g; select pg_switch_wal()")
	}
	past, err := proto.ParseLSN(pg.Exec(t, "select pg_current_wal_flush_lsn()"))
	if err != nil {
		t.Fatal(err)
	}
	for _, sk := range sks {
		var st map[string]string
		harness.WaitFor(t, 30*time.Second, fmt.Sprintf("safekeeper %d to commit %s and hold WAL for the slot", sk.ID, past), func() bool {
			st = sk.TimelineStatus(t, ten.String(), tl.String())
			commit, _ := proto.ParseLSN(st["commit_lsn"])
			return commit >= past && strings.Contains(st["retention_reason"], `replication slot "archiver"`)
		})
		if removed, _ := proto.ParseLSN(st["removed_up_to"]); removed > restart.SegmentStart(pg.WALSegSize) {
			t.Fatalf("safekeeper %d removed WAL up to %s, past the slot's restart_lsn %s (%s)", sk.ID, removed, restart, st["retention_reason"])
		}
	}

	// Safekeeper 1's disk is replaced; a pull from safekeeper 2 brings the slot.
	sks[0].Kill()
	if err := os.RemoveAll(sks[0].DataDir); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := harness.Run(t, "timeline", "pull", "--from", sks[1].Addr, "--data-dir", sks[0].DataDir,
		"--tenant-id", ten.String(), "--timeline-id", tl.String())
	if code != 0 || !strings.Contains(out, "1 replication slot") {
		t.Fatalf("timeline pull: exit %d\n%s%s", code, out, stderr)
	}
	sks[0].Start()
	if got := slotsOn(t, sks[0], ten, tl)["archiver"]; got < restart {
		t.Fatalf("after the pull the slot on the replaced safekeeper is at %s, want at least %s", got, restart)
	}

	// pg_receivewal re-pointed at safekeeper 2, into an empty directory,
	// starts at the slot's position.
	fresh := pgtest.Dir(t, "archive2-")
	rw2 := pg.Cmd(ctx, "pg_receivewal", append(hostPort(sks[1]), "-U", "postgres", "-d", opts, "--slot", "archiver", "-D", fresh, "--no-loop")...)
	var rw2Out harness.SyncBuffer
	rw2.Stdout, rw2.Stderr = &rw2Out, &rw2Out
	if err := rw2.Start(); err != nil {
		t.Fatal(err)
	}
	var files []string
	harness.WaitFor(t, 30*time.Second, "pg_receivewal on safekeeper 2 to write a segment", func() bool {
		files, _ = filepath.Glob(filepath.Join(fresh, "0000*"))
		return len(files) > 0
	})
	rw2.Process.Signal(syscall.SIGINT)
	rw2.Wait()
	sort.Strings(files)
	if want := proto.SegmentFileName(1, restart, pg.WALSegSize); strings.TrimSuffix(filepath.Base(files[0]), ".partial") != want {
		t.Fatalf("pg_receivewal on safekeeper 2 started at %s, want the slot's segment %s\n%s", filepath.Base(files[0]), want, rw2Out.String())
	}

	// Dropped on safekeeper 3: gone everywhere.
	h3, p3, _ := strings.Cut(sks[2].Addr, ":")
	c, err := pgconn.Connect(harness.Context(t, 10*time.Second), fmt.Sprintf("host=%s port=%s user=postgres sslmode=disable replication=true %s", h3, p3, opts))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(harness.Context(t, 10*time.Second), "DROP_REPLICATION_SLOT archiver").ReadAll(); err != nil {
		t.Fatal(err)
	}
	c.Close(context.Background())
	harness.WaitFor(t, 30*time.Second, "the slot dropped on safekeeper 3 to be gone on every safekeeper", func() bool {
		for _, sk := range sks {
			if _, ok := slotsOn(t, sk, ten, tl)["archiver"]; ok {
				return false
			}
		}
		return true
	})
}
