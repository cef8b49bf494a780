package server

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/server/httpapi"
	"github.com/safekeeper/safekeeper/storage"
)

// Deleting a timeline (DELETE /v1/tenant/{t}/timeline/{tl}):
//
//  1. The key is marked deleting: opens of it are refused from then on, and
//     an open in progress is waited for.
//  2. If the timeline runs, its connections are counted (bind). With any
//     and no force, the delete is refused and nothing changed. Otherwise
//     binds are refused from then on, the timeline leaves the registry, and
//     each bound connection is ended: its read is cut, and it ends with
//     FATAL 57P01 after its owner made durable and answered what it sent.
//  3. The owner and retention goroutines stop (persisting what they hold).
//  4. storage.DeleteTimeline removes it in one transaction: a crash leaves
//     it whole or gone.

// ErrTimelineBusy: a delete without force found a proposer or reader
// connected to the timeline. Nothing was changed.
var ErrTimelineBusy = errors.New("server: timeline has connections")

// errTimelineDeleted ends the connections of a deleted timeline.
var errTimelineDeleted = pgwire.Errorf(pgwire.AdminShutdown, "terminating connection: the timeline was deleted")

// deleteWait bounds how long a forced delete waits for the connections it
// cut to end before it closes their sockets.
const deleteWait = 5 * time.Second

// DeleteResult is what a delete found (the API's answer).
type DeleteResult = httpapi.DeleteResult

// bind counts pc as a connection of t (a proposer's stream, a reader's
// commands); delete refuses or ends them. It fails once t is being
// deleted.
func (t *timeline) bind(pc *pgwire.Conn) error {
	t.usersMu.Lock()
	defer t.usersMu.Unlock()
	if t.deleted {
		return pgwire.Errorf(pgwire.UndefinedObject, "timeline %s does not exist on this safekeeper (it was deleted)", t.key)
	}
	if t.users == nil {
		t.users = map[*pgwire.Conn]int{}
	}
	t.users[pc]++
	return nil
}

// unbind undoes one bind of pc.
func (t *timeline) unbind(pc *pgwire.Conn) {
	t.usersMu.Lock()
	defer t.usersMu.Unlock()
	if t.users[pc]--; t.users[pc] <= 0 {
		delete(t.users, pc)
	}
	if t.deleted && len(t.users) == 0 && t.usersGone != nil {
		close(t.usersGone)
		t.usersGone = nil
	}
}

// isDeleted reports whether t is being deleted: a read error on one of
// its connections is then the delete's doing.
func (t *timeline) isDeleted() bool {
	t.usersMu.Lock()
	defer t.usersMu.Unlock()
	return t.deleted
}

// retire marks t deleted unless it has connections and force is false. It
// returns its connections and a channel closed when the last has unbound.
func (t *timeline) retire(force bool) (users []*pgwire.Conn, gone <-chan struct{}, err error) {
	t.usersMu.Lock()
	defer t.usersMu.Unlock()
	if len(t.users) > 0 && !force {
		what := fmt.Sprintf("%d connections (a proposer or readers); end them", len(t.users))
		if len(t.users) == 1 {
			what = "1 connection (a proposer or a reader); end it"
		}
		return nil, nil, fmt.Errorf("%w: timeline %s has %s or delete with force", ErrTimelineBusy, t.key, what)
	}
	t.deleted = true
	ch := make(chan struct{})
	if len(t.users) == 0 {
		close(ch)
	} else {
		t.usersGone = ch
	}
	for pc := range t.users {
		users = append(users, pc)
	}
	return users, ch, nil
}

// unretire undoes a retire(false), which found no connections: binds are
// taken again.
func (t *timeline) unretire() {
	t.usersMu.Lock()
	defer t.usersMu.Unlock()
	t.deleted = false
}

// reservedDelete is a timeline of a tenant delete, reserved and (if it
// runs, t) retired.
type reservedDelete struct {
	key  proto.TimelineKey
	t    *timeline
	gone <-chan struct{}
}

// undoRetire unretires the timelines a refused tenant delete retired.
func undoRetire(rs []reservedDelete) {
	for _, r := range rs {
		if r.t != nil {
			r.t.unretire()
		}
	}
}

// DeleteTimeline deletes timeline key durably (see the steps above). It
// fails with ErrTimelineBusy if it has connections and force is false, and
// with storage.ErrNoTimeline if it is not stored.
func (s *Server) DeleteTimeline(key proto.TimelineKey, force bool) (DeleteResult, error) {
	t, err := s.reserveDelete(key)
	if err != nil {
		return DeleteResult{}, err
	}
	defer s.unreserveDelete(key)
	var users []*pgwire.Conn
	var gone <-chan struct{}
	if t != nil {
		if users, gone, err = t.retire(force); err != nil {
			return DeleteResult{}, err
		}
	}
	return s.finishDelete(key, t, users, gone, force)
}

// reserveDelete marks key deleting (step 1), after an open of it under
// way, and returns it if it runs. unreserveDelete undoes it.
func (s *Server) reserveDelete(key proto.TimelineKey) (*timeline, error) {
	for {
		s.mu.Lock()
		if s.isStopping() {
			s.mu.Unlock()
			return nil, errShutdown
		}
		if op, ok := s.opening[key]; ok {
			s.mu.Unlock()
			<-op.done
			continue
		}
		if _, ok := s.deleting[key]; ok {
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: timeline %s is being deleted already", ErrTimelineBusy, key)
		}
		s.deleting[key] = struct{}{}
		t := s.timelines[key]
		s.mu.Unlock()
		return t, nil
	}
}

func (s *Server) unreserveDelete(key proto.TimelineKey) {
	s.mu.Lock()
	delete(s.deleting, key)
	s.mu.Unlock()
}

// finishDelete does steps 2 to 4 for a timeline reserved and, if it runs
// (t), retired with the connections it had (users, gone when they end).
func (s *Server) finishDelete(key proto.TimelineKey, t *timeline, users []*pgwire.Conn, gone <-chan struct{}, force bool) (DeleteResult, error) {
	var res DeleteResult
	if t != nil {
		s.mu.Lock()
		delete(s.timelines, key)
		s.mu.Unlock()
		res.WasActive = len(users) > 0
		for _, pc := range users {
			pc.SetReadDeadline(time.Now()) // each ends with errTimelineDeleted
		}
		select {
		case <-gone:
		case <-time.After(deleteWait):
			for _, pc := range users {
				pc.Close()
			}
			<-gone
		}
		t.cancel()
		<-t.stopped
		<-t.retired
	}
	del := s.db.DeleteTimeline
	if s.hooks.deleteTimeline != nil {
		del = s.hooks.deleteTimeline
	}
	err := del(key.TenantID, key.TimelineID)
	if errors.Is(err, storage.ErrNoTimeline) && t == nil {
		return res, err
	}
	if err != nil {
		return res, err
	}
	res.DirExisted = true
	s.log.Info("deleted timeline", "tenant_id", key.TenantID.String(), "timeline_id", key.TimelineID.String(),
		"force", force, "connections_ended", res.WasActive)
	return res, nil
}

// DeleteTenant deletes every timeline of tenant. Without force it is all
// or nothing: every timeline is retired (connections refused from then on)
// before any is deleted, and one with connections undoes that
// (ErrTimelineBusy, nothing changed). It fails with storage.ErrNoTimeline
// if the tenant has no timeline here.
func (s *Server) DeleteTenant(tenant proto.ID, force bool) (map[string]DeleteResult, error) {
	keys, err := s.db.Timelines()
	if err != nil {
		return nil, err
	}
	var mine []proto.TimelineKey
	for _, k := range keys {
		if k.TenantID == tenant {
			mine = append(mine, k)
		}
	}
	if len(mine) == 0 {
		return nil, fmt.Errorf("%w: tenant %s has no timeline on this safekeeper", storage.ErrNoTimeline, tenant)
	}
	sort.Slice(mine, func(i, j int) bool { return mine[i].String() < mine[j].String() })
	out := map[string]DeleteResult{}
	if force {
		for _, k := range mine {
			r, err := s.DeleteTimeline(k, true)
			if errors.Is(err, storage.ErrNoTimeline) {
				continue // deleted meanwhile
			}
			if err != nil {
				return out, err
			}
			out[k.TimelineID.String()] = r
		}
		return out, nil
	}
	// Without force, all or nothing: every timeline is reserved and
	// retired (no connection may bind from then on) before any is
	// deleted; one with connections undoes them all.
	var reserved []reservedDelete
	defer func() {
		for _, r := range reserved {
			s.unreserveDelete(r.key)
		}
	}()
	for _, k := range mine {
		t, err := s.reserveDelete(k)
		if err != nil {
			undoRetire(reserved)
			return nil, err
		}
		r := reservedDelete{key: k, t: t}
		if t != nil {
			if _, r.gone, err = t.retire(false); err != nil {
				s.unreserveDelete(k)
				undoRetire(reserved)
				return nil, err
			}
		}
		reserved = append(reserved, r)
	}
	for i, r := range reserved {
		res, err := s.finishDelete(r.key, r.t, nil, r.gone, false)
		if errors.Is(err, storage.ErrNoTimeline) {
			continue // deleted meanwhile
		}
		if err != nil {
			// The ones not reached yet take connections again (they
			// would answer "deleted" until a restart otherwise).
			undoRetire(reserved[i+1:])
			return out, err
		}
		out[r.key.TimelineID.String()] = res
	}
	return out, nil
}
