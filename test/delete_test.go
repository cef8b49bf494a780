package test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/xlog/xlogtest"
	"github.com/safekeeper/safekeeper/test/harness"
)

// TestKillNineDuringDeleteLeavesTimelineWholeOrGone: a timeline of 24
// segments is deleted (with force) while the safekeeper is killed with
// SIGKILL at a random moment of the delete, again and again until the
// delete survives. After each restart the timeline is either gone (404) or
// whole: the same flush_lsn and, exported offline, the same bytes; and the
// other timeline on the same safekeeper is untouched either way.
func TestKillNineDuringDeleteLeavesTimelineWholeOrGone(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	sk := harness.StartSafekeeper(t, 1)
	fill := func(tl byte, segs int) ([]byte, proto.LSN) {
		p := startTerm(t, sk, tl, 1)
		gen := xlogtest.NewGenerator(tlStart, segSize, 1, sysID)
		for gen.Pos() < tlStart+proto.LSN(segs*segSize) {
			gen.Record(4000)
		}
		wal := gen.Take()
		begin := tlStart
		for off := 0; off < len(wal); off += proto.MaxWALPerRequest {
			chunk := wal[off:min(off+proto.MaxWALPerRequest, len(wal))]
			p.send(p.appendReq(begin, chunk, begin+proto.LSN(len(chunk))))
			begin += proto.LSN(len(chunk))
		}
		for {
			if r := p.resp(); r.FlushLSN == begin {
				break
			}
		}
		p.c.Close()
		return wal, begin
	}
	wal, end := fill(1, 24)
	otherWAL, _ := fill(2, 2)
	url := func(tl byte) string {
		return fmt.Sprintf("http://%s/v1/tenant/%s/timeline/%s", sk.HTTPAddr, tenant(1), proto.ID{0xbb, tl})
	}
	client := &http.Client{Timeout: 20 * time.Second}
	get := func(u string) int {
		resp, err := client.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// exported returns the timeline's WAL as wal export writes it, the
	// safekeeper stopped meanwhile.
	exported := func(tl byte) []byte {
		if err := sk.Stop(10 * time.Second); err != nil {
			t.Fatalf("stop: %v", err)
		}
		out := t.TempDir()
		if code, _, stderr := harness.Run(t, "wal", "export", "--data-dir", sk.DataDir, "--tenant-id", tenant(1).String(),
			"--timeline-id", proto.ID{0xbb, tl}.String(), "--output", out); code != 0 {
			t.Fatalf("wal export: exit %d: %s", code, stderr)
		}
		names, _ := filepath.Glob(filepath.Join(out, "0*"))
		var got []byte
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, b...)
		}
		os.RemoveAll(out)
		sk.Start()
		return got
	}
	whole, kills := 0, 0
	for i := 0; ; i++ {
		if i == 30 {
			t.Fatalf("the delete never survived %d kills", i)
		}
		// The first kills land at once, later ones later: the delete of
		// 24 MiB takes some milliseconds, and in the end one completes.
		delay := time.Duration(rng.Int64N(int64(time.Duration(i+1) * 2 * time.Millisecond)))
		done := make(chan int, 1)
		go func() {
			req, _ := http.NewRequestWithContext(context.Background(), "DELETE", url(1)+"?force=true", nil)
			resp, err := client.Do(req)
			if err != nil {
				done <- 0 // killed before it answered
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		time.Sleep(delay) // where the kill lands, not a wait for a condition
		sk.Kill()
		answered := <-done
		kills++
		sk.Start()
		switch code := get(url(1)); code {
		case http.StatusNotFound:
			t.Logf("gone after %d kills (%d times it was whole); the last delete answered %d", kills, whole, answered)
			if got := exported(2); !bytes.Equal(got[:len(otherWAL)], otherWAL) {
				t.Fatal("the other timeline's WAL changed")
			}
			if whole == 0 {
				t.Log("no kill landed before the delete was durable; the check of a whole timeline did not run")
			}
			return
		case http.StatusOK:
			if answered == http.StatusOK {
				t.Fatalf("the delete answered 200 but the timeline is back after kill -9")
			}
			whole++
			got := exported(1)
			if len(got) < int(end-tlStart) || !bytes.Equal(got[:end-tlStart], wal) {
				t.Fatalf("kill %d (after %v): the timeline is back but its WAL differs (%d bytes exported, %d pushed)", kills, delay, len(got), end-tlStart)
			}
		default:
			t.Fatalf("GET after restart: %d", code)
		}
	}
}
