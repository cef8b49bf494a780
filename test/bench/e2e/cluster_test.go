package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// config is one configuration of synchronous replication.
type config struct {
	name      string
	syncNames string   // synchronous_standby_names
	standbys  []string // the stock standbys it runs
	proposer  bool     // runs the proposer and the three safekeepers
	syncState string   // pg_stat_replication.sync_state of its members
}

var configs = []config{
	{name: "A1", syncNames: "s1", standbys: []string{"s1"}, syncState: "sync"},
	{name: "A3", syncNames: "ANY 2 (s1,s2,s3)", standbys: []string{"s1", "s2", "s3"}, syncState: "quorum"},
	{name: "B", syncNames: "proposer", proposer: true, syncState: "sync"},
}

// members are the application_names the configuration waits for.
func (c config) members() []string {
	if c.proposer {
		return []string{"proposer"}
	}
	return c.standbys
}

func (c config) has(standby string) bool {
	for _, s := range c.standbys {
		if s == standby {
			return true
		}
	}
	return false
}

// Settings of the primary (the standbys copy them). No checkpoint may
// start inside a round by itself: the harness runs one before each round.
var primaryConf = []string{
	"synchronous_standby_names = ''",
	"max_wal_size = '8GB'",
	"checkpoint_timeout = '30min'",
	"wal_sender_timeout = '60s'",
}

var (
	tenantID   = proto.ID{0xbe, 0x9c, 1}
	timelineID = proto.ID{0xbe, 0x9c, 2}
)

// standby is a stock streaming standby of the primary, fed through its own
// physical slot (named like it), with application_name = name.
type standby struct {
	b       *bench
	name    string
	pg      *pgtest.Cluster
	running bool
}

// newStandby takes a base backup (creating the slot) and configures it; it
// is not started. It streams from the primary over TCP; it listens on its
// own Unix socket only (no TCP port to pick).
func (b *bench) newStandby(name string) *standby {
	return &standby{b: b, name: name, pg: b.pg.BaseBackup(b.t, pgtest.BackupOptions{
		Signal:          pgtest.StandbySignal,
		PrimaryConninfo: b.pg.TCPConnString() + " application_name=" + name,
		Slot:            name,
	})}
}

func (s *standby) start() {
	s.pg.Start(s.b.t)
	s.running = true
}

// stop is a fast shutdown (the standby's shutdown restartpoint is done when
// it returns, before the next round).
func (s *standby) stop() {
	s.pg.Shutdown(s.b.t)
	s.running = false
	s.b.waitNoWalsender(s.name)
}

func (s *standby) pid() int {
	pid, err := s.pg.Pid()
	if err != nil {
		s.b.t.Fatalf("standby %s: %v", s.name, err)
	}
	return pid
}

// replayLSN asks the standby how far it replayed.
func (s *standby) replayLSN(ctx context.Context) (proto.LSN, error) {
	conn, err := pgx.Connect(ctx, s.pg.ConnString()+" connect_timeout=5")
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var lsn string
	if err := conn.QueryRow(ctx, "SELECT COALESCE(pg_last_wal_replay_lsn(), '0/0')::text").Scan(&lsn); err != nil {
		return 0, err
	}
	return proto.ParseLSN(lsn)
}

// runPG runs a PostgreSQL program as the postgres user (pgtest.Cmd) with a
// time limit and returns its combined output.
func (b *bench) runPG(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := b.pg.Cmd(ctx, name, args...).CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v: %w", timeout, err)
	}
	return string(out), err
}

// startSafekeepers starts the three safekeepers (the first time: creates
// them, each with a fresh data directory it keeps from then on).
func (b *bench) startSafekeepers() {
	if b.sks == nil {
		b.sks = harness.StartSafekeepers(b.t, 3)
		return
	}
	for _, sk := range b.sks {
		if sk.PID() == 0 {
			sk.Start()
		}
	}
}

func (b *bench) stopSafekeepers() {
	for _, sk := range b.sks {
		if sk.PID() != 0 {
			if err := sk.Stop(60 * time.Second); err != nil {
				b.t.Fatalf("safekeeper %d: exit after SIGTERM: %v\n%s", sk.ID, err, harness.Tail(sk.Log(), 20))
			}
		}
	}
}

// startProposer starts `safekeeper propose` (the first time: creates it and
// its slot on the primary) and notes where its log begins.
func (b *bench) startProposer() {
	if b.prop == nil {
		addrs := harness.Addrs(b.sks)
		b.propLogFrom = 0
		harness.CreateTimeline(b.t, b.pg.TCPConnString(), addrs,
			tenantID.String(), timelineID.String())
		b.prop = harness.StartProposer(b.t, harness.ProposerOptions{Upstream: b.pg.TCPConnString(), Safekeepers: addrs,
			Tenant: tenantID.String(), Timeline: timelineID.String(), Slot: "proposer", ApplicationName: "proposer"})
		return
	}
	b.propLogFrom = len(b.prop.Log())
	b.prop.Start()
}

// stopProposer stops the proposer with SIGTERM and returns the link stats
// it logged on the way out.
func (b *bench) stopProposer() []linkStat {
	if b.prop == nil || b.prop.PID() == 0 {
		return nil
	}
	if exited, code := b.prop.Exited(); exited {
		b.t.Fatalf("the proposer exited by itself (code %d):\n%s", code, harness.Tail(b.prop.Log(), 40))
	}
	if err := b.prop.Stop(60 * time.Second); err != nil {
		b.t.Fatalf("proposer: exit after SIGTERM: %v\n%s", err, harness.Tail(b.prop.Log(), 40))
	}
	b.waitNoWalsender("proposer")
	log := b.prop.Log()
	if b.propLogFrom <= len(log) {
		log = log[b.propLogFrom:]
	}
	st, err := parseLinkStats(log)
	if err != nil {
		b.t.Fatalf("proposer link stats: %v", err)
	}
	if len(st) != len(b.sks) {
		b.t.Fatalf("the proposer logged %d \"safekeeper link stats\" lines at SIGTERM, want %d:\n%s", len(st), len(b.sks), harness.Tail(log, 20))
	}
	return st
}

// switchTo makes c the configuration: synchronous_standby_names, then
// everything c does not use stopped, everything it uses started, then
// waits until its members are synchronous and caught up.
func (b *bench) switchTo(c config) {
	b.exec(fmt.Sprintf("ALTER SYSTEM SET synchronous_standby_names = '%s'", c.syncNames))
	b.exec("SELECT pg_reload_conf()")
	for _, s := range b.standbys {
		if s.running && !c.has(s.name) {
			s.stop()
		}
	}
	if !c.proposer {
		b.stopProposer()
		b.stopSafekeepers()
	}
	for _, s := range b.standbys {
		if !s.running && c.has(s.name) {
			s.start()
		}
	}
	if c.proposer {
		b.startSafekeepers()
		if b.prop == nil || b.prop.PID() == 0 {
			b.startProposer()
		}
	}
	b.waitReady(c)
}

// waitReady waits until every member of c streams as a synchronous standby
// (sync_state c.syncState, not lagging) with everything the primary has
// written flushed, and each stock standby has replayed it, so that no
// catch-up runs into the round.
func (b *bench) waitReady(c config) {
	b.t.Helper()
	target := b.lsn("SELECT pg_current_wal_lsn()::text")
	b.poll(3*time.Minute, fmt.Sprintf("%s: %s synchronous and caught up with %s", c.name, strings.Join(c.members(), ","), target), func() (bool, string) {
		if c.proposer {
			b.prop.CheckRunning()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rows, err := b.mon.Query(ctx, "SELECT application_name, state, sync_state, COALESCE(flush_lsn, '0/0')::text FROM pg_stat_replication ORDER BY application_name")
		if err != nil {
			return false, err.Error()
		}
		type row struct{ name, state, sync, flush string }
		var seen []row
		for rows.Next() {
			var r row
			if err := rows.Scan(&r.name, &r.state, &r.sync, &r.flush); err != nil {
				rows.Close()
				return false, err.Error()
			}
			seen = append(seen, r)
		}
		rows.Close()
		status := fmt.Sprintf("pg_stat_replication %v", seen)
		for _, m := range c.members() {
			ok := false
			for _, r := range seen {
				flush, err := proto.ParseLSN(r.flush)
				if r.name == m && r.state == "streaming" && r.sync == c.syncState && err == nil && flush >= target {
					ok = true
				}
			}
			if !ok {
				return false, status
			}
		}
		for _, s := range b.standbys {
			if !c.has(s.name) {
				continue
			}
			replay, err := s.replayLSN(ctx)
			if err != nil || replay < target {
				return false, fmt.Sprintf("%s; standby %s replayed to %s (%v)", status, s.name, replay, err)
			}
		}
		return true, status
	})
}

// waitNoWalsender waits until the primary has no walsender left for
// application_name name: a stopped member's walsender must neither pass for
// its successor in waitReady nor run into the next round.
func (b *bench) waitNoWalsender(name string) {
	b.t.Helper()
	b.poll(time.Minute, "the primary's walsender for "+name+" to exit", func() (bool, string) {
		n := b.query(fmt.Sprintf("SELECT count(*) FROM pg_stat_replication WHERE application_name = '%s'", name))
		return n == "0", n + " left"
	})
}

// checkStillSync fails the test if a member of c is no longer a
// synchronous standby after a round.
func (b *bench) checkStillSync(c config) {
	for _, m := range c.members() {
		n := b.query(fmt.Sprintf("SELECT count(*) FROM pg_stat_replication WHERE application_name = '%s' AND state = 'streaming' AND sync_state = '%s'", m, c.syncState))
		if n == "0" {
			b.t.Fatalf("%s: %s is no longer a %s standby after the round (pg_stat_replication rows: %s)", c.name, m, c.syncState, n)
		}
	}
}

// poll calls cond with a growing delay (5 ms up to 200 ms) until it is
// true, failing the test after timeout with the last status it returned.
func (b *bench) poll(timeout time.Duration, what string, cond func() (bool, string)) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	delay := 5 * time.Millisecond
	for {
		ok, status := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out after %v waiting for %s; last seen: %s", timeout, what, status)
		}
		time.Sleep(delay)
		delay = min(delay*2, 200*time.Millisecond)
	}
}

// exec runs sql on the primary through the monitor connection.
func (b *bench) exec(sql string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := b.mon.Exec(ctx, sql); err != nil {
		b.t.Fatalf("primary: %s: %v", sql, err)
	}
}

// query returns the one value sql selects, as text.
func (b *bench) query(sql string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var v string
	if err := b.mon.QueryRow(ctx, sql).Scan(&v); err != nil {
		b.t.Fatalf("primary: %s: %v", sql, err)
	}
	return v
}

func (b *bench) lsn(sql string) proto.LSN {
	b.t.Helper()
	l, err := proto.ParseLSN(b.query(sql))
	if err != nil {
		b.t.Fatal(err)
	}
	return l
}
