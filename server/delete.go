package server

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
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

// DeleteResult is what a delete found, in Neon's names.
type DeleteResult struct {
	// DirExisted: the timeline was stored.
	DirExisted bool `json:"dir_existed"`
	// WasActive: connections were ended (force).
	WasActive bool `json:"was_active"`
}

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
		return nil, nil, fmt.Errorf("%w: timeline %s has %d connections (a proposer or readers); end them or delete with force",
			ErrTimelineBusy, t.key, len(t.users))
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

// DeleteTimeline deletes timeline key durably (see the steps above). It
// fails with ErrTimelineBusy if it has connections and force is false, and
// with storage.ErrNoTimeline if it is not stored.
func (s *Server) DeleteTimeline(key proto.TimelineKey, force bool) (DeleteResult, error) {
	var t *timeline
	for {
		s.mu.Lock()
		if s.isStopping() {
			s.mu.Unlock()
			return DeleteResult{}, errShutdown
		}
		if op, ok := s.opening[key]; ok {
			s.mu.Unlock()
			<-op.done
			continue
		}
		if _, ok := s.deleting[key]; ok {
			s.mu.Unlock()
			return DeleteResult{}, fmt.Errorf("%w: timeline %s is being deleted already", ErrTimelineBusy, key)
		}
		s.deleting[key] = struct{}{}
		t = s.timelines[key]
		s.mu.Unlock()
		break
	}
	defer func() {
		s.mu.Lock()
		delete(s.deleting, key)
		s.mu.Unlock()
	}()
	var res DeleteResult
	if t != nil {
		users, gone, err := t.retire(force)
		if err != nil {
			return res, err
		}
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
	err := s.db.DeleteTimeline(key.TenantID, key.TimelineID)
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

// DeleteTenant deletes every timeline of tenant. Without force it first
// checks that none has connections (ErrTimelineBusy, nothing changed). It
// fails with storage.ErrNoTimeline if the tenant has no timeline here.
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
	if !force {
		for _, k := range mine {
			s.mu.Lock()
			t := s.timelines[k]
			s.mu.Unlock()
			if t == nil {
				continue
			}
			t.usersMu.Lock()
			n := len(t.users)
			t.usersMu.Unlock()
			if n > 0 {
				return nil, fmt.Errorf("%w: timeline %s has %d connections (a proposer or readers); end them or delete with force",
					ErrTimelineBusy, k, n)
			}
		}
	}
	out := map[string]DeleteResult{}
	for _, k := range mine {
		r, err := s.DeleteTimeline(k, force)
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
