package test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
)

// TestProposeRefusedForGoodExitsClearly: safekeepers whose timeline belongs
// to another cluster (another system id) refuse the proposer's ServerInfo;
// no retry can fix that, so once no quorum is possible `propose` exits 1
// with one line naming the safekeepers and the mismatch, instead of warning
// and reconnecting forever.
func TestProposeRefusedForGoodExitsClearly(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Options{WALSegSizeMB: 1})
	sks := []*harness.Safekeeper{harness.StartSafekeeper(t, 1), harness.StartSafekeeper(t, 2), harness.StartSafekeeper(t, 3)}
	// The timeline, created by a test proposer of another cluster (sysID,
	// 1 MiB segments) on safekeepers 1 and 2; safekeeper 3 does not hold it.
	gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
	_, end := gen.Record(200)
	wal := gen.Take()
	for _, sk := range sks[:2] {
		p := startTerm(t, sk, 1, 1)
		p.send(p.appendReq(tlStart, wal, end))
		p.resp()
		p.c.Close()
	}
	prop := harness.StartProcess(t, "proposer", "propose",
		"--upstream", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres sslmode=disable", pg.Port),
		"--safekeepers", strings.Join([]string{sks[0].Addr, sks[1].Addr, sks[2].Addr}, ","),
		"--tenant-id", tenant(1).String(), "--timeline-id", proto.ID{0xbb, 1}.String())
	harness.WaitFor(t, 60*time.Second, "the proposer to give up", func() bool {
		exited, _ := prop.Exited()
		return exited
	})
	_, code := prop.Exited()
	log := prop.Log()
	last := strings.TrimSpace(log[strings.LastIndex(strings.TrimRight(log, "\n"), "\n")+1:])
	if code != 1 || !strings.Contains(last, "no quorum is possible") || !strings.Contains(last, "system_id") ||
		!strings.Contains(last, sks[0].Addr) || !strings.Contains(last, sks[1].Addr) {
		t.Fatalf("propose against another cluster's timeline: exit %d, last line %q; want exit 1 and one line naming both safekeepers and system_id\n%s", code, last, log)
	}
	if n := strings.Count(log, "system_id"); n > 4 {
		t.Errorf("the refusal was logged %d times: retried instead of given up", n)
	}
}
