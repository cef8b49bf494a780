package test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/test/harness"
)

// fetchRun is one `safekeeper wal fetch` run.
type fetchRun struct {
	code           int
	data           []byte // the file written, nil if none
	stderr         string
	elapsed        time.Duration
	synced, padded bool
}

func walFetch(t *testing.T, addrs []string, timeline proto.ID, name string, extra ...string) fetchRun {
	t.Helper()
	out := filepath.Join(t.TempDir(), "RECOVERYXLOG")
	args := append([]string{"wal", "fetch", "--safekeepers", strings.Join(addrs, ","),
		"--tenant-id", tenant(1).String(), "--timeline-id", timeline.String(), "--timeout", "60s"}, extra...)
	cmd := exec.CommandContext(harness.Context(t, 2*time.Minute), harness.Binary(t), append(args, name, out)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	t0 := time.Now()
	cmd.Run()
	r := fetchRun{code: cmd.ProcessState.ExitCode(), stderr: stderr.String(), elapsed: time.Since(t0)}
	r.data, _ = os.ReadFile(out)
	r.synced = strings.Contains(r.stderr, "synced=true")
	r.padded = strings.Contains(r.stderr, "zero_padded=true")
	return r
}

// segmentOf is WAL (which starts at tlStart) [seg, end) zero-padded to a
// whole segment.
func segmentOf(wal []byte, seg, end proto.LSN) []byte {
	b := make([]byte, segSize)
	copy(b, wal[seg-tlStart:end-tlStart])
	return b
}

// TestWALFetchServesRestoreCommand: `safekeeper wal fetch` as PostgreSQL's
// restore_command. With commit_lsn lagging the WAL a quorum holds (the
// primary died before the proposer passed the last commit_lsn on), the
// last segment is served only once the end is settled: with a live
// proposer, when it commits; with none, after fetch's own sync. Whole
// segments come byte for byte, the last one zero-padded; a segment past
// the end, of another PostgreSQL timeline, or a history file is "not found"
// (exit 1); everything else that fails is exit 126, which stops recovery
// instead of ending it.
func TestWALFetchServesRestoreCommand(t *testing.T) {
	sks := harness.StartSafekeepers(t, 3)
	addrs := harness.Addrs(sks)
	timeline := proto.ID{0xbb, 1}
	var ps []*tp
	for _, sk := range sks {
		ps = append(ps, startTerm(t, sk, 1, 1))
	}
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	var wal []byte
	// push sends gen's next WAL (records until past `until`) to ps with
	// commit_lsn = commit, and waits for every response.
	push := func(ps []*tp, until, commit proto.LSN) proto.LSN {
		t.Helper()
		begin := tlStart + proto.LSN(len(wal))
		var end proto.LSN
		for end <= until {
			_, end = gen.Record(3000)
		}
		b := gen.Take()
		wal = append(wal, b...)
		for _, p := range ps {
			n := 0
			for off := 0; off < len(b); off += proto.MaxWALPerRequest {
				p.send(p.appendReq(begin+proto.LSN(off), b[off:min(len(b), off+proto.MaxWALPerRequest)], commit))
				n++
			}
			for range n {
				p.resp()
			}
		}
		return end
	}
	// Segment 1 whole and committed; then, on safekeepers 1 and 2 only,
	// WAL into segment 3 that the proposer never reports committed.
	end1 := push(ps, tlStart+segSize+segSize/4, 0)
	for _, p := range ps { // commit_lsn = end1 everywhere
		p.send(p.appendReq(end1, nil, end1))
		p.resp()
	}
	end2 := push(ps[:2], tlStart+2*segSize+segSize/2, end1)
	seg1, seg2, seg3 := tlStart, tlStart+segSize, tlStart+2*segSize
	name := func(tli uint32, l proto.LSN) string { return proto.SegmentFileName(tli, l, segSize) }

	// A whole segment below commit_lsn: byte for byte, at once.
	r := walFetch(t, addrs, timeline, name(1, seg1))
	if r.code != 0 || !bytes.Equal(r.data, wal[:segSize]) || r.padded || r.synced {
		t.Fatalf("segment 1: exit %d, %d bytes, padded %v, synced %v; want exit 0 and the WAL\n%s", r.code, len(r.data), r.padded, r.synced, r.stderr)
	}

	// The segment holding commit_lsn while a proposer is live (it streams
	// heartbeats): fetch waits for it to commit the quorum's WAL, which it
	// does after half a second, and serves up to there. No sync.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t0 := time.Now()
		for {
			commit := end1
			if time.Since(t0) > 500*time.Millisecond {
				commit = end2
			}
			for _, p := range ps {
				p.c.Send(p.appendReq(end1, nil, commit)) // heartbeats; answers unread
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	r = walFetch(t, addrs, timeline, name(1, seg3))
	close(stop)
	<-done
	if r.code != 0 || r.synced || !bytes.Equal(r.data, segmentOf(wal, seg3, end2)) ||
		!strings.Contains(r.stderr, "waiting for the live proposer") {
		t.Fatalf("last segment with a live proposer: exit %d, synced %v, %d bytes (want the WAL up to %s, zero-padded); want it after the proposer committed, without sync\n%s",
			r.code, r.synced, len(r.data), end2, r.stderr)
	}
	for _, p := range ps {
		p.c.Close()
	}

	// More WAL above commit_lsn on a quorum, and then no proposer: fetch
	// commits it with a sync of its own and serves all of it.
	ps = []*tp{startTerm2(t, sks[0], end2), startTerm2(t, sks[1], end2)}
	end3 := push(ps, end2+segSize/8, end2)
	for _, p := range ps {
		p.c.Close()
	}
	r = walFetch(t, addrs, timeline, name(1, seg3))
	if r.code != 0 || !r.synced || !r.padded || !bytes.Equal(r.data, segmentOf(wal, seg3, end3)) {
		t.Fatalf("last segment with no proposer: exit %d, synced %v, padded %v, %d bytes; want the WAL up to %s, zero-padded, after a sync\n%s",
			r.code, r.synced, r.padded, len(r.data), end3, r.stderr)
	}
	// Segment 2 lay below the end all along: whole.
	if r := walFetch(t, addrs, timeline, name(1, seg2)); r.code != 0 || !bytes.Equal(r.data, wal[segSize:2*segSize]) {
		t.Fatalf("segment 2: exit %d, %d bytes\n%s", r.code, len(r.data), r.stderr)
	}

	// "Not found" (exit 1), which ends recovery: past the end, another
	// PostgreSQL timeline, a history file.
	for _, f := range []string{name(1, seg3+segSize), name(2, seg1), "00000002.history"} {
		if r := walFetch(t, addrs, timeline, f); r.code != 1 || r.data != nil || !strings.Contains(r.stderr, "no such WAL file") {
			t.Errorf("%s: exit %d, wrote %d bytes; want exit 1 (not found) and nothing written\n%s", f, r.code, len(r.data), r.stderr)
		}
	}
	// Exit 126, which stops recovery: a timeline no safekeeper holds, no
	// safekeeper answering, a name that is no WAL file, bad flags.
	sks[2].Kill()
	nobody := []string{sks[2].Addr, harness.RefusedAddr(t)}
	for _, tc := range []struct {
		what     string
		addrs    []string
		timeline proto.ID
		name     string
		want     string
	}{
		{"unknown timeline", addrs, proto.ID{0xbb, 9}, name(1, seg1), "no safekeeper holds the timeline"},
		{"nobody answers", nobody, timeline, name(1, seg1), "no quorum"},
		{"not a WAL file name", addrs, timeline, "pg_hba.conf", "is not a WAL segment"},
	} {
		if r := walFetch(t, tc.addrs, tc.timeline, tc.name); r.code != 126 || r.data != nil || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: exit %d, wrote %d bytes; want exit 126 naming %q\n%s", tc.what, r.code, len(r.data), tc.want, r.stderr)
		}
	}
	for _, args := range [][]string{{"--no-such-flag", "F", "P"}, {"--tenant-id", tenant(1).String(), "F", "P"}} {
		if r := walFetchRaw(t, args); r.code != 126 {
			t.Errorf("wal fetch %q: exit %d, want 126 (a usage error must stop recovery too)\n%s", args, r.code, r.stderr)
		}
	}
	// With one of three safekeepers down the WAL is still served.
	if r := walFetch(t, addrs, timeline, name(1, seg1)); r.code != 0 || !bytes.Equal(r.data, wal[:segSize]) {
		t.Fatalf("segment 1 with safekeeper 3 down: exit %d\n%s", r.code, r.stderr)
	}
}

// startTerm2 starts term 2 on sk, continuing its WAL at from.
func startTerm2(t *testing.T, sk *harness.Safekeeper, from proto.LSN) *tp {
	p := dial(t, sk, 1)
	p.greet()
	p.vote(node(2, 2))
	p.elected(from, hist(1, uint64(tlStart), 2, uint64(from)))
	return p
}

func walFetchRaw(t *testing.T, args []string) fetchRun {
	t.Helper()
	cmd := exec.CommandContext(harness.Context(t, time.Minute), harness.Binary(t), append([]string{"wal", "fetch"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Run()
	return fetchRun{code: cmd.ProcessState.ExitCode(), stderr: stderr.String()}
}

// TestWALFetchServesHistoryFiles: after a promotion `wal fetch` serves the
// history file of the safekeepers' PostgreSQL timeline byte for byte as the
// promoted primary wrote it, and after a second one, the first promotion's
// too, byte for byte as PostgreSQL wrote it (no trailing separator of the
// later file); timeline 1 and timelines they were never on have none
// (exit 1, which recovery takes for "no such timeline").
func TestWALFetchServesHistoryFiles(t *testing.T) {
	sk := harness.StartSafekeeper(t, 1)
	addrs, timeline := []string{sk.Addr}, proto.ID{0xbb, 1}
	switchAt, end, hist2 := promoteOnce(t, sk)
	if r := walFetch(t, addrs, timeline, "00000002.history"); r.code != 0 || !bytes.Equal(r.data, hist2) {
		t.Fatalf("00000002.history on timeline 2: exit %d, %q; want %q\n%s", r.code, r.data, hist2, r.stderr)
	}
	// A second promotion: PostgreSQL timeline 3, term 3.
	hist3 := append(append(bytes.Clone(hist2), '\n'), fmt.Sprintf("2\t%s\tno recovery target specified\n", end)...)
	p := dial(t, sk, 1)
	p.info.PgTimeline, p.info.ProposerUUID, p.info.WalEnd = 3, proto.ID{0xcc, 3}, end
	p.greet()
	p.send(&proto.TimelineHistory{PgTimeline: 3, Content: hist3})
	p.vote(node(3, 3))
	p.elected(end, hist(1, uint64(tlStart), 2, uint64(switchAt), 3, uint64(end)))
	pushWAL(t, p, xlogtest.NewGenerator(end, segSize, 3, sysID), end, 5)
	for _, tc := range []struct {
		name string
		want []byte
	}{{"00000003.history", hist3}, {"00000002.history", hist2}} {
		if r := walFetch(t, addrs, timeline, tc.name); r.code != 0 || !bytes.Equal(r.data, tc.want) {
			t.Errorf("%s on timeline 3: exit %d, %q; want %q\n%s", tc.name, r.code, r.data, tc.want, r.stderr)
		}
	}
	for _, name := range []string{"00000001.history", "00000004.history"} {
		if r := walFetch(t, addrs, timeline, name); r.code != 1 || r.data != nil {
			t.Errorf("%s on timeline 3: exit %d, wrote %d bytes; want exit 1 and nothing\n%s", name, r.code, len(r.data), r.stderr)
		}
	}
}
