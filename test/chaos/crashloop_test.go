package chaos

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/test/harness"
)

// fault is one kind of fault the crash loop injects.
type fault int

const (
	killSafekeeper fault = iota // kill -9 one safekeeper, restart it
	killProposer                // kill -9 the proposer, restart it
	partition                   // cut one safekeeper off behind its proxy, heal
)

func (f fault) String() string {
	return [...]string{"kill -9 safekeeper", "kill -9 proposer", "partition safekeeper"}[f]
}

// TestCrashLoopSafekeepers is the short crash loop of `make test`: bank
// transfers (Go workers recording each transfer id) and pgbench with the
// transfer script run against the primary while every 1–3 s a random
// safekeeper is killed -9 and restarted (never more than one of three down).
// At the end a hot standby fed by a safekeeper shows the invariant total and
// every acknowledged transfer, and every safekeeper's WAL equals the
// primary's byte for byte.
func TestCrashLoopSafekeepers(t *testing.T) {
	if testing.Short() {
		t.Skip("crash loop with real processes: skipped in -short mode")
	}
	crashLoop(t, 25*time.Second, false, killSafekeeper)
}

// TestChaos is the long crash loop of `make chaos`: for -chaos.duration,
// safekeeper kills, proposer kills and partitions (the proposer reaches the
// safekeepers through proxies), then the same checks as
// TestCrashLoopSafekeepers.
func TestChaos(t *testing.T) {
	if *chaosDuration == 0 {
		t.Skip("long crash loop: run with -chaos.duration=10m (make chaos)")
	}
	crashLoop(t, *chaosDuration, true, killSafekeeper, killSafekeeper, killProposer, partition)
}

func crashLoop(t *testing.T, d time.Duration, proxies bool, kinds ...fault) {
	rng := newRand(t)
	c := startCluster(t, options{proxies: proxies})
	b := newBank(t, c.pg)
	sb := c.startStandby(c.sks[0])
	b.start(4, rng)

	ctx := harness.Context(t, d+5*time.Minute)
	type result struct {
		out string
		err error
	}
	bench := make(chan result, 1)
	go func() {
		out, err := pgbench(ctx, t, c.pg, 2, d)
		bench <- result{out, err}
	}()

	counts := map[fault]int{}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		pause := time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
		if time.Until(deadline) < pause {
			break
		}
		<-time.After(pause) // the fault schedule, not a wait for a condition
		c.checkProposerAlive()
		f := kinds[rng.IntN(len(kinds))]
		counts[f]++
		c.inject(rng, f)
	}
	t.Logf("faults injected in %v: %v", d, counts)

	// Commits still flow after the last fault.
	n := b.ackedCount()
	harness.WaitFor(t, 60*time.Second, "commits after the last fault", func() bool {
		c.checkProposerAlive()
		return b.ackedCount() >= n+20
	})
	r := <-bench
	if r.err != nil {
		t.Fatalf("%v\n%s", r.err, r.out)
	}
	if m := pgbenchDoneRe.FindStringSubmatch(r.out); m != nil {
		t.Logf("pgbench -f transfer.sql -c 2: %s transactions, none failed", m[1])
	}
	b.stopAndReport()
	acked, _ := b.snapshot()
	if len(acked) < 100 {
		t.Fatalf("only %d transfers acknowledged in %v", len(acked), d)
	}

	final := c.finish()
	sb.waitReplay(t, final)
	onPrimary := b.check(t, "primary", func(sql string) string { return c.pg.Exec(t, sql) }, acked)
	onStandby := b.check(t, "standby fed by safekeeper 1", func(sql string) string { return sb.query(t, sql) }, acked)
	if onPrimary != onStandby {
		t.Errorf("standby %q, primary %q", onStandby, onPrimary)
	}
	c.checkSegments(final)
}

// inject performs one fault and undoes it: restart, heal. Only one
// safekeeper is ever unavailable at a time, a minority of three.
func (c *cluster) inject(rng *rand.Rand, f fault) {
	t := c.t
	t.Helper()
	down := 200*time.Millisecond + time.Duration(rng.Int64N(int64(1300*time.Millisecond)))
	switch f {
	case killSafekeeper:
		sk := c.sks[rng.IntN(len(c.sks))]
		sk.Kill()
		<-time.After(down)
		sk.Start()
		t.Logf("%v: killed -9 safekeeper %d, restarted after %v", time.Since(c.started).Round(time.Millisecond), sk.ID, down.Round(time.Millisecond))
	case killProposer:
		before := c.quorumTerm()
		c.prop.Kill()
		<-time.After(down / 4)
		c.prop.Start()
		harness.WaitFor(t, 90*time.Second, fmt.Sprintf("a term above %d on a quorum", before), func() bool {
			c.checkProposerAlive()
			return c.quorumTerm() > before
		})
		t.Logf("%v: killed -9 the proposer; the restarted one is elected in a term above %d", time.Since(c.started).Round(time.Millisecond), before)
	case partition:
		i := rng.IntN(len(c.sks))
		mode := harness.PartitionMode(rng.IntN(2))
		c.proxies[i].Partition(mode)
		<-time.After(2 * down)
		c.proxies[i].Heal()
		t.Logf("%v: partitioned safekeeper %d (%v) for %v", time.Since(c.started).Round(time.Millisecond), c.sks[i].ID, mode, (2 * down).Round(time.Millisecond))
	}
}
