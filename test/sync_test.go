package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/tlstest"
)

// TestSyncCopiesDonorWALAndCommitsEverywhere is the disaster-recovery step:
// the primary (here a test proposer) is gone, one safekeeper lags behind the
// other two, and `safekeeper sync` must elect, copy the missing WAL from the
// donor, commit the donor's end of WAL on every reachable safekeeper and
// print it.
func TestSyncCopiesDonorWALAndCommitsEverywhere(t *testing.T) {
	sks := harness.StartSafekeepers(t, 3)
	var ps []*tp
	for _, sk := range sks {
		ps = append(ps, startTerm(t, sk, 1, 1))
	}
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	// WAL every safekeeper gets, committed.
	_, end1 := gen.Record(100)
	for i := 0; i < 30; i++ {
		_, end1 = gen.Record(3000 + i*500)
	}
	common := gen.Take()
	for _, p := range ps {
		p.send(p.appendReq(tlStart, common[:min(len(common), proto.MaxWALPerRequest)], 0))
		for off := proto.MaxWALPerRequest; off < len(common); off += proto.MaxWALPerRequest {
			p.send(p.appendReq(tlStart+proto.LSN(off), common[off:min(len(common), off+proto.MaxWALPerRequest)], end1))
		}
	}
	// More WAL, only on safekeepers 1 and 2 (3 is partitioned away), never
	// committed before the primary is lost: flush_lsn differs, commit lags.
	var end2 proto.LSN
	for i := 0; i < 200; i++ {
		_, end2 = gen.Record(2000 + i*37%9000)
	}
	more := gen.Take()
	for _, p := range ps[:2] {
		for off := 0; off < len(more); off += proto.MaxWALPerRequest {
			p.send(p.appendReq(end1+proto.LSN(off), more[off:min(len(more), off+proto.MaxWALPerRequest)], end1))
		}
	}
	for i, p := range ps {
		want := end2
		if i == 2 {
			want = end1
		}
		harness.WaitFor(t, 30*time.Second, "appends acknowledged", func() bool { return p.resp().FlushLSN >= want })
		p.c.Close()
	}

	addrs := harness.Addrs(sks)
	cmd := exec.CommandContext(harness.Context(t, 2*time.Minute), harness.Binary(t), "sync", "--safekeepers", strings.Join(addrs, ","),
		"--tenant-id", tenant(1).String(), "--timeline-id", proto.ID{0xbb, 1}.String(), "--timeout", "60s")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("sync: %v\n%s", err, stderr.String())
	}
	got, err := proto.ParseLSN(strings.TrimSpace(stdout.String()))
	if err != nil || got != end2 {
		t.Fatalf("sync printed %q, want %v\n%s", stdout.String(), end2, stderr.String())
	}
	// Again, with --json: the same commit_lsn, as "X/X".
	js, err := exec.CommandContext(harness.Context(t, 2*time.Minute), harness.Binary(t), "sync", "--json", "--safekeepers", strings.Join(addrs, ","),
		"--tenant-id", tenant(1).String(), "--timeline-id", proto.ID{0xbb, 1}.String(), "--timeout", "60s").Output()
	var res struct {
		CommitLSN  string `json:"commit_lsn"`
		TimelineID string `json:"timeline_id"`
	}
	if err != nil || json.Unmarshal(js, &res) != nil || res.CommitLSN != end2.String() || res.TimelineID != (proto.ID{0xbb, 1}).String() {
		t.Fatalf("sync --json: %v %q", err, js)
	}
	// Every safekeeper, the lagging one included, holds and commits end2.
	for i, sk := range sks {
		g := dial(t, sk, 1).greet()
		if g.FlushLSN != end2 || g.CommitLSN != end2 {
			t.Fatalf("safekeeper %d after sync: flush %v commit %v, want both %v", i+1, g.FlushLSN, g.CommitLSN, end2)
		}
	}
	// The copied bytes are the donor's: export safekeeper 3 and compare.
	if err := sks[2].Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	exp := exec.CommandContext(harness.Context(t, 2*time.Minute), harness.Binary(t), "wal", "export", "--data-dir", sks[2].DataDir,
		"--tenant-id", tenant(1).String(), "--timeline-id", proto.ID{0xbb, 1}.String(), "--output", out)
	if b, err := exp.CombinedOutput(); err != nil {
		t.Fatalf("wal export: %v\n%s", err, b)
	}
	var exported []byte
	for seg := tlStart; seg < end2; seg += segSize {
		name := proto.SegmentFileName(1, seg, segSize)
		b, err := os.ReadFile(filepath.Join(out, name))
		if os.IsNotExist(err) {
			b, err = os.ReadFile(filepath.Join(out, name+".partial"))
		}
		if err != nil {
			t.Fatal(err)
		}
		exported = append(exported, b...)
	}
	want := append(append([]byte(nil), common...), more...)
	if !bytes.Equal(exported[:len(want)], want) {
		t.Fatal("safekeeper 3's WAL after sync differs from the donor's")
	}
}

func TestSyncWithoutQuorumFailsClearly(t *testing.T) {
	sks := harness.StartSafekeepers(t, 3)
	p := startTerm(t, sks[0], 1, 1)
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	_, end := gen.Record(100)
	p.send(p.appendReq(tlStart, gen.Take(), 0))
	if r := p.resp(); r.FlushLSN != end {
		t.Fatalf("flush %v", r.FlushLSN)
	}
	p.c.Close()
	sks[1].Kill()
	sks[2].Kill()
	cmd := exec.CommandContext(harness.Context(t, 2*time.Minute), harness.Binary(t), "sync", "--safekeepers", sks[0].Addr+","+sks[1].Addr+","+sks[2].Addr,
		"--tenant-id", tenant(1).String(), "--timeline-id", proto.ID{0xbb, 1}.String(), "--timeout", "3s")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil || cmd.ProcessState.ExitCode() != 1 {
		t.Fatalf("sync without a quorum: %v (exit %d), want exit 1\n%s", err, cmd.ProcessState.ExitCode(), stderr.String())
	}
	if stdout.Len() != 0 || !strings.Contains(stderr.String(), "no quorum") {
		t.Fatalf("stdout %q stderr %q: want nothing on stdout and a message naming the missing quorum", stdout.String(), stderr.String())
	}

	// A safekeeper that refuses every attempt (--tls-required, and sync
	// connects in plaintext): the message at the timeout names its last
	// refusal, SQLSTATE and text, not only the count of greetings.
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir)
	cert, key := filepath.Join(dir, "sk.crt"), filepath.Join(dir, "sk.key")
	ca.Issue(t, "sk", cert, key)
	tlsSK := harness.StartSafekeeper(t, 4, "--tls-cert", cert, "--tls-key", key, "--tls-required")
	cmd = exec.CommandContext(harness.Context(t, 2*time.Minute), harness.Binary(t), "sync", "--safekeepers", tlsSK.Addr,
		"--tenant-id", tenant(1).String(), "--timeline-id", proto.ID{0xbb, 9}.String(), "--create",
		"--system-id", strconv.FormatUint(sysID, 10), "--wal-seg-size", strconv.Itoa(segSize), "--timeout", "2s")
	stdout.Reset()
	stderr.Reset()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Run()
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	msg := lines[len(lines)-1] // the error; the lines before are the log
	if code := cmd.ProcessState.ExitCode(); code != 1 || stdout.Len() != 0 || !strings.Contains(msg, "no quorum") ||
		!strings.Contains(msg, tlsSK.Addr+": 28000 ") || !strings.Contains(msg, "no encryption") || len(msg) > 500 {
		t.Fatalf("sync against a safekeeper that requires TLS: exit %d, stdout %q, last line %q; want exit 1 and one short line naming %s, its 28000 and its text\n%s",
			code, stdout.String(), msg, tlsSK.Addr, stderr.String())
	}
}

// timelineStatus runs TIMELINE_STATUS on sk for tenant(1)/tl, or, with tl
// 0, IDENTIFY_SYSTEM without naming a timeline (a client relying on the
// safekeeper's only timeline).
func timelineStatus(t *testing.T, sk *harness.Safekeeper, tl byte) error {
	t.Helper()
	ctx := harness.Context(t, 10*time.Second)
	host, port, _ := net.SplitHostPort(sk.Addr)
	connStr := fmt.Sprintf("host=%s port=%s user=test sslmode=disable replication=true", host, port)
	query := "IDENTIFY_SYSTEM"
	if tl != 0 {
		connStr += fmt.Sprintf(" options='-c tenant_id=%s -c timeline_id=%s'", tenant(1), proto.ID{0xbb, tl})
		query = "TIMELINE_STATUS"
	}
	c, err := pgconn.Connect(ctx, connStr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, query).ReadAll()
	return err
}

// TestSyncDoesNotCreateTimelines: sync with --system-id and a mistyped
// --timeline-id must not create that timeline on the safekeepers (clients
// relying on "the only timeline" would break) but fail, naming the timeline
// and the safekeepers asked; --create initialises a brand-new timeline.
func TestSyncDoesNotCreateTimelines(t *testing.T) {
	sks := harness.StartSafekeepers(t, 3)
	for _, sk := range sks {
		startTerm(t, sk, 1, 1).c.Close()
	}
	addrs := strings.Join(harness.Addrs(sks), ",")
	sync := func(extra ...string) (stdout, stderr string, code int) {
		args := append([]string{"sync", "--safekeepers", addrs, "--tenant-id", tenant(1).String(),
			"--timeline-id", proto.ID{0xbb, 2}.String(), "--system-id", strconv.FormatUint(sysID, 10),
			"--wal-seg-size", strconv.Itoa(segSize), "--timeout", "20s"}, extra...)
		cmd := exec.CommandContext(harness.Context(t, 2*time.Minute), harness.Binary(t), args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		cmd.Run()
		return out.String(), errb.String(), cmd.ProcessState.ExitCode()
	}

	stdout, stderr, code := sync()
	if code != 4 || stdout != "" {
		t.Fatalf("sync of a timeline no safekeeper holds: exit %d, stdout %q, want exit 4 (refused for good) and nothing printed\n%s", code, stdout, stderr)
	}
	for _, want := range []string{tenant(1).String() + "/" + proto.ID{0xbb, 2}.String(), sks[0].Addr, sks[1].Addr, sks[2].Addr, "--create"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("sync's message does not name %q:\n%s", want, stderr)
		}
	}
	var pe *pgconn.PgError
	for _, sk := range sks {
		if err := timelineStatus(t, sk, 2); !errors.As(err, &pe) || pe.Code != "42704" {
			t.Fatalf("safekeeper %d after the refused sync: TIMELINE_STATUS of the mistyped timeline: %v, want it not to exist", sk.ID, err)
		}
		if err := timelineStatus(t, sk, 0); err != nil {
			t.Fatalf("safekeeper %d after the refused sync: a client relying on the only timeline fails: %v", sk.ID, err)
		}
	}

	stdout, stderr, code = sync("--create")
	if code != 0 || strings.TrimSpace(stdout) != "0/0" {
		t.Fatalf("sync --create of a new timeline: exit %d, stdout %q, want exit 0 and 0/0\n%s", code, stdout, stderr)
	}
	// sync returns once a quorum holds the (empty) timeline; the third
	// safekeeper may not have been greeted yet.
	var holders []string
	for _, sk := range sks {
		err := timelineStatus(t, sk, 2)
		if err == nil {
			holders = append(holders, sk.Addr)
		} else if !errors.As(err, &pe) || pe.Code != "42704" {
			t.Fatalf("safekeeper %d after sync --create: TIMELINE_STATUS: %v", sk.ID, err)
		}
	}
	if len(holders) < 2 {
		t.Fatalf("after sync --create only %v hold the timeline; want a quorum of 3", holders)
	}
}

// TestSyncRefusesWhileAProposerStreams: sync would depose a live proposer
// and leave the primary's commits waiting, so it refuses (exit 1, naming
// the proposer) while one streamed within the lease over an open
// connection; --force runs it anyway.
func TestSyncRefusesWhileAProposerStreams(t *testing.T) {
	sks := harness.StartSafekeepers(t, 3)
	var ps []*tp
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	_, end := gen.Record(500)
	wal := gen.Take()
	for _, sk := range sks {
		p := startTerm(t, sk, 1, 1)
		p.send(p.appendReq(tlStart, wal, end))
		if r := p.resp(); r.FlushLSN != end {
			t.Fatalf("flush %v, want %v", r.FlushLSN, end)
		}
		ps = append(ps, p)
	}
	addrs := strings.Join(harness.Addrs(sks), ",")
	sync := func(extra ...string) (int, string, string) {
		cmd := exec.CommandContext(harness.Context(t, 2*time.Minute), harness.Binary(t), append([]string{"sync", "--safekeepers", addrs,
			"--tenant-id", tenant(1).String(), "--timeline-id", proto.ID{0xbb, 1}.String(), "--timeout", "30s"}, extra...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.Run()
		return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
	}
	proposerAddr := ps[0].c.NetConn().LocalAddr().String()
	code, stdout, stderr := sync()
	if code != 1 || stdout != "" || !strings.Contains(stderr, "a proposer is streaming to the timeline") || !strings.Contains(stderr, "--force") {
		t.Fatalf("sync with a live proposer: exit %d, stdout %q; want exit 1 naming it and --force\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "term 1") || !strings.Contains(stderr, strings.Split(proposerAddr, ":")[0]) {
		t.Errorf("the refusal does not name the proposer (term 1, %s): %s", proposerAddr, stderr)
	}
	// Nothing changed: the proposer still owns term 1 everywhere.
	for i, sk := range sks {
		if g := dial(t, sk, 1).greet(); g.VotedFor.Term != 1 {
			t.Fatalf("safekeeper %d voted for term %d after a refused sync", i+1, g.VotedFor.Term)
		}
	}
	code, stdout, stderr = sync("--force")
	if got, err := proto.ParseLSN(strings.TrimSpace(stdout)); code != 0 || err != nil || got != end {
		t.Fatalf("sync --force: exit %d, printed %q; want %v\n%s", code, stdout, end, stderr)
	}
}
