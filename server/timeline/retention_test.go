package timeline

import (
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

func TestRetentionHorizon(t *testing.T) {
	const seg = 1 << 20
	// commit 0x900000; 2 MiB kept below it; every peer at 0x800000.
	base := retentionInputs{SegSize: seg, CommitLSN: 0x900000, TruncateLSN: 0x800000, WalKeep: 2 << 20, MaxPeerKeep: 6 << 20}
	with := func(f func(*retentionInputs)) retentionInputs { in := base; f(&in); return in }
	cases := []struct {
		name   string
		in     retentionInputs
		want   uint64
		reason string
	}{
		{"wal_keep_size bounds, without any consumer", base, 0x700000, "wal_keep_size"},
		{"a consumer bounds, rounded down to a segment", with(func(in *retentionInputs) { in.ConsumerSeen, in.RemoteConsistent = true, 0x650000 }), 0x600000, "remote_consistent_lsn"},
		{"the lowest peer bounds", with(func(in *retentionInputs) { in.TruncateLSN = 0x512345 }), 0x500000, "peer safekeepers' flush_lsn (truncate_lsn)"},
		{"a peer too far behind is capped", with(func(in *retentionInputs) { in.TruncateLSN = 0x100000 }), 0x300000, "max_peer_wal_keep_size (a peer safekeeper is further behind)"},
		{"a peer never heard from is capped", with(func(in *retentionInputs) { in.TruncateLSN = 0 }), 0x300000, "max_peer_wal_keep_size (a peer safekeeper is further behind)"},
		{"nothing kept below commit: commit_lsn bounds", with(func(in *retentionInputs) { in.WalKeep, in.TruncateLSN = 0, 0x900000 }), 0x900000, "wal_keep_size"},
		{"a slot bounds", with(func(in *retentionInputs) { in.Slots = []slotPos{{"a", 0x800000}, {"b", 0x2fffff}} }), 0x200000, `replication slot "b"`},
		{"an active reader keeps its segment", with(func(in *retentionInputs) { in.ReaderPos = []proto.LSN{0x400001} }), 0x400000, "an active reader"},
		{"the archive bounds", with(func(in *retentionInputs) { in.Archiving, in.BackupLSN = true, 0x456789 }), 0x400000, "the archive (backup_lsn)"},
		{"nothing archived yet: nothing removed", with(func(in *retentionInputs) { in.Archiving = true }), 0, "the archive (backup_lsn)"},
		{"short timeline: nothing", with(func(in *retentionInputs) { in.CommitLSN = 0x100000 }), 0, "wal_keep_size"},
	}
	for _, c := range cases {
		r := retentionHorizon(c.in)
		if uint64(r.Horizon) != c.want || r.Reason != c.reason || len(r.Invalidate) != 0 {
			t.Errorf("%s: %#x (%s, invalidate %v), want %#x (%s)", c.name, uint64(r.Horizon), r.Reason, r.Invalidate, c.want, c.reason)
		}
	}
	// max_slot_wal_keep_size: a slot too far behind is invalidated and
	// no longer bounds the horizon; one within it does.
	in := with(func(in *retentionInputs) {
		in.MaxSlotKeep = 4 << 20
		in.Slots = []slotPos{{"far", 0x200000}, {"near", 0x600000}}
	})
	r := retentionHorizon(in)
	if r.Horizon != 0x600000 || len(r.Invalidate) != 1 || r.Invalidate[0].Name != "far" {
		t.Errorf("max_slot_wal_keep_size: %#x, invalidate %v; want 0x600000 and slot far invalidated", uint64(r.Horizon), r.Invalidate)
	}
}
