package timeline

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage"
	"github.com/safekeeper/safekeeper/test/harness"
)

var (
	testTenant   = proto.ID{0xaa, 1}
	testTimeline = proto.ID{0xbb, 1}
)

// TestSlotSaveFailureIsLogged: a slot whose restart_lsn cannot be written
// is logged (not dropped silently) and marked unsaved, so the next save
// tries again.
func TestSlotSaveFailureIsLogged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "safekeeper.db")
	db, err := storage.Open(path, storage.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	st := acceptor.NewState(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: 7300000000000000042,
		TenantID: testTenant, TimelineID: testTimeline, PgTimeline: 1, WalSegSize: 1 << 20})
	tl, err := db.CreateTimeline(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.CreateSlot(storage.Slot{Name: "s1"}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db, err = storage.Open(path, storage.Options{ReadOnly: true}) // every write fails
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tl, _, err = db.OpenTimeline(testTenant, testTimeline)
	if err != nil {
		t.Fatal(err)
	}
	var logs harness.SyncBuffer
	r, err := newReplState(tl, 1, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	r.slots["s1"].RestartLSN, r.slots["s1"].saved = proto.LSN(0x1000000), proto.LSN(0x1000000)
	r.saveSlot(storage.Slot{Name: "s1", RestartLSN: proto.LSN(0x1000000), RestartTLI: 1})
	if !strings.Contains(logs.String(), "could not save replication slot") || !strings.Contains(logs.String(), "s1") {
		t.Fatalf("a failed slot save was not logged: %q", logs.String())
	}
	if r.slots["s1"].saved != 0 {
		t.Fatalf("a failed slot save left the slot marked saved at %s", r.slots["s1"].saved)
	}
}
