package server

import "testing"

func TestRetentionHorizon(t *testing.T) {
	const seg = 1 << 20
	base := retentionInputs{SegSize: seg, CommitLSN: 0x900000, TruncateLSN: 0x800000, ConsumerSeen: true, RemoteConsistent: 0x750000}
	with := func(f func(*retentionInputs)) retentionInputs { in := base; f(&in); return in }
	cases := []struct {
		name string
		in   retentionInputs
		want uint64
	}{
		{"consumer bounds, rounded down to a segment", base, 0x700000},
		{"no consumer since start: nothing", with(func(in *retentionInputs) { in.ConsumerSeen = false }), 0},
		{"truncate_lsn bounds", with(func(in *retentionInputs) { in.TruncateLSN = 0x512345 }), 0x500000},
		{"commit_lsn bounds", with(func(in *retentionInputs) { in.CommitLSN, in.RemoteConsistent = 0x312345, 0x900000 }), 0x300000},
		{"slot bounds", with(func(in *retentionInputs) { in.SlotRestart = []lsn{0x800000, 0x2fffff} }), 0x200000},
		{"active reader keeps its segment", with(func(in *retentionInputs) { in.ReaderPos = []lsn{0x400001} }), 0x400000},
		{"no truncate_lsn: nothing", with(func(in *retentionInputs) { in.TruncateLSN = 0 }), 0},
	}
	for _, c := range cases {
		if got := uint64(retentionHorizon(c.in)); got != c.want {
			t.Errorf("%s: %#x, want %#x", c.name, got, c.want)
		}
	}
}
