package proposer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proto"
)

// Refusals for good. A safekeeper refuses a ServerInfo that does not match
// the timeline it holds, and a TimelineHistory that does not continue it,
// with SQLSTATE 22023 (README_PROTO.md, rule 1 and "PostgreSQL timeline
// switches"); no retry, and no restart, can change that. The refusal says
// why in words only, so the link asks the refusing safekeeper for its
// timeline (TIMELINE_STATUS) and compares it with what it sent
// (classifyRefusal): the reason is a RefusalReason, not a parse of the
// message.

// RefusalReason is why a safekeeper refuses this primary for good.
type RefusalReason int

const (
	// RefusedUnknown: a 22023 refusal whose reason the safekeeper's
	// TIMELINE_STATUS did not show (it did not answer, or its timeline
	// matches what was sent).
	RefusedUnknown RefusalReason = iota
	// RefusedSystemID: the timeline belongs to another cluster (another
	// database system identifier).
	RefusedSystemID
	// RefusedPgVersion: the timeline is of another PostgreSQL major
	// version.
	RefusedPgVersion
	// RefusedSegmentSize: the timeline has another WAL segment size.
	RefusedSegmentSize
	// RefusedOlderPgTimeline: the timeline is on a newer PostgreSQL
	// timeline than the primary: a standby was promoted since, and this is
	// a primary it was promoted from, which must not write on.
	RefusedOlderPgTimeline
	// RefusedForkedPgTimeline: the primary's PostgreSQL timeline history
	// does not continue the timeline's (another promotion to the same or
	// a later timeline, or a branch below the timeline's commit_lsn: the
	// primary lacks committed WAL).
	RefusedForkedPgTimeline
)

// String is the reason in a few words, as the refusal's message starts.
func (r RefusalReason) String() string {
	switch r {
	case RefusedSystemID:
		return "another system id"
	case RefusedPgVersion:
		return "another PostgreSQL major version"
	case RefusedSegmentSize:
		return "another WAL segment size"
	case RefusedOlderPgTimeline:
		return "older PostgreSQL timeline"
	case RefusedForkedPgTimeline:
		return "forked PostgreSQL timeline"
	}
	return "incompatible"
}

// RefusalError is one safekeeper's refusal of this primary for good.
type RefusalError struct {
	Safekeeper string        // its configured address
	Reason     RefusalReason // why, from its TIMELINE_STATUS
	// PgTimeline is the PostgreSQL timeline of the safekeeper's timeline
	// (TIMELINE_STATUS; 0 if it did not answer).
	PgTimeline uint32
	// Err is what the safekeeper said: its ErrorResponse (a
	// *pgconn.PgError), or, for a refusal foreseen from its
	// TIMELINE_STATUS before any greeting, the mismatch found there.
	Err error
}

func (e *RefusalError) Error() string {
	return fmt.Sprintf("%s: %s: %v", e.Safekeeper, e.Reason, e.Err)
}

func (e *RefusalError) Unwrap() error { return e.Err }

// IncompatibleError: so many safekeepers refuse this primary for good that
// no quorum is possible; retrying cannot fix it (errors.Is
// ErrIncompatible). Reason is the refusals' reason (the most common one;
// the first safekeeper's among equals).
type IncompatibleError struct {
	Reason   RefusalReason
	Refusals []*RefusalError // in the configured order
	Total    int             // safekeepers configured
	// Theirs and Ours: the newest PostgreSQL timeline the refusing
	// safekeepers' timeline is on, and the primary's.
	Theirs, Ours uint32
}

func (e *IncompatibleError) Error() string {
	var parts []string
	for _, r := range e.Refusals {
		parts = append(parts, r.Error())
	}
	what := ""
	if e.Reason == RefusedOlderPgTimeline && e.Theirs > e.Ours {
		what = fmt.Sprintf(": the safekeepers' timeline is on PostgreSQL timeline %d, this primary on %d (a standby was promoted since)", e.Theirs, e.Ours)
	}
	return fmt.Sprintf("proposer: refused: %s%s: %d of %d safekeepers refuse it for good, no quorum is possible (%s)",
		e.Reason, what, len(e.Refusals), e.Total, strings.Join(parts, "; "))
}

// Unwrap returns ErrIncompatible.
func (e *IncompatibleError) Unwrap() error { return ErrIncompatible }

// incompatibleError is the *IncompatibleError of refusals (by index in
// addrs) of the primary described by si.
func incompatibleError(refusals map[int]error, addrs []string, si *proto.ServerInfo) error {
	e := &IncompatibleError{Total: len(addrs), Ours: si.PgTimeline}
	count := map[RefusalReason]int{}
	for i, addr := range addrs {
		err, ok := refusals[i]
		if !ok {
			continue
		}
		var re *RefusalError
		if !errors.As(err, &re) {
			re = &RefusalError{Safekeeper: addr, Err: err}
		}
		e.Refusals = append(e.Refusals, re)
		e.Theirs = max(e.Theirs, re.PgTimeline)
		count[re.Reason]++
		if len(e.Refusals) == 1 || count[re.Reason] > count[e.Reason] {
			e.Reason = re.Reason
		}
	}
	return e
}

// classifyRefusal compares the timeline a safekeeper holds (its
// TIMELINE_STATUS, p) with the ServerInfo sent, as the safekeeper does
// (rule 1): the reason it refuses it, with the mismatch, or
// RefusedUnknown and nil when p shows none. withHistory: the connection
// sent a TimelineHistory too, which the safekeeper may have refused.
func classifyRefusal(si *proto.ServerInfo, p client.Probe, withHistory bool) (RefusalReason, error) {
	switch {
	case !p.Holds:
		return RefusedUnknown, nil
	case p.SystemID != si.SystemID:
		return RefusedSystemID, fmt.Errorf("TIMELINE_STATUS: the timeline's system_id is %d, the primary's %d", p.SystemID, si.SystemID)
	case p.PgVersion/10000 != si.PgVersion/10000:
		return RefusedPgVersion, fmt.Errorf("TIMELINE_STATUS: the timeline's PostgreSQL major version is %d, the primary's %d", p.PgVersion/10000, si.PgVersion/10000)
	case p.SegSize != si.WalSegSize:
		return RefusedSegmentSize, fmt.Errorf("TIMELINE_STATUS: the timeline's wal_seg_size is %d, the primary's %d", p.SegSize, si.WalSegSize)
	case p.PgTimeline > si.PgTimeline:
		return RefusedOlderPgTimeline, fmt.Errorf("TIMELINE_STATUS: the timeline's pg_timeline is %d, the primary's %d", p.PgTimeline, si.PgTimeline)
	case withHistory:
		// The ServerInfo matches: the TimelineHistory was refused.
		return RefusedForkedPgTimeline, nil
	}
	return RefusedUnknown, nil
}

// refusal is the *RefusalError for safekeeper addr's 22023 err: the link
// asks it for its timeline (TIMELINE_STATUS, within the connect timeout)
// to tell why.
func (l *skLinks) refusal(ctx context.Context, addr string, err error) *RefusalError {
	sc := SyncConfig{Safekeepers: l.addrs, TenantID: l.dial.TenantID, TimelineID: l.dial.TimelineID,
		ConnectTimeout: l.dial.ConnectTimeout, Security: l.dial.Security}
	timeout := l.dial.ConnectTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p := probeTimeline(pctx, &sc, addr)
	reason, _ := classifyRefusal(l.si, p, l.hist != nil)
	return &RefusalError{Safekeeper: addr, Reason: reason, PgTimeline: p.PgTimeline, Err: err}
}

// refusedByProbes foresees, from every safekeeper's TIMELINE_STATUS, that
// so many of them would refuse si (rule 1) that no quorum is possible: the
// *IncompatibleError, before any greeting; nil otherwise.
func refusedByProbes(probes []client.Probe, si *proto.ServerInfo) error {
	refusals := map[int]error{}
	addrs := make([]string, len(probes))
	for i, p := range probes {
		addrs[i] = p.Addr
		if reason, err := classifyRefusal(si, p, false); err != nil {
			refusals[i] = &RefusalError{Safekeeper: p.Addr, Reason: reason, PgTimeline: p.PgTimeline, Err: err}
		}
	}
	if len(refusals) == 0 || !refusalBlocksQuorum(len(refusals), len(probes)) {
		return nil
	}
	return incompatibleError(refusals, addrs, si)
}

// probeAll asks every safekeeper at once (TIMELINE_STATUS).
func probeAll(ctx context.Context, sc *SyncConfig) []client.Probe {
	probes := make([]client.Probe, len(sc.Safekeepers))
	var wg sync.WaitGroup
	for i, addr := range sc.Safekeepers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			probes[i] = probeTimeline(ctx, sc, addr)
		}()
	}
	wg.Wait()
	return probes
}
