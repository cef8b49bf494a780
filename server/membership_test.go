package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/httpapi"
)

// putJSON sends body to url with PUT and decodes the answer into v.
func putJSON(t *testing.T, url, body string, v any) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("PUT %s: %v", url, err)
	}
	return resp.StatusCode
}

// TestMembershipCall: PUT .../membership switches a timeline to a
// configuration of a higher generation, durably (also after a restart),
// and the proposer streaming in the older generation is refused at its
// next request with SK001 and the configuration in Detail; a lower
// generation changes nothing (200, switched false); another configuration
// of the same generation is 409; a body that is no configuration is 400.
func TestMembershipCall(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, dir, func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	base := "http://" + s.HTTPAddr().String()
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	p.push(10, 1000, 0)
	url := fmt.Sprintf("%s/v1/tenant/%s/timeline/%s", base, tTenant, tTimeline)

	var sw httpapi.MembershipSwitch
	joint := `{"generation": 2, "members": [1, 2, 3], "new_members": [1, 2, 4]}`
	if code := putJSON(t, url+"/membership", joint, &sw); code != 200 || !sw.Switched || sw.Configuration.Generation != 2 ||
		sw.Term != 1 || sw.FlushLSN != p.pos {
		t.Fatalf("PUT generation 2: %d %+v", code, sw)
	}
	// The proposer greeted in generation 0: its next request is refused.
	p.send(&proto.SafeKeeperRequest{Sender: p.ballot, BeginLSN: p.pos, EndLSN: p.pos, CommitLSN: p.pos})
	_, err := p.c.Recv(p.ctx)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "SK001" {
		t.Fatalf("request in generation 0 after the switch: %v, want SK001", err)
	}
	if c, err := proto.ParseConfigurationDetail(pe.Detail); err != nil || c.Generation != 2 || len(c.NewMembers) != 3 {
		t.Fatalf("SK001 detail %q: %s, %v", pe.Detail, c, err)
	}
	want := proto.Configuration{Generation: 2, Members: []uint64{1, 2, 3}, NewMembers: []uint64{1, 2, 4}}
	if code := putJSON(t, url+"/membership", `{"generation": 1, "members": [1, 2, 3]}`, &sw); code != 200 || sw.Switched || !sw.Configuration.Equal(want) {
		t.Fatalf("PUT generation 1 after 2: %d %+v, want 200 keeping generation 2", code, sw)
	}
	var e httpapi.ErrorBody
	if code := putJSON(t, url+"/membership", `{"generation": 2, "members": [1, 2, 3]}`, &e); code != http.StatusConflict || e.Code != "configuration_conflict" {
		t.Fatalf("PUT another generation 2: %d %+v, want 409 configuration_conflict", code, e)
	}
	for _, bad := range []string{`{"generation": 3}`, `{"generation": 0}`, `{"generation": 3, "members": [1, 1]}`, `{"generation": 3, "members": [1], "bogus": 1}`, `[`} {
		if code := putJSON(t, url+"/membership", bad, &e); code != http.StatusBadRequest || e.Code != "bad_request" {
			t.Fatalf("PUT %s: %d %+v, want 400 bad_request", bad, code, e)
		}
	}
	if code := putJSON(t, fmt.Sprintf("%s/v1/tenant/%s/timeline/%s/membership", base, tTenant, proto.ID{0xee}), joint, &e); code != http.StatusNotFound {
		t.Fatalf("PUT for a timeline not held: %d %+v", code, e)
	}
	p.c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), tTimeout)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	s = startTestServer(t, dir, func(c *Config) { c.ListenHTTP = "127.0.0.1:0" })
	var tl httpapi.Timeline
	url = fmt.Sprintf("http://%s/v1/tenant/%s/timeline/%s", s.HTTPAddr(), tTenant, tTimeline)
	if code := getJSON(t, url, &tl); code != 200 || tl.Configuration == nil || !tl.Configuration.Equal(want) {
		t.Fatalf("after a restart: %d, configuration %v", code, tl.Configuration)
	}
}

// TestPullTimelineOnline: POST /v1/pull_timeline copies a timeline from a
// running peer into a running safekeeper (its WAL, state and
// configuration), which then serves it; a second pull finds it held; a
// term bump raises voted_for and never lowers it.
func TestPullTimelineOnline(t *testing.T) {
	a := startTestServer(t, t.TempDir(), nil)
	p := newTestPush(t, a.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	p.push(40, 4000, 0)
	b := startTestServer(t, t.TempDir(), func(c *Config) { c.NodeID = 2; c.ListenHTTP = "127.0.0.1:0" })
	key := proto.TimelineKey{TenantID: tTenant, TimelineID: tTimeline}
	cl := httpapi.NewClient("http://"+b.HTTPAddr().String(), nil, "")
	ctx := testCtx(t)
	// An empty copy, never voted (what an interrupted pull leaves) is
	// replaced, not taken for held.
	if _, err := proposer.CreateTimeline(ctx, proposer.CreateConfig{Safekeepers: []string{b.Addr().String()}, TenantID: tTenant, TimelineID: tTimeline,
		SystemID: tSysID, WalSegSize: tSeg}); err != nil {
		t.Fatal(err)
	}
	// The creating greeting's connection may still be closing on the
	// server: the copy is replaced only once it has (409 busy until then).
	var res *httpapi.PullResponse
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		res, err = cl.PullTimeline(ctx, key, a.Addr().String())
		if err == nil || !strings.Contains(err.Error(), "409") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || res.Existed || res.FlushLSN != p.pos || res.Term != 1 {
		t.Fatalf("pull: %+v, %v; want flush_lsn %s, term 1", res, err, p.pos)
	}
	tl, _, err := cl.Timeline(ctx, key)
	if err != nil || tl.FlushLSN != p.pos || tl.Term != 1 {
		t.Fatalf("the pulled timeline: %+v, %v", tl, err)
	}
	if res, err := cl.PullTimeline(ctx, key, a.Addr().String()); err != nil || !res.Existed {
		t.Fatalf("second pull: %+v, %v; want existed", res, err)
	}
	if tb, err := cl.TermBump(ctx, key, 7); err != nil || tb.PreviousTerm != 1 || tb.CurrentTerm != 7 {
		t.Fatalf("term_bump 7: %+v, %v", tb, err)
	}
	if tb, err := cl.TermBump(ctx, key, 3); err != nil || tb.PreviousTerm != 7 || tb.CurrentTerm != 7 {
		t.Fatalf("term_bump 3 after 7: %+v, %v", tb, err)
	}
	for _, bad := range []uint64{0, proto.MaxTerm + 1, 1<<64 - 1} {
		if _, err := cl.TermBump(ctx, key, bad); err == nil || !strings.Contains(err.Error(), "400") {
			t.Fatalf("term_bump %d: %v, want 400", bad, err)
		}
	}
	if _, err := cl.PullTimeline(ctx, proto.TimelineKey{TenantID: tTenant, TimelineID: proto.ID{0xee}}, a.Addr().String()); err == nil {
		t.Fatal("pull of a timeline the peer does not hold succeeded")
	}
	var e httpapi.ErrorBody
	req, _ := http.NewRequest(http.MethodPost, "http://"+b.HTTPAddr().String()+"/v1/pull_timeline", strings.NewReader(`{"tenant_id": "zz"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("pull with a bad body: %d %+v", resp.StatusCode, e)
	}
}

// TestRemovedMemberRefusesAndDeletes: once its configuration no longer
// names it, a safekeeper refuses a new reader (SK002, the configuration in
// Detail) and, after RemovedTimelineGrace, deletes the timeline; a
// timeline still naming it is kept.
func TestRemovedMemberRefusesAndDeletes(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.ListenHTTP = "127.0.0.1:0"; c.RemovedTimelineGrace = time.Second })
	base := "http://" + s.HTTPAddr().String()
	other := proto.ID{0xbb, 7}
	for _, tl := range []proto.ID{tTimeline, other} {
		p := newTestPush(t, s.Addr().String(), tl, 1, hist1(tStart), tStart)
		p.push(5, 1000, 0)
		p.c.Close()
	}
	url := func(tl proto.ID) string { return fmt.Sprintf("%s/v1/tenant/%s/timeline/%s", base, tTenant, tl) }
	// A reader streaming when the safekeeper learns it is removed.
	live := newStream(t, s.Addr().String())
	live.c = replConnect(t, s.Addr().String(), false, fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, tTimeline))
	live.start("START_REPLICATION " + tStart.String())
	live.next()
	var sw httpapi.MembershipSwitch
	if code := putJSON(t, url(tTimeline)+"/membership", `{"generation": 3, "members": [2, 3, 4]}`, &sw); code != 200 || !sw.Switched {
		t.Fatalf("PUT a configuration without node 1: %d %+v", code, sw)
	}
	for {
		m, err := live.c.ReceiveMessage(live.ctx)
		if _, ok := m.(*pgproto3.CopyData); ok && err == nil {
			continue
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "SK002" || pe.Severity != "FATAL" {
			t.Fatalf("the stream of a reader when its safekeeper was removed: %T %v, want FATAL SK002", m, err)
		}
		break
	}
	if code := putJSON(t, url(other)+"/membership", `{"generation": 3, "members": [1, 3, 4]}`, &sw); code != 200 || !sw.Switched {
		t.Fatalf("PUT a configuration with node 1: %d %+v", code, sw)
	}
	st := newStream(t, s.Addr().String())
	st.c = replConnect(t, s.Addr().String(), false, fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tTenant, tTimeline))
	st.query("START_REPLICATION " + tStart.String())
	m := st.msg()
	e, ok := m.(*pgproto3.ErrorResponse)
	if !ok || e.Code != "SK002" || !strings.HasPrefix(e.Detail, proto.ConfigurationDetail) {
		t.Fatalf("START_REPLICATION on a removed member: %T %+v, want SK002 with the configuration", m, m)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var e httpapi.ErrorBody
		if code := getJSON(t, url(tTimeline), &e); code == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the timeline this safekeeper was removed from is still there 30 s after a 1 s grace")
		}
		time.Sleep(100 * time.Millisecond)
	}
	var tl httpapi.Timeline
	if code := getJSON(t, url(other), &tl); code != 200 {
		t.Fatalf("the timeline still naming node 1 was deleted too: %d", code)
	}
}
