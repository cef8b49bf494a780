package server

import (
	"encoding/json"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
)

// TestStateChangesLoggedOnce: votes granted and refused, term changes,
// elections and a truncation are each logged once, at info, with the
// timeline's tenant_id and timeline_id, the term, the peer and LSNs as
// "X/X" strings in JSON logs; appends log nothing at info.
func TestStateChangesLoggedOnce(t *testing.T) {
	var logs syncBuffer
	s := startTestServer(t, t.TempDir(), func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	addr := s.Addr().String()
	p1 := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p1.push(10, 1000, 0)
	mid := p1.pos
	p1.push(10, 1000, mid) // above commit_lsn: the next term truncates it
	// Term 2 elected at mid: the tail of term 1 is truncated.
	p2 := newTestPush(t, addr, tTimeline, 2, proto.TermHistory{{Term: 1, StartLSN: tStart}, {Term: 2, StartLSN: mid}}, mid)
	p2.heartbeat()
	// A stale candidate: refused.
	ctx := testCtx(t)
	c, err := proposer.Dial(ctx, proposer.DialConfig{AllowTimelineCreation: true, Addr: addr, TenantID: tTenant, TimelineID: tTimeline})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
		TimelineID: tTimeline, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xdd}})
	c.Recv(ctx)
	c.Send(&proto.RequestVote{Candidate: proto.Ballot{Term: 1, UUID: proto.ID{0xdd}}})
	if v, err := c.Recv(ctx); err != nil || v.(*proto.VoteResponse).VotedFor.Term != 2 {
		t.Fatalf("stale vote: %v %v", v, err)
	}

	type line map[string]any
	parse := func() []line {
		var out []line
		for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var m line
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("log line is not JSON: %q", l)
			}
			out = append(out, m)
		}
		return out
	}
	waitFor(t, "the refused vote's line", func() bool { return strings.Contains(logs.String(), `"vote refused"`) })
	count := map[string][]line{}
	for _, m := range parse() {
		count[m["msg"].(string)] = append(count[m["msg"].(string)], m)
	}
	for msg, n := range map[string]int{"vote granted": 2, "vote refused": 1, "term changed": 2, "proposer elected": 2, "truncated WAL": 1,
		"proposer connected": 3} {
		if len(count[msg]) != n {
			t.Errorf("%q logged %d times, want %d", msg, len(count[msg]), n)
		}
		for _, m := range count[msg] {
			if m["tenant_id"] != tTenant.String() || m["timeline_id"] != tTimeline.String() || m["peer"] == nil ||
				(m["term"] == nil && msg != "proposer connected") {
				t.Errorf("%q without its fields: %v", msg, m)
			}
		}
	}
	if tr := count["truncated WAL"]; len(tr) == 1 && (tr[0]["lsn"] != mid.String() || tr[0]["previous_flush_lsn"] != p1.pos.String()) {
		t.Errorf("truncation logged as %v, want lsn %q from %q (LSNs as X/X strings)", tr[0], mid, p1.pos)
	}

	// Appends: nothing more at info.
	n := len(parse())
	p2.push(200, 500, 0)
	if m := len(parse()); m != n {
		t.Errorf("200 appends logged %d lines at info", m-n)
	}
}

// TestDatabaseOpenLogged: the start logs "opening the database" with its
// path before bbolt opens it and "database opened" with the path and the
// time it took after, at info: a slow start on a busy disk says where it
// is.
func TestDatabaseOpenLogged(t *testing.T) {
	var logs syncBuffer
	dir := t.TempDir()
	startTestServer(t, dir, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	path := filepath.Join(dir, "safekeeper.db")
	var msgs []string
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		switch m["msg"] {
		case "opening the database":
			if m["path"] != path || m["level"] != "INFO" {
				t.Errorf("opening logged as %v, want path %s at INFO", m, path)
			}
		case "database opened":
			if d, ok := m["duration"].(float64); m["path"] != path || m["level"] != "INFO" || !ok || d <= 0 {
				t.Errorf("opened logged as %v, want path %s and a duration at INFO", m, path)
			}
		default:
			continue
		}
		msgs = append(msgs, m["msg"].(string))
	}
	if want := []string{"opening the database", "database opened"}; !slices.Equal(msgs, want) {
		t.Fatalf("logged %q, want %q:\n%s", msgs, want, logs.String())
	}
}

// TestWALRefusalWarnedOncePerMinute: a proposer that retries every second
// against a disk limit gets 53100 each time, and the safekeeper warns once
// (refusalWarning), not once a retry.
func TestWALRefusalWarnedOncePerMinute(t *testing.T) {
	var logs syncBuffer
	s := startTestServer(t, t.TempDir(), func(c *Config) {
		c.MaxDiskUsage, c.MinFreeDisk = 1<<10, -1 // any database file is over it
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	addr := s.Addr().String()
	const tries = 4
	for term := uint64(1); term <= tries; term++ {
		p := newTestPush(t, addr, tTimeline, term, proto.TermHistory{{Term: term, StartLSN: tStart}}, tStart)
		wantCode(t, tryPush(p, 4, 8000), pgwire.DiskFull)
		p.c.Close()
	}
	warned := strings.Count(logs.String(), `"msg":"refusing WAL: disk limit"`)
	if warned != 1 {
		t.Fatalf("%d warnings for %d refusals within a minute, want 1:\n%s", warned, tries, logs.String())
	}
}

// TestListeningLineNamesBoundAddresses: asked for port 0, the server logs
// one "safekeeper listening" line whose pg and http are the addresses it
// bound (the kernel's ports), which is how tests and operators learn them.
func TestListeningLineNamesBoundAddresses(t *testing.T) {
	var logs syncBuffer
	s := startTestServer(t, t.TempDir(), func(c *Config) {
		c.ListenHTTP = "127.0.0.1:0"
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	waitFor(t, "the listening line", func() bool { return strings.Contains(logs.String(), `"msg":"safekeeper listening"`) })
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		if m["msg"] == "safekeeper listening" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d listening lines, want 1:\n%s", len(lines), logs.String())
	}
	pg, http := s.Addr().String(), s.HTTPAddr().String()
	if strings.HasSuffix(pg, ":0") || strings.HasSuffix(http, ":0") {
		t.Fatalf("bound addresses %s, %s", pg, http)
	}
	if lines[0]["pg"] != pg || lines[0]["http"] != http {
		t.Fatalf("listening line %v, want pg=%s http=%s", lines[0], pg, http)
	}
}
