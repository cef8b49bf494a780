package server

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
)

// A safekeeper removed from a timeline's configuration (README_PROTO.md,
// rule 9): it refuses proposers (SK002, in the acceptor), refuses new
// readers (errRemoved), and deletes its copy once it has been removed for
// Config.RemovedTimelineGrace (sweepRemoved).

// errRemoved is the refusal of a reader of a timeline this safekeeper is
// no longer a member of: SK002 with the configuration in Detail, as a
// proposer gets it.
func errRemoved(node uint64, c proto.Configuration) *pgwire.Error {
	e := pgwire.Errorf(codeNotMember, "safekeeper %d is not a member of the timeline's configuration (%s): read from a member", node, c)
	if b, err := json.Marshal(c); err == nil {
		e.Detail = proto.ConfigurationDetail + string(b)
	}
	return e
}

// removedFrom reports whether this safekeeper is outside configuration c
// (which, in generation 0, names nobody: no one is removed).
func (s *Server) removedFrom(c proto.Configuration) bool {
	return c.Generation > 0 && !c.IsMember(s.cfg.NodeID)
}

// sweepRemoved deletes, every quarter of the grace (at least every
// second, at most every minute), the running timelines this safekeeper
// has been removed from for RemovedTimelineGrace: since it first saw
// them so (a restart starts the wait again; a later configuration that
// names it again ends it).
func (s *Server) sweepRemoved() {
	grace := s.cfg.RemovedTimelineGrace
	every := min(max(grace/4, time.Second), time.Minute)
	t := time.NewTicker(every)
	defer t.Stop()
	since := map[proto.TimelineKey]time.Time{}
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		seen := map[proto.TimelineKey]bool{}
		for _, tl := range s.reg.Running() {
			key, st := tl.Key(), tl.State()
			if !s.removedFrom(st.Configuration) {
				continue
			}
			seen[key] = true
			first, ok := since[key]
			if !ok {
				since[key] = time.Now()
				continue
			}
			if time.Since(first) < grace {
				continue
			}
			res, err := s.reg.Delete(key, true)
			if err != nil {
				s.log.Warn("deleting a timeline this safekeeper was removed from failed; retried", "tenant_id", key.TenantID, "timeline_id", key.TimelineID, "err", err)
				continue
			}
			delete(since, key)
			s.log.Info("deleted a timeline this safekeeper was removed from", "tenant_id", key.TenantID, "timeline_id", key.TimelineID,
				"generation", st.Configuration.Generation, "members", fmt.Sprint(st.Configuration.All()), "removed_for", time.Since(first).Round(time.Second).String(),
				"connections_ended", res.WasActive)
		}
		for key := range since {
			if !seen[key] {
				delete(since, key)
			}
		}
	}
}
