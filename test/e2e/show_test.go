package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/test/harness"
)

// shown is GET /v1/tenant/{t}/timeline/{tl} (and `timeline show --json`).
type shown = httpapi.Timeline

// TestTimelineShowMatchesPgStatReplication: with a real primary, the
// proposer and a hot standby streaming from safekeeper 1, `timeline show`
// on safekeeper 1 reports the proposer with the positions the primary's
// pg_stat_replication shows for it (write_lsn: what it sent; flush_lsn:
// the quorum's commit_lsn), and the standby with the positions it reports
// itself (pg_stat_wal_receiver's flushed_lsn, pg_last_wal_replay_lsn()),
// all within one status interval of the standby (1 s here) once the load
// stops; under load the standby's lags in time are measured, and once it
// has replayed everything and reported so twice, they are cleared, as
// pg_stat_replication shows NULL then.
func TestTimelineShowMatchesPgStatReplication(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test: skipped in -short mode")
	}
	c := startCluster(t)
	sk := c.sks[0]
	ctx := harness.Context(t, 180*time.Second)
	if out, err := c.pgbench(ctx, "-i", "-s", "2", "-q"); err != nil {
		t.Fatalf("pgbench -i: %v\n%s", err, out)
	}

	// A hot standby from a base backup, streaming from safekeeper 1.
	sb := harness.StartStandby(t, c.pg, sk, harness.StandbyOptions{Tenant: tenantID.String(), Timeline: timelineID.String(),
		Conf: []string{"hot_standby_feedback = on", "wal_receiver_status_interval = 1s"}})
	standby := func(sql string) string {
		out, err := sb.Query(context.Background(), sql)
		if err != nil {
			return ""
		}
		return out
	}
	show := func() shown {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("http://%s/v1/tenant/%s/timeline/%s", sk.HTTPAddr, tenantID, timelineID))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var s shown
		if resp.StatusCode != 200 || json.Unmarshal(b, &s) != nil {
			t.Fatalf("GET timeline: %d %s", resp.StatusCode, b)
		}
		return s
	}
	standbyReader := func(s shown) int {
		for i, r := range s.Readers {
			if r.ApplicationName == "standby1" {
				return i
			}
		}
		return -1
	}
	c.waitFor(60*time.Second, "the standby streaming from safekeeper 1", func() bool { return standbyReader(show()) >= 0 })

	// Load: the standby's lags in time are measured.
	load := make(chan error, 1)
	go func() {
		out, err := c.pgbench(ctx, "-c", "4", "-j", "2", "-T", "4", "-n")
		if err != nil {
			err = fmt.Errorf("%v\n%s", err, out)
		}
		load <- err
	}()
	measured := false
	for running := true; running; {
		select {
		case err := <-load:
			if err != nil {
				t.Fatalf("pgbench: %v", err)
			}
			running = false
		case <-time.After(200 * time.Millisecond): // a sampling interval, not a wait for a condition
		}
		s := show()
		if i := standbyReader(s); i >= 0 && s.Readers[i].FlushLag != nil && s.Readers[i].ReplayLag != nil {
			r := s.Readers[i]
			// Each lag is measured at the report that passed its sample,
			// so they need not be ordered (as in pg_stat_replication).
			if *r.FlushLag < 0 || *r.ReplayLag < 0 || *r.FlushLag > 30 || *r.ReplayLag > 30 || (r.WriteLag != nil && (*r.WriteLag < 0 || *r.WriteLag > 30)) {
				t.Fatalf("standby lags under load: write %v flush %v replay %v", r.WriteLag, *r.FlushLag, *r.ReplayLag)
			}
			measured = true
		}
	}
	if !measured {
		t.Fatal("no flush_lag or replay_lag was ever reported for the standby under load")
	}

	// Idle: the reports agree within one status interval.
	end := c.lsn("SELECT pg_current_wal_flush_lsn()")
	var last string
	c.waitFor(15*time.Second, "timeline show to agree with pg_stat_replication and the standby", func() bool {
		row, err := c.pg.Query(context.Background(), "SELECT write_lsn || ' ' || flush_lsn FROM pg_stat_replication WHERE application_name = 'proposer'")
		if err != nil {
			return false
		}
		received, replayed := standby("SELECT flushed_lsn FROM pg_stat_wal_receiver"), standby("SELECT pg_last_wal_replay_lsn()")
		s := show()
		i := standbyReader(s)
		if s.Proposer == nil || i < 0 {
			last = fmt.Sprintf("proposer %v, readers %+v", s.Proposer, s.Readers)
			return false
		}
		r := s.Readers[i]
		got := fmt.Sprintf("%s %s", s.Proposer.WriteLSN, s.Proposer.CommitLSN)
		last = fmt.Sprintf("pg_stat_replication %q, proposer %q; standby flushed %s replayed %s, reader flush %s apply %s; end %s",
			row, got, received, replayed, r.FlushLSN, r.ApplyLSN, end)
		return row == got && s.Proposer.CommitLSN >= end && received == r.FlushLSN.String() && replayed == r.ApplyLSN.String() &&
			r.FlushLSN >= end && r.LagBytes == 0
	})
	t.Logf("agreed: %s", last)
	// Caught up and reporting so: the lags are cleared (NULL in
	// pg_stat_replication).
	c.waitFor(15*time.Second, "the caught-up standby's lags to be cleared", func() bool {
		s := show()
		i := standbyReader(s)
		return i >= 0 && s.Readers[i].WriteLag == nil && s.Readers[i].FlushLag == nil && s.Readers[i].ReplayLag == nil
	})
	// The CLI's table names both.
	out, err := exec.Command(harness.Binary(t), "timeline", "show", "--http", sk.HTTPAddr,
		"--tenant-id", tenantID.String(), "--timeline-id", timelineID.String()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "standby1") || !strings.Contains(string(out), "term 1") {
		t.Fatalf("timeline show: %v\n%s", err, out)
	}
	t.Logf("timeline show:\n%s", out)
}
