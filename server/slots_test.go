package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/storage"
)

func readSlotRow(t *testing.T, s *Server, name string) string {
	t.Helper()
	c := replConnect(t, s.Addr().String(), false, "")
	row := oneRow(t, must(exec(t, c, "READ_REPLICATION_SLOT "+name)), nil, "slot_type", "restart_lsn", "restart_tli")
	return strings.Join(row, ",")
}

// waitReply sends a standby status update asking for a reply and waits for
// the keepalive answering it: the reader has then handled the update.
func (s *stream) waitReply(write, flush lsn) {
	s.t.Helper()
	s.status(write, flush, true)
	for {
		if k, ok := s.next().(pgwire.PrimaryKeepalive); ok && !k.ReplyRequested {
			return
		}
	}
}

// TestSlotWithoutReservedWALGetsRestartTLI: a slot created without
// RESERVE_WAL (as pg_receivewal --create-slot does) gets restart_lsn from
// the stream's flush reports, and with it restart_tli = the timeline's TLI,
// also after a restart. A flush reported past what was sent moves the slot
// only to the end sent.
func TestSlotWithoutReservedWALGetsRestartTLI(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, dir, nil)
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(10, 1000, 0)
	end := p.pos

	c := newStream(t, addr)
	oneRow(t, must(exec(t, c.c, "CREATE_REPLICATION_SLOT s PHYSICAL")), nil, "slot_name", "consistent_point", "snapshot_name", "output_plugin")
	if got := readSlotRow(t, s, "s"); got != "physical,NULL,NULL" {
		t.Fatalf("new slot %q", got)
	}
	c.start("START_REPLICATION SLOT s " + tStart.String() + " TIMELINE 1")
	c.readWAL(tStart, end)
	c.waitReply(end, end+0x1000000)
	want := "physical," + end.String() + ",1"
	if got := readSlotRow(t, s, "s"); got != want {
		t.Fatalf("slot after a flush report: %q, want %q", got, want)
	}
	shutdown(t, s)
	s = startTestServer(t, dir, nil)
	if got := readSlotRow(t, s, "s"); got != want {
		t.Fatalf("slot after a restart: %q, want %q", got, want)
	}
}

// TestSlotStoredWithoutTLIReadsTimelineTLI: a slot persisted with a valid
// restart_lsn and restart_tli 0 (by a build with the bug above) reads as the
// timeline's TLI.
func TestSlotStoredWithoutTLIReadsTimelineTLI(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, dir, nil)
	newTestPush(t, s.Addr().String(), tTimeline, 1, hist1(tStart), tStart).push(2, 100, 0)
	shutdown(t, s)
	db, err := storage.Open(filepath.Join(dir, "safekeeper.db"), storage.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	tl, _, err := db.OpenTimeline(tTenant, tTimeline)
	if err == nil {
		err = tl.CreateSlot(storage.Slot{Name: "old", RestartLSN: tStart})
	}
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s = startTestServer(t, dir, nil)
	if got, want := readSlotRow(t, s, "old"), "physical,"+tStart.String()+",1"; got != want {
		t.Fatalf("slot stored with restart_tli 0: %q, want %q", got, want)
	}
}

// TestReportedPositionsClampedToWALSent: a reader that started at X and
// was sent WAL up to Y reports ps_applylsn (and the others) far above Y.
// Retention never passes the segment holding Y: a reader cannot have
// stored WAL it was never sent. The proposer is told Y, and a stream from
// a retained LSN below Y still works.
func TestReportedPositionsClampedToWALSent(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(150, 9000, 0) // ~1.3 segments; truncate_lsn 0: nothing removed yet
	y := p.pos
	from := tStart + 1000

	c := newStream(t, addr)
	c.start("START_REPLICATION " + from.String())
	c.readWAL(from, y)
	const bogus = lsn(0xFFFFFFFFFFFF)
	z := pgwire.ConsumerFeedback{ReceivedLSN: bogus, DiskConsistentLSN: bogus, RemoteConsistentLSN: bogus, ReplyTime: 4242}
	c.sendCopy(z.Append(nil))
	c.waitReply(bogus, bogus)
	if r := p.heartbeat(); r.Consumer.ReplyTime != 4242 || r.Consumer.RemoteConsistentLSN != y ||
		r.Consumer.ReceivedLSN != y || r.Consumer.DiskConsistentLSN != y {
		t.Fatalf("consumer feedback relayed as %+v, want every position clamped to %s", r.Consumer, y)
	}
	c.c.Close(context.Background())
	tl := running(s, proto.TimelineKey{TenantID: tTenant, TimelineID: tTimeline})
	waitFor(t, "the reader to leave", func() bool {
		readers, _ := tl.Counts()
		return readers == 0
	})

	// More WAL, committed and on every safekeeper (truncate_lsn): only the
	// consumer's report holds retention now.
	wal2Start := p.pos
	p.truncate = true
	wal2, _ := p.push(300, 9000, 0)
	horizon := y.SegmentStart(tSeg)
	waitFor(t, "removal up to the segment of "+y.String(), func() bool {
		p.heartbeat()
		return statusOf(t, s).RemovedUpTo >= horizon
	})
	s.reg.Retain(tl) // one more pass with every input settled
	if got := statusOf(t, s).RemovedUpTo; got != horizon {
		t.Fatalf("removed_up_to %s, want %s: WAL past what the reader was sent (%s) was removed", got, horizon, y)
	}
	again := newStream(t, addr)
	again.start("START_REPLICATION " + horizon.String())
	if got := again.readWAL(horizon, p.pos); !bytes.Equal(got[wal2Start-horizon:], wal2) {
		t.Fatal("WAL streamed from the retained segment differs")
	}
}

// TestSlotInvalidatedPastMaxSlotWALKeepSize: a slot whose restart_lsn falls
// further behind commit_lsn than MaxSlotWALKeepSize is invalidated, as
// PostgreSQL's max_slot_wal_keep_size: logged, it no longer holds WAL
// (READ_REPLICATION_SLOT shows no restart_lsn), the WAL it held is removed,
// and a stream from its old position gets 58P01.
func TestSlotInvalidatedPastMaxSlotWALKeepSize(t *testing.T) {
	var logs logBuffer
	s := startTestServer(t, t.TempDir(), func(c *Config) {
		c.MaxSlotWALKeepSize = 2 * tSeg
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	addr := s.Addr().String()
	p := newTestPush(t, addr, tTimeline, 1, hist1(tStart), tStart)
	p.push(10, 100, 0) // truncate_lsn 0: nothing removed yet
	c := replConnect(t, addr, false, "")
	if _, err := exec(t, c, `CREATE_REPLICATION_SLOT "old" PHYSICAL (RESERVE_WAL)`); err != nil {
		t.Fatal(err)
	}
	if row := readSlotRow(t, s, "old"); !strings.HasPrefix(row, "physical,"+tStart.String()) {
		t.Fatalf("reserved slot %q", row)
	}
	p.truncate = true
	p.push(500, 9000, 0) // more than 4 segments past the slot
	waitFor(t, "the slot to be invalidated and its WAL removed", func() bool {
		p.heartbeat()
		return statusOf(t, s).RemovedUpTo > tStart && strings.HasPrefix(readSlotRow(t, s, "old"), "physical,NULL")
	})
	if !strings.Contains(logs.String(), "invalidating replication slot") || !strings.Contains(logs.String(), "slot=old") {
		t.Fatalf("the invalidation is not logged:\n%s", logs.String())
	}
	st := newStream(t, addr)
	st.query(fmt.Sprintf("START_REPLICATION SLOT old PHYSICAL %s", tStart))
	st.expect("CopyBothResponse")
	if e := st.expect("ErrorResponse").(*pgproto3.ErrorResponse); e.Code != pgwire.UndefinedFile {
		t.Fatalf("a stream from the invalidated slot's old position: %s %s", e.Code, e.Message)
	}
}
