package test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/test/harness"
)

// statusOf reads TIMELINE_STATUS of timeline 1 by column name.
func statusOf(t *testing.T, sk *harness.Safekeeper) map[string]string {
	t.Helper()
	return sk.TimelineStatus(t, tenant(1).String(), proto.ID{0xbb, 1}.String())
}

func exportWAL(t *testing.T, sk *harness.Safekeeper) string {
	t.Helper()
	out := t.TempDir()
	if code, _, stderr := harness.Run(t, "wal", "export", "--data-dir", sk.DataDir, "--tenant-id", tenant(1).String(),
		"--timeline-id", proto.ID{0xbb, 1}.String(), "--output", out); code != 0 {
		t.Fatalf("wal export: exit %d: %s", code, stderr)
	}
	return out
}

// TestTimelinePullCopiesAWholeTimeline: `safekeeper timeline pull` copies a
// peer's timeline into a stopped safekeeper's data directory — its vote,
// term history, flush_lsn and commit_lsn and its WAL byte for byte — after
// which it is a member the proposer streams on to. From a peer whose
// retention removed the timeline's first segments it copies from the first
// whole segment held, and then holds the timeline from there (58P01 below).
// It refuses a data directory a server holds and a timeline already there.
func TestTimelinePullCopiesAWholeTimeline(t *testing.T) {
	src := harness.StartSafekeeper(t, 1)
	trimmed := harness.StartSafekeeper(t, 2, "--wal-keep-size", "0", "--retention-interval", "50ms")
	dst := harness.StartSafekeeper(t, 3)
	dst2 := harness.StartSafekeeper(t, 4)
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	var end proto.LSN
	for i := 0; i < 900; i++ {
		_, end = gen.Record(3000)
	}
	wal := gen.Take()
	ps := []*tp{startTerm(t, src, 1, 1), startTerm(t, trimmed, 1, 1)}
	for _, p := range ps {
		n := 0
		for off := 0; off < len(wal); off += proto.MaxWALPerRequest {
			r := p.appendReq(tlStart+proto.LSN(off), wal[off:min(len(wal), off+proto.MaxWALPerRequest)], end)
			r.TruncateLSN = end // every safekeeper has it: retention may remove it on trimmed
			p.send(r)
			n++
		}
		for range n {
			p.resp()
		}
		p.send(p.appendReq(end, nil, end)) // commit_lsn = end
		p.resp()
	}
	harness.WaitFor(t, 30*time.Second, "safekeeper 2 to remove its first segments", func() bool {
		rm, _ := proto.ParseLSN(statusOf(t, trimmed)["removed_up_to"])
		return rm > tlStart
	})
	pull := func(from, into *harness.Safekeeper) (int, string, string) {
		return harness.Run(t, "timeline", "pull", "--from", from.Addr, "--data-dir", into.DataDir,
			"--tenant-id", tenant(1).String(), "--timeline-id", proto.ID{0xbb, 1}.String())
	}
	if code, _, stderr := pull(src, dst); code != 1 || !strings.Contains(stderr, "in use") {
		t.Fatalf("pull into a running safekeeper's data dir: exit %d: %s", code, stderr)
	}
	if err := dst.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := pull(src, dst)
	if code != 0 || !strings.Contains(stdout, "pulled timeline") {
		t.Fatalf("pull: exit %d\n%s%s", code, stdout, stderr)
	}
	t.Logf("%s", strings.TrimSpace(stdout))
	if code, _, stderr := pull(src, dst); code != 1 || !strings.Contains(stderr, "already holds") {
		t.Fatalf("a second pull: exit %d: %s", code, stderr)
	}
	// Into a data directory that does not exist yet (a replaced disk):
	// nothing is created while the peer cannot be reached; then it is made
	// and filled.
	fresh := filepath.Join(t.TempDir(), "replaced", "data")
	pullFresh := func(from string) (int, string, string) {
		return harness.Run(t, "timeline", "pull", "--from", from, "--data-dir", fresh,
			"--tenant-id", tenant(1).String(), "--timeline-id", proto.ID{0xbb, 1}.String(), "--timeout", "10s")
	}
	if code, _, stderr := pullFresh(harness.RefusedAddr(t)); code != 1 {
		t.Fatalf("pull from an unreachable peer: exit %d: %s", code, stderr)
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Fatalf("a pull that could not reach its peer left %s behind (%v)", fresh, err)
	}
	if code, stdout, stderr := pullFresh(src.Addr); code != 0 || !strings.Contains(stdout, "pulled timeline") {
		t.Fatalf("pull into a data directory that did not exist: exit %d\n%s%s", code, stdout, stderr)
	}
	// Onto a file system too small for the WAL: refused before a byte is
	// copied (a pull that met ENOSPC would leave the disk full).
	if os.Geteuid() == 0 {
		mnt := filepath.Join(t.TempDir(), "small")
		if err := os.Mkdir(mnt, 0o700); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mnt).CombinedOutput(); err != nil {
			t.Fatalf("mount tmpfs: %v\n%s", err, out)
		}
		t.Cleanup(func() { exec.Command("umount", mnt).Run() })
		code, _, stderr := harness.Run(t, "timeline", "pull", "--from", src.Addr, "--data-dir", filepath.Join(mnt, "data"),
			"--tenant-id", tenant(1).String(), "--timeline-id", proto.ID{0xbb, 1}.String(), "--timeout", "10s")
		if code != 1 || !strings.Contains(stderr, "nothing copied") || !strings.Contains(stderr, "MiB free") {
			t.Fatalf("pull onto an 8 MiB file system: exit %d: %s", code, stderr)
		}
		if _, err := os.Stat(filepath.Join(mnt, "data")); !os.IsNotExist(err) {
			t.Fatalf("the refused pull left its data directory behind (%v)", err)
		}
		t.Logf("onto an 8 MiB tmpfs: %s", strings.TrimSpace(stderr))
	} else {
		t.Log("not root: the pull onto a small tmpfs is not tried")
	}
	dst.Start()
	a, b := statusOf(t, src), statusOf(t, dst)
	for _, col := range []string{"term", "voted_for", "last_log_term", "flush_lsn", "commit_lsn", "timeline_start_lsn", "system_id", "pg_timeline", "removed_up_to"} {
		if a[col] != b[col] {
			t.Errorf("%s: peer %q, pulled %q", col, a[col], b[col])
		}
	}
	// The proposer of term 1 goes on with the pulled one as with any member.
	p := dial(t, dst, 1)
	if g := p.greet(); g.FlushLSN != end || g.VotedFor != node(1, 1) {
		t.Fatalf("pulled safekeeper greets with flush %s, vote %v; want %s, %v", g.FlushLSN, g.VotedFor, end, node(1, 1))
	}
	p.vote(node(1, 1))
	p.elected(end, hist(1, uint64(tlStart)))
	_, end2 := gen.Record(500)
	more := gen.Take()
	p.send(p.appendReq(end, more, end2))
	if r := p.resp(); r.FlushLSN != end2 {
		t.Fatalf("append after the pull: flush %s, want %s", r.FlushLSN, end2)
	}
	p.c.Close()
	for _, sk := range []*harness.Safekeeper{src, dst} {
		if err := sk.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	one, three := exportWAL(t, src), exportWAL(t, dst)
	for s := tlStart; s+segSize <= end; s += segSize {
		name := proto.SegmentFileName(1, s, segSize)
		x, errX := os.ReadFile(filepath.Join(one, name))
		y, errY := os.ReadFile(filepath.Join(three, name))
		if errX != nil || errY != nil || !bytes.Equal(x, y) {
			t.Fatalf("segment %s: peer %v, pulled %v, equal %v", name, errX, errY, bytes.Equal(x, y))
		}
	}

	// From the trimmed peer: the first whole segment it holds.
	if err := dst2.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if code, stdout, stderr := pull(trimmed, dst2); code != 0 {
		t.Fatalf("pull from a trimmed peer: exit %d\n%s%s", code, stdout, stderr)
	}
	dst2.Start()
	rm := statusOf(t, trimmed)["removed_up_to"]
	if got := statusOf(t, dst2)["removed_up_to"]; got != rm {
		t.Fatalf("pulled from a peer holding WAL from %s: removed_up_to %s", rm, got)
	}
	below := proto.LSN(tlStart)
	host, port, _ := strings.Cut(dst2.Addr, ":")
	conn, err := pgconn.Connect(harness.Context(t, 10*time.Second), fmt.Sprintf("host=%s port=%s user=t sslmode=disable replication=true options='-c tenant_id=%s -c timeline_id=%s'",
		host, port, tenant(1), proto.ID{0xbb, 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(harness.Context(t, 10*time.Second), fmt.Sprintf("START_REPLICATION PHYSICAL %s TIMELINE 1", below)).ReadAll()
	if err == nil || !strings.Contains(err.Error(), "58P01") {
		t.Fatalf("a read below the pulled timeline's first byte: %v, want 58P01", err)
	}
}

// TestTimelinePullCarriesTheHistoryFile: a pull from a peer that a
// promoted primary's proposer switched to PostgreSQL timeline 2 stores the
// promoted primary's history file with the rest, as the acceptor does at
// the switch: the pulled safekeeper answers TIMELINE_HISTORY 2 with the
// exact bytes and takes a proposer of timeline 2 (its TimelineHistory
// matches what it recorded) instead of refusing it with 22023 for good,
// which left the new primary's standbys stalled silently.
func TestTimelinePullCarriesTheHistoryFile(t *testing.T) {
	src := harness.StartSafekeeper(t, 1)
	dst := harness.StartSafekeeper(t, 2)
	switchAt, end, history := promoteOnce(t, src)
	if err := dst.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := harness.Run(t, "timeline", "pull", "--from", src.Addr, "--data-dir", dst.DataDir,
		"--tenant-id", tenant(1).String(), "--timeline-id", proto.ID{0xbb, 1}.String())
	if code != 0 {
		t.Fatalf("pull: exit %d\n%s%s", code, stdout, stderr)
	}
	t.Logf("%s", strings.TrimSpace(stdout))
	dst.Start()
	if st := statusOf(t, dst); st["pg_timeline"] != "2" || st["flush_lsn"] != end.String() {
		t.Fatalf("pulled: pg_timeline %s, flush_lsn %s; want 2, %s", st["pg_timeline"], st["flush_lsn"], end)
	}
	c := replConn(t, dst, 1)
	res, err := c.Exec(harness.Context(t, 10*time.Second), "TIMELINE_HISTORY 2").ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 {
		t.Fatalf("TIMELINE_HISTORY 2 on the pulled safekeeper: %v", err)
	}
	if row := res[0].Rows[0]; string(row[0]) != "00000002.history" || !bytes.Equal(row[1], history) {
		t.Fatalf("TIMELINE_HISTORY 2 on the pulled safekeeper = %q, %q; want 00000002.history, %q", row[0], row[1], history)
	}

	// A proposer of timeline 2 (term 3) is taken, and streams on.
	r := dial(t, dst, 1)
	r.info.PgTimeline, r.info.ProposerUUID, r.info.WalEnd = 2, proto.ID{0xcc, 3}, end
	if g := r.greet(); g.FlushLSN != end {
		t.Fatalf("greeting: flush %s, want %s", g.FlushLSN, end)
	}
	r.send(&proto.TimelineHistory{PgTimeline: 2, Content: history})
	r.send(&proto.RequestVote{Candidate: node(3, 3)})
	m, err := r.c.Recv(r.ctx)
	if v, ok := m.(*proto.VoteResponse); err != nil || !ok || v.VotedFor != node(3, 3) {
		t.Fatalf("a proposer of PostgreSQL timeline 2 asking the pulled safekeeper for a vote: %T %+v, %v; want the vote", m, m, err)
	}
	if info, ok := r.recv().(*proto.SafeKeeperInfo); !ok || info.FlushLSN != end {
		t.Fatalf("fresh info after the grant: %+v", info)
	}
	r.ballot = node(3, 3)
	r.elected(end, hist(1, uint64(tlStart), 2, uint64(switchAt), 3, uint64(end)))
	pushWAL(t, r, xlogtest.NewGenerator(end, segSize, 2, sysID), end, 5)
}

// pushWAL sends gen's next records (from begin) on p with commit_lsn = their
// end and returns the end.
func pushWAL(t *testing.T, p *tp, gen *xlogtest.Generator, begin proto.LSN, records int) proto.LSN {
	t.Helper()
	var end proto.LSN
	for range records {
		_, end = gen.Record(2000)
	}
	p.send(p.appendReq(begin, gen.Take(), end))
	if r := p.resp(); r.FlushLSN != end {
		t.Fatalf("append up to %s: flush %s", end, r.FlushLSN)
	}
	return end
}

// promoteOnce gives sk timeline 1 (tenant 1) as a primary and a promoted
// standby's proposers would: WAL of PostgreSQL timeline 1 in term 1 up to
// switchAt, then the proposer of PostgreSQL timeline 2 (term 2) with its
// history file, which switches it, and WAL of timeline 2 up to end, all
// committed.
func promoteOnce(t *testing.T, sk *harness.Safekeeper) (switchAt, end proto.LSN, history []byte) {
	t.Helper()
	p := startTerm(t, sk, 1, 1)
	switchAt = pushWAL(t, p, xlogtest.NewGenerator(tlStart, segSize, 1, sysID), tlStart, 30)
	p.c.Close()
	history = []byte(fmt.Sprintf("1\t%s\tno recovery target specified\n", switchAt))
	q := dial(t, sk, 1)
	q.info.PgTimeline, q.info.ProposerUUID, q.info.WalEnd = 2, proto.ID{0xcc, 2}, switchAt
	q.greet()
	q.send(&proto.TimelineHistory{PgTimeline: 2, Content: history})
	q.vote(node(2, 2))
	q.elected(switchAt, hist(1, uint64(tlStart), 2, uint64(switchAt)))
	end = pushWAL(t, q, xlogtest.NewGenerator(switchAt, segSize, 2, sysID), switchAt, 30)
	q.c.Close()
	return switchAt, end, history
}
