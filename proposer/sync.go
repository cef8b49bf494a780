package proposer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proposer/session"
	"github.com/safekeeper/safekeeper/proto"
)

// ErrSyncIncomplete: the election was won but not every reachable
// safekeeper confirmed commit_lsn at the donor's end of WAL in time (for
// instance the WAL copy from the donor kept failing).
var ErrSyncIncomplete = errors.New("proposer: sync incomplete")

// ErrNoTimeline: a quorum of safekeepers answered that they do not hold the
// timeline and none does, and Config.Create (SyncConfig.Create) was not set
// (client.ErrNoTimeline, the same value).
var ErrNoTimeline = client.ErrNoTimeline

// SyncConfig configures Sync. The timeline fields must match what the
// safekeepers stored when the timeline was created (rule 1).
type SyncConfig struct {
	// Safekeepers are the host:port addresses of all safekeepers.
	Safekeepers []string
	// TenantID and TimelineID name the timeline.
	TenantID, TimelineID proto.ID
	// Configuration and SafekeeperIDs are the timeline's configuration
	// and the ids expected at the addresses, as in Config. A safekeeper
	// holding a newer configuration makes Sync start over in it.
	Configuration proto.Configuration
	SafekeeperIDs []uint64
	// SystemID is the primary's database system identifier. 0: read it,
	// with PgVersion, WalSegSize and PgTimeline, from the first safekeeper
	// that holds the timeline (TIMELINE_STATUS).
	SystemID uint64
	// PgVersion is PG_VERSION_NUM of the primary (only the major version is
	// checked). Default 150000, or discovered with SystemID.
	PgVersion uint32
	// WalSegSize is the WAL segment size in bytes. Default 16 MiB, or
	// discovered with SystemID.
	WalSegSize uint32
	// PgTimeline is the PostgreSQL TLI. Default 1, or discovered with
	// SystemID.
	PgTimeline uint32
	// Create lets Sync create the timeline on safekeepers that do not hold
	// it: a brand-new timeline (Neon's compute start); SystemID is then
	// required. Without it Sync first asks every safekeeper (TIMELINE_STATUS)
	// and, until one holds the timeline, greets none of them (a greeting
	// creates the timeline): ErrNoTimeline once a quorum answered that they
	// do not hold it.
	Create bool
	// ProposerUUID owns the sync's term. Default random.
	ProposerUUID proto.ID
	// Logger receives progress. nil means discard.
	Logger *slog.Logger
	// ConnectTimeout bounds each connection attempt. Default 10 s.
	ConnectTimeout time.Duration
	// Security: how to connect to the safekeepers (sslmode, sslrootcert,
	// password).
	Security Security
	// Force runs sync even while a proposer streams to the timeline
	// (deposing it). Without it Sync first asks every safekeeper and fails
	// with ErrProposerLive when one reports a proposer that streamed within
	// ProposerLease over a connection still open.
	Force bool
	// ProposerLease is that window. Default DefaultProposerLease.
	ProposerLease time.Duration
}

// Sync is `safekeeper sync` (Neon's sync-safekeepers): it wins an election
// without generating WAL, brings every reachable safekeeper of the term to
// the donor's end of WAL — copying what one lacks from the donor over a
// term reader (START_REPLICATION ... (term 'N'), which serves the donor's
// WAL up to its flush_lsn while it votes in our term) — and returns once a
// quorum, and every other safekeeper still connected, reports that point as
// commit_lsn. A timeline without WAL returns (0, ErrNoWAL); one no
// safekeeper holds is ErrNoTimeline unless cfg.Create. The caller bounds the
// whole run with ctx: no quorum in time is ErrNoQuorum, a quorum that did not
// finish is ErrSyncIncomplete.
func Sync(ctx context.Context, cfg SyncConfig) (proto.LSN, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := cfg.Configuration.Validate(); err != nil {
		return 0, fmt.Errorf("proposer: SyncConfig.Configuration: %w", err)
	}
	for {
		lsn, err := syncTimeline(ctx, cfg)
		var ce *session.ConfigurationError
		if errors.As(err, &ce) && ce.Configuration.Generation > cfg.Configuration.Generation {
			// A membership change (rule 9): the same sync in the newer
			// configuration.
			cfg.Logger.Info("a safekeeper holds a newer configuration; syncing in it", "safekeeper", cfg.Safekeepers[ce.Safekeeper],
				"generation", ce.Configuration.Generation, "was", cfg.Configuration.Generation)
			cfg.Configuration, cfg.SafekeeperIDs = ce.Configuration.Clone(), nil
			continue
		}
		return lsn, nameDeposed(err, cfg.Safekeepers)
	}
}

func syncTimeline(ctx context.Context, cfg SyncConfig) (proto.LSN, error) {
	switch {
	case cfg.Create && cfg.SystemID == 0:
		return 0, errors.New("proposer: SyncConfig.Create needs SystemID: a new timeline cannot be described by the safekeepers")
	case !cfg.Create:
		if err := findTimeline(ctx, &cfg); err != nil {
			return 0, err
		}
	}
	if cfg.PgVersion == 0 {
		cfg.PgVersion = 150000
	}
	if cfg.WalSegSize == 0 {
		cfg.WalSegSize = 16 << 20
	}
	if cfg.PgTimeline == 0 {
		cfg.PgTimeline = 1
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.ProposerLease == 0 {
		cfg.ProposerLease = DefaultProposerLease
	}
	if !cfg.Force {
		if l, ok := findLive(ctx, &cfg, 0, cfg.ProposerLease); ok {
			return 0, fmt.Errorf("%w: %s; sync would depose it and the primary's commits would wait for a new proposer: stop it first, or pass --force",
				ErrProposerLive, l)
		}
	}
	if cfg.ProposerUUID.IsZero() {
		c, err := Config{Upstream: "-", Safekeepers: cfg.Safekeepers, TenantID: proto.ID{1}, TimelineID: proto.ID{1}}.withDefaults()
		if err != nil {
			return 0, err
		}
		cfg.ProposerUUID = c.ProposerUUID
	}
	si := proto.ServerInfo{
		ProtocolVersion: proto.ProtocolVersion, PgVersion: cfg.PgVersion, SystemID: cfg.SystemID,
		TenantID: cfg.TenantID, TimelineID: cfg.TimelineID, PgTimeline: cfg.PgTimeline,
		WalSegSize: cfg.WalSegSize, ProposerUUID: cfg.ProposerUUID, Configuration: cfg.Configuration.Clone(),
	}
	if err := si.Validate(); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	links := &skLinks{
		addrs: cfg.Safekeepers, si: &si, queueCap: 16, log: cfg.Logger,
		// Without Create, findTimeline found a safekeeper holding it: the
		// greetings may create it on the others (a replaced disk).
		create: true,
		bo:     backoff{min: 100 * time.Millisecond, max: time.Second},
		events: make(chan skEvent, 64),
		dial:   client.DialConfig{TenantID: cfg.TenantID, TimelineID: cfg.TimelineID, ApplicationName: "sync", ConnectTimeout: cfg.ConnectTimeout, Security: cfg.Security},
	}
	links.start(ctx)
	y := &syncer{cfg: cfg, links: links, copies: make(chan streamChunk), sks: make([]syncSK, len(cfg.Safekeepers))}
	for i := range y.sks {
		y.sks[i].retry = backoff{min: 100 * time.Millisecond, max: time.Second}
	}
	y.sess = session.New(session.Config{
		N: len(cfg.Safekeepers), UUID: cfg.ProposerUUID, MaxInFlight: copyWindow,
		HeartbeatInterval: session.Duration(200 * time.Millisecond),
		Configuration:     cfg.Configuration, IDs: cfg.SafekeeperIDs,
	}, y)
	defer func() {
		cancel()
		for i := range y.sks {
			if y.sks[i].out != nil {
				close(y.sks[i].out)
			}
		}
		links.wg.Wait()
		y.copyWG.Wait()
	}()
	t := time.NewTicker(tick)
	defer t.Stop()
	var refusals map[int]error
	for {
		var r session.Ready
		var err error
		select {
		case <-ctx.Done():
			return 0, y.timeoutError()
		case <-t.C:
			r = y.sess.Tick(sessionTime(time.Now()))
		case c := <-y.copies:
			r = y.onCopy(c)
		case ev := <-links.events:
			sk := &y.sks[ev.sk]
			switch {
			case ev.refused:
				if ev.gen == sk.gen && sk.out != nil { // refused after its greeting
					y.closeLink(ev.sk)
					y.sess.Disconnected(ev.sk)
				}
				if refusals == nil {
					refusals = map[int]error{}
				}
				refusals[ev.sk] = ev.err
				if refusalBlocksQuorum(len(refusals), len(cfg.Safekeepers)) {
					return 0, incompatibleError(refusals, cfg.Safekeepers, &si)
				}
				cfg.Logger.Error("safekeeper refuses the timeline's description for good; not retried", "safekeeper", cfg.Safekeepers[ev.sk], "err", ev.err)
			case ev.out != nil: // a new, greeted connection
				y.closeLink(ev.sk)
				sk.gen, sk.out = ev.gen, ev.out
				sk.quiet = ev.quiet
				r, err = y.sess.Greeted(ev.sk, ev.info)
			case ev.gen != sk.gen:
				continue // a dropped connection's leftovers
			case ev.err != nil:
				// The link warns about it (skLinks.loop, rate-limited per reason).
				cfg.Logger.Debug("safekeeper disconnected", "safekeeper", cfg.Safekeepers[ev.sk], "err", ev.err)
				y.closeLink(ev.sk)
				y.sess.Disconnected(ev.sk)
			default:
				r, err = y.sess.Receive(ev.sk, ev.msg)
			}
		}
		if err != nil {
			y.logEvents(r)
			return 0, err
		}
		y.act(ctx, r)
		if r.Elect {
			e, r, err := y.sess.Elect(^proto.LSN(0), 0)
			if err != nil {
				y.logEvents(r)
				return 0, err
			}
			y.target = e.TermStartLSN
			y.act(ctx, r)
			y.act(ctx, y.sess.PumpAll())
		}
		if y.done() {
			return y.target, nil
		}
	}
}

// copyWindow is how many SafeKeeperRequests sync keeps in flight per
// safekeeper.
const copyWindow = 8

// syncer is Sync's IO around a Session: the safekeeper connections, and
// the copy streams that bring a safekeeper behind the donor's end of WAL
// (the target) its missing WAL from the donor. It is the Session's
// WALSource: sync generates no WAL, so all it streams is the donor's.
type syncer struct {
	cfg    SyncConfig
	links  *skLinks
	sess   *session.Session
	sks    []syncSK
	target proto.LSN // the donor's end of WAL: 0 until the election

	copies  chan streamChunk
	copyIDs int
	copyWG  sync.WaitGroup
}

type syncSK struct {
	gen int
	out chan []byte // nil while disconnected

	copyID   int          // the current copy stream (0: none)
	copyStop func()       // stops it
	chunk    *streamChunk // a chunk from the donor not yet wholly sent
	copyWant bool         // the session needs a copy stream from copyFrom
	copyFrom proto.LSN
	retryAt  time.Time // a failed copy stream is restarted no sooner
	retry    backoff
	// quiet: this connection is a reconnect after the same failure as the
	// one before; its lines go at debug (logEvents).
	quiet bool
}

// act carries out what the session decided (logs its events, sends, drops
// connections), and starts the copy streams it asked for.
func (y *syncer) act(ctx context.Context, r session.Ready) {
	y.logEvents(r)
	for _, m := range r.Sends {
		if out := y.sks[m.To].out; out != nil {
			select {
			case out <- m.Msg.Encode(nil):
			default:
			}
		}
	}
	for _, i := range r.Drop {
		y.closeLink(i)
	}
	for i := range y.sks {
		if s := &y.sks[i]; s.copyWant {
			s.copyWant = false
			y.startCopy(ctx, i, s.copyFrom)
		}
	}
}

// logEvents logs the session's events in r.
func (y *syncer) logEvents(r session.Ready) {
	logEvents(y.cfg.Logger, y.cfg.Safekeepers, func(i int) bool { return y.sks[i].quiet }, r.Events)
}

func (y *syncer) closeLink(i int) {
	s := &y.sks[i]
	if s.out != nil {
		close(s.out)
		s.out = nil
	}
	y.stopCopy(i)
	s.copyWant = false
	s.gen = -1
}

// done: a quorum confirmed target as commit_lsn, and so did every
// safekeeper still streaming in this term.
func (y *syncer) done() bool {
	if y.sess.Core().Election() == nil {
		return false
	}
	n, open := 0, 0
	for i := range y.sks {
		switch {
		case !y.sess.Streaming(i):
		case y.sess.Acked(i) >= y.target:
			n++
		default:
			open++
		}
	}
	return y.sess.Core().HasQuorum(func(i int) bool { return y.sess.Streaming(i) && y.sess.Acked(i) >= y.target }) && open == 0
}

func (y *syncer) timeoutError() error {
	core := y.sess.Core()
	if core.Election() == nil {
		err := fmt.Errorf("%w: %d greeted, %d granted of %d before the timeout", ErrNoQuorum, core.Greetings(), core.Grants(), core.N())
		if ends := y.links.lastErrors(func(i int) bool { return y.sks[i].out == nil }); ends != "" {
			err = fmt.Errorf("%w; not connected: %s", err, ends)
		}
		return err
	}
	synced, behind := 0, 0
	for i := range y.sks {
		if y.sess.Streaming(i) && y.sess.Acked(i) >= y.target {
			synced++
		}
		if y.sks[i].copyID != 0 {
			behind++
		}
	}
	return fmt.Errorf("%w: commit_lsn %s confirmed by %d of %d safekeepers (quorum %d), %d still copying WAL from the donor, at the timeout",
		ErrSyncIncomplete, y.target, synced, core.N(), core.Quorum(), behind)
}

// WAL is the session's WALSource: the donor's WAL below the target, from
// safekeeper i's copy stream (act starts one when it has none).
func (y *syncer) WAL(i int, lsn proto.LSN, max int) []byte {
	s := &y.sks[i]
	if lsn >= y.target {
		return nil
	}
	if s.copyID == 0 {
		if !time.Now().Before(s.retryAt) {
			s.copyWant, s.copyFrom = true, lsn
		}
		return nil
	}
	c := s.chunk
	if c == nil {
		return nil
	}
	d, skipped, consumed := c.piece(lsn, min(max, int(y.target-lsn)))
	if skipped {
		y.cfg.Logger.Error("WAL copy from the donor skipped bytes", "safekeeper", y.cfg.Safekeepers[i], "chunk", c.start, "want", lsn)
		y.stopCopy(i)
		return nil
	}
	if sent := lsn + proto.LSN(len(d)); consumed || sent >= y.target {
		close(c.ack)
		s.chunk = nil
		if sent >= y.target {
			y.stopCopy(i)
			y.cfg.Logger.Info("safekeeper has the donor's WAL", "safekeeper", y.cfg.Safekeepers[i], "end_of_wal", y.target)
		}
	}
	return d
}

// End is the donor's end of WAL (WALSource).
func (y *syncer) End() proto.LSN { return y.target }

func (y *syncer) startCopy(ctx context.Context, i int, from proto.LSN) {
	e := y.sess.Core().Election()
	y.copyIDs++
	cctx, stop := context.WithCancel(ctx)
	y.sks[i].copyID, y.sks[i].copyStop = y.copyIDs, stop
	y.cfg.Logger.Info("copying WAL from the donor", "safekeeper", y.cfg.Safekeepers[i],
		"donor", y.cfg.Safekeepers[e.Donor], "from", from, "to", y.target)
	y.copyWG.Add(1)
	go func(id int) {
		defer y.copyWG.Done()
		copyFromDonor(cctx, y.cfg, y.cfg.Safekeepers[e.Donor], e.Term, from, y.target, i, id, y.copies)
	}(y.copyIDs)
}

func (y *syncer) stopCopy(i int) {
	s := &y.sks[i]
	if s.copyStop != nil {
		s.copyStop()
	}
	if s.chunk != nil {
		close(s.chunk.ack)
	}
	s.copyID, s.copyStop, s.chunk = 0, nil, nil
}

// onCopy takes a chunk (or the failure) of a copy stream; a failed stream
// is restarted by a later pump, after a backoff, where the safekeeper's
// pipeline ends.
func (y *syncer) onCopy(c streamChunk) session.Ready {
	s := &y.sks[c.sk]
	if c.id != s.copyID {
		if c.ack != nil {
			close(c.ack)
		}
		return session.Ready{}
	}
	if c.err != nil {
		d := s.retry.next()
		y.cfg.Logger.Warn("WAL copy from the donor failed; retrying", "safekeeper", y.cfg.Safekeepers[c.sk], "err", c.err, "retry_in", d)
		y.stopCopy(c.sk)
		s.retryAt = time.Now().Add(d)
		return session.Ready{}
	}
	s.chunk = &c
	s.retry.reset()
	return y.sess.Pump(c.sk)
}

// copyFromDonor reads the donor's WAL from `from` up to `to` over a term
// reader and hands it to the sync loop one chunk at a time.
func copyFromDonor(ctx context.Context, cfg SyncConfig, donor string, term uint64, from, to proto.LSN, sk, id int, out chan<- streamChunk) {
	post := func(c streamChunk) bool {
		c.sk, c.id = sk, id
		select {
		case out <- c:
			return true
		case <-ctx.Done():
			return false
		}
	}
	// donor is host:port: it greeted.
	connStr, err := client.TimelineConnString(donor, "sync", cfg.Security, cfg.TenantID, cfg.TimelineID)
	if err != nil {
		post(streamChunk{err: fmt.Errorf("donor safekeeper %s: %w", donor, err)})
		return
	}
	streamChunks(ctx, "donor safekeeper "+donor, connStr, "sync_copy", cfg.ConnectTimeout, from, to, cfg.PgTimeline, term, post)
}

// findTimeline asks every safekeeper (at once) whether it holds the
// timeline, in rounds until one does. Then, without SystemID, it fills
// SystemID, PgVersion, WalSegSize and PgTimeline from the first holder in
// the configured order. Once a quorum answered that they do not hold it it
// fails with ErrNoTimeline: the greeting that follows would create it, and
// without Create sync must not create a timeline by accident (a mistyped
// id). At ctx's end it fails with ErrNoQuorum and what each one said.
func findTimeline(ctx context.Context, cfg *SyncConfig) error {
	quorum := len(cfg.Safekeepers)/2 + 1
	bo := backoff{min: 100 * time.Millisecond, max: time.Second}
	var warned time.Time
	for {
		probes := make([]client.Probe, len(cfg.Safekeepers))
		var wg sync.WaitGroup
		for i, addr := range cfg.Safekeepers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				probes[i] = probeTimeline(ctx, cfg, addr)
			}()
		}
		wg.Wait()
		var missing, failed, failedText []string
		var errs []error
		for _, p := range probes {
			switch {
			case p.Holds:
				if cfg.SystemID == 0 {
					cfg.SystemID, cfg.PgVersion, cfg.WalSegSize, cfg.PgTimeline = p.SystemID, p.PgVersion, p.SegSize, p.PgTimeline
				}
				return nil
			case p.Missing:
				missing = append(missing, p.Addr)
			default:
				failed = append(failed, p.Addr)
				errs = append(errs, p.Err)
				failedText = append(failedText, p.Addr+": "+endText(p.Err))
			}
		}
		tl := fmt.Sprintf("%s/%s", cfg.TenantID, cfg.TimelineID)
		var noAnswer string
		if len(failed) > 0 {
			noAnswer = fmt.Sprintf("; no answer from %s: %s", strings.Join(failed, ", "),
				strings.ReplaceAll(errors.Join(errs...).Error(), "\n", "; "))
		}
		if len(missing) >= quorum {
			return fmt.Errorf("%w: timeline %s is not on %s%s", ErrNoTimeline, tl, strings.Join(missing, ", "), noAnswer)
		}
		d := bo.next()
		level := slog.LevelDebug
		if now := time.Now(); now.Sub(warned) >= repeatWarning {
			level, warned = slog.LevelWarn, now // the first time, then once a minute
		}
		cfg.Logger.Log(ctx, level, "no safekeeper holding the timeline answered yet; asking again",
			"not_on", strings.Join(missing, ","), "no_answer", strings.Join(failedText, "; "), "retry_in", d)
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("no safekeeper holding timeline %s answered", tl)
			if len(missing) > 0 {
				msg += fmt.Sprintf("; it is not on %s", strings.Join(missing, ", "))
			}
			return fmt.Errorf("%w: %s%s", ErrNoQuorum, msg, noAnswer)
		case <-time.After(d):
		}
	}
}

// probeTimeline asks the safekeeper at addr TIMELINE_STATUS for cfg's
// timeline.
func probeTimeline(ctx context.Context, cfg *SyncConfig, addr string) client.Probe {
	return client.ProbeTimeline(ctx, addr, cfg.TenantID, cfg.TimelineID, cfg.Security, cfg.ConnectTimeout)
}
