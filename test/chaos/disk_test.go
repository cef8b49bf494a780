package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// TestDiskStaysBoundedWithStandbysReading: a stock deployment — a hot
// standby streaming from safekeeper 1, pg_receivewal from safekeeper 2, no
// pageserver-style consumer — under transfers and a pg_switch_wal loop
// that writes hundreds of 1 MiB segments. With --wal-keep-size 4MB every
// safekeeper removes WAL as it goes: what it keeps below commit_lsn stays
// within wal_keep_size plus a few segments, its database file stops
// growing, TIMELINE_STATUS names the bound, both readers keep up, a reader
// resuming at a retained LSN is served and one below it gets 58P01 naming
// the segment.
func TestDiskStaysBoundedWithStandbysReading(t *testing.T) {
	skipShort(t)
	rng := newRand(t)
	const keep = 4 << 20
	c := startCluster(t, options{skArgs: []string{"--wal-keep-size", "4MB", "--retention-interval", "100ms"},
		conf: []string{"wal_keep_size = 0", "max_wal_size = '64MB'", "min_wal_size = '32MB'"}})
	b := newBank(t, c.pg)
	sb := c.startStandby(c.sks[0])
	recv := startReceiveWAL(t, c, c.sks[1])
	b.start(2, rng)
	seg := proto.LSN(c.pg.WALSegSize)

	// switchSegments ends n segments with pg_switch_wal (each is 1 MiB of
	// WAL to stream and store) and waits until every safekeeper committed.
	switchSegments := func(n int) proto.LSN {
		t.Helper()
		for i := 0; i < n; i++ {
			c.pg.Exec(t, "INSERT INTO transfers VALUES (-"+strconv.Itoa(int(rng.Uint32()>>1))+", 0, 0, 0) ON CONFLICT DO NOTHING")
			c.pg.Exec(t, "SELECT pg_switch_wal()")
		}
		end := c.flushLSN()
		c.waitCommitted(end, 120*time.Second)
		return end
	}
	dbSize := func(sk *harness.Safekeeper) int64 {
		fi, err := os.Stat(filepath.Join(sk.DataDir, "safekeeper.db"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	checkBounded := func(when string) map[int]proto.LSN {
		t.Helper()
		removed := map[int]proto.LSN{}
		for i, sk := range c.sks {
			var row map[string]string
			harness.WaitFor(t, 30*time.Second, fmt.Sprintf("safekeeper %d to remove WAL below its wal_keep_size (%s)", i+1, when), func() bool {
				row = statusRow(t, sk.Addr)
				commit, _ := proto.ParseLSN(row["commit_lsn"])
				rm, _ := proto.ParseLSN(row["removed_up_to"])
				removed[i] = rm
				return rm > 0 && commit-rm <= keep+3*seg
			})
			t.Logf("%s: safekeeper %d keeps %s..%s (bounded by %s; horizon %s), database %d MiB",
				when, i+1, row["removed_up_to"], row["commit_lsn"], row["retention_reason"], row["retention_horizon"], dbSize(sk)>>20)
		}
		return removed
	}

	switchSegments(60)
	checkBounded("after 60 segments")
	sizes := map[int]int64{}
	for i, sk := range c.sks {
		sizes[i] = dbSize(sk)
	}
	end := switchSegments(200)
	removed := checkBounded("after 260 segments")
	// Bounded: 200 MiB of WAL went through, and the file may have grown by
	// one of bbolt's steps (16 MiB here: pages that retention freed while
	// a reader's transaction was open cannot be reused until it ends, and
	// a loaded machine keeps readers open longer), not with the WAL.
	for i, sk := range c.sks {
		if now := dbSize(sk); now > 2*sizes[i]+8<<20 {
			t.Errorf("safekeeper %d: database grew from %d to %d MiB over 200 more segments: not bounded", i+1, sizes[i]>>20, now>>20)
		}
	}

	// Both readers kept up, so they were never cut off.
	sb.WaitReplay(t, end.String(), replayTimeout)
	recv.waitSegment(t, end-seg)

	// Resuming at a retained LSN is served; below it, 58P01 naming it.
	// The workers stop first, so the horizon stays where it is read.
	b.stopAndReport()
	sk := c.sks[2]
	// One segment above the horizon is well inside what is kept (wal_keep_size
	// is 4 segments and commit_lsn no longer moves); one below was removed.
	rm, _ := proto.ParseLSN(statusRow(t, sk.Addr)["removed_up_to"])
	if rm < removed[2] {
		t.Fatalf("removed_up_to went back from %s to %s", removed[2], rm)
	}
	at := rm + seg
	if got := startAt(t, sk, at); got != "" {
		t.Fatalf("START_REPLICATION at the retained %s: %s", at, got)
	}
	gone := rm - seg
	want := fmt.Sprintf("requested WAL segment %s has already been removed", proto.SegmentFileName(1, gone, uint64(seg)))
	if got := startAt(t, sk, gone); got != "58P01 "+want {
		t.Fatalf("START_REPLICATION at the removed %s: %q, want 58P01 %q", gone, got, want)
	}
	// The transfers acknowledged after end reach the standby too: wait
	// for it to replay the primary's WAL as of the workers' stop.
	sb.WaitReplay(t, c.flushLSN().String(), replayTimeout)
	acked, _ := b.snapshot()
	b.check(t, "standby fed by safekeeper 1", func(sql string) string { return sb.Exec(t, sql) }, acked)
	// A standby and pg_receivewal under load report nothing past the WAL.
	for i, sk := range c.sks {
		if strings.Contains(sk.Log(), "reported a position past") {
			t.Errorf("safekeeper %d warned about a stock client's report:\n%s", i+1, harness.LastLine(sk.Log(), "reported a position past"))
		}
	}
}

// replConn opens a replication connection to a safekeeper for the
// cluster's timeline; it is closed at the end of the test.
func replConn(t *testing.T, addr string) *pgconn.PgConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	host, port, _ := strings.Cut(addr, ":")
	conn, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=postgres sslmode=disable replication=true options='-c tenant_id=%s -c timeline_id=%s'",
		host, port, tenantID, timelineID))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// statusRow reads a safekeeper's TIMELINE_STATUS as text by column name.
func statusRow(t *testing.T, addr string) map[string]string {
	t.Helper()
	conn := replConn(t, addr)
	defer conn.Close(context.Background())
	return harness.StatusRow(t, conn)
}

// startAt starts a stream at l and returns "" once WAL arrives, or the
// error's "SQLSTATE message".
func startAt(t *testing.T, sk *harness.Safekeeper, l proto.LSN) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := replConn(t, sk.Addr)
	defer conn.Close(context.Background())
	conn.Frontend().Send(&pgproto3.Query{String: fmt.Sprintf("START_REPLICATION PHYSICAL %s TIMELINE 1", l)})
	if err := conn.Frontend().Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := conn.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) > 0 && m.Data[0] == 'w' {
				return ""
			}
		case *pgproto3.ErrorResponse:
			return m.Code + " " + m.Message
		}
	}
}

// receiver is pg_receivewal streaming from a safekeeper into a directory.
type receiver struct {
	dir string
	seg uint64
}

func startReceiveWAL(t *testing.T, c *cluster, sk *harness.Safekeeper) *receiver {
	t.Helper()
	r := &receiver{dir: pgtest.Dir(t, "chaos-recv-"), seg: c.pg.WALSegSize}
	host, port, _ := strings.Cut(sk.Addr, ":")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := c.pg.Cmd(ctx, "pg_receivewal", "-D", r.dir, "-h", host, "-p", port, "-U", "postgres", "-d",
		fmt.Sprintf("options='-c tenant_id=%s -c timeline_id=%s'", tenantID, timelineID))
	var out harness.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if t.Failed() {
			t.Logf("pg_receivewal output:\n%s", harness.Tail(out.String(), 20))
		}
	})
	return r
}

// waitSegment waits until pg_receivewal has completed the segment holding l.
func (r *receiver) waitSegment(t *testing.T, l proto.LSN) {
	t.Helper()
	name := proto.SegmentFileName(1, l, r.seg)
	harness.WaitFor(t, 120*time.Second, "pg_receivewal to complete "+name, func() bool {
		_, err := os.Stat(filepath.Join(r.dir, name))
		return err == nil
	})
}
