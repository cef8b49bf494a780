package server

import (
	"fmt"
	"testing"

	"github.com/safekeeper/safekeeper/server/httpapi"
)

// TestReaderLagCountsFromStreamStartUntilReported: a reader's lag is
// commit_lsn minus the higher of the write and flush it reported; one
// that has reported nothing yet (a standby or pg_receivewal before its
// first status update) lags by what lies between its stream's start and
// commit_lsn, not by its whole LSN (a position of 0): on a live stream,
// through the timeline detail's lag_bytes and safekeeper_reader_lag_bytes
// (server/timeline's TestReaderLagBytes checks the cases).
func TestReaderLagCountsFromStreamStartUntilReported(t *testing.T) {
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
