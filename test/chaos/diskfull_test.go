package chaos

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/test/harness"
)

// tmpfsSize is the size of safekeeper 3's data directory in
// TestDiskFullSafekeeperRefusesAndRecovers.
// WAL is never removed here (no consumer reports), so it holds the whole
// run's WAL (about 80 MiB) besides the filler.
const tmpfsSize = "256m"

// mountTmpfs mounts a tmpfs of size at a new directory, unmounted at
// cleanup after stop (which must end every process using it).
func mountTmpfs(t *testing.T, size string, stop func()) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts a tmpfs and must run as root (CI does)")
	}
	mnt := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		stop()
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", mnt, err, out)
		}
	})
	return mnt
}

// fill writes a file in dir until the file system is full and returns its
// path and size.
func fill(t *testing.T, dir string) (string, int64) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	var n int64
	for {
		w, err := f.Write(chunk)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			return path, n
		}
		if err != nil {
			t.Fatalf("fill %s: %v", path, err)
		}
	}
}

// TestDiskFullSafekeeperRefusesAndRecovers: safekeeper 3's data directory
// is a small tmpfs, filled up under load. It must refuse with a clear error
// (a log line; the proposer gets SQLSTATE 58030 or 53100), the other two
// keep the quorum, and once space is freed it recovers by itself (round 1:
// the same process rebuilds its timeline) and catches up. Round 2 also
// checks that it acknowledged nothing it did not write: cut off from the
// proposer while its disk is full, it is killed -9 and restarted on the
// full disk, and the flush_lsn it reported before the kill must not exceed
// what its bbolt file holds after the restart (commit_lsn may: it is
// persisted lazily, as the protocol allows).
func TestDiskFullSafekeeperRefusesAndRecovers(t *testing.T) {
	skipShort(t)
	rng := newRand(t)
	var mnt string
	c := startCluster(t, options{proxies: true, sk3: func(sk *harness.Safekeeper) {
		sk.Kill()
		mnt = mountTmpfs(t, tmpfsSize, sk.Kill)
		sk.DataDir = filepath.Join(mnt, "data")
		// No reserve: this test is about the disk actually filling up
		// (ENOSPC in storage); test/breaker_test.go is about the reserve.
		sk.Args = append(sk.Args, "--min-free-disk", "0")
		sk.Start()
	}})
	sk, proxy := c.sks[2], c.proxies[2]
	b := newBank(t, c.pg)
	b.start(3, rng)
	b.startBig(1, rng)
	c.waitAcked(b, 100, "before the disk fills")

	for round := 1; round <= 2; round++ {
		logFrom, propFrom := len(sk.Log()), len(c.prop.Log())
		filler, size := fill(t, mnt)
		harness.WaitFor(t, 90*time.Second, "safekeeper 3 to log a storage failure", func() bool {
			c.checkProposerAlive()
			return strings.Contains(sk.Log()[logFrom:], "storage failed")
		})
		t.Logf("round %d: %d MiB filler; safekeeper 3: %s", round, size>>20, harness.LastLine(sk.Log(), "storage failed"))
		harness.WaitFor(t, 30*time.Second, "the proposer to get SQLSTATE 58030 or 53100", func() bool {
			l := c.prop.Log()[propFrom:]
			return strings.Contains(l, "58030") || strings.Contains(l, "53100")
		})
		t.Logf("round %d: proposer: %s", round, harness.LastLine(c.prop.Log(), "SQLSTATE 5"))
		c.waitAcked(b, 200, "with safekeeper 3's disk full")

		if round == 2 {
			proxy.Partition(harness.Refuse) // nothing new can reach it
			reported, err := timelineStatus(sk.Addr)
			if err != nil {
				t.Fatal(err)
			}
			sk.Kill()
			sk.Start()
			durable, err := timelineStatus(sk.Addr)
			if err != nil {
				t.Fatal(err)
			}
			// Acknowledged WAL is durable: flush_lsn never goes back.
			// TIMELINE_STATUS reports the commit_lsn held in memory, which
			// a heartbeat moves before it is persisted (lazily, within
			// 100 ms: on a full disk that fails), so commit_lsn may come
			// back lower, as the protocol allows; SafeKeeperResponse
			// reports only the durable one.
			if durable.FlushLSN < reported.FlushLSN {
				t.Errorf("safekeeper 3 reported flush_lsn %s, but after kill -9 its bbolt file holds flush_lsn %s",
					reported.FlushLSN, durable.FlushLSN)
			}
			t.Logf("round 2: reported before kill -9 flush_lsn %s commit_lsn %s; durable after restart on the full disk %s %s",
				reported.FlushLSN, reported.CommitLSN, durable.FlushLSN, durable.CommitLSN)
		}

		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		proxy.Heal()
		c.pg.Exec(t, fmt.Sprintf("INSERT INTO transfers VALUES (%d, 0, 0, 0)", -round))
		mark := c.flushLSN()
		harness.WaitFor(t, 90*time.Second, fmt.Sprintf("safekeeper 3 to recover and reach %s after space returned", mark), func() bool {
			c.checkProposerAlive()
			st, err := timelineStatus(sk.Addr)
			return err == nil && st.CommitLSN >= mark
		})
		t.Logf("round %d: space freed; safekeeper 3 recovered and reached %s", round, mark)
	}
	b.stopAndReport()
	acked, _ := b.snapshot()
	final := c.finish()
	b.check(t, "primary", func(sql string) string { return c.pg.Exec(t, sql) }, acked)
	c.checkSegments(final)
}
