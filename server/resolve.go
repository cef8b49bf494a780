package server

import (
	"errors"
	"fmt"
	"strings"

	"github.com/safekeeper/safekeeper/acceptor"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/server/auth"
	"github.com/safekeeper/safekeeper/server/timeline"
)

// Which timeline a connection means: the one a proposer's greeting names
// (created if START_WAL_PUSH allows it), or the one a reader's startup
// options name. The registry (server/timeline) opens it; the refusals get
// their SQLSTATEs here.

// timelineFor returns the running timeline named by m, opening it from disk
// or, if it is new and create is set (START_WAL_PUSH's
// allow_timeline_creation), creating it (atomically, rule 1). A timeline
// that is not stored and may not be created is errNoTimeline's refusal.
func (s *Server) timelineFor(m *proto.ServerInfo, create bool) (*timeline.Timeline, error) {
	if create {
		t, err := s.reg.OpenOrCreate(m)
		return t, fromTimeline(err)
	}
	t, err := s.timelineByKey(proto.TimelineKey{TenantID: m.TenantID, TimelineID: m.TimelineID})
	var pe *pgwire.Error
	if errors.Is(err, timeline.ErrNotFound) && errors.As(err, &pe) {
		return nil, errNoTimeline(pe)
	}
	return t, err
}

// errNoTimeline is the refusal of a greeting that names a timeline this
// safekeeper does not hold when its START_WAL_PUSH did not allow creating
// it: undefined_object, as PostgreSQL refuses a missing slot, keeping the
// open's own message (it may say the timeline is being deleted).
func errNoTimeline(open *pgwire.Error) *pgwire.Error {
	e := *open
	e.Detail = "START_WAL_PUSH did not allow timeline creation (allow_timeline_creation false)."
	e.Hint = "Check the tenant and timeline ids; a new timeline is created by a proposer allowed to create it."
	return &e
}

// timelineByKey returns the running timeline key, opening it from disk; it
// never creates one (readers cannot create timelines). A timeline that is
// not stored is an *pgwire.Error with UndefinedObject (and
// timeline.ErrNotFound).
func (s *Server) timelineByKey(key proto.TimelineKey) (*timeline.Timeline, error) {
	t, err := s.reg.Open(key)
	return t, fromTimeline(err)
}

// resolveTimeline picks the timeline a reader means: the one its startup
// options name, else the only one stored (matching the tenant if only
// tenant_id was given). Otherwise the error names the choices.
//
// With auth on, only the timelines of the token's tenant are candidates
// (a safekeeperdata token sees all).
func (s *Server) resolveTimeline(ids startupIDs, claims *auth.Claims) (*timeline.Timeline, error) {
	if ids.hasTenant && ids.hasTimeline {
		key := proto.TimelineKey{TenantID: ids.tenant, TimelineID: ids.timeline}
		// Refused before the lookup: another tenant's timeline that
		// exists and one that does not get the same answer.
		if err := allows(claims, s.auth != nil, key); err != nil {
			return nil, err
		}
		return s.timelineByKey(key)
	}
	all, err := s.reg.Keys()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", acceptor.ErrStorage, err)
	}
	var match []proto.TimelineKey
	for _, k := range all {
		if s.auth != nil && claims.CheckTenant(k.TenantID) != nil {
			continue
		}
		if (!ids.hasTenant || k.TenantID == ids.tenant) && (!ids.hasTimeline || k.TimelineID == ids.timeline) {
			match = append(match, k)
		}
	}
	switch len(match) {
	case 1:
		return s.timelineByKey(match[0])
	case 0:
		return nil, pgwire.Errorf(pgwire.UndefinedObject, "no timeline on this safekeeper matches the startup options")
	}
	names := make([]string, 0, len(match))
	for i, k := range match {
		if i == 8 {
			names = append(names, fmt.Sprintf("and %d more", len(match)-i))
			break
		}
		names = append(names, k.String())
	}
	e := pgwire.Errorf(pgwire.InvalidParameterValue, "this safekeeper holds %d timelines (%s): name one in the startup options",
		len(match), strings.Join(names, ", "))
	e.Hint = "Connect with options '-c tenant_id=HEX -c timeline_id=HEX'."
	return nil, e
}
