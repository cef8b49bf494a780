package test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// TestProposeRefusedForGoodExitsClearly: safekeepers whose timeline belongs
// to another cluster (another system id) refuse the proposer's ServerInfo;
// no retry, and no restart, can fix that, so once no quorum is possible
// `propose` exits 4 (which the unit's RestartPreventExitStatus names) with
// one line naming the reason, the safekeepers and the mismatch, instead of
// warning and reconnecting forever.
func TestProposeRefusedForGoodExitsClearly(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Options{WALSegSizeMB: 1})
	sks := harness.StartSafekeepers(t, 3)
	// The timeline, created by a test proposer of another cluster (sysID,
	// 1 MiB segments) on safekeepers 1 and 2; safekeeper 3 does not hold it.
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	_, end := gen.Record(200)
	wal := gen.Take()
	for _, sk := range sks[:2] {
		p := startTerm(t, sk, 1, 1)
		p.send(p.appendReq(tlStart, wal, end))
		p.resp()
		p.c.Close()
	}
	// Seen before the campaign in the safekeepers' TIMELINE_STATUS (the
	// lease check), and, with --proposer-lease 0, in their refusals of the
	// greeting (each safekeeper is then asked why).
	for _, lease := range []string{"10s", "0"} {
		prop := harness.StartProposer(t, harness.ProposerOptions{Upstream: pg.ConnString(), Safekeepers: harness.Addrs(sks),
			Tenant: tenant(1).String(), Timeline: proto.ID{0xbb, 1}.String(), Args: []string{"--proposer-lease", lease}})
		harness.WaitFor(t, 60*time.Second, "the proposer to give up", func() bool {
			exited, _ := prop.Exited()
			return exited
		})
		_, code := prop.Exited()
		log := prop.Log()
		last := harness.LastLine(log, "")
		if code != 4 || !strings.HasPrefix(last, "safekeeper: refused: another system id: ") || !strings.Contains(last, "no quorum is possible") ||
			!strings.Contains(last, "system_id") || !strings.Contains(last, sks[0].Addr) || !strings.Contains(last, sks[1].Addr) {
			t.Fatalf("--proposer-lease %s: propose against another cluster's timeline: exit %d, last line %q; want exit 4 and one line naming the reason, both safekeepers and system_id\n%s", lease, code, last, log)
		}
		t.Logf("--proposer-lease %s: the refusal: %s", lease, last)
		if n := strings.Count(log, "system_id"); n > 4 {
			t.Errorf("--proposer-lease %s: the refusal was logged %d times: retried instead of given up", lease, n)
		}
	}
}

// TestProposerSlotHoldsWALForALaggingSafekeeper: while the proposer
// streams, its physical slot on the primary exists and holds WAL at
// truncate_lsn — the oldest WAL some safekeeper still needs — not at the
// quorum commit_lsn. The replication stream runs without the slot (a slot
// in use would follow the flush position the stream reports, commit_lsn,
// and leave a lagging safekeeper behind); the slot keeper advances it on
// its own, so pg_replication_slots shows it active=f while
// pg_stat_replication shows the proposer streaming. With one safekeeper
// down, the WAL it lacks stays on the primary across a checkpoint.
func TestProposerSlotHoldsWALForALaggingSafekeeper(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Options{WALSegSizeMB: 1, Conf: []string{"max_wal_size = '32MB'", "min_wal_size = '2MB'"}})
	sks := harness.StartSafekeepers(t, 3)
	tl := proto.ID{0xbb, 7}
	prop := harness.StartProposer(t, harness.ProposerOptions{Upstream: pg.ConnString(), Safekeepers: harness.Addrs(sks),
		Tenant: tenant(1).String(), Timeline: tl.String(), Create: true, Slot: "proposer", ApplicationName: "proposer"})
	flushOf := func(sk *harness.Safekeeper) (flush, commit proto.LSN) {
		_, flush, commit = skTimelineOf(t, sk, tenant(1), tl)
		return flush, commit
	}
	lsn := func(sql string) proto.LSN {
		l, err := proto.ParseLSN(pg.Exec(t, sql))
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return l
	}
	slot := func() (active string, restart proto.LSN) {
		out := pg.Exec(t, "select active::text || ' ' || coalesce(restart_lsn::text, '0/0') from pg_replication_slots where slot_name = 'proposer'")
		f := strings.Fields(out)
		if len(f) != 2 {
			t.Fatalf("pg_replication_slots for the proposer's slot: %q", out)
		}
		l, err := proto.ParseLSN(f[1])
		if err != nil {
			t.Fatal(err)
		}
		return f[0], l
	}
	harness.WaitFor(t, 60*time.Second, "the proposer to stream", func() bool {
		prop.CheckRunning()
		out, err := pg.Query(t.Context(), "select state from pg_stat_replication where application_name = 'proposer'")
		return err == nil && out == "streaming"
	})
	pg.Exec(t, "create table slot_t(x int); insert into slot_t select generate_series(1, 20000)")
	end := lsn("select pg_current_wal_flush_lsn()")
	harness.WaitFor(t, 30*time.Second, "every safekeeper to hold the WAL and the slot to follow", func() bool {
		for _, sk := range sks {
			if f, _ := flushOf(sk); f < end {
				return false
			}
		}
		_, r := slot()
		return r >= end.SegmentStart(pg.WALSegSize)
	})
	active, _ := slot()
	t.Logf("streaming: pg_replication_slots active=%s, pg_stat_replication %q", active, pg.Exec(t, "select state || ' ' || sync_state from pg_stat_replication where application_name = 'proposer'"))

	lagging, _ := flushOf(sks[2])
	sks[2].Kill()
	for i := 0; i < 6; i++ {
		pg.Exec(t, "insert into slot_t select generate_series(1, 50000); select pg_switch_wal()")
	}
	end = lsn("select pg_current_wal_flush_lsn()")
	harness.WaitFor(t, 30*time.Second, "two safekeepers to commit the WAL written while the third is down", func() bool {
		f, c := flushOf(sks[0])
		return f >= end && c >= end
	})
	_, restart := slot()
	pg.Exec(t, "checkpoint")
	if restart > lagging || restart == 0 {
		t.Fatalf("the slot holds WAL from %s; the safekeeper that is down has it only up to %s (committed %s)", restart, lagging, end)
	}
	need := pg.Exec(t, "select pg_walfile_name('"+lagging.String()+"')")
	if n := pg.Exec(t, "select count(*) from pg_ls_waldir() where name = '"+need+"'"); n != "1" {
		t.Fatalf("after a checkpoint the primary removed %s, which the safekeeper that is down still needs (slot restart_lsn %s)", need, restart)
	}
	sks[2].Start()
	harness.WaitFor(t, 60*time.Second, "the safekeeper that was down to catch up", func() bool {
		f, _ := flushOf(sks[2])
		return f >= end
	})
}

// TestMistypedTimelineIDIsRefusedNotCreated: `propose` never creates a
// timeline unless told to. The timeline is created once (`safekeeper
// timeline create`, which may run twice); the proposer started without
// --create protects it. Restarted with the last hex digit of
// --timeline-id changed, it exits 4 at once, naming the ids, the
// safekeepers that do not hold that timeline and --create, and nothing is
// created anywhere: no timeline on a safekeeper, no slot on the primary
// (the slot and application_name default to proposer_<timeline id>, so two
// timelines never share them). A safekeeper whose disk was replaced is
// given the timeline by the proposer's greeting, because the others hold
// it. `timeline create` naming another cluster's system id exits 4.
func TestMistypedTimelineIDIsRefusedNotCreated(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Options{WALSegSizeMB: 1})
	sks := harness.StartSafekeepers(t, 3)
	addrs := harness.Addrs(sks)
	upstream := pg.ConnString()
	tl := proto.ID{0xbb, 0x20, 0x01}
	typo := proto.ID{0xbb, 0x20, 0x01}
	typo[15] ^= 0x01 // the last hex digit
	for range 2 {
		code, out, stderr := harness.Run(t, "timeline", "create", "--upstream", upstream, "--safekeepers", strings.Join(addrs, ","),
			"--tenant-id", tenant(1).String(), "--timeline-id", tl.String())
		if code != 0 || strings.Count(out, "holds timeline "+tenant(1).String()+"/"+tl.String()) != 3 {
			t.Fatalf("timeline create: exit %d\n%s%s", code, out, stderr)
		}
	}
	slots := func() string {
		return pg.Exec(t, "select coalesce(string_agg(slot_name, ',' order by slot_name), '') from pg_replication_slots")
	}

	prop := harness.StartProposer(t, harness.ProposerOptions{Upstream: upstream, Safekeepers: addrs, Tenant: tenant(1).String(), Timeline: tl.String()})
	app := "proposer_" + tl.String()
	harness.WaitFor(t, 60*time.Second, "the proposer to stream as "+app, func() bool {
		prop.CheckRunning()
		out, err := pg.Query(t.Context(), "select state from pg_stat_replication where application_name = '"+app+"'")
		return err == nil && out == "streaming"
	})
	if got := slots(); got != app {
		t.Fatalf("slots on the primary: %q, want the default %q", got, app)
	}

	// A replaced disk: safekeeper 3 comes back empty and gets the timeline
	// from the proposer's greeting (its peers hold it), then the WAL.
	sks[2].Kill()
	if err := os.RemoveAll(sks[2].DataDir); err != nil {
		t.Fatal(err)
	}
	sks[2].Start()
	pg.Exec(t, "create table typo_t(x int); insert into typo_t select generate_series(1, 1000)")
	end, err := proto.ParseLSN(pg.Exec(t, "select pg_current_wal_flush_lsn()"))
	if err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 60*time.Second, "the replaced safekeeper to hold the timeline's WAL", func() bool {
		_, flush, _ := skTimelineOf(t, sks[2], tenant(1), tl)
		return flush >= end
	})
	if err := prop.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}

	mistyped := harness.StartProposer(t, harness.ProposerOptions{Name: "mistyped", Upstream: upstream, Safekeepers: addrs,
		Tenant: tenant(1).String(), Timeline: typo.String()})
	harness.WaitFor(t, 30*time.Second, "the mistyped proposer to exit", func() bool {
		exited, _ := mistyped.Exited()
		return exited
	})
	_, code := mistyped.Exited()
	log := mistyped.Log()
	last := harness.LastLine(log, "")
	if code != 4 || !strings.Contains(last, tenant(1).String()+"/"+typo.String()) || !strings.Contains(last, "--create") ||
		!strings.Contains(last, "--timeline-id") {
		t.Fatalf("propose with a mistyped --timeline-id: exit %d, last line %q; want exit 4 naming the ids and --create\n%s", code, last, log)
	}
	for _, a := range addrs {
		if !strings.Contains(last, a) {
			t.Errorf("the refusal does not name safekeeper %s: %q", a, last)
		}
	}
	for _, sk := range sks {
		resp, err := http.Get("http://" + sk.HTTPAddr + "/v1/tenant/" + tenant(1).String() + "/timeline/" + typo.String())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("safekeeper %d: the mistyped timeline answers %d, want 404: it was created", sk.ID, resp.StatusCode)
		}
	}
	if got := slots(); got != app {
		t.Fatalf("slots on the primary after the mistyped start: %q, want only %q", got, app)
	}

	code, out, stderr := harness.Run(t, "timeline", "create", "--system-id", "42", "--safekeepers", strings.Join(addrs, ","),
		"--tenant-id", tenant(1).String(), "--timeline-id", tl.String())
	if code != 4 || !strings.Contains(out+stderr, "22023") {
		t.Fatalf("timeline create for another cluster's timeline: exit %d; want 4 and the safekeepers' 22023\n%s%s", code, out, stderr)
	}
}

// TestPgReceiveWALStartedBeforeTheProposerWaitsForIt: pg_receivewal gives
// up for good when its first IDENTIFY_SYSTEM fails. Started on a timeline
// just created, before its proposer, it is not told 0/0 nor refused: its
// IDENTIFY_SYSTEM waits (up to wal_sender_timeout) until the proposer's
// election gives the timeline its start, and then it streams from there.
func TestPgReceiveWALStartedBeforeTheProposerWaitsForIt(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Options{WALSegSizeMB: 1})
	sks := harness.StartSafekeepers(t, 3)
	addrs := harness.Addrs(sks)
	tl := proto.ID{0xbb, 0x21}
	harness.CreateTimeline(t, pg.ConnString(), addrs, tenant(1).String(), tl.String())

	dir := pgtest.Dir(t, "early-")
	host, port, _ := strings.Cut(sks[0].Addr, ":")
	rw := pg.Cmd(harness.Context(t, 2*time.Minute), "pg_receivewal", "-h", host, "-p", port, "-U", "postgres", "-D", dir, "--no-loop",
		"-d", "options='-c tenant_id="+tenant(1).String()+" -c timeline_id="+tl.String()+"'")
	var out harness.SyncBuffer
	rw.Stdout, rw.Stderr = &out, &out
	if err := rw.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- rw.Wait() }()
	defer rw.Process.Kill()
	harness.WaitFor(t, 20*time.Second, "pg_receivewal connected to safekeeper 1", func() bool {
		return scrapeMetric(t, sks[0], "safekeeper_connections", "") >= 1
	})
	// The proposer comes later than a reader's quick retry would wait (an
	// operator starting it after the reader): pg_receivewal must still be
	// there 3 s on.
	select {
	case err := <-exited:
		t.Fatalf("pg_receivewal gave up before the proposer started: %v\n%s", err, out.String())
	case <-time.After(3 * time.Second):
	}

	prop := harness.StartProposer(t, harness.ProposerOptions{Upstream: pg.ConnString(), Safekeepers: addrs, Tenant: tenant(1).String(), Timeline: tl.String()})
	start := proto.LSN(0)
	harness.WaitFor(t, 60*time.Second, "pg_receivewal to write the timeline's first segment", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("pg_receivewal exited: %v\n%s", err, out.String())
		default:
		}
		if start == 0 {
			s, _, _ := skTimelineOf(t, sks[0], tenant(1), tl)
			start = s
		}
		_, err := os.Stat(filepath.Join(dir, proto.SegmentFileName(1, start, pg.WALSegSize)+".partial"))
		return start != 0 && err == nil
	})
	if strings.Contains(out.String(), "0/0") {
		t.Fatalf("pg_receivewal was told 0/0:\n%s", out.String())
	}
	if exited, code := prop.Exited(); exited {
		t.Fatalf("proposer exited %d", code)
	}
}
