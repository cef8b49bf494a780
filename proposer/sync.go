package proposer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto"
)

// ErrSyncIncomplete: the election was won but not every reachable
// safekeeper confirmed commit_lsn at the donor's end of WAL in time (for
// instance the WAL copy from the donor kept failing).
var ErrSyncIncomplete = errors.New("proposer: sync incomplete")

// ErrNoTimeline: a quorum of safekeepers answered that they do not hold the
// timeline and none does, and SyncConfig.Create was not set.
var ErrNoTimeline = errors.New("proposer: no safekeeper holds the timeline")

// SyncConfig configures Sync. The timeline fields must match what the
// safekeepers stored when the timeline was created (rule 1).
type SyncConfig struct {
	// Safekeepers are the host:port addresses of all safekeepers.
	Safekeepers []string
	// TenantID and TimelineID name the timeline.
	TenantID, TimelineID proto.ID
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
	lsn, err := syncTimeline(ctx, cfg)
	return lsn, nameDeposed(err, cfg.Safekeepers)
}

func syncTimeline(ctx context.Context, cfg SyncConfig) (proto.LSN, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
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
		WalSegSize: cfg.WalSegSize, ProposerUUID: cfg.ProposerUUID,
	}
	if err := si.Validate(); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	links := &skLinks{
		addrs: cfg.Safekeepers, si: &si, queueCap: 16, log: cfg.Logger,
		bo:     backoff{min: 100 * time.Millisecond, max: time.Second},
		events: make(chan skEvent, 64),
		dial:   DialConfig{TenantID: cfg.TenantID, TimelineID: cfg.TimelineID, ApplicationName: "sync", ConnectTimeout: cfg.ConnectTimeout},
	}
	links.start(ctx)
	core := NewCore(len(cfg.Safekeepers), cfg.ProposerUUID)
	type skSync struct {
		gen      int
		out      chan []byte
		voting   bool
		pending  *proto.VoteResponse
		elected  bool
		behind   bool // needs WAL from the donor
		inflight int
		synced   bool // reported commit_lsn ≥ term start

		copyID   int        // the current copy stream (0: none)
		copyStop func()     // stops it
		chunk    *copyChunk // a chunk from the donor not yet fully sent
		sent     proto.LSN  // next LSN to send while behind
	}
	sks := make([]skSync, len(cfg.Safekeepers))
	copies := make(chan copyChunk)
	copyIDs := 0
	var copyWG sync.WaitGroup
	defer func() {
		cancel()
		for i := range sks {
			if sks[i].out != nil {
				close(sks[i].out)
			}
		}
		links.wg.Wait()
		copyWG.Wait()
	}()
	stopCopy := func(i int) {
		s := &sks[i]
		if s.copyStop != nil {
			s.copyStop()
		}
		if s.chunk != nil {
			close(s.chunk.ack)
		}
		s.copyID, s.copyStop, s.chunk = 0, nil, nil
	}
	const copyWindow = 8 // SafeKeeperRequests in flight per safekeeper while copying
	send := func(i int, m proto.Message) {
		if sks[i].out != nil {
			select {
			case sks[i].out <- m.Encode(nil):
			default:
			}
		}
	}
	var target proto.LSN
	// feed sends the pending donor chunk to safekeeper i, at most
	// copyWindow requests in flight; the chunk is acknowledged to its copy
	// stream (which then reads the next) once wholly sent.
	feed := func(i int) {
		s := &sks[i]
		for s.chunk != nil && s.inflight < copyWindow {
			c := s.chunk
			end := c.start + proto.LSN(len(c.wal))
			if c.start > s.sent || end <= s.sent {
				if c.start > s.sent {
					cfg.Logger.Error("WAL copy from the donor skipped bytes", "safekeeper", cfg.Safekeepers[i], "chunk", c.start, "want", s.sent)
					stopCopy(i)
					return
				}
			} else {
				d := c.wal[s.sent-c.start:]
				d = d[:min(len(d), proto.MaxWALPerRequest, int(target-s.sent))]
				s.inflight++
				send(i, core.Request(s.sent, d))
				s.sent += proto.LSN(len(d))
			}
			if s.sent >= end || s.sent >= target {
				close(c.ack)
				s.chunk = nil
			}
			if s.sent >= target {
				s.behind = false
				stopCopy(i)
				cfg.Logger.Info("safekeeper has the donor's WAL", "safekeeper", cfg.Safekeepers[i], "end_of_wal", target)
			}
		}
	}
	startCopy := func(i int, from proto.LSN) {
		e := core.Election()
		copyIDs++
		cctx, stop := context.WithCancel(ctx)
		sks[i].copyID, sks[i].copyStop, sks[i].sent = copyIDs, stop, from
		cfg.Logger.Info("copying WAL from the donor", "safekeeper", cfg.Safekeepers[i],
			"donor", cfg.Safekeepers[e.Donor], "from", from, "to", target)
		copyWG.Add(1)
		go func(id int) {
			defer copyWG.Done()
			copyFromDonor(cctx, cfg, cfg.Safekeepers[e.Donor], e.Term, from, target, i, id, copies)
		}(copyIDs)
	}
	start := func(i int) {
		pe, err := core.ProposerElected(i)
		if err != nil {
			cfg.Logger.Warn("safekeeper cannot join", "safekeeper", cfg.Safekeepers[i], "err", err)
			return
		}
		send(i, pe)
		sks[i].elected = true
		sks[i].behind = pe.StartStreamingAt < target
		if sks[i].behind {
			startCopy(i, pe.StartStreamingAt)
			return
		}
		sks[i].inflight++
		send(i, core.Request(pe.StartStreamingAt, nil))
	}
	// done: a quorum confirmed target as commit_lsn, and so did every
	// safekeeper still connected in this term.
	done := func() bool {
		n, open := 0, 0
		for i := range sks {
			switch {
			case sks[i].synced:
				n++
			case sks[i].elected && sks[i].out != nil:
				open++
			}
		}
		return n >= core.Quorum() && open == 0
	}
	for {
		select {
		case <-ctx.Done():
			if core.Election() == nil {
				return 0, fmt.Errorf("%w: %d greeted, %d granted of %d before the timeout", ErrNoQuorum, core.Greetings(), core.Grants(), core.N())
			}
			synced, behind := 0, 0
			for i := range sks {
				if sks[i].synced {
					synced++
				}
				if sks[i].behind {
					behind++
				}
			}
			return 0, fmt.Errorf("%w: commit_lsn %s confirmed by %d of %d safekeepers (quorum %d), %d still copying WAL from the donor, at the timeout",
				ErrSyncIncomplete, target, synced, core.N(), core.Quorum(), behind)
		case c := <-copies:
			s := &sks[c.sk]
			if c.id != s.copyID {
				if c.ack != nil {
					close(c.ack)
				}
				continue
			}
			if c.err != nil {
				cfg.Logger.Warn("WAL copy from the donor failed; retrying", "safekeeper", cfg.Safekeepers[c.sk], "err", c.err)
				stopCopy(c.sk)
				if s.behind && s.out != nil {
					// Resume where the safekeeper's pipeline ends.
					startCopy(c.sk, s.sent)
				}
				continue
			}
			s.chunk = &c
			feed(c.sk)
		case ev := <-links.events:
			s := &sks[ev.sk]
			if ev.out != nil {
				if s.out != nil {
					close(s.out)
				}
				stopCopy(ev.sk)
				*s = skSync{gen: ev.gen, out: ev.out}
				if err := core.Greeted(ev.sk, ev.info); err != nil {
					return 0, err
				}
				if core.Ballot().Term != 0 {
					s.voting = true
					send(ev.sk, &proto.RequestVote{Candidate: core.Ballot()})
				} else if core.Greetings() >= core.Quorum() {
					b, err := core.Campaign()
					if err != nil {
						return 0, err
					}
					for i := range sks {
						if sks[i].out != nil {
							sks[i].voting = true
							send(i, &proto.RequestVote{Candidate: b})
						}
					}
				}
				continue
			}
			if ev.gen != s.gen {
				continue
			}
			if ev.err != nil {
				cfg.Logger.Warn("safekeeper disconnected", "safekeeper", cfg.Safekeepers[ev.sk], "err", ev.err)
				if s.out != nil {
					close(s.out)
				}
				stopCopy(ev.sk)
				*s = skSync{gen: -1}
				core.Disconnected(ev.sk)
				continue
			}
			switch m := ev.msg.(type) {
			case *proto.VoteResponse:
				if m.VotedFor != core.Ballot() {
					_, err := core.Voted(ev.sk, m, nil)
					return 0, err
				}
				s.pending = m
			case *proto.SafeKeeperInfo:
				if s.pending == nil {
					return 0, fmt.Errorf("proposer: safekeeper %s sent SafeKeeperInfo out of order", cfg.Safekeepers[ev.sk])
				}
				quorum, err := core.Voted(ev.sk, s.pending, m)
				s.pending = nil
				if err != nil {
					return 0, err
				}
				if core.Election() != nil {
					start(ev.sk)
				} else if quorum {
					e, err := core.Elect(^proto.LSN(0), 0)
					if err != nil {
						return 0, err
					}
					target = e.TermStartLSN
					cfg.Logger.Info("elected", "term", e.Term, "donor", cfg.Safekeepers[e.Donor], "end_of_wal", target)
					for i := range sks {
						if sks[i].out != nil && sks[i].voting && sks[i].pending == nil && !sks[i].elected {
							if core.Granted(i) {
								start(i)
							}
						}
					}
				}
			case *proto.SafeKeeperResponse:
				s.inflight--
				if _, err := core.Response(ev.sk, m); err != nil {
					return 0, err
				}
				if s.behind {
					feed(ev.sk)
					continue
				}
				if m.CommitLSN >= target {
					s.synced = true
				} else if core.CommitLSN() >= target && s.inflight == 0 {
					s.inflight++
					send(ev.sk, core.Request(m.FlushLSN, nil)) // carry the commit_lsn
				}
				if done() {
					return target, nil
				}
				// The first heartbeats may have raced the commit decision:
				// send the commit to everyone that has the WAL.
				if core.CommitLSN() >= target {
					for i := range sks {
						if sks[i].elected && !sks[i].behind && !sks[i].synced && sks[i].inflight == 0 {
							sks[i].inflight++
							send(i, core.Request(target, nil))
						}
					}
				}
			}
		}
	}
}

// copyChunk is one piece of the donor's WAL (or the copy stream's failure)
// for the sync loop; the loop closes ack once it has sent the chunk on.
type copyChunk struct {
	sk, id int
	start  proto.LSN
	wal    []byte
	err    error
	ack    chan struct{}
}

// copyFromDonor reads the donor's WAL from `from` up to `to` over a term
// reader and hands it to the sync loop one chunk at a time.
func copyFromDonor(ctx context.Context, cfg SyncConfig, donor string, term uint64, from, to proto.LSN, sk, id int, out chan<- copyChunk) {
	post := func(c copyChunk) bool {
		c.sk, c.id = sk, id
		select {
		case out <- c:
			return true
		case <-ctx.Done():
			return false
		}
	}
	host, port, err := splitHostPort(donor)
	if err != nil {
		post(copyChunk{err: err})
		return
	}
	connStr := fmt.Sprintf("host=%s port=%s user=sync sslmode=disable options='-c tenant_id=%s -c timeline_id=%s'",
		host, port, cfg.TenantID, cfg.TimelineID)
	up, err := dialUpstream(ctx, "donor safekeeper "+donor, connStr, "sync_copy", cfg.ConnectTimeout)
	if err != nil {
		post(copyChunk{err: err})
		return
	}
	defer up.close()
	if err := up.startReplicationTerm(ctx, "", from, cfg.PgTimeline, term); err != nil {
		post(copyChunk{err: err})
		return
	}
	err = up.forward(ctx, from, to, handOff(ctx, func(start proto.LSN, wal []byte, ack chan struct{}) bool {
		return post(copyChunk{start: start, wal: wal, ack: ack})
	}))
	if err != nil {
		post(copyChunk{err: err})
	}
}

// sqlstateUndefinedObject is what a safekeeper answers TIMELINE_STATUS
// for a timeline it does not hold.
const sqlstateUndefinedObject = "42704"

// timelineProbe is one safekeeper's answer to TIMELINE_STATUS.
type timelineProbe struct {
	addr    string
	holds   bool // the timeline exists there; the fields below are set
	missing bool // the safekeeper answered that it does not hold the timeline
	err     error

	systemID                       uint64
	pgVersion, segSize, pgTimeline uint32
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
	for {
		probes := make([]timelineProbe, len(cfg.Safekeepers))
		var wg sync.WaitGroup
		for i, addr := range cfg.Safekeepers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				probes[i] = probeTimeline(ctx, cfg, addr)
			}()
		}
		wg.Wait()
		var missing, failed []string
		var errs []error
		for _, p := range probes {
			switch {
			case p.holds:
				if cfg.SystemID == 0 {
					cfg.SystemID, cfg.PgVersion, cfg.WalSegSize, cfg.PgTimeline = p.systemID, p.pgVersion, p.segSize, p.pgTimeline
				}
				return nil
			case p.missing:
				missing = append(missing, p.addr)
			default:
				failed = append(failed, p.addr)
				errs = append(errs, p.err)
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
		cfg.Logger.Debug("no safekeeper holding the timeline answered yet; asking again", "timeline", tl,
			"not_on", strings.Join(missing, ","), "no_answer", strings.Join(failed, ","), "retry_in", d)
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

// probeTimeline asks one safekeeper TIMELINE_STATUS for the timeline.
func probeTimeline(ctx context.Context, cfg *SyncConfig, addr string) timelineProbe {
	p := timelineProbe{addr: addr}
	host, port, err := splitHostPort(addr)
	if err != nil {
		p.err = err
		return p
	}
	connStr := fmt.Sprintf("host=%s port=%s user=sync sslmode=disable options='-c tenant_id=%s -c timeline_id=%s'",
		host, port, cfg.TenantID, cfg.TimelineID)
	timeout := cfg.ConnectTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	up, err := dialUpstream(ctx, "safekeeper "+addr, connStr, "sync", timeout)
	if err != nil {
		p.err = err
		return p
	}
	res, err := up.pg.Exec(ctx, "TIMELINE_STATUS").ReadAll()
	up.close()
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == sqlstateUndefinedObject:
		p.missing = true
		return p
	case err != nil:
		p.err = fmt.Errorf("%s: TIMELINE_STATUS: %w", addr, err)
		return p
	case len(res) != 1 || len(res[0].Rows) != 1:
		p.err = fmt.Errorf("%s: TIMELINE_STATUS returned no row", addr)
		return p
	}
	col := map[string]string{}
	for j, f := range res[0].FieldDescriptions {
		if j < len(res[0].Rows[0]) {
			col[f.Name] = string(res[0].Rows[0][j])
		}
	}
	parse := func(name string, bits int) uint64 {
		v, err := strconv.ParseUint(col[name], 10, bits)
		if err != nil && p.err == nil {
			p.err = fmt.Errorf("%s: TIMELINE_STATUS %s %q: %v", addr, name, col[name], err)
		}
		return v
	}
	p.systemID = parse("system_id", 64)
	pgv, seg, tli := parse("pg_version", 32), parse("wal_seg_size", 32), parse("pg_timeline", 32)
	if p.err != nil {
		return p
	}
	p.holds = true
	p.pgVersion, p.segSize, p.pgTimeline = uint32(pgv), uint32(seg), uint32(tli)
	return p
}
