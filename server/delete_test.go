package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/server/timeline"
)

func httpDo(t *testing.T, method, url string, v any) int {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s %s: %v\n%s", method, url, err, b)
		}
	}
	return resp.StatusCode
}

// TestDeleteTimeline: DELETE of a timeline with a proposer and a reader
// connected is 409 without force and changes nothing (both streams go on);
// with force both connections end with FATAL 57P01, the timeline is gone
// (404, not listed, a reader's connection is refused), also after a
// restart, while another timeline is untouched; then the ids can be
// created anew, and DELETE of the tenant removes the rest.
func TestDeleteTimeline(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, dir, func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	base := "http://" + s.HTTPAddr().String()
	addr := s.Addr().String()
	other := proto.ID{0xbb, 2}
	po := newTestPush(t, addr, other, 1, hist1(tStart), tStart)
	otherWAL, _ := po.push(30, 2000, 0)
	po.c.Close()

	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(20, 1000, 0)
	st := newStream(t, addr)
	st.c = replConnect(t, addr, false, fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, tTimeline))
	st.start("START_REPLICATION " + tStart.String())
	st.readWAL(tStart, p.pos)
	url := fmt.Sprintf("%s/v1/tenant/%s/timeline/%s", base, tTenant, tTimeline)

	var e map[string]string
	if code := httpDo(t, "DELETE", url, &e); code != http.StatusConflict || e["code"] != "busy" || !strings.Contains(e["error"], "has 2 connections (a proposer or readers); end them or delete with force") {
		t.Fatalf("DELETE with connections: %d %v, want 409 busy naming 2 connections", code, e)
	}
	if code := httpDo(t, "DELETE", url+"?force=maybe", &e); code != http.StatusBadRequest {
		t.Fatalf("DELETE ?force=maybe: %d %v, want 400", code, e)
	}
	if code := httpDo(t, "DELETE", fmt.Sprintf("%s/v1/tenant/%s/timeline/xyz", base, tTenant), &e); code != http.StatusBadRequest || e["code"] != "bad_id" {
		t.Fatalf("DELETE of a bad id: %d %v, want 400 bad_id", code, e)
	}
	// Nothing changed: both streams go on.
	before := p.pos
	p.push(5, 1000, 0)
	st.readWAL(before, p.pos)
	var tl httpapi.Timeline
	if code := getJSON(t, url, &tl); code != 200 || tl.FlushLSN != p.pos || tl.Proposer == nil || len(tl.Readers) != 1 {
		t.Fatalf("after the refused delete: %d %+v", code, tl)
	}

	var res httpapi.DeleteResult
	if code := httpDo(t, "DELETE", url+"?force=true", &res); code != 200 || !res.DirExisted || !res.WasActive {
		t.Fatalf("DELETE ?force=true: %d %+v", code, res)
	}
	// Both connections were ended with 57P01.
	var pe *pgconn.PgError
	for {
		_, err := p.c.Recv(p.ctx)
		if err == nil {
			continue
		}
		if !errors.As(err, &pe) || pe.Code != pgwire.AdminShutdown {
			t.Fatalf("proposer after the delete: %v, want FATAL %s", err, pgwire.AdminShutdown)
		}
		break
	}
	for {
		m, err := st.c.ReceiveMessage(st.ctx)
		if _, ok := m.(*pgproto3.CopyData); ok && err == nil {
			continue
		}
		if !errors.As(err, &pe) || pe.Code != pgwire.AdminShutdown || pe.Severity != "FATAL" {
			t.Fatalf("reader after the delete: %T %v, want FATAL %s", m, err, pgwire.AdminShutdown)
		}
		break
	}
	check := func(when string) {
		t.Helper()
		if code := getJSON(t, url, &e); code != 404 {
			t.Fatalf("%s: GET of the deleted timeline %d %v, want 404", when, code, e)
		}
		var list []httpapi.TimelineSummary
		if getJSON(t, base+"/v1/tenant/timeline", &list); len(list) != 1 || list[0].TimelineID != other.String() {
			t.Fatalf("%s: timelines %+v, want only %s", when, list, other)
		}
		c := replConnect(t, addr, false, fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, tTimeline))
		_, err := exec(t, c, "IDENTIFY_SYSTEM")
		wantCode(t, err, pgwire.UndefinedObject)
		r := newStream(t, addr)
		r.c = replConnect(t, addr, false, fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, other))
		r.start("START_REPLICATION " + tStart.String())
		if got := r.readWAL(tStart, tStart+lsn(len(otherWAL))); !bytes.Equal(got, otherWAL) {
			t.Fatalf("%s: the other timeline's WAL changed", when)
		}
		c.Close(r.ctx)
		r.c.Close(r.ctx)
	}
	check("after the delete")
	if code := httpDo(t, "DELETE", url, &e); code != 404 || e["code"] != "not_found" {
		t.Fatalf("second DELETE: %d %v, want 404", code, e)
	}

	shutdown(t, s)
	s = startTestServer(t, dir, func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	base, addr = "http://"+s.HTTPAddr().String(), s.Addr().String()
	url = fmt.Sprintf("%s/v1/tenant/%s/timeline/%s", base, tTenant, tTimeline)
	check("after a restart")

	// The ids can be used again: a new timeline, from its own start.
	p = newTestPush(t, addr, tTimeline, 1, hist1(2*tStart), 2*tStart)
	p.push(3, 500, 0)
	if code := getJSON(t, url, &tl); code != 200 || tl.TimelineStartLSN != 2*tStart || tl.FlushLSN != p.pos {
		t.Fatalf("recreated: %d %+v", code, tl)
	}
	p.c.Close()
	waitFor(t, "every connection to leave", func() bool { return connections(s) == 0 })

	var all map[string]httpapi.DeleteResult
	if code := httpDo(t, "DELETE", fmt.Sprintf("%s/v1/tenant/%s", base, tTenant), &all); code != 200 || len(all) != 2 {
		t.Fatalf("DELETE tenant: %d %v", code, all)
	}
	var list []httpapi.TimelineSummary
	if getJSON(t, base+"/v1/tenant/timeline", &list); len(list) != 0 {
		t.Fatalf("after the tenant delete: %+v", list)
	}
	if code := httpDo(t, "DELETE", fmt.Sprintf("%s/v1/tenant/%s", base, tTenant), &e); code != 404 {
		t.Fatalf("DELETE of an empty tenant: %d %v", code, e)
	}
}

// TestForcedDeleteEndsAStreamingProposerAtOnce: a forced delete cuts the
// reads of a proposer that streams without pause, and the cut sticks
// although the push reader sets its own read deadline around each
// message: the delete returns at once (not after deleteWait, when it
// closes the sockets) and the proposer gets FATAL 57P01, not a reset.
func TestForcedDeleteEndsAStreamingProposerAtOnce(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	url := fmt.Sprintf("http://%s/v1/tenant/%s/timeline/%s", s.HTTPAddr(), tTenant, tTimeline)
	for round := 0; round < 5; round++ {
		p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
		p.push(1, 100, 0)
		// The proposer streams without pause: one goroutine sends WAL, one
		// reads the responses, until the connection ends.
		sent := make(chan error, 1)
		go func() {
			for {
				p.gen.Record(200)
				wal := p.gen.Take()
				end := p.pos + lsn(len(wal))
				if err := p.c.Send(&proto.SafeKeeperRequest{Sender: p.ballot, BeginLSN: p.pos, EndLSN: end, CommitLSN: end, WAL: wal}); err != nil {
					sent <- err
					return
				}
				p.pos = end
			}
		}()
		ended := make(chan error, 1)
		go func() {
			for {
				if _, err := p.c.Recv(p.ctx); err != nil {
					ended <- err
					return
				}
			}
		}()
		waitFor(t, "the stream to be under way", func() bool { return statusOf(t, s).FlushLSN > tStart+10_000 })

		start := time.Now()
		var res httpapi.DeleteResult
		if code := httpDo(t, "DELETE", url+"?force=true", &res); code != 200 || !res.WasActive {
			t.Fatalf("round %d: DELETE ?force=true: %d %+v", round, code, res)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("round %d: the forced delete took %v (its reads were not cut: it waited to close the sockets)", round, d)
		}
		err := <-ended
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != pgwire.AdminShutdown || pe.Severity != "FATAL" {
			t.Fatalf("round %d: the proposer's stream ended with %v, want FATAL %s", round, err, pgwire.AdminShutdown)
		}
		p.c.Close()
		<-sent
	}
}

// TestDeleteTenantWithoutForceIsAllOrNothing: a tenant delete without force
// retires every timeline before it deletes any, so one with a connection
// refuses the whole delete (409) and the others, retired for a moment, take
// connections again; with force, all go.
func TestDeleteTenantWithoutForceIsAllOrNothing(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	base := "http://" + s.HTTPAddr().String()
	addr := s.Addr().String()
	idle, busy := proto.ID{0x01, 1}, proto.ID{0xfe, 1} // idle is retired first
	for _, tl := range []proto.ID{idle, busy} {
		p := newTestPush(t, addr, tl, 1, hist1(tStart), tStart)
		p.push(5, 1000, 0)
		p.c.Close()
	}
	waitFor(t, "the pushers' connections to end", func() bool { return connections(s) == 0 })
	rd := replConnect(t, addr, false, fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, busy))
	defer rd.Close(testCtx(t))
	if _, err := exec(t, rd, "IDENTIFY_SYSTEM"); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("%s/v1/tenant/%s", base, tTenant)
	var e map[string]string
	if code := httpDo(t, "DELETE", url, &e); code != http.StatusConflict || e["code"] != "busy" || !strings.Contains(e["error"], "has 1 connection (a proposer or a reader); end it or delete with force") {
		t.Fatalf("DELETE of the tenant with a reader on %s: %d %v, want 409 busy naming 1 connection", busy, code, e)
	}
	var list []httpapi.TimelineSummary
	if getJSON(t, base+"/v1/tenant/timeline", &list); len(list) != 2 {
		t.Fatalf("timelines after the refused delete: %+v, want both", list)
	}
	c := replConnect(t, addr, false, fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, idle))
	_, err := exec(t, c, "IDENTIFY_SYSTEM")
	c.Close(testCtx(t))
	if err != nil {
		t.Fatalf("a reader of %s after the refused tenant delete: %v (left retired)", idle, err)
	}
	var res map[string]httpapi.DeleteResult
	if code := httpDo(t, "DELETE", url+"?force=true", &res); code != 200 || len(res) != 2 || !res[busy.String()].WasActive {
		t.Fatalf("DELETE ?force=true: %d %+v", code, res)
	}
	if getJSON(t, base+"/v1/tenant/timeline", &list); len(list) != 0 {
		t.Fatalf("timelines after the forced delete: %+v", list)
	}
}

// TestDeleteTenantThatFailsLeavesTheRestUsable: a tenant delete whose first
// timeline's deletion fails (a full disk) leaves the timelines it had not
// reached taking connections, not answering "deleted" until a restart.
func TestDeleteTenantThatFailsLeavesTheRestUsable(t *testing.T) {
	first, second := proto.ID{0x01, 1}, proto.ID{0xfe, 1}
	errDisk := errors.New("no space left on device")
	s := startHookedServer(t, t.TempDir(), func(c *Config) { c.ListenHTTP = "127.0.0.1:0" }, hooks{
		deleteTimeline: func(tenant, timeline proto.ID) error { return errDisk },
	})
	addr := s.Addr().String()
	for _, tl := range []proto.ID{first, second} {
		p := newTestPush(t, addr, tl, 1, hist1(tStart), tStart)
		p.push(5, 1000, 0)
		p.c.Close()
	}
	var err error
	waitFor(t, "the pushers' connections to end", func() bool {
		_, err = s.reg.DeleteTenant(tTenant, false)
		return !errors.Is(err, timeline.ErrBusy)
	})
	if !errors.Is(err, errDisk) {
		t.Fatalf("DeleteTenant with a failing disk: %v, want %v", err, errDisk)
	}
	for _, tl := range []proto.ID{first, second} {
		c := replConnect(t, addr, false, fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, tl))
		_, err = exec(t, c, "IDENTIFY_SYSTEM")
		c.Close(testCtx(t))
		if err != nil {
			t.Fatalf("a reader of %s after the failed tenant delete: %v", tl, err)
		}
	}
}

// connections counts the connections bound to s's open timelines.
func connections(s *Server) int {
	n := 0
	for _, tl := range s.reg.Running() {
		n += tl.Connections()
	}
	return n
}
