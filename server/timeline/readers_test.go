package timeline

import (
	"testing"

	"github.com/safekeeper/safekeeper/proto"
)

// TestReaderLagBytes: a reader's lag is commit_lsn minus the higher of the
// write and flush it reported; one that has reported nothing yet (a
// standby or pg_receivewal before its first status update) lags by what
// lies between its stream's start and commit_lsn, not by its whole LSN (a
// position of 0).
func TestReaderLagBytes(t *testing.T) {
	const commit = proto.LSN(0x3000000)
	for _, c := range []struct {
		name   string
		start  proto.LSN
		status ReaderStatus
		want   uint64
	}{
		{"nothing reported: from the stream's start", 0x2000000, ReaderStatus{}, 0x1000000},
		{"only write reported (pg_receivewal without --synchronous)", 0x2000000, ReaderStatus{Write: 0x2800000}, 0x800000},
		{"flush reported", 0x2000000, ReaderStatus{Write: 0x2c00000, Flush: 0x2e00000}, 0x200000},
		{"a report below the start counts as reported", 0x2000000, ReaderStatus{Write: 0x1000000, Flush: 0x1000000}, 0x2000000},
		{"write past commit (a term reader): no lag, no wrap", 0x2000000, ReaderStatus{Write: 0x3100000, Flush: 0x2f00000}, 0},
		{"started past commit: no lag", 0x3100000, ReaderStatus{}, 0},
	} {
		rd := &Reader{start: c.start, status: c.status}
		if got := rd.lagBytes(commit); got != c.want {
			t.Errorf("%s: lag %#x, want %#x", c.name, got, c.want)
		}
	}

}
