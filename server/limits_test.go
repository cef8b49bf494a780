package server

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
)

// TestTimelineAndSlotLimits: a greeting that would create a timeline past
// MaxTimelines gets 53400 and creates nothing; a slot past MaxSlots gets
// 53400 "all replication slots are in use", temporary ones counted; both
// are counted in safekeeper_refused_total.
func TestTimelineAndSlotLimits(t *testing.T) {
	s := startTestServer(t, t.TempDir(), func(c *Config) { c.MaxTimelines, c.MaxSlots = 2, 2 })
	addr := s.Addr().String()
	newTestPush(t, addr, proto.ID{0xbb, 1}, 1, hist1(tStart), tStart)
	newTestPush(t, addr, proto.ID{0xbb, 2}, 1, hist1(tStart), tStart)
	ctx := testCtx(t)
	c, err := proposer.Dial(ctx, proposer.DialConfig{AllowTimelineCreation: true, Addr: addr, TenantID: tTenant, TimelineID: proto.ID{0xbb, 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
		TimelineID: proto.ID{0xbb, 3}, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xcc}})
	_, err = c.Recv(ctx)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != pgwire.ConfigurationLimitExceeded {
		t.Fatalf("third timeline: %v, want 53400", err)
	}
	if keys, _ := s.db.Timelines(); len(keys) != 2 {
		t.Fatalf("timelines stored: %v", keys)
	}
	rc := replConnect(t, addr, false, "-c tenant_id="+tTenant.String()+" -c timeline_id="+proto.ID{0xbb, 1}.String())
	if _, err := exec(t, rc, `CREATE_REPLICATION_SLOT "a" PHYSICAL`); err != nil {
		t.Fatal(err)
	}
	if _, err := exec(t, rc, `CREATE_REPLICATION_SLOT "b" TEMPORARY PHYSICAL`); err != nil {
		t.Fatal(err)
	}
	_, err = exec(t, rc, `CREATE_REPLICATION_SLOT "c" PHYSICAL`)
	if e := wantCode(t, err, pgwire.ConfigurationLimitExceeded); e.Message != "all replication slots are in use" || e.Hint == "" {
		t.Fatalf("third slot: %+v", e)
	}
	if _, err := exec(t, rc, `DROP_REPLICATION_SLOT "a"`); err != nil {
		t.Fatal(err)
	}
	if _, err := exec(t, rc, `CREATE_REPLICATION_SLOT "c" PHYSICAL`); err != nil {
		t.Fatalf("a slot after one was dropped: %v", err)
	}
	if n := refused(s, "timelines"); n != 1 {
		t.Errorf("refused timelines %v", n)
	}
	if n := refused(s, "slots"); n != 1 {
		t.Errorf("refused slots %v", n)
	}
}

// TestAutoDiskReserve: --min-free-disk auto keeps 2% of the file system,
// at most 1 GiB, but at least twice the WAL buffer (what is written after
// the breaker trips), that floor at most a quarter of the file system.
func TestAutoDiskReserve(t *testing.T) {
	const (
		mib    = 1 << 20
		gib    = 1 << 30
		buffer = 32 * mib // Config.MaxBufferedWAL's default
	)
	for _, c := range []struct {
		name   string
		total  uint64
		buffer int64
		want   uint64
	}{
		{"empty", 0, buffer, 0},
		{"a 16 MiB tmpfs: a quarter", 16 * mib, buffer, 4 * mib},
		{"a 64 MiB tmpfs: a quarter, not 2% (1.3 MiB)", 64 * mib, buffer, 16 * mib},
		{"256 MiB: the quarter meets twice the buffer", 256 * mib, buffer, 64 * mib},
		{"1 GiB: twice the buffer, not 2% (20 MiB)", gib, buffer, 64 * mib},
		{"3200 MiB: 2% is twice the buffer", 3200 * mib, buffer, 64 * mib},
		{"10 GiB: 2%", 10 * gib, buffer, 10 * gib / 50},
		{"50 GiB: 2% is 1 GiB", 50 * gib, buffer, gib},
		{"1 TiB: at most 1 GiB", 1024 * gib, buffer, gib},
		{"a larger buffer raises the floor", 10 * gib, 256 * mib, 512 * mib},
		{"a buffer above 1 GiB: the floor wins over the cap", 1024 * gib, 2 * gib, 4 * gib},
	} {
		if got := autoDiskReserve(c.total, c.buffer); got != c.want {
			t.Errorf("%s: autoDiskReserve(%d, %d) = %d, want %d", c.name, c.total, c.buffer, got, c.want)
		}
	}
}

// tryPush sends n records of size bytes as WAL and reads the answers; it
// returns the first error (a refusal ends the connection).
func tryPush(p *testPush, n, size int) error {
	for i := 0; i < n; i++ {
		p.gen.Record(size)
	}
	wal := p.gen.Take()
	reqs := 0
	for off := 0; off < len(wal); off += proto.MaxWALPerRequest {
		chunk := wal[off:min(off+proto.MaxWALPerRequest, len(wal))]
		err := p.c.Send(&proto.SafeKeeperRequest{Sender: p.ballot, BeginLSN: p.pos, EndLSN: p.pos + lsn(len(chunk)), CommitLSN: p.pos + lsn(len(chunk)), WAL: chunk})
		if err != nil {
			break // the refusal is read below
		}
		p.pos += lsn(len(chunk))
		reqs++
	}
	for i := 0; i < max(reqs, 1); i++ {
		if _, err := p.c.Recv(p.ctx); err != nil {
			return err
		}
	}
	return nil
}

// TestDiskBreakerCountsFreePagesInsideTheFile: bbolt's file never
// shrinks. With --max-disk-usage reached, or the file system's free space
// below the reserve, the breaker refuses WAL (53100) and /readyz answers
// 503; after the timeline is deleted its pages are free inside the file
// (which is as large as before), and they count as free: the breaker
// resets, /readyz is 200 again and another timeline takes WAL.
func TestDiskBreakerCountsFreePagesInsideTheFile(t *testing.T) {
	const limit = 4 << 20
	// diskOf2Limits is a file system of 2×limit holding the database file
	// alone.
	diskOf2Limits := func(dir string, fs *unix.Statfs_t) error {
		fs.Bsize, fs.Blocks, fs.Bavail = 1, 2*limit, 2*limit
		if fi, err := os.Stat(filepath.Join(dir, "safekeeper.db")); err == nil {
			fs.Bavail -= uint64(min(fi.Size(), 2*limit))
		}
		return nil
	}
	// walRefused is GET /v1/status's wal_refused: the breaker's reason and
	// since when, null while WAL is taken.
	type walRefused struct {
		Reason, Detail string
		Since          time.Time
	}
	walRefusedOf := func(t *testing.T, base string) *walRefused {
		t.Helper()
		var st struct {
			WALRefused *walRefused `json:"wal_refused"`
		}
		if code := getJSON(t, base+"/v1/status", &st); code != http.StatusOK {
			t.Fatalf("/v1/status: %d", code)
		}
		return st.WALRefused
	}
	for _, c := range []struct {
		name   string
		tweak  func(*Config)
		h      hooks
		reason string // /v1/status wal_refused.reason while tripped
		detail string // in its detail
	}{
		{"max-disk-usage", func(c *Config) { c.MaxDiskUsage, c.MinFreeDisk = limit, -1 }, hooks{}, "max_disk_usage", "at --max-disk-usage 4194304"},
		{"min-free-disk", func(c *Config) { c.MinFreeDisk = limit }, hooks{statfs: diskOf2Limits}, "min_free_disk", "below the reserve of 4194304 (--min-free-disk)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startHookedServer(t, t.TempDir(), func(cfg *Config) {
				cfg.ListenHTTP = "127.0.0.1:0"
				c.tweak(cfg)
			}, c.h)
			base := "http://" + s.HTTPAddr().String()
			addr := s.Addr().String()
			var e map[string]string
			if code := getJSON(t, base+"/readyz", &e); code != http.StatusOK {
				t.Fatalf("/readyz before any WAL: %d %v", code, e)
			}
			if r := walRefusedOf(t, base); r != nil {
				t.Fatalf("/v1/status before any WAL: wal_refused %+v, want null", r)
			}
			before := time.Now()
			p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
			var err error
			for i := 0; err == nil; i++ {
				if i == 64 {
					t.Fatalf("no refusal after %d MiB of WAL; file %d bytes", i/4, s.db.FileSize())
				}
				err = tryPush(p, 32, 8000)
			}
			wantCode(t, err, pgwire.DiskFull)
			size := s.db.FileSize()
			if code := getJSON(t, base+"/readyz", &e); code != http.StatusServiceUnavailable || e["code"] != "disk_full" {
				t.Fatalf("/readyz with the breaker tripped: %d %v, want 503 disk_full", code, e)
			}
			if r := walRefusedOf(t, base); r == nil || r.Reason != c.reason || !strings.Contains(r.Detail, c.detail) ||
				r.Since.Before(before.Add(-time.Second)) || r.Since.After(time.Now()) {
				t.Fatalf("/v1/status with the breaker tripped: wal_refused %+v, want reason %s, %q in its detail and a time since the test began", r, c.reason, c.detail)
			}
			url := fmt.Sprintf("%s/v1/tenant/%s/timeline/%s?force=true", base, tTenant, tTimeline)
			if code := httpDo(t, "DELETE", url, nil); code != http.StatusOK {
				t.Fatalf("DELETE: %d", code)
			}
			s.checkDisk() // as watchDisk does every diskCheckInterval
			if s.disk.tripped.Load() {
				t.Fatalf("the breaker is still tripped after the delete: %s (file %d bytes, %d reusable)", s.disk.refusal.Load().why, s.db.FileSize(), s.db.ReusableBytes())
			}
			if s.db.FileSize() < size {
				t.Fatalf("the file shrank from %d to %d bytes: the test no longer checks free pages", size, s.db.FileSize())
			}
			if code := getJSON(t, base+"/readyz", &e); code != http.StatusOK {
				t.Fatalf("/readyz after the delete: %d %v", code, e)
			}
			if r := walRefusedOf(t, base); r != nil {
				t.Fatalf("/v1/status after the delete: wal_refused %+v, want null", r)
			}
			p2 := newTestPush(t, addr, proto.ID{0xbb, 2}, 1, hist1(tStart), tStart)
			if err := tryPush(p2, 32, 8000); err != nil {
				t.Fatalf("WAL after the delete: %v", err)
			}
		})
	}
}

// refused is safekeeper_refused_total{reason} of s.
func refused(s *Server, reason string) float64 {
	return testutil.ToFloat64(s.metrics.Timelines().Refused.WithLabelValues(reason))
}
