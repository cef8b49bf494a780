package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
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
	promote                     // lose the primary's host, sync, promote the standby, re-protect it (once)
)

func (f fault) String() string {
	return [...]string{"kill -9 safekeeper", "kill -9 proposer", "partition safekeeper", "lose the primary, promote the standby"}[f]
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
// safekeepers through proxies), and once, half-way through, the loss of
// the primary's host (kill -9 of the primary and the proposer, sync, the
// standby fed by safekeeper 1 promoted, a proposer protecting it on the same
// safekeepers, a new standby from it); then the same checks as
// TestCrashLoopSafekeepers, on the promoted primary.
func TestChaos(t *testing.T) {
	if *chaosDuration == 0 {
		t.Skip("long crash loop: run with -chaos.duration=10m (make chaos)")
	}
	crashLoop(t, *chaosDuration, true, killSafekeeper, killSafekeeper, killProposer, partition, promote)
}

func crashLoop(t *testing.T, d time.Duration, proxies bool, kinds ...fault) {
	rng := newRand(t)
	c := startCluster(t, options{proxies: proxies})
	b := newBank(t, c.pg)
	c.bank = b
	c.standby = c.startStandby(c.sks[0])
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
	half := time.Now().Add(d / 2)
	for time.Now().Before(deadline) {
		pause := time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
		if time.Until(deadline) < pause {
			break
		}
		<-time.After(pause) // the fault schedule, not a wait for a condition
		c.checkProposerAlive()
		f := kinds[rng.IntN(len(kinds))]
		if f == promote && (c.promoted || time.Now().Before(half)) {
			f = killSafekeeper // the primary is lost once, in the second half
		}
		counts[f]++
		c.inject(rng, f)
	}
	if slices.Contains(kinds, promote) && !c.promoted {
		counts[promote]++
		c.inject(rng, promote) // a run too short to draw it
	}
	t.Logf("faults injected in %v: %v", d, counts)

	// Commits still flow after the last fault.
	n := b.ackedCount()
	harness.WaitFor(t, 60*time.Second, "commits after the last fault", func() bool {
		c.checkProposerAlive()
		return b.ackedCount() >= n+20
	})
	r := <-bench
	switch {
	case c.promoted:
		// Its primary was lost under it: it ends with an error.
		t.Logf("pgbench -f transfer.sql -c 2 against the first primary ended with its host: %v", r.err)
	case r.err != nil:
		t.Fatalf("%v\n%s", r.err, r.out)
	default:
		if m := pgbenchDoneRe.FindStringSubmatch(r.out); m != nil {
			t.Logf("pgbench -f transfer.sql -c 2: %s transactions, none failed", m[1])
		}
	}
	b.stopAndReport()
	acked, _ := b.snapshot()
	if len(acked) < 100 {
		t.Fatalf("only %d transfers acknowledged in %v", len(acked), d)
	}

	final := c.finish()
	sb := c.standby
	sb.WaitReplay(t, final.String(), replayTimeout)
	onPrimary := b.check(t, "primary", func(sql string) string { return c.pg.Exec(t, sql) }, acked)
	onStandby := b.check(t, "standby fed by safekeeper 1", func(sql string) string { return sb.Exec(t, sql) }, acked)
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
	case promote:
		c.loseThePrimary()
	case partition:
		i := rng.IntN(len(c.sks))
		mode := harness.PartitionMode(rng.IntN(2))
		c.proxies[i].Partition(mode)
		<-time.After(2 * down)
		c.proxies[i].Heal()
		t.Logf("%v: partitioned safekeeper %d (%v) for %v", time.Since(c.started).Round(time.Millisecond), c.sks[i].ID, mode, (2 * down).Round(time.Millisecond))
	}
}

// loseThePrimary is the bad day inside the loop: the primary's host is lost
// (kill -9 of the primary and the proposer); sync commits the quorum's end
// of WAL; the standby fed by safekeeper 1 replays to it and is promoted; the
// bank moves to it; a proposer protects it on the same safekeepers; a new
// standby, a base backup of it, streams from safekeeper 1.
func (c *cluster) loseThePrimary() {
	t := c.t
	t.Helper()
	c.prop.Kill()
	c.pg.Kill(t)
	var addrs []string
	for _, sk := range c.sks {
		addrs = append(addrs, sk.Addr)
	}
	code, out, stderr := harness.Run(t, "sync", "--safekeepers", strings.Join(addrs, ","),
		"--tenant-id", tenantID.String(), "--timeline-id", timelineID.String(), "--timeout", "60s")
	if code != 0 {
		t.Fatalf("sync after losing the primary: exit %d: %s", code, stderr)
	}
	end := lsnOf(t, out)
	sb := c.standby
	sb.WaitReplay(t, end.String(), replayTimeout)
	sb.Promote(t)
	harness.WaitFor(t, 60*time.Second, "the promoted standby to leave recovery", func() bool {
		return sb.Exec(t, "select pg_is_in_recovery()") == "f"
	})
	sb.Exec(t, "alter system set synchronous_standby_names = 'proposer'")
	sb.Exec(t, "select pg_reload_conf()")
	c.pg = sb
	c.bank.host.Store(&sb.SocketDir)
	c.prop = c.startProposer("proposer", "proposer")
	c.waitSyncStandby("proposer")
	c.standby = c.startStandby(c.sks[0])
	c.promoted = true
	t.Logf("%v: lost the primary (kill -9 with the proposer); synced at %s; the standby is the primary now (PostgreSQL timeline %s), protected on the same safekeepers; a new standby follows it",
		time.Since(c.started).Round(time.Millisecond), end, sb.Exec(t, "select substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"))
}
