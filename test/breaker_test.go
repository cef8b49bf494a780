package test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/test/harness"
)

// TestDiskBreakerRefusesBeforeTheDiskIsFull: a safekeeper on a 64 MiB
// tmpfs with --min-free-disk 8MB takes WAL until the file system's free
// space falls below the reserve, then refuses more with FATAL 53100 while
// space is still left (storage never meets ENOSPC); readers are still
// served every acknowledged byte; once space is freed, a proposer's next
// connection is taken again without a restart.
func TestDiskBreakerRefusesBeforeTheDiskIsFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts a tmpfs and must run as root (CI does)")
	}
	mnt := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v\n%s", err, out)
	}
	var sk *harness.Safekeeper
	t.Cleanup(func() {
		if sk != nil {
			sk.Kill()
		}
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount: %v\n%s", err, out)
		}
	})
	free := func() uint64 {
		var fs unix.Statfs_t
		if err := unix.Statfs(mnt, &fs); err != nil {
			t.Fatal(err)
		}
		return fs.Bavail * uint64(fs.Bsize)
	}
	sk = harness.StartSafekeeper(t, 1, "--min-free-disk", "8MB")
	sk.Kill()
	sk.DataDir = filepath.Join(mnt, "data")
	sk.Start()

	// A filler leaves 16 MiB free.
	filler := filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, free()-16<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startTerm(t, sk, 1, 1)
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	var wal []byte
	acked := tlStart
	var refused *pgconn.PgError
	for i := 0; refused == nil; i++ {
		if i == 200 {
			t.Fatalf("no refusal after %d MiB of WAL; %d bytes free", i/4, free())
		}
		begin := gen.Pos()
		for gen.Pos() < begin+256<<10 {
			gen.Record(8000)
		}
		chunk := gen.Take()
		wal = append(wal, chunk...) // everything sent; acked is a prefix
		for off := 0; off < len(chunk); off += proto.MaxWALPerRequest {
			part := chunk[off:min(off+proto.MaxWALPerRequest, len(chunk))]
			if err := p.c.Send(p.appendReq(begin+proto.LSN(off), part, begin+proto.LSN(off+len(part)))); err != nil {
				break
			}
		}
		end := begin + proto.LSN(len(chunk))
		for acked < end {
			m, err := p.c.Recv(p.ctx)
			if errors.As(err, &refused) {
				break
			}
			if err != nil {
				t.Fatalf("push: %v", err)
			}
			if r, ok := m.(*proto.SafeKeeperResponse); ok && r.FlushLSN > acked {
				acked = r.FlushLSN
			}
		}
	}
	left := free()
	if refused.Code != pgwire.DiskFull || refused.Severity != "FATAL" || !strings.Contains(refused.Message, "below the reserve") {
		t.Fatalf("refusal %s %s %q, want FATAL 53100 naming the reserve", refused.Severity, refused.Code, refused.Message)
	}
	if left == 0 || strings.Contains(sk.Log(), "storage failed") {
		t.Fatalf("the disk filled up (%d bytes free) or storage failed before the breaker tripped:\n%s", left, sk.Log())
	}
	t.Logf("refused at %s with %d bytes still free: %s", acked, left, refused.Message)
	if got := scrapeMetric(t, sk, "safekeeper_disk_breaker_tripped", ""); got != 1 {
		t.Fatalf("safekeeper_disk_breaker_tripped %v", got)
	}
	// `safekeeper status` says that WAL is refused, and why.
	if code, out, stderr := harness.Run(t, "status", "--http", sk.HTTPAddr); code != 0 ||
		!strings.Contains(out, "REFUSED (53100) since") || !strings.Contains(out, "free space below --min-free-disk") || !strings.Contains(out, "below the reserve of 8388608") {
		t.Fatalf("status with the breaker tripped: exit %d, want a line saying WAL is refused for free space below --min-free-disk\n%s%s", code, out, stderr)
	} else {
		t.Logf("safekeeper status with the breaker tripped:\n%s", out)
	}
	// Reads go on: every acknowledged byte is served.
	if got := streamWAL(t, replConn(t, sk, 1), tlStart, acked); !bytes.Equal(got, wal[:acked-tlStart]) {
		t.Fatal("the WAL read back after the refusal differs from what was acknowledged")
	}
	// Space returns: a new proposer connection is taken without a restart.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 10*time.Second, "the breaker to reset", func() bool {
		return scrapeMetric(t, sk, "safekeeper_disk_breaker_tripped", "") == 0
	})
	if code, out, stderr := harness.Run(t, "status", "--http", sk.HTTPAddr); code != 0 || strings.Contains(out, "REFUSED") || !regexp.MustCompile(`(?m)^WAL +taken$`).MatchString(out) {
		t.Fatalf("status after the breaker reset: exit %d, want WAL taken\n%s%s", code, out, stderr)
	}
	p2 := dial(t, sk, 1)
	fresh := p2.greet()
	p2.vote(node(2, 2))
	p2.elected(fresh.FlushLSN, append(fresh.History.Clone(), proto.TermSwitch{Term: 2, StartLSN: fresh.FlushLSN}))
	gen2 := xlogtest.NewGenerator(fresh.FlushLSN, segSize, 1, sysID)
	gen2.Record(4000)
	more := gen2.Take()
	p2.send(p2.appendReq(fresh.FlushLSN, more, fresh.FlushLSN+proto.LSN(len(more))))
	if r := p2.resp(); r.FlushLSN != fresh.FlushLSN+proto.LSN(len(more)) {
		t.Fatalf("after space returned: flush_lsn %s, want %s", r.FlushLSN, fresh.FlushLSN+proto.LSN(len(more)))
	}
}
