package server

import (
	"fmt"
	"testing"

	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/server/httpapi"
)

// TestReaderLagCountsFromStreamStartUntilReported: a reader's lag is
// commit_lsn minus the higher of the write and flush it reported; one
// that has reported nothing yet (a standby or pg_receivewal before its
// first status update) lags by what lies between its stream's start and
// commit_lsn, not by its whole LSN (a position of 0). Checked on lagBytes,
// then on a live stream through the timeline detail's lag_bytes and
// safekeeper_reader_lag_bytes.
func TestReaderLagCountsFromStreamStartUntilReported(t *testing.T) {
	const commit = lsn(0x3000000)
	for _, c := range []struct {
		name   string
		start  lsn
		status pgwire.StandbyStatusUpdate
		want   uint64
	}{
		{"nothing reported: from the stream's start", 0x2000000, pgwire.StandbyStatusUpdate{}, 0x1000000},
		{"only write reported (pg_receivewal without --synchronous)", 0x2000000, pgwire.StandbyStatusUpdate{Write: 0x2800000}, 0x800000},
		{"flush reported", 0x2000000, pgwire.StandbyStatusUpdate{Write: 0x2c00000, Flush: 0x2e00000}, 0x200000},
		{"a report below the start counts as reported", 0x2000000, pgwire.StandbyStatusUpdate{Write: 0x1000000, Flush: 0x1000000}, 0x2000000},
		{"write past commit (a term reader): no lag, no wrap", 0x2000000, pgwire.StandbyStatusUpdate{Write: 0x3100000, Flush: 0x2f00000}, 0},
		{"started past commit: no lag", 0x3100000, pgwire.StandbyStatusUpdate{}, 0},
	} {
		rd := &walReader{start: c.start, status: c.status}
		if got := rd.lagBytes(commit); got != c.want {
			t.Errorf("%s: lag %#x, want %#x", c.name, got, c.want)
		}
	}

	s := startTestServer(t, t.TempDir(), func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(150, 9000, 0) // ~1.3 segments, all committed
	committed := p.pos
	from := tStart + tSeg
	st := newStream(t, addr)
	st.start("START_REPLICATION " + from.String())
	st.readWAL(from, committed)
	url := fmt.Sprintf("http://%s/v1/tenant/%s/timeline/%s", s.HTTPAddr(), tTenant, tTimeline)
	check := func(when string, want uint64) {
		t.Helper()
		var tl httpapi.Timeline
		if code := getJSON(t, url, &tl); code != 200 || len(tl.Readers) != 1 || tl.CommitLSN != committed {
			t.Fatalf("%s: %d, commit_lsn %s (want %s), readers %+v", when, code, tl.CommitLSN, committed, tl.Readers)
		}
		if got := tl.Readers[0].LagBytes; got != want {
			t.Errorf("%s: lag_bytes %d, want %d", when, got, want)
		}
		if got := timelineGauge(t, scrapeMetrics(t, s), "safekeeper_reader_lag_bytes"); uint64(got) != want {
			t.Errorf("%s: safekeeper_reader_lag_bytes %v, want %d", when, got, want)
		}
	}
	check("before the first status update", uint64(committed-from))
	st.waitReply(committed, 0) // write only, as pg_receivewal without --synchronous
	check("after a status update with everything written", 0)
}
