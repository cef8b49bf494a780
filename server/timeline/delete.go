package timeline

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/safekeeper/safekeeper/proto"
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
//  3. Retention and the owner stop (the owner persisting what it holds).
//  4. storage.DeleteTimeline removes it in one transaction: a crash leaves
//     it whole or gone.

// deleteWait bounds how long a forced delete waits for the connections it
// cut to end before it closes their sockets.
const deleteWait = 5 * time.Second

// DeleteResult is what a delete found.
type DeleteResult struct {
	// DirExisted: the timeline was stored.
	DirExisted bool
	// WasActive: connections were ended (force).
	WasActive bool
}

// User is a connection bound to a timeline (a proposer's stream, a
// reader's commands): a forced delete cuts its reads, so that it ends
// (the server tells it why: the timeline was deleted), and closes it if it
// has not ended within deleteWait.
type User interface {
	SetReadDeadline(time.Time) error
	Close() error
}

// Bind counts u as a connection of t (a proposer's stream, a reader's
// commands); a delete refuses or ends them. It fails (a *NotFoundError)
// once t is being deleted.
func (t *Timeline) Bind(u User) error {
	t.usersMu.Lock()
	defer t.usersMu.Unlock()
	if t.deleted {
		return &NotFoundError{Key: t.key, Why: "does not exist on this safekeeper (it was deleted)"}
	}
	if t.users == nil {
		t.users = map[User]int{}
	}
	t.users[u]++
	return nil
}

// Unbind undoes one Bind of u.
func (t *Timeline) Unbind(u User) {
	t.usersMu.Lock()
	defer t.usersMu.Unlock()
	if t.users[u]--; t.users[u] <= 0 {
		delete(t.users, u)
		if len(t.users) == 0 {
			t.users = nil // Go maps do not shrink: an idle timeline keeps none
		}
	}
	if t.deleted && len(t.users) == 0 && t.usersGone != nil {
		close(t.usersGone)
		t.usersGone = nil
	}
}

// Deleted reports whether t is being deleted: a read error on one of its
// connections is then the delete's doing.
func (t *Timeline) Deleted() bool {
	t.usersMu.Lock()
	defer t.usersMu.Unlock()
	return t.deleted
}

// retire marks t deleted unless it has connections and force is false. It
// returns its connections and a channel closed when the last has unbound.
func (t *Timeline) retire(force bool) (users []User, gone <-chan struct{}, err error) {
	t.usersMu.Lock()
	defer t.usersMu.Unlock()
	if len(t.users) > 0 && !force {
		what := fmt.Sprintf("%d connections (a proposer or readers); end them", len(t.users))
		if len(t.users) == 1 {
			what = "1 connection (a proposer or a reader); end it"
		}
		return nil, nil, fmt.Errorf("%w: timeline %s has %s or delete with force", ErrBusy, t.key, what)
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
func (t *Timeline) unretire() {
	t.usersMu.Lock()
	defer t.usersMu.Unlock()
	t.deleted = false
}

// reservedDelete is a timeline of a tenant delete, reserved and (if it
// runs, t) retired.
type reservedDelete struct {
	key  proto.TimelineKey
	t    *Timeline
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

// Delete deletes timeline key durably (see the steps above). It fails
// with ErrBusy if it has connections and force is false, with ErrNotFound
// if it is not stored, and with ErrStopped once Stop ran.
func (r *Registry) Delete(key proto.TimelineKey, force bool) (DeleteResult, error) {
	t, err := r.reserveDelete(key)
	if err != nil {
		return DeleteResult{}, err
	}
	defer r.unreserveDelete(key)
	var users []User
	var gone <-chan struct{}
	if t != nil {
		if users, gone, err = t.retire(force); err != nil {
			return DeleteResult{}, err
		}
	}
	return r.finishDelete(key, t, users, gone, force)
}

// reserveDelete marks key deleting (step 1), after an open of it under
// way, and returns it if it runs. unreserveDelete undoes it.
func (r *Registry) reserveDelete(key proto.TimelineKey) (*Timeline, error) {
	for {
		r.mu.Lock()
		if r.stopping {
			r.mu.Unlock()
			return nil, ErrStopped
		}
		if op, ok := r.opening[key]; ok {
			r.mu.Unlock()
			<-op.done
			continue
		}
		if _, ok := r.deleting[key]; ok {
			r.mu.Unlock()
			return nil, fmt.Errorf("%w: timeline %s is being deleted already", ErrBusy, key)
		}
		r.deleting[key] = struct{}{}
		t := r.timelines[key]
		r.mu.Unlock()
		return t, nil
	}
}

func (r *Registry) unreserveDelete(key proto.TimelineKey) {
	r.mu.Lock()
	delete(r.deleting, key)
	r.mu.Unlock()
}

// finishDelete does steps 2 to 4 for a timeline reserved and, if it runs
// (t), retired with the connections it had (users, gone when they end).
func (r *Registry) finishDelete(key proto.TimelineKey, t *Timeline, users []User, gone <-chan struct{}, force bool) (DeleteResult, error) {
	var res DeleteResult
	if t != nil {
		r.mu.Lock()
		delete(r.timelines, key)
		r.retiring[t] = struct{}{}
		r.mu.Unlock()
		res.WasActive = len(users) > 0
		for _, pc := range users {
			pc.SetReadDeadline(time.Now()) // each ends: the timeline was deleted
		}
		select {
		case <-gone:
		case <-time.After(deleteWait):
			for _, pc := range users {
				pc.Close()
			}
			<-gone
		}
		r.ret.forget(t)
		t.stop()
		r.mu.Lock()
		delete(r.retiring, t)
		r.mu.Unlock()
	}
	del := r.db.DeleteTimeline
	if r.cfg.Hooks.DeleteTimeline != nil {
		del = r.cfg.Hooks.DeleteTimeline
	}
	err := del(key.TenantID, key.TimelineID)
	if errors.Is(err, storage.ErrNoTimeline) && t == nil {
		return res, err
	}
	if err != nil {
		return res, err
	}
	res.DirExisted = true
	r.log.Info("deleted timeline", "tenant_id", key.TenantID.String(), "timeline_id", key.TimelineID.String(),
		"force", force, "connections_ended", res.WasActive)
	return res, nil
}

// DeleteTenant deletes every timeline of tenant. Without force it is all
// or nothing: every timeline is retired (connections refused from then on)
// before any is deleted, and one with connections undoes that (ErrBusy,
// nothing changed). It fails with ErrNotFound if the tenant has no
// timeline here.
func (r *Registry) DeleteTenant(tenant proto.ID, force bool) (map[string]DeleteResult, error) {
	keys, err := r.db.Timelines()
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
			rd, err := r.Delete(k, true)
			if errors.Is(err, storage.ErrNoTimeline) {
				continue // deleted meanwhile
			}
			if err != nil {
				return out, err
			}
			out[k.TimelineID.String()] = rd
		}
		return out, nil
	}
	// Without force, all or nothing: every timeline is reserved and
	// retired (no connection may bind from then on) before any is
	// deleted; one with connections undoes them all.
	var reserved []reservedDelete
	defer func() {
		for _, rd := range reserved {
			r.unreserveDelete(rd.key)
		}
	}()
	for _, k := range mine {
		t, err := r.reserveDelete(k)
		if err != nil {
			undoRetire(reserved)
			return nil, err
		}
		rd := reservedDelete{key: k, t: t}
		if t != nil {
			if _, rd.gone, err = t.retire(false); err != nil {
				r.unreserveDelete(k)
				undoRetire(reserved)
				return nil, err
			}
		}
		reserved = append(reserved, rd)
	}
	for i, rd := range reserved {
		res, err := r.finishDelete(rd.key, rd.t, nil, rd.gone, false)
		if errors.Is(err, storage.ErrNoTimeline) {
			continue // deleted meanwhile
		}
		if err != nil {
			// The ones not reached yet take connections again (they
			// would answer "deleted" until a restart otherwise).
			undoRetire(reserved[i+1:])
			return out, err
		}
		out[rd.key.TimelineID.String()] = res
	}
	return out, nil
}

// Connections is how many connections are bound to the timeline (Bind).
func (t *Timeline) Connections() int {
	t.usersMu.Lock()
	defer t.usersMu.Unlock()
	return len(t.users)
}
