package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/server/httpapi"
)

// Config is a controller.
type Config struct {
	// Client is the fleet's etcd (required). The controller does not
	// close it.
	Client *fleet.Client
	// Listener is where the HTTP API is served (required); Run closes it.
	Listener net.Listener
	// Advertise is the HTTP address other controllers and operators are
	// told to reach the leader at (the campaign value); default the
	// listener's address.
	Advertise string
	// Replicas is the members of a timeline placed without a "replicas"
	// in the request; default fleet.DefaultReplicas.
	Replicas int
	// ElectionTTL is the election session's lease time to live, in whole
	// seconds (rounded up): a leader silent this long is deposed. Default
	// 10 s, at least 1 s.
	ElectionTTL time.Duration
	// RefreshInterval is how often the view of the fleet behind /metrics
	// is read from etcd; default 2 s.
	RefreshInterval time.Duration
	// Safekeeper is the HTTP API of the safekeeper advertised at addr
	// (moves push configurations, pull timelines and bump terms through
	// it); default server/httpapi's client without TLS or token.
	Safekeeper func(addr string) Safekeeper
	// MoveParallel bounds the timeline moves under way at once; default 4.
	MoveParallel int
	// CatchUpTimeout is how long a move waits for the new members to copy
	// the timeline and catch up before it rolls back; default 10 min.
	CatchUpTimeout time.Duration
	// DeadNodeTimeout: the timelines of a node without a lease this long
	// are moved to live nodes; default 30 min, negative: never.
	DeadNodeTimeout time.Duration
	// ReconcileInterval is how often the leader looks for work in etcd
	// (migration requests, drains, dead nodes); default 1 s.
	ReconcileInterval time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// MaxReplicas bounds the "replicas" of a placement request.
const MaxReplicas = 15

func (cfg *Config) withDefaults() error {
	if cfg.Client == nil {
		return errors.New("controller: no etcd client")
	}
	if cfg.Listener == nil {
		return errors.New("controller: no listener")
	}
	if cfg.Advertise == "" {
		cfg.Advertise = cfg.Listener.Addr().String()
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = fleet.DefaultReplicas
	}
	if cfg.Replicas < 1 || cfg.Replicas > MaxReplicas {
		return fmt.Errorf("controller: %d replicas: want 1 to %d", cfg.Replicas, MaxReplicas)
	}
	if cfg.ElectionTTL == 0 {
		cfg.ElectionTTL = 10 * time.Second
	}
	if cfg.ElectionTTL < time.Second {
		return fmt.Errorf("controller: election TTL %v: want at least 1s", cfg.ElectionTTL)
	}
	if cfg.RefreshInterval <= 0 {
		cfg.RefreshInterval = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Safekeeper == nil {
		cfg.Safekeeper = func(addr string) Safekeeper { return httpapi.NewClient(addr, nil, "") }
	}
	if cfg.MoveParallel <= 0 {
		cfg.MoveParallel = 4
	}
	if cfg.CatchUpTimeout <= 0 {
		cfg.CatchUpTimeout = 10 * time.Minute
	}
	if cfg.DeadNodeTimeout == 0 {
		cfg.DeadNodeTimeout = 30 * time.Minute
	}
	if cfg.ReconcileInterval <= 0 {
		cfg.ReconcileInterval = time.Second
	}
	return nil
}

// ErrNotLeader: the controller does not lead (it campaigns, or waits for
// the leader to go).
var ErrNotLeader = errors.New("controller: not the leader")

// Controller is one controller process's logic.
type Controller struct {
	cfg Config
	log *slog.Logger
	m   *metrics
	srv *http.Server

	mu   sync.Mutex
	lead *leadership // nil when not leading

	view atomic.Pointer[fleet.ClusterStatus] // the last fleet read, for /metrics

	// warned is when each rate-limited warning was last logged (the
	// reconcile loop's goroutine only).
	warned map[string]time.Time
}

// leadership is one term as the leader.
type leadership struct {
	key string // the election key this controller won with
	rev int64  // its create revision
	// ctx ends when the leadership does (session lost, a fenced write,
	// shutdown); abdicate ends it.
	ctx      context.Context
	abdicate context.CancelFunc
}

// Term is one term of this controller as the leader, as Lead hands it to
// the work only the leader may do.
type Term struct {
	// Key and Rev are the election key this controller won with and its
	// create revision.
	Key string
	Rev int64
	l   *leadership
}

// Fence is the compare every write of the term must carry in its
// transaction: it fails once the key is gone (the session's lease
// expired) or is another's.
func (t Term) Fence() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(t.Key), "=", t.Rev)
}

// Done is closed when the controller knows the term has ended. Work that
// spans several writes checks it between them; it is no guard by itself
// (a paused process learns late): the fence is.
func (t Term) Done() <-chan struct{} { return t.l.ctx.Done() }

// New makes a controller of cfg; Run starts it.
func New(cfg Config) (*Controller, error) {
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, log: cfg.Logger, m: newMetrics()}
	c.srv = &http.Server{Handler: c.handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)}
	return c, nil
}

// Addr is the HTTP API's address.
func (c *Controller) Addr() net.Addr { return c.cfg.Listener.Addr() }

// Advertise is the campaign value: the HTTP address as advertised.
func (c *Controller) Advertise() string { return c.cfg.Advertise }

// IsLeader reports whether the controller leads now (as far as it knows:
// its writes are fenced all the same).
func (c *Controller) IsLeader() bool { return c.leader() != nil }

func (c *Controller) leader() *leadership {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lead != nil && c.lead.ctx.Err() != nil {
		return nil
	}
	return c.lead
}

func (c *Controller) setLeader(l *leadership) {
	c.mu.Lock()
	c.lead = l
	c.mu.Unlock()
	if l != nil {
		c.m.isLeader.Set(1)
	} else {
		c.m.isLeader.Set(0)
	}
}

// Lead runs fn in the current term as the leader, or fails with
// ErrNotLeader. Every write fn makes to etcd must carry t.Fence() in its
// transaction; a write refused by it is fleet.ErrFenced, and fn returning
// an error that wraps it ends the term (the controller campaigns again).
// The term may end while fn runs (the process paused past the election
// TTL): fn's context is the caller's all the same, and its writes are
// refused by the fence, which is what keeps a deposed leader from
// writing, not what the controller believes. This is where the leader's
// work goes: placement now, moving timelines between nodes next (a move
// is several fenced writes, checking t.Done() between them).
func (c *Controller) Lead(ctx context.Context, fn func(ctx context.Context, t Term) error) error {
	l := c.leader()
	if l == nil {
		return ErrNotLeader
	}
	err := fn(ctx, Term{Key: l.key, Rev: l.rev, l: l})
	if errors.Is(err, fleet.ErrFenced) {
		c.log.Warn("a write was refused by the election fence: this controller is no longer the leader",
			"election_key", l.key, "election_rev", l.rev)
		l.abdicate()
	}
	return err
}

// Run serves and campaigns until ctx ends (see the package comment). It
// returns nil then, or an error if the HTTP API could not serve.
func (c *Controller) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	served := make(chan error, 1)
	wg.Add(3)
	go func() {
		defer wg.Done()
		err := c.srv.Serve(c.cfg.Listener)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		served <- err
		cancel()
	}()
	go func() { defer wg.Done(); c.refresh(ctx) }()
	go func() { defer wg.Done(); c.campaign(ctx) }()
	<-ctx.Done()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	c.srv.Shutdown(sctx)
	scancel()
	wg.Wait()
	return <-served
}

// campaign campaigns, leads while the session lasts, and again, until ctx
// ends.
func (c *Controller) campaign(ctx context.Context) {
	const firstWait = 250 * time.Millisecond
	wait := firstWait
	for ctx.Err() == nil {
		err := c.term(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			wait = firstWait
			continue
		}
		c.log.Warn("controller election failed; campaigning again", "err", err, "retry_in", wait.String())
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// term is one session: a lease, a campaign, and leadership until the
// session ends, the leadership is fenced off, or ctx ends. It returns nil
// when it led and lost (campaign again at once).
func (c *Controller) term(ctx context.Context) error {
	cli := c.cfg.Client.Etcd()
	ttl := int64((c.cfg.ElectionTTL + time.Second - 1) / time.Second)
	gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
	lease, err := cli.Grant(gctx, ttl)
	gcancel()
	if err != nil {
		return fmt.Errorf("%w (%s): %v", fleet.ErrUnavailable, c.cfg.Client.Endpoints(), err)
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithLease(lease.ID), concurrency.WithTTL(int(ttl)), concurrency.WithContext(ctx))
	if err != nil {
		c.revoke(lease.ID)
		return fmt.Errorf("%w (%s): %v", fleet.ErrUnavailable, c.cfg.Client.Endpoints(), err)
	}
	// The lease is revoked however the term ends: a resignation that lets
	// another controller lead at once (at worst it expires by itself).
	defer func() { sess.Orphan(); c.revoke(lease.ID) }()
	// NewElection adds the "/" ElectionPrefix ends with.
	el := concurrency.NewElection(sess, strings.TrimSuffix(c.cfg.Client.ElectionPrefix(), "/"))
	cctx, ccancel := context.WithCancel(ctx) // ends with the session too
	defer ccancel()
	go func() {
		select {
		case <-sess.Done():
			ccancel()
		case <-cctx.Done():
		}
	}()
	c.log.Info("campaigning for the controller leadership", "advertise", c.cfg.Advertise, "election_ttl", c.cfg.ElectionTTL.String())
	if err := el.Campaign(cctx, c.cfg.Advertise); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		select {
		case <-sess.Done():
			return errors.New("the election session's lease expired while campaigning")
		default:
		}
		return fmt.Errorf("%w (%s): campaign: %v", fleet.ErrUnavailable, c.cfg.Client.Endpoints(), err)
	}
	select {
	case <-sess.Done():
		return errors.New("the election session's lease expired while campaigning")
	default:
	}
	lctx, lcancel := context.WithCancel(cctx)
	defer lcancel()
	l := &leadership{key: el.Key(), rev: el.Rev(), ctx: lctx, abdicate: lcancel}
	c.setLeader(l)
	c.m.terms.Inc()
	c.log.Info("became the controller leader", "advertise", c.cfg.Advertise, "election_key", l.key, "election_rev", l.rev)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.reconcile(lctx, Term{Key: l.key, Rev: l.rev, l: l})
	}()
	<-lctx.Done()
	<-done
	c.setLeader(nil)
	switch {
	case ctx.Err() != nil:
		c.log.Info("resigning the controller leadership: shutting down")
	case isDone(sess.Done()):
		c.log.Warn("lost the controller leadership: the election session's lease expired (the process was paused, or etcd out of reach, longer than the election TTL); campaigning again",
			"election_ttl", c.cfg.ElectionTTL.String())
	default:
		c.log.Warn("gave up the controller leadership after a fenced write; campaigning again")
	}
	return nil
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (c *Controller) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.cfg.Client.Etcd().Revoke(ctx, id)
}

// refresh reads the fleet every RefreshInterval for the metrics.
func (c *Controller) refresh(ctx context.Context) {
	failing := false
	t := time.NewTicker(c.cfg.RefreshInterval)
	defer t.Stop()
	for {
		s, err := c.cfg.Client.Status(ctx)
		switch {
		case err == nil:
			c.view.Store(&s)
			if failing {
				c.log.Info("etcd answers again: the fleet view is fresh")
			}
			failing = false
		case ctx.Err() != nil:
			return
		case !failing:
			c.log.Warn("reading the fleet from etcd failed; the metrics keep the last view", "err", err)
			failing = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
