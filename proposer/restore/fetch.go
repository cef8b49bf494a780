package restore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proposer/client"
	"github.com/safekeeper/safekeeper/proto"
)

// ErrNotFound: the file asked for does not exist on the safekeepers — a
// segment at or past the end of the timeline's WAL, of another PostgreSQL
// timeline, or a history file they do not hold. For a restore_command this
// is the one answer that may end recovery: PostgreSQL takes it for the end
// of the archive.
var ErrNotFound = errors.New("proposer: no such WAL file on the safekeepers")

// FetchConfig configures Fetch.
type FetchConfig struct {
	// Safekeepers are the host:port addresses of all safekeepers of the
	// timeline.
	Safekeepers []string
	// TenantID and TimelineID name the timeline.
	TenantID, TimelineID proto.ID
	// Logger receives progress. nil means discard.
	Logger *slog.Logger
	// ConnectTimeout bounds each connection attempt. Default 10 s.
	ConnectTimeout time.Duration
	// Security: how to connect to the safekeepers (sslmode, sslrootcert,
	// password).
	Security client.Security
	// ProposerLease: a proposer that streamed (WAL or a heartbeat, every
	// 200 ms by default) to a safekeeper this recently and is still
	// connected is live. Default proposer.DefaultProposerLease.
	ProposerLease time.Duration
	// SettleTimeout bounds the wait for a live proposer to bring
	// commit_lsn up to the WAL a quorum holds. Default 10 s.
	SettleTimeout time.Duration
}

// Fetched is a file Fetch found.
type Fetched struct {
	// Data is the file's content: a whole segment (zero-padded after End
	// for the last one) or a history file.
	Data []byte
	// Start and End are the WAL the segment holds (End < Start + segment
	// size for the last segment of the WAL); zero for a history file.
	Start, End proto.LSN
	// From is the safekeeper it was read from.
	From string
	// Padded: zeros follow End to the segment's end (FetchArchive, which
	// leaves Data nil, says so here).
	Padded bool
	// Synced: Fetch ran a sync to commit the WAL a quorum held above
	// commit_lsn, because no proposer was live to do it.
	Synced bool
}

var (
	segmentName = regexp.MustCompile(`^([0-9A-F]{8})([0-9A-F]{8})([0-9A-F]{8})$`)
	historyName = regexp.MustCompile(`^([0-9A-F]{8})\.history$`)
)

// Fetch is `safekeeper wal fetch`, a restore_command: it returns the
// PostgreSQL WAL file called name (a segment, TTTTTTTTXXXXXXXXYYYYYYYY, or a
// history file, TTTTTTTT.history) from the safekeepers.
//
// A segment wholly below commit_lsn is read from any safekeeper that holds
// it. The segment holding the end of the WAL is returned up to the end of
// the WAL that is committed — every commit the primary saw acknowledged is
// below it — and zero-padded, which recovery reads as the end of WAL. That
// end is settled first: when a quorum holds WAL above commit_lsn (the
// primary died before the proposer told the safekeepers the last
// commit_lsn), a live proposer is waited for (cfg.SettleTimeout) to commit
// it; with none live, Fetch runs proposer.Sync to commit it itself, as
// `safekeeper sync` would. A segment at or past the end, of another PostgreSQL
// timeline, or a history file the safekeepers do not hold is ErrNotFound.
// Everything else is an error that must stop recovery rather than end it
// (no quorum answered, the timeline is not there, the segment was removed,
// a read failed).
func Fetch(ctx context.Context, cfg FetchConfig, name string) (Fetched, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.ProposerLease == 0 {
		cfg.ProposerLease = proposer.DefaultProposerLease
	}
	if cfg.SettleTimeout == 0 {
		cfg.SettleTimeout = 10 * time.Second
	}
	if len(cfg.Safekeepers) == 0 {
		return Fetched{}, errors.New("proposer: no safekeepers given")
	}
	seg := segmentName.FindStringSubmatch(name)
	hist := historyName.FindStringSubmatch(name)
	if seg == nil && hist == nil {
		return Fetched{}, fmt.Errorf("proposer: %q is not a WAL segment (TTTTTTTTXXXXXXXXYYYYYYYY) or history file (TTTTTTTT.history) name", name)
	}
	f := fetcher{cfg: cfg, sc: proposer.SyncConfig{Safekeepers: cfg.Safekeepers, TenantID: cfg.TenantID, TimelineID: cfg.TimelineID,
		Logger: cfg.Logger, ConnectTimeout: cfg.ConnectTimeout, Security: cfg.Security}}
	holders, err := f.probe(ctx)
	if err != nil {
		return Fetched{}, err
	}
	tli := holders[0].PgTimeline
	if hist != nil {
		n, _ := strconv.ParseUint(hist[1], 16, 32)
		content, from, err := f.history(ctx, holders, uint32(n))
		if err != nil {
			return Fetched{}, err
		}
		return Fetched{Data: content, From: from}, nil
	}
	segTLI, _ := strconv.ParseUint(seg[1], 16, 32)
	hi, _ := strconv.ParseUint(seg[2], 16, 32)
	lo, _ := strconv.ParseUint(seg[3], 16, 32)
	segSize := uint64(holders[0].SegSize)
	perID := uint64(0x100000000) / segSize
	if lo >= perID {
		return Fetched{}, fmt.Errorf("proposer: %q is not a WAL segment name for %d-byte segments", name, segSize)
	}
	start := proto.LSN((hi*perID + lo) * segSize)
	end := start + proto.LSN(segSize)
	if uint32(segTLI) != tli {
		// An ancestor's segment: served whole if it lies below where that
		// timeline ended (the bytes are the same on every later one); the
		// segment holding the switch is asked for under the new name.
		content, _, err := f.history(ctx, holders, tli)
		if err != nil {
			return Fetched{}, err
		}
		ends, _ := proto.ParsePgHistory(tli, content)
		ancestorEnd, ok := proto.LSN(0), false
		for _, e := range ends {
			if e.TLI == uint32(segTLI) {
				ancestorEnd, ok = e.End, true
			}
		}
		if !ok || end > ancestorEnd {
			return Fetched{}, fmt.Errorf("%w: %s is of PostgreSQL timeline %d, which the safekeepers' timeline %d does not hold there", ErrNotFound, name, segTLI, tli)
		}
	}

	commit := maxCommit(holders)
	res := Fetched{Start: start, End: end}
	if end > commit {
		// The segment holds the end of the WAL, or lies past it.
		if res.End, res.Synced, err = f.settle(ctx, holders); err != nil {
			return Fetched{}, err
		}
		if start >= res.End {
			return Fetched{}, fmt.Errorf("%w: %s starts at %s, at or past the end of the committed WAL %s", ErrNotFound, name, start, res.End)
		}
		res.End = min(res.End, end)
		if holders, err = f.probe(ctx); err != nil { // who has it committed now
			return Fetched{}, err
		}
	}
	res.Data, res.From, err = f.read(ctx, holders, tli, start, res.End, int(segSize))
	if err != nil {
		return Fetched{}, fmt.Errorf("%s: %w", name, err)
	}
	return res, nil
}

// history returns the history file of PostgreSQL timeline n from the first
// holder that answers TIMELINE_HISTORY n (ErrNotFound if they have none).
func (f *fetcher) history(ctx context.Context, holders []client.Probe, n uint32) ([]byte, string, error) {
	var errs []error
	for _, p := range holders {
		connStr, err := client.TimelineConnString(p.Addr, "fetch", f.cfg.Security, f.cfg.TenantID, f.cfg.TimelineID)
		if err != nil {
			return nil, "", err
		}
		up, err := client.DialReplication(ctx, "safekeeper "+p.Addr, connStr, "wal_fetch", f.cfg.ConnectTimeout)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		h, err := up.TimelineHistory(ctx, n)
		up.Close()
		var pe *pgconn.PgError
		switch {
		case errors.As(err, &pe) && pe.Code == "58P01":
			return nil, "", fmt.Errorf("%w: %08X.history: the safekeepers' PostgreSQL timeline %d has no history file for timeline %d",
				ErrNotFound, n, p.PgTimeline, n)
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: TIMELINE_HISTORY %d: %w", p.Addr, n, err))
			continue
		}
		return h, p.Addr, nil
	}
	return nil, "", fmt.Errorf("no safekeeper answered TIMELINE_HISTORY %d: %w", n, errors.Join(errs...))
}

type fetcher struct {
	cfg FetchConfig
	sc  proposer.SyncConfig
}

// probe asks every safekeeper TIMELINE_STATUS at once and returns those
// that hold the timeline, or an error: proposer.ErrNoTimeline when a quorum
// answered that they do not hold it, else proposer.ErrNoQuorum when no holder
// answered.
func (f *fetcher) probe(ctx context.Context) ([]client.Probe, error) {
	probes := make([]client.Probe, len(f.cfg.Safekeepers))
	var wg sync.WaitGroup
	for i, addr := range f.cfg.Safekeepers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			probes[i] = client.ProbeTimeline(ctx, addr, f.cfg.TenantID, f.cfg.TimelineID, f.cfg.Security, f.cfg.ConnectTimeout)
		}()
	}
	wg.Wait()
	var holders []client.Probe
	var missing []string
	var errs []error
	for _, p := range probes {
		switch {
		case p.Holds:
			holders = append(holders, p)
		case p.Missing:
			missing = append(missing, p.Addr)
		default:
			errs = append(errs, p.Err)
		}
	}
	tl := fmt.Sprintf("%s/%s", f.cfg.TenantID, f.cfg.TimelineID)
	if len(holders) > 0 {
		if len(errs) > 0 {
			f.cfg.Logger.Warn("some safekeepers did not answer", "err", errors.Join(errs...))
		}
		return holders, nil
	}
	if len(missing) >= len(f.cfg.Safekeepers)/2+1 {
		return nil, fmt.Errorf("%w: timeline %s is not on %s", proposer.ErrNoTimeline, tl, strings.Join(missing, ", "))
	}
	msg := fmt.Sprintf("no safekeeper holding timeline %s answered", tl)
	if len(missing) > 0 {
		msg += fmt.Sprintf("; it is not on %s", strings.Join(missing, ", "))
	}
	return nil, fmt.Errorf("%w: %s: %v", proposer.ErrNoQuorum, msg, errors.Join(errs...))
}

func maxCommit(ps []client.Probe) proto.LSN {
	var c proto.LSN
	for _, p := range ps {
		c = max(c, p.Commit)
	}
	return c
}

// quorumFlush is the highest LSN that at least a quorum of the safekeepers
// answering have flushed — a bound from above on what was acknowledged
// only if every safekeeper answered; otherwise the highest flush_lsn
// among them (the acknowledged WAL is on a quorum, which meets any quorum
// of answers).
func (f *fetcher) quorumFlush(ps []client.Probe) proto.LSN {
	flushes := make([]proto.LSN, 0, len(ps))
	for _, p := range ps {
		flushes = append(flushes, p.Flush)
	}
	slices.Sort(flushes)
	slices.Reverse(flushes)
	if len(ps) < len(f.cfg.Safekeepers) {
		return flushes[0]
	}
	return flushes[len(f.cfg.Safekeepers)/2]
}

// settle returns the end of the committed WAL, once it covers every commit
// a primary may have seen acknowledged. That needs a quorum's answers: the
// acknowledged WAL is on a quorum, and a quorum of answers includes one of
// them. When the safekeepers hold WAL above commit_lsn, a live proposer
// (streaming to one of them in the current term) is given
// cfg.SettleTimeout to commit it; with none, proposer.Sync commits it.
func (f *fetcher) settle(ctx context.Context, holders []client.Probe) (proto.LSN, bool, error) {
	quorum := len(f.cfg.Safekeepers)/2 + 1
	if len(holders) < quorum {
		return 0, false, fmt.Errorf("%w: %d of %d safekeepers hold the timeline and answered; the end of its WAL needs %d",
			proposer.ErrNoQuorum, len(holders), len(f.cfg.Safekeepers), quorum)
	}
	target := f.quorumFlush(holders)
	commit := maxCommit(holders)
	if commit >= target {
		return commit, false, nil
	}
	var term uint64
	for _, p := range holders {
		term = max(term, p.Term)
	}
	live := ""
	for _, p := range holders {
		if p.Live(term, f.cfg.ProposerLease) {
			live = p.ProposerAddr
		}
	}
	if live != "" {
		f.cfg.Logger.Info("the safekeepers hold WAL above commit_lsn; waiting for the live proposer to commit it",
			"commit_lsn", commit, "flush_lsn", target, "proposer", live, "term", term)
		deadline := time.Now().Add(f.cfg.SettleTimeout)
		for commit < target && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return 0, false, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
			ps, err := f.probe(ctx)
			if err != nil {
				return 0, false, err
			}
			commit = max(commit, maxCommit(ps))
		}
		if commit < target {
			// A live primary goes on writing: what is committed now is
			// what a copy taken now can have.
			f.cfg.Logger.Warn("the live proposer did not commit the WAL the safekeepers held in time; fetching what is committed",
				"commit_lsn", commit, "flush_lsn", target, "waited", f.cfg.SettleTimeout)
		}
		return commit, false, nil
	}
	f.cfg.Logger.Info("the safekeepers hold WAL above commit_lsn and no proposer is streaming; running sync to commit it",
		"commit_lsn", commit, "flush_lsn", target, "term", term)
	sc := f.sc
	sc.Force = true // no proposer is live: settle checked
	sc.SystemID, sc.PgVersion, sc.WalSegSize, sc.PgTimeline = holders[0].SystemID, holders[0].PgVersion, holders[0].SegSize, holders[0].PgTimeline
	end, err := proposer.Sync(ctx, sc)
	if err != nil {
		return 0, false, fmt.Errorf("committing the WAL above commit_lsn %s: %w", commit, err)
	}
	return end, true, nil
}

// read returns the WAL [start, end) zero-padded to size bytes, from the
// first of the holders that has it all committed and holds the segment
// from its first byte.
func (f *fetcher) read(ctx context.Context, holders []client.Probe, tli uint32, start, end proto.LSN, size int) ([]byte, string, error) {
	var errs []error
	for _, p := range holders {
		switch {
		case p.Commit < end:
			errs = append(errs, fmt.Errorf("%s: commit_lsn %s is below %s", p.Addr, p.Commit, end))
			continue
		case max(p.TimelineStart, p.RemovedTo) > start:
			errs = append(errs, fmt.Errorf("%s: holds the timeline only from %s (timeline start %s, removed up to %s)",
				p.Addr, max(p.TimelineStart, p.RemovedTo), p.TimelineStart, p.RemovedTo))
			continue
		}
		buf, err := f.readFrom(ctx, p.Addr, tli, start, end, size)
		if err == nil {
			return buf, p.Addr, nil
		}
		errs = append(errs, err)
	}
	return nil, "", fmt.Errorf("no safekeeper could serve %s..%s: %w", start, end, errors.Join(errs...))
}

func (f *fetcher) readFrom(ctx context.Context, addr string, tli uint32, start, end proto.LSN, size int) ([]byte, error) {
	connStr, err := client.TimelineConnString(addr, "fetch", f.cfg.Security, f.cfg.TenantID, f.cfg.TimelineID)
	if err != nil {
		return nil, err
	}
	up, err := client.DialReplication(ctx, "safekeeper "+addr, connStr, "wal_fetch", f.cfg.ConnectTimeout)
	if err != nil {
		return nil, err
	}
	defer up.Close()
	if err := up.StartReplication(ctx, "", start, tli); err != nil {
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	buf := make([]byte, size)
	got := start
	var gap error
	err = up.Forward(ctx, start, end, func(at proto.LSN, wal []byte) bool {
		if at != got {
			gap = fmt.Errorf("%s: WAL at %s, expected %s", addr, at, got)
			return false
		}
		n := min(len(wal), int(end-at))
		copy(buf[at-start:], wal[:n])
		got += proto.LSN(n)
		return true
	})
	if err == nil {
		err = gap
	}
	if err == nil && got < end {
		err = fmt.Errorf("%s: stream ended at %s, below %s", addr, got, end)
	}
	if err != nil {
		return nil, err
	}
	return buf, nil
}
