package server

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
)

// slotPush is a test proposer stream that syncs slots: greeted, its first
// slot table read (it follows the greeting's answer).
func slotPush(t *testing.T, addr string) (*testPush, proto.SlotTable) {
	t.Helper()
	ctx := testCtx(t)
	c, err := proposer.Dial(ctx, proposer.DialConfig{AllowTimelineCreation: true, SyncSlots: true, Addr: addr, TenantID: tTenant, TimelineID: tTimeline})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p := &testPush{t: t, ctx: ctx, c: c}
	p.send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
		TimelineID: tTimeline, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xcc, 1}, WalEnd: tStart})
	if _, ok := p.recv().(*proto.SafeKeeperInfo); !ok {
		t.Fatal("greeting not answered with SafeKeeperInfo")
	}
	tbl, ok := p.recv().(*proto.SafeKeeperSlots)
	if !ok {
		t.Fatal("the greeting's answer is not followed by the slot table")
	}
	return p, tbl.SlotTable
}

// nextSlots reads the next slot table the safekeeper reports, skipping
// other messages.
func (p *testPush) nextSlots() proto.SlotTable {
	p.t.Helper()
	for {
		if m, ok := p.recv().(*proto.SafeKeeperSlots); ok {
			return m.SlotTable
		}
	}
}

func entryOf(tbl proto.SlotTable, name string) (proto.SlotEntry, bool) {
	for _, e := range tbl.Entries {
		if e.Name == name && !e.Dropped {
			return e, true
		}
	}
	return proto.SlotEntry{}, false
}

// TestSlotTablesOnThePushStream: on a push stream that asked for
// sync_replication_slots the safekeeper reports its persistent slots (not
// temporary ones) right after the greeting's answer and again when they
// change; a merged table from the proposer creates the slots it lacks,
// drops those a tombstone names, moves restart_lsn up and never down, and
// a slot dropped stays dropped when a stale table names it again — after
// a restart too (rule 11). Slots on a stream without the option is 08P01.
func TestSlotTablesOnThePushStream(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, dir, nil)
	addr := s.Addr().String()
	p, first := slotPush(t, addr)
	if len(first.Entries) != 0 {
		t.Fatalf("first table of a new timeline: %+v, want none", first)
	}
	p.elect(1, hist1(tStart), tStart)
	p.push(10, 200, 0)

	c := replConnect(t, addr, false, "")
	must(exec(t, c, "CREATE_REPLICATION_SLOT a PHYSICAL RESERVE_WAL"))
	must(exec(t, c, "CREATE_REPLICATION_SLOT tmp TEMPORARY PHYSICAL"))
	tbl := p.nextSlots()
	a, ok := entryOf(tbl, "a")
	if !ok || a.Incarnation == 0 || a.RestartLSN != tStart || len(tbl.Entries) != 1 {
		t.Fatalf("table after CREATE_REPLICATION_SLOT a: %+v; want a alone (no temporary slot), restart_lsn %s, an incarnation", tbl, tStart)
	}

	// The proposer's merge: a dropped elsewhere, b created elsewhere.
	b := proto.SlotEntry{Name: "b", Incarnation: 77, RestartLSN: tStart + 0x100, RestartTLI: 1}
	p.send(&proto.Slots{SlotTable: proto.SlotTable{Entries: []proto.SlotEntry{{Name: "a", Incarnation: a.Incarnation, Dropped: true}, b}}})
	tbl = p.nextSlots()
	if _, ok := entryOf(tbl, "a"); ok {
		t.Fatalf("a still in the table after its tombstone: %+v", tbl)
	}
	if got, ok := entryOf(tbl, "b"); !ok || got != b {
		t.Fatalf("b in the table: %+v; want %+v", tbl, b)
	}
	if row := oneRow(t, must(exec(t, c, "READ_REPLICATION_SLOT b")), nil, "slot_type", "restart_lsn", "restart_tli"); row[1] != b.RestartLSN.String() {
		t.Fatalf("READ_REPLICATION_SLOT b: %q, want restart_lsn %s", row, b.RestartLSN)
	}
	if row := oneRow(t, must(exec(t, c, "READ_REPLICATION_SLOT a")), nil, "slot_type", "restart_lsn", "restart_tli"); row[0] != "NULL" {
		t.Fatalf("READ_REPLICATION_SLOT a after its tombstone: %q, want no slot", row)
	}

	// restart_lsn only moves up; a stale table does not bring a back.
	lower, higher := b, b
	lower.RestartLSN, higher.RestartLSN = tStart, tStart+0x200
	p.send(&proto.Slots{SlotTable: proto.SlotTable{Entries: []proto.SlotEntry{a, lower}}})
	p.send(&proto.Slots{SlotTable: proto.SlotTable{Entries: []proto.SlotEntry{higher}}})
	tbl = p.nextSlots()
	if got, _ := entryOf(tbl, "b"); got.RestartLSN != higher.RestartLSN {
		t.Fatalf("b after a lower and a higher restart_lsn: %+v, want %s", tbl, higher.RestartLSN)
	}
	if _, ok := entryOf(tbl, "a"); ok {
		t.Fatalf("a stale table brought the dropped slot back: %+v", tbl)
	}

	// After a restart: b is there, a stays dropped.
	p.c.Close()
	shutdown(t, s)
	s = startTestServer(t, dir, nil)
	p, tbl = slotPush(t, s.Addr().String())
	if got, ok := entryOf(tbl, "b"); !ok || got.RestartLSN != higher.RestartLSN {
		t.Fatalf("b after a restart: %+v", tbl)
	}
	p.send(&proto.Slots{SlotTable: proto.SlotTable{Entries: []proto.SlotEntry{a, higher}}})
	// Then one that changes something, so that its report shows the stale
	// table was taken too (tables are taken in order).
	cslot := proto.SlotEntry{Name: "c", Incarnation: 3, RestartLSN: tStart, RestartTLI: 1}
	p.send(&proto.Slots{SlotTable: proto.SlotTable{Entries: []proto.SlotEntry{cslot}}})
	if tbl = p.nextSlots(); len(tbl.Entries) == 0 {
		t.Fatal("no report")
	}
	if _, ok := entryOf(tbl, "c"); !ok {
		t.Fatalf("report after slot c was sent: %+v", tbl)
	}
	if _, ok := entryOf(tbl, "a"); ok {
		t.Fatalf("after a restart a stale table brought the dropped slot a back: %+v", tbl)
	}

	// A stream that did not ask for slot tables may not send one.
	q, err := proposer.Dial(testCtx(t), proposer.DialConfig{Addr: s.Addr().String(), TenantID: tTenant, TimelineID: tTimeline})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
		TimelineID: tTimeline, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xcc, 2}, WalEnd: tStart}); err != nil {
		t.Fatal(err)
	}
	if m, err := q.Recv(testCtx(t)); err != nil {
		t.Fatal(err)
	} else if _, ok := m.(*proto.SafeKeeperInfo); !ok {
		t.Fatalf("greeting answered with %T", m)
	}
	q.Send(&proto.Slots{SlotTable: proto.SlotTable{Entries: []proto.SlotEntry{a}}})
	_, err = q.Recv(testCtx(t))
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != pgwire.ProtocolViolation {
		t.Fatalf("Slots without sync_replication_slots: %v, want 08P01", err)
	}
}

// TestSlotDroppedElsewhereWaitsForItsStreamHere: a slot dropped on
// another safekeeper while a reader streams from it here is not dropped
// under the stream (the WAL it has not confirmed stays held): the slot
// goes, and its tombstone is reported, when the stream ends; a new stream
// meanwhile gets "does not exist".
func TestSlotDroppedElsewhereWaitsForItsStreamHere(t *testing.T) {
	s := startTestServer(t, t.TempDir(), nil)
	addr := s.Addr().String()
	p, _ := slotPush(t, addr)
	p.elect(1, hist1(tStart), tStart)
	p.push(10, 200, 0)
	c := newStream(t, addr)
	must(exec(t, c.c, "CREATE_REPLICATION_SLOT busy PHYSICAL RESERVE_WAL"))
	busy, ok := entryOf(p.nextSlots(), "busy")
	if !ok {
		t.Fatal("slot busy not reported")
	}
	c.start("START_REPLICATION SLOT busy " + tStart.String())
	c.next()

	p.send(&proto.Slots{SlotTable: proto.SlotTable{Entries: []proto.SlotEntry{{Name: "busy", Incarnation: busy.Incarnation, Dropped: true},
		{Name: "marker", Incarnation: 1, RestartLSN: tStart, RestartTLI: 1}}}})
	tbl := p.nextSlots() // taken: the marker is in
	if _, ok := entryOf(tbl, "marker"); !ok {
		t.Fatalf("report after the merge: %+v, want the marker slot", tbl)
	}
	if _, ok := entryOf(tbl, "busy"); !ok {
		t.Fatalf("the slot a reader streams from was dropped under it: %+v", tbl)
	}
	other := replConnect(t, addr, false, "")
	_, err := exec(t, other, "START_REPLICATION SLOT busy "+tStart.String())
	wantCode(t, err, pgwire.UndefinedObject)

	c.c.Close(testCtx(t)) // the stream ends
	for {
		tbl = p.nextSlots()
		if _, ok := entryOf(tbl, "busy"); ok {
			continue
		}
		found := false
		for _, e := range tbl.Entries {
			found = found || (e.Name == "busy" && e.Dropped && e.Incarnation == busy.Incarnation)
		}
		if !found {
			t.Fatalf("after the stream ended: %+v, want busy's tombstone", tbl)
		}
		break
	}
}
