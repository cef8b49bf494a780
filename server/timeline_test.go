package server

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
	"github.com/safekeeper/safekeeper/test/harness"
)

// TestOwnerPublishesOnlyStateChanges: the owner hands readers a new state
// (and wakes every walsender) only when a commit changed it, not for every
// staged request: a stream of requests committed in batches costs at most
// one publication per commit.
func TestOwnerPublishesOnlyStateChanges(t *testing.T) {
	var pubs atomic.Uint64
	s := startHookedServer(t, t.TempDir(), nil, hooks{onPublish: func() { pubs.Add(1) }})
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	// Requests sent back to back: the owner takes several per batch.
	p.push(400, 8000, 0)
	p.push(400, 8000, 0)
	commits := s.db.Stats().Commits
	n := pubs.Load()
	if n == 0 || n > commits {
		t.Fatalf("%d publications for %d commits: want at least one, at most one per commit", n, commits)
	}
	t.Logf("%d publications, %d commits, %d requests", n, commits, 2*(400*8000/131072+1))
}

// Requests that arrive back to back share group commits: the reader that
// runs the owner commits only when no further message is already here
// (pgwire's Pending sees through the server's own connection wrapper).
func TestPipelinedRequestsShareGroupCommits(t *testing.T) {
	s := startHookedServer(t, t.TempDir(), nil, hooks{})
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	for range 400 {
		p.gen.Record(2000)
	}
	wal := p.gen.Take()
	const chunk = 4 << 10
	before := s.db.Stats().Commits
	reqs := 0
	for off := 0; off < len(wal); off += chunk {
		part := wal[off:min(off+chunk, len(wal))]
		p.send(&proto.SafeKeeperRequest{Sender: p.ballot, BeginLSN: p.pos, EndLSN: p.pos + lsn(len(part)), CommitLSN: p.pos, WAL: part})
		p.pos += lsn(len(part))
		reqs++
	}
	var resp *proto.SafeKeeperResponse
	for range reqs {
		resp = p.recv().(*proto.SafeKeeperResponse)
	}
	if resp.FlushLSN != p.pos {
		t.Fatalf("flush_lsn %s after the last response, want %s", resp.FlushLSN, p.pos)
	}
	commits := s.db.Stats().Commits - before
	if commits > uint64(reqs/4) {
		t.Fatalf("%d requests sent back to back took %d commits: want group commits (at most %d)", reqs, commits, reqs/4)
	}
	t.Logf("%d requests, %d commits", reqs, commits)
}

// A commit_lsn that comes without WAL is served to readers at once, is not
// committed per request, reaches the disk within persistInterval, and is
// never reported to the proposer before it is durable.
func TestCommitLSNWithoutWALPersistedLazily(t *testing.T) {
	s := startHookedServer(t, t.TempDir(), nil, hooks{})
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	p.push(200, 8000, tStart) // WAL, committed only up to its start
	end := p.pos
	tl := running(s, proto.TimelineKey{TenantID: tTenant, TimelineID: tTimeline})
	durable := func() acceptor.State {
		st, err := tl.Stored()
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	const beats = 40
	before := s.db.Stats().Commits
	for i := range beats {
		commit := tStart + (end-tStart)*lsn(i+1)/beats
		p.send(&proto.SafeKeeperRequest{Sender: p.ballot, BeginLSN: end, EndLSN: end, CommitLSN: commit})
		resp := p.recv().(*proto.SafeKeeperResponse)
		if st, _ := tl.Status(); st.CommitLSN != commit {
			t.Fatalf("heartbeat %d: readers see commit_lsn %s right after the response, want %s", i, st.CommitLSN, commit)
		}
		if d := durable().CommitLSN; resp.CommitLSN > d {
			t.Fatalf("heartbeat %d: response reports commit_lsn %s, the disk has %s", i, resp.CommitLSN, d)
		}
	}
	if n := s.db.Stats().Commits - before; n >= beats/2 {
		t.Fatalf("%d heartbeats carrying only commit_lsn made %d commits, want far fewer (one per 100 ms)", beats, n)
	}
	waitFor(t, "commit_lsn on disk", func() bool { return durable().CommitLSN == end })
}

// Shutdown persists a commit_lsn held in memory.
func TestShutdownPersistsCommitLSN(t *testing.T) {
	dir := t.TempDir()
	s := startHookedServer(t, dir, nil, hooks{persistInterval: time.Hour})
	p := newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart)
	p.push(50, 8000, tStart)
	p.heartbeat() // commit_lsn = the end, in memory only
	tl := running(s, proto.TimelineKey{TenantID: tTenant, TimelineID: tTimeline})
	if st, _ := tl.Stored(); st.CommitLSN != tStart {
		t.Fatalf("commit_lsn %s on disk before the shutdown, want %s (in memory only)", st.CommitLSN, tStart)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.Shutdown(ctx)
	db, err := storage.Open(filepath.Join(dir, "safekeeper.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, st, err := db.OpenTimeline(tTenant, tTimeline)
	if err != nil {
		t.Fatal(err)
	}
	if st.CommitLSN != p.pos {
		t.Fatalf("after shutdown commit_lsn on disk is %s, want %s", st.CommitLSN, p.pos)
	}
}

// gatedStorage holds a Commit of its timeline that moves flush_lsn past hold, until
// release is closed.
type gatedStorage struct {
	acceptor.Storage
	hold    *atomic.Uint64  // hold a Commit whose flush_lsn is past it (0: none)
	held    chan<- struct{} // told when a Commit is held
	release <-chan struct{}
}

func (g gatedStorage) Commit(s acceptor.State) error {
	if h := g.hold.Load(); h != 0 && uint64(s.FlushLSN) > h {
		g.held <- struct{}{}
		<-g.release
	}
	return g.Storage.Commit(s)
}

// WAL received and not yet committed is bounded over all timelines
// (Config.MaxBufferedWAL): while one timeline's commit holds the whole
// budget, another timeline's request waits in its reader, and goes through
// once the budget is given back.
func TestBufferedWALBoundedAcrossTimelines(t *testing.T) {
	var hold atomic.Uint64
	held, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	s := startHookedServer(t, t.TempDir(), func(c *Config) { c.MaxBufferedWAL = proto.MaxWALPerRequest },
		hooks{storage: func(st *storage.Timeline) acceptor.Storage {
			if st.Key().TimelineID == tTimeline {
				return gatedStorage{Storage: st, hold: &hold, held: held, release: release}
			}
			return st
		}})
	t.Cleanup(open) // before the server's Shutdown, which waits for the held commit
	addr := s.Addr().String()
	a := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	b := newTestPush(t, addr, proto.ID{0x77, 2}, 1, hist1(tStart), tStart)
	a.heartbeat()
	b.heartbeat()

	// A request of the budget's size on a: its commit is held (that one,
	// not a periodic commit of a's owner, which takes no budget).
	hold.Store(uint64(a.pos))
	for a.gen.Pos() < a.pos+proto.MaxWALPerRequest-200 {
		a.gen.Record(100)
	}
	wal := a.gen.Take()
	wal = wal[:min(len(wal), proto.MaxWALPerRequest)]
	a.send(&proto.SafeKeeperRequest{Sender: a.ballot, BeginLSN: a.pos, EndLSN: a.pos + lsn(len(wal)), CommitLSN: a.pos, WAL: wal})
	select {
	case <-held: // a's owner is in the commit, with the budget taken
	case <-time.After(10 * time.Second):
		t.Fatal("timeline a's commit never started")
	}

	// b's request must wait for the budget.
	bDone := make(chan *proto.SafeKeeperResponse, 1)
	b.gen.Record(500)
	bwal := b.gen.Take()
	b.send(&proto.SafeKeeperRequest{Sender: b.ballot, BeginLSN: b.pos, EndLSN: b.pos + lsn(len(bwal)), CommitLSN: b.pos, WAL: bwal})
	go func() {
		m, err := b.c.Recv(b.ctx)
		if err != nil {
			t.Error(err)
		}
		r, _ := m.(*proto.SafeKeeperResponse)
		bDone <- r
	}()
	select {
	case r := <-bDone:
		t.Fatalf("timeline b answered (%+v) while timeline a's uncommitted request held the whole budget", r)
	case <-time.After(300 * time.Millisecond):
	}
	open()
	select {
	case r := <-bDone:
		if want := b.pos + lsn(len(bwal)); r == nil || r.FlushLSN != want {
			t.Fatalf("timeline b after the budget came back: %+v, want flush_lsn %s", r, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("timeline b never answered after the budget was given back")
	}
	if r := a.recv().(*proto.SafeKeeperResponse); r.FlushLSN <= a.pos {
		t.Fatalf("timeline a: %+v", r)
	}
}

// A proposer that keeps sending but never reads its responses is
// disconnected once maxOutQueue replies wait for it; the timeline's owner is
// never held up by it, so the next proposer is served at once.
func TestProposerThatDoesNotReadIsDisconnected(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.WalSenderTimeout = time.Hour })
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	nc := p.c.NetConn()
	nc.SetWriteDeadline(time.Now().Add(tTimeout))
	hb := &proto.SafeKeeperRequest{Sender: p.ballot, BeginLSN: tStart, EndLSN: tStart, CommitLSN: tStart}
	// The socket buffers on both sides hold at most a few MiB of ~100-byte
	// responses; past them and maxOutQueue the server must give up.
	var err error
	sent := 0
	for ; sent < 2_000_000 && err == nil; sent++ {
		err = p.c.Send(hb)
	}
	var ne net.Error
	switch {
	case err == nil:
		t.Fatalf("%d requests with no response read, and the server has not disconnected", sent)
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("sends blocked after %d requests: the server stopped reading", sent)
	}
	t.Logf("disconnected after %d requests: %v", sent, err)
	q := newTestPush(t, addr, tTimeline, 2, proto.TermHistory{{Term: 2, StartLSN: tStart}}, tStart)
	if _, resp := q.push(10, 100, 0); resp.FlushLSN <= tStart {
		t.Fatalf("the next proposer's WAL was not flushed: %v", resp.FlushLSN)
	}
}

// Once WAL has stopped arriving, the server gives back the database pages
// its mmap touched (here: a reader's WAL) without waiting for a burst of
// anything, and the reader is still served the same bytes afterwards.
func TestQuietServerReleasesDatabaseMapping(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, dir, nil)
	addr := s.Addr().String()
	dbPath := filepath.Join(dir, "safekeeper.db")
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	wal, _ := p.push(1000, 8000, 0) // ~8 MB
	c := newStream(t, addr)
	c.start("START_REPLICATION " + tStart.String() + " TIMELINE 1")
	if got := c.readWAL(tStart, p.pos); !bytes.Equal(got, wal) {
		t.Fatal("streamed WAL differs from what was pushed")
	}
	kb, err := harness.MappedRSS(0, dbPath)
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	if kb < 4<<10 {
		t.Fatalf("streaming 8 MB mapped only %d KiB of the database", kb)
	}
	waitFor(t, "the database mapping to be released", func() bool {
		now, err := harness.MappedRSS(0, dbPath)
		return err == nil && now < kb/4
	})
	// The same bytes again, from pages mapped anew.
	c2 := newStream(t, addr)
	c2.start("START_REPLICATION " + tStart.String() + " TIMELINE 1")
	if got := c2.readWAL(tStart, p.pos); !bytes.Equal(got, wal) {
		t.Fatal("WAL streamed after the release differs")
	}
}

// TestIdleTimelinesKeepNoGoroutine: a timeline whose connections ended
// holds no goroutine of its own (its owner's background goroutine returns
// once nothing is left to wait for; retention runs on the registry's few
// workers), after it persisted the commit_lsn it held in memory and had
// its retention pass. Ten thousand idle timelines cost their memory only.
func TestIdleTimelinesKeepNoGoroutine(t *testing.T) {
	s := startHookedServer(t, t.TempDir(), nil, hooks{})
	const n = 40
	base := runtime.NumGoroutine()
	ends := make([]lsn, n)
	for i := range n {
		p := newTestPush(t, s.Addr().String(), proto.ID{0xbb, 0x40, byte(i)}, 1, hist1(tStart), tStart)
		p.push(4, 8000, tStart)
		p.heartbeat() // commit_lsn = the WAL's end, held in memory until persisted
		ends[i] = p.pos
		p.c.Close()
	}
	settled := func(i int) (acceptor.State, string) {
		tl := running(s, proto.TimelineKey{TenantID: tTenant, TimelineID: proto.ID{0xbb, 0x40, byte(i)}})
		st, err := tl.Stored()
		if err != nil {
			t.Fatal(err)
		}
		_, reason := tl.Retention()
		return st, reason
	}
	harness.WaitFor(t, 10*time.Second, "every timeline to persist its commit_lsn and have a retention pass", func() bool {
		for i := range n {
			if st, reason := settled(i); st.CommitLSN != ends[i] || reason == "" {
				return false
			}
		}
		return true
	})
	harness.WaitFor(t, 10*time.Second, "the idle timelines' goroutines to return", func() bool {
		return runtime.NumGoroutine() <= base+2
	})
	t.Logf("%d goroutines with the server up, %d with %d idle timelines", base, runtime.NumGoroutine(), n)
}
