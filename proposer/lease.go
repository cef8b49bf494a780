package proposer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proto"
)

// DefaultProposerLease is how recently a proposer must have streamed to a
// safekeeper (WAL or a heartbeat, every 200 ms by default), over a
// connection still open, to count as live: a new proposer waits while one
// is, and sync refuses to run.
const DefaultProposerLease = 10 * time.Second

// ErrProposerLive: sync found a proposer streaming to the timeline; it
// would depose it, and the primary's commits would wait for a new one.
var ErrProposerLive = errors.New("proposer: a proposer is streaming to the timeline")

// ErrIncompatible: so many safekeepers refused the ServerInfo for good —
// the timeline they hold belongs to another cluster (system id), another
// PostgreSQL major version or another segment size, or it is on a newer
// PostgreSQL timeline than the primary, or the primary's timeline history
// forks from it — that no quorum is possible. Retrying cannot fix it. The
// error is an *IncompatibleError, which says why (refusal.go).
var ErrIncompatible = errors.New("proposer: the safekeepers' timeline does not match this primary")

// sqlstateInvalidParameterValue is a safekeeper's refusal of a ServerInfo
// that does not match the timeline it holds (rule 1).
const sqlstateInvalidParameterValue = "22023"

// The SQLSTATEs of a safekeeper's refusals for the timeline's
// configuration (README_PROTO.md, rule 9): the connection greeted in an
// older generation; the safekeeper is not a member. Detail carries the
// configuration it holds.
const (
	sqlstateStaleGeneration = "SK001"
	sqlstateNotMember       = "SK002"
)

// incompatible reports whether err is a safekeeper's refusal of our
// ServerInfo (rule 1) or TimelineHistory, which reconnecting cannot fix.
func incompatible(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == sqlstateInvalidParameterValue
}

// sqlstateUndefinedObject is what a safekeeper answers, to TIMELINE_STATUS
// or a greeting not allowed to create the timeline, for a timeline it does
// not hold.
const sqlstateUndefinedObject = "42704"

// missingTimeline reports whether err is a safekeeper's refusal of a
// greeting not allowed to create the timeline: it does not hold it (42704).
func missingTimeline(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == sqlstateUndefinedObject
}

// checkTimeline asks every safekeeper at once (TIMELINE_STATUS) whether it
// holds the timeline. It returns nil as soon as one does, and
// ErrNoTimeline, naming them, once a quorum answered that they do not
// (waiting up to a second for the others' answers, to name them too).
// While neither is known (safekeepers down or refusing) it asks again with
// backoff, warning the first time and then once a minute; at ctx's end it
// returns ctx's error.
func checkTimeline(ctx context.Context, cfg Config) error {
	sc := SyncConfig{Safekeepers: cfg.Safekeepers, TenantID: cfg.TenantID, TimelineID: cfg.TimelineID,
		ConnectTimeout: cfg.ConnectTimeout, Security: cfg.Security}
	n := len(cfg.Safekeepers)
	bo := backoff{min: cfg.ReconnectMin, max: cfg.ReconnectMax}
	var warned time.Time
	for {
		pctx, cancel := context.WithCancel(ctx)
		probes := make(chan client.Probe, n)
		for _, addr := range cfg.Safekeepers {
			go func() { probes <- probeTimeline(pctx, &sc, addr) }()
		}
		var missing, errs []string
		var settle <-chan time.Time // once a quorum answered missing: the others' answers, for the message
		holds := false
	collect:
		for range n {
			select {
			case p := <-probes:
				switch {
				case p.Holds:
					holds = true
					break collect
				case p.Missing:
					missing = append(missing, p.Addr)
				default:
					errs = append(errs, p.Addr+": "+endText(p.Err))
				}
				if settle == nil && refusalBlocksQuorum(len(missing), n) {
					settle = time.After(time.Second)
				}
			case <-settle:
				break collect
			}
		}
		cancel()
		if holds {
			return nil
		}
		if refusalBlocksQuorum(len(missing), n) {
			var on []string // in the configured order
			for _, a := range cfg.Safekeepers {
				if slices.Contains(missing, a) {
					on = append(on, a)
				}
			}
			err := fmt.Errorf("%w: timeline %s/%s is not on %s", ErrNoTimeline, cfg.TenantID, cfg.TimelineID, strings.Join(on, ", "))
			if len(errs) > 0 {
				err = fmt.Errorf("%w; no answer from %s", err, strings.Join(errs, "; "))
			}
			return err
		}
		d := bo.next()
		level := slog.LevelDebug
		if now := time.Now(); now.Sub(warned) >= repeatWarning {
			level, warned = slog.LevelWarn, now // the first time, then once a minute
		}
		cfg.Logger.Log(ctx, level, "no safekeeper holding the timeline answered yet; asking again before connecting to them",
			"not_on", strings.Join(missing, ","), "no_answer", strings.Join(errs, "; "), "retry_in", d)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
}

// LiveProposer is a proposer streaming to a timeline, as a safekeeper's
// TIMELINE_STATUS reports it.
type LiveProposer struct {
	Addr       string // the proposer's address, as the safekeeper sees it
	Term       uint64
	Safekeeper string // the safekeeper that reported it
	Age        time.Duration
}

func (l LiveProposer) String() string {
	return fmt.Sprintf("the proposer of term %d at %s (streamed to safekeeper %s %v ago)", l.Term, l.Addr, l.Safekeeper, l.Age.Round(time.Millisecond))
}

// findLive asks every safekeeper at once (TIMELINE_STATUS) and returns a
// proposer of a term above `above` that streamed within lease over a
// connection still open, in the term the safekeeper votes in (one deposed
// since does not count). Safekeepers that do not answer or do not hold the
// timeline report none.
func findLive(ctx context.Context, sc *SyncConfig, above uint64, lease time.Duration) (LiveProposer, bool) {
	return liveIn(probeAll(ctx, sc), above, lease)
}

// liveIn is findLive's answer from the safekeepers' probes.
func liveIn(probes []client.Probe, above uint64, lease time.Duration) (LiveProposer, bool) {
	var best LiveProposer
	found := false
	for _, p := range probes {
		if p.Holds && p.LastPushTerm > above && p.Live(p.Term, lease) && (!found || p.LastPushTerm > best.Term) {
			best = LiveProposer{Addr: p.ProposerAddr, Term: p.LastPushTerm, Safekeeper: p.Addr, Age: p.LastPushAge}
			found = true
		}
	}
	return best, found
}

// waitLease returns nil once no proposer of a term above ours streams to
// the timeline (findLive), or when ctx ends. A proposer restarted by its
// supervisor after it was deposed therefore waits for the one that deposed
// it to stop instead of deposing it in turn. It does not wait for a
// proposer it can never follow: when so many safekeepers hold the timeline
// in a state that refuses si for good (refusedByProbes: another system id,
// major version or segment size, or a newer PostgreSQL timeline — si is a
// primary a standby was promoted from) that no quorum is possible, it
// returns that *IncompatibleError at once. Before it first waits it calls
// beforeWait; waited reports whether it did.
func waitLease(ctx context.Context, cfg Config, ours uint64, si *proto.ServerInfo, beforeWait func()) (waited bool, err error) {
	sc := SyncConfig{Safekeepers: cfg.Safekeepers, TenantID: cfg.TenantID, TimelineID: cfg.TimelineID, ConnectTimeout: cfg.ConnectTimeout,
		Security: cfg.Security}
	var seen LiveProposer
	defer cfg.Stats.waitingFor(LiveProposer{}, false)
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
		probes := probeAll(pctx, &sc)
		cancel()
		if err := refusedByProbes(probes, si); err != nil {
			return waited, err
		}
		l, ok := liveIn(probes, ours, cfg.ProposerLease)
		if !ok {
			if seen.Term != 0 {
				cfg.Logger.Info("no other proposer streams to the timeline any more; campaigning", "last_seen", seen.String())
			}
			return waited, nil
		}
		if !waited {
			beforeWait()
			waited = true
		}
		if l.Term != seen.Term || l.Addr != seen.Addr {
			cfg.Logger.Info("another proposer is streaming to the timeline; waiting until it stops before campaigning",
				"proposer", l.Addr, "term", l.Term, "safekeeper", l.Safekeeper, "proposer_lease", cfg.ProposerLease)
		}
		seen = l
		cfg.Stats.waitingFor(l, true)
		select {
		case <-ctx.Done():
		case <-time.After(min(time.Second, cfg.ProposerLease/4)):
		}
	}
	return waited, nil
}

// deposedBy fills a *DeposedError's By: who streams to the safekeeper that
// showed the higher term. The deposer has usually only just won its votes,
// so the safekeeper is asked for up to two seconds.
func deposedBy(ctx context.Context, err error, sc SyncConfig) error {
	var de *DeposedError
	if !errors.As(err, &de) || de.Addr == "" {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for {
		p := probeTimeline(ctx, &sc, de.Addr)
		if p.Holds && p.ProposerAddr != "" && p.LastPushTerm >= de.Term {
			de.By = fmt.Sprintf("the proposer of term %d streams to it from %s", p.LastPushTerm, p.ProposerAddr)
			return err
		}
		select {
		case <-ctx.Done():
			de.By = fmt.Sprintf("no proposer of term %d streamed to it within 2s (a sync, or a proposer still being elected)", de.Term)
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// refusalBlocksQuorum reports whether n refusals out of total leave fewer
// than a quorum.
func refusalBlocksQuorum(n, total int) bool { return total-n < total/2+1 }
