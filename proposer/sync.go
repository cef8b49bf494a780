package proposer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/safekeeper/safekeeper/proto"
)

// ErrSyncNeedsWALCopy: a quorum could only be reached by copying WAL from
// the donor to safekeepers that lack it, which Sync does not do yet.
var ErrSyncNeedsWALCopy = errors.New("proposer: sync needs WAL copied from the donor, which is not implemented")

// SyncConfig configures Sync. The timeline fields must match what the
// safekeepers stored when the timeline was created (rule 1).
type SyncConfig struct {
	// Safekeepers are the host:port addresses of all safekeepers.
	Safekeepers []string
	// TenantID and TimelineID name the timeline.
	TenantID, TimelineID proto.ID
	// SystemID is the primary's database system identifier.
	SystemID uint64
	// PgVersion is PG_VERSION_NUM of the primary (only the major version is
	// checked). Default 150000.
	PgVersion uint32
	// WalSegSize is the WAL segment size in bytes. Default 16 MiB.
	WalSegSize uint32
	// PgTimeline is the PostgreSQL TLI. Default 1.
	PgTimeline uint32
	// ProposerUUID owns the sync's term. Default random.
	ProposerUUID proto.ID
	// Logger receives progress. nil means discard.
	Logger *slog.Logger
	// ConnectTimeout bounds each connection attempt. Default 10 s.
	ConnectTimeout time.Duration
}

// Sync is `safekeeper sync` (Neon's sync-safekeepers): it wins an election
// without generating WAL and brings a quorum to the donor's end of WAL with
// that point committed, and returns it. It handles the case where a quorum
// already holds the donor's WAL (it then only needs commit_lsn carried by
// heartbeats); a quorum that needs WAL copied from the donor fails with
// ErrSyncNeedsWALCopy once ctx expires (reading WAL from a safekeeper needs
// the replication server of issue 4). A timeline without WAL returns
// (0, ErrNoWAL). The caller bounds the whole run with ctx.
func Sync(ctx context.Context, cfg SyncConfig) (proto.LSN, error) {
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
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
	}
	sks := make([]skSync, len(cfg.Safekeepers))
	defer func() {
		cancel()
		for i := range sks {
			if sks[i].out != nil {
				close(sks[i].out)
			}
		}
		links.wg.Wait()
	}()
	send := func(i int, m proto.Message) {
		if sks[i].out != nil {
			select {
			case sks[i].out <- m.Encode(nil):
			default:
			}
		}
	}
	var target proto.LSN
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
			cfg.Logger.Warn("safekeeper lacks the donor's WAL; copying it is not implemented yet",
				"safekeeper", cfg.Safekeepers[i], "has", pe.StartStreamingAt, "needs", target)
			return
		}
		sks[i].inflight++
		send(i, core.Request(pe.StartStreamingAt, nil))
	}
	behind := 0
	for {
		select {
		case <-ctx.Done():
			if core.Election() == nil {
				return 0, fmt.Errorf("%w: %d greeted, %d granted of %d before the timeout", ErrNoQuorum, core.Greetings(), core.Grants(), core.N())
			}
			behind = 0
			for i := range sks {
				if sks[i].behind {
					behind++
				}
			}
			if behind > 0 {
				return 0, fmt.Errorf("%w: %d safekeeper(s) lack WAL below %s", ErrSyncNeedsWALCopy, behind, target)
			}
			return 0, fmt.Errorf("%w: commit_lsn %s not confirmed by a quorum before the timeout", ErrNoQuorum, target)
		case ev := <-links.events:
			s := &sks[ev.sk]
			if ev.out != nil {
				if s.out != nil {
					close(s.out)
				}
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
				if m.CommitLSN >= target {
					s.synced = true
				} else if core.CommitLSN() >= target && s.inflight == 0 {
					s.inflight++
					send(ev.sk, core.Request(m.FlushLSN, nil)) // carry the commit_lsn
				}
				n := 0
				for i := range sks {
					if sks[i].synced {
						n++
					}
				}
				if n >= core.Quorum() {
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
