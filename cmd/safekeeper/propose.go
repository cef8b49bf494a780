package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
)

// exitDeposed is the exit code of `propose` when another proposer took over
// the timeline with a higher term (docs/proposer.md).
const exitDeposed = 3

func proposeCommand() *cli.Command {
	return &cli.Command{
		Name:      "propose",
		Usage:     "stream a PostgreSQL primary's WAL to a quorum of safekeepers (the walproposer)",
		UsageText: "safekeeper propose --upstream 'host=... port=... user=...' (--safekeepers H:P,H:P,H:P | --etcd-endpoints URLS) --tenant-id HEX --timeline-id HEX [--create] [--slot NAME] [--application-name NAME] [--buffer-size 64MiB]",
		Description: "Connects to the primary as a physical replication client (creating or reusing a\n" +
			"physical slot), wins an election on the safekeepers, and streams WAL to all of them.\n" +
			"It reports flush = the quorum commit_lsn, so with synchronous_standby_names naming\n" +
			"--application-name every commit waits until a quorum of safekeepers has it durable.\n" +
			"Reconnects with backoff, except when the primary refuses it for good (unknown role, wrong\n" +
			"password, invalid slot name, no such database: exit 1), and when so many safekeepers refuse\n" +
			"this primary for good that no quorum is possible (exit 4): their timeline has another system\n" +
			"id, segment size or major version, or is on a newer PostgreSQL timeline (a standby was\n" +
			"promoted: this is an old primary; the message says \"refused: older PostgreSQL timeline\"),\n" +
			"or this primary's timeline history forks from theirs. Before each campaign it asks the\n" +
			"safekeepers whether another proposer streamed to the timeline within --proposer-lease over a\n" +
			"connection still open, and waits while one does, so a proposer restarted by its supervisor\n" +
			"after it was deposed does not depose the new one in turn; one they would refuse for good is\n" +
			"told so at once, without waiting. SIGHUP is logged and ignored.\n" +
			"It never creates a timeline unless told to: without --create, a timeline that no\n" +
			"safekeeper holds (a quorum answers that they do not) ends it with exit 4, naming the ids;\n" +
			"pass --create once, at a new timeline's first start. Once one safekeeper holds the\n" +
			"timeline, the others get it at their next greeting (a replaced disk).\n" +
			"--slot and --application-name default to proposer_<timeline-id>, so proposers of\n" +
			"different timelines never share the primary's slot or synchronous standby name.\n" +
			"With --etcd-endpoints instead of --safekeepers it proposes to the members of the timeline's\n" +
			"configuration in etcd (safekeeper timeline create), at their advertised addresses, and watches\n" +
			"it: a configuration naming other members or addresses is taken up without a restart of the\n" +
			"process (the proposer reconnects to them). A timeline with no configuration is refused (exit 4).\n" +
			"While etcd is unreachable the proposer goes on with the configuration it has.\n" +
			"--listen-http serves Prometheus /metrics (term, commit_lsn, the lag behind the primary,\n" +
			"each safekeeper link's state), /healthz and /readyz (200 while it streams to a quorum).\n" +
			"Exit codes: 0 after SIGTERM/SIGINT, 2 usage error, 3 deposed (a higher term appeared on a\n" +
			"safekeeper; the message names it and who streams to it), 4 refused for good (no safekeeper\n" +
			"holds the timeline, or the safekeepers refuse this primary: a restart cannot fix it; an\n" +
			"operator must act), 1 any other error.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       requireTimelineFlags("upstream"),
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "upstream", Usage: "libpq connection string of the primary, e.g. 'host=127.0.0.1 port=5432 user=postgres' (required)"},
			&cli.StringFlag{Name: "safekeepers", Usage: "comma-separated host:port list of every safekeeper of the timeline (or --etcd-endpoints)"},
			&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)"},
			&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)"},
			&cli.BoolFlag{Name: "create", Usage: "create the timeline on the safekeepers if none holds it: a new timeline's first start only"},
			&cli.StringFlag{Name: "slot", DefaultText: "proposer_<timeline-id>", Usage: "physical replication slot on the primary (created with RESERVE_WAL if missing): 1-63 lowercase letters, digits, underscores"},
			&cli.StringFlag{Name: "application-name", DefaultText: "proposer_<timeline-id>", Usage: "application_name on the primary (1-63 printable ASCII bytes); name it in synchronous_standby_names"},
			&cli.StringFlag{Name: "buffer-size", Value: "64MiB", Usage: "in-memory WAL kept for lagging safekeepers (e.g. 64MiB); older WAL is re-read from the primary"},
			&cli.DurationFlag{Name: "proposer-lease", Value: proposer.DefaultProposerLease, Usage: "wait to campaign while another proposer streamed to the timeline this recently; 0: take over at once (deposing it)"},
			&cli.StringFlag{Name: "listen-http", Usage: "host:port for the proposer's /metrics, /healthz and /readyz (plain HTTP; e.g. 127.0.0.1:7686); '' (the default) serves none"},
		}, append(securityFlags(), etcdFlags()...)...),
		Action: func(c *cli.Context) error {
			log, tl, err := timelineArgsFor(c, false)
			if err != nil {
				return err
			}
			if tl.etcd != nil {
				defer tl.etcd.Close()
			}
			setProcs()
			tenant, timeline := tl.tenant, tl.timeline
			bufSize, err := parseByteSize(c.String("buffer-size"))
			if err != nil {
				return usagef("--buffer-size: %w", err)
			}
			if bufSize < proto.MaxWALPerRequest {
				return usagef("--buffer-size %s: want at least 128KiB (one request of WAL)", c.String("buffer-size"))
			}
			if err := checkUpstream(c.String("upstream")); err != nil {
				return err
			}
			slot, appName := c.String("slot"), c.String("application-name")
			if !c.IsSet("slot") {
				slot = proposer.DefaultName(timeline)
			}
			if !c.IsSet("application-name") {
				appName = proposer.DefaultName(timeline)
			}
			if err := checkApplicationName(appName); err != nil {
				return usagef("--application-name %q: %w", appName, err)
			}
			if err := checkSlotName(slot); err != nil {
				return usagef("--slot: %w", err)
			}
			listenHTTP := c.String("listen-http")
			if listenHTTP != "" {
				if err := checkListenAddr(listenHTTP); err != nil {
					return usagef("--listen-http %q: %w", listenHTTP, err)
				}
			}
			lease := c.Duration("proposer-lease")
			switch {
			case lease < 0:
				return usagef("--proposer-lease %v: want 0 (no wait) or a positive duration", lease)
			case lease == 0:
				lease = -1 // proposer.Config: negative disables the wait
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			defer ignoreSIGHUP(log)()
			sec, err := securityFrom(c)
			if err != nil {
				return err
			}
			if tl.etcd != nil {
				// The members from etcd; while etcd does not answer, wait
				// for it rather than exit (a supervisor would only start
				// the same wait again).
				for wait := time.Second; ; wait = min(2*wait, 10*time.Second) {
					tl.resolved, tl.safekeepers, err = resolveTimeline(ctx, tl.etcd, tenant, timeline)
					if !errors.Is(err, fleet.ErrUnavailable) || ctx.Err() != nil {
						break
					}
					log.Warn("etcd unavailable; the timeline's members are read once it answers", "err", err, "retry_in", wait.String())
					select {
					case <-ctx.Done():
					case <-time.After(wait):
					}
				}
				if ctx.Err() != nil {
					return nil
				}
				if err != nil {
					return err
				}
				log.Info("configuration read from etcd", "generation", tl.resolved.Config.Generation, "members", tl.resolved.Config.All(),
					"safekeepers", strings.Join(tl.safekeepers, ","))
			}
			sks := tl.safekeepers
			var stats atomic.Pointer[proposer.Stats]
			stats.Store(proposer.NewStats(sks))
			if listenHTTP != "" {
				stop, err := serveProposerHTTP(log, listenHTTP, stats.Load, tenant, timeline)
				if err != nil {
					return err
				}
				defer stop()
			}
			var ownTerm uint64 // the last term a Run of this process owned
			for {
				runCtx, restart := context.WithCancel(ctx)
				changed := watchMembers(runCtx, log, tl, sks, restart)
				err = proposer.Run(runCtx, proposer.Config{
					Upstream: c.String("upstream"), Safekeepers: sks, TenantID: tenant, TimelineID: timeline,
					SlotName: slot, ApplicationName: appName, Logger: log, Create: c.Bool("create"),
					BufferSize: bufSize, ProposerLease: lease, Security: sec, Stats: stats.Load(),
					Configuration: tl.resolved.Config, SafekeeperIDs: resolvedIDs(tl), OwnTerm: ownTerm,
				})
				restart()
				// The next Run does not wait for this one's term to end
				// (its connections may still be open on the safekeepers).
				ownTerm = max(ownTerm, stats.Load().Snapshot(time.Now()).Term)
				next, ok := <-changed
				if !ok || ctx.Err() != nil {
					break
				}
				// A new configuration in etcd: the same proposer on its
				// members, without a restart of the process.
				addrs, _ := next.Addrs()
				log.Info("configuration changed in etcd; proposing to its members", "generation", next.Config.Generation,
					"members", next.Config.All(), "safekeepers", strings.Join(addrs, ","), "was", strings.Join(sks, ","))
				tl.resolved, sks = next, addrs
				stats.Store(proposer.NewStats(sks))
			}
			if errors.Is(err, proposer.ErrDeposed) {
				return deposedExit(err)
			}
			if errors.Is(err, proposer.ErrIncompatible) {
				return refusedExit(err)
			}
			if errors.Is(err, proposer.ErrNoTimeline) {
				return cli.Exit(fmt.Sprintf("%v; nothing was created: check --tenant-id and --timeline-id "+
					"(and --safekeepers), or pass --create at a new timeline's first start", err), exitPermanent)
			}
			if err == nil {
				log.Info("stopped")
			}
			return err
		},
	}
}

// deposedExit is the exit error for a deposed proposer (or sync): one
// message naming the safekeeper's address and both terms, exit code 3.
func deposedExit(err error) error {
	msg := err.Error()
	var de *proposer.DeposedError
	if errors.As(err, &de) {
		msg = de.Reason()
	}
	return cli.Exit("deposed: "+msg+"; another proposer owns the timeline now", exitDeposed)
}

// refusedExit is the exit error for a primary the safekeepers refuse for
// good (proposer.ErrIncompatible): exit 4, with what to do about it.
func refusedExit(err error) error {
	var ie *proposer.IncompatibleError
	if errors.As(err, &ie) {
		switch ie.Reason {
		case proposer.RefusedOlderPgTimeline:
			err = fmt.Errorf("%w; this primary must not write on: bring it back as a standby of the new primary (pg_rewind, or a new base backup: docs/operations.md) and do not run its proposer", err)
		case proposer.RefusedForkedPgTimeline:
			err = fmt.Errorf("%w; this primary's history forks from the timeline the safekeepers hold: it must not be protected there", err)
		case proposer.RefusedSystemID, proposer.RefusedPgVersion, proposer.RefusedSegmentSize:
			err = fmt.Errorf("%w; check --tenant-id and --timeline-id: they name another cluster's timeline", err)
		}
	}
	return permanentError{err}
}

// nameDataLen is PostgreSQL's NAMEDATALEN: names hold at most 63 bytes.
const nameDataLen = 64

// checkSlotName applies PostgreSQL's rule for replication slot names
// (proto.CheckSlotName: 1 to 63 lower case letters, digits and underscores)
// to --slot, so that a name the primary would refuse is a usage error. The
// error wraps the *proto.SlotNameError and says what would do.
func checkSlotName(name string) error {
	err := proto.CheckSlotName(name)
	var se *proto.SlotNameError
	if !errors.As(err, &se) {
		return err
	}
	if se.Reason == proto.SlotNameInvalidCharacter {
		return fmt.Errorf("%w; use only lower case letters, digits and underscores", err)
	}
	return fmt.Errorf("%w; want 1 to %d bytes", err, proto.MaxSlotNameLen)
}

// checkApplicationName checks the name the primary must find in
// synchronous_standby_names: PostgreSQL cuts application_name to 63 bytes
// and replaces anything but printable ASCII with '?', after which it would
// no longer match.
func checkApplicationName(name string) error {
	if name == "" {
		return errors.New("want the non-empty name that synchronous_standby_names on the primary lists")
	}
	if len(name) >= nameDataLen {
		return fmt.Errorf("want at most %d bytes (PostgreSQL truncates a longer application_name)", nameDataLen-1)
	}
	for _, r := range name {
		if r < 32 || r > 126 {
			return errors.New("want printable ASCII only (PostgreSQL replaces other characters in application_name with '?')")
		}
	}
	return nil
}

// timelineFlags are the flags propose and sync share.
type timelineFlags struct {
	safekeepers      []string
	tenant, timeline proto.ID
	// With --etcd-endpoints instead of --safekeepers: the client (closed
	// by the command) and the timeline's configuration it resolved (none
	// for timeline create, which makes it).
	etcd     *fleet.Client
	resolved fleet.Resolved
}

// resolvedIDs are the safekeeper_ids expected at tl.safekeepers: the
// members' when the configuration came from etcd, none (learned from the
// greetings) with --safekeepers.
func resolvedIDs(tl timelineFlags) []uint64 {
	if tl.etcd == nil {
		return nil
	}
	return tl.resolved.IDs()
}

// requireTimelineFlags is the Before of a command naming a timeline's
// safekeepers: the flags first (propose's --upstream), then --safekeepers
// or --etcd-endpoints, --tenant-id and --timeline-id, every missing one
// named at once.
func requireTimelineFlags(first ...string) cli.BeforeFunc {
	return func(c *cli.Context) error {
		var missing []string
		for _, n := range first {
			if !c.IsSet(n) {
				missing = append(missing, n)
			}
		}
		if !c.IsSet("safekeepers") && !c.IsSet("etcd-endpoints") {
			missing = append(missing, "safekeepers (or etcd-endpoints)")
		}
		for _, n := range []string{"tenant-id", "timeline-id"} {
			if !c.IsSet(n) {
				missing = append(missing, n)
			}
		}
		return missingFlags(missing)
	}
}

// timelineArgs checks what propose and sync share: no arguments, the log
// flags, --safekeepers or --etcd-endpoints, --tenant-id and --timeline-id.
// With --etcd-endpoints the safekeepers are the members of the timeline's
// configuration there, at their advertised addresses.
func timelineArgs(c *cli.Context) (*slog.Logger, timelineFlags, error) {
	return timelineArgsFor(c, true)
}

// timelineArgsFor is timelineArgs; resolve false leaves the configuration
// unread (timeline create makes it).
func timelineArgsFor(c *cli.Context, resolve bool) (*slog.Logger, timelineFlags, error) {
	var f timelineFlags
	if c.NArg() > 0 {
		return nil, f, usagef("%s takes no arguments, got %q", c.Command.Name, c.Args().Slice())
	}
	log, err := logger(c)
	if err != nil {
		return nil, f, err
	}
	if f.tenant, f.timeline, err = parseIDs(c); err != nil {
		return nil, f, err
	}
	if c.IsSet("safekeepers") && c.IsSet("etcd-endpoints") {
		return nil, f, usagef("--safekeepers and --etcd-endpoints exclude each other: the addresses come from one or the other")
	}
	if !c.IsSet("etcd-endpoints") {
		if _, err := etcdClient(c); err != nil { // an etcd flag without --etcd-endpoints
			return nil, f, err
		}
		if f.safekeepers, err = parseSafekeepers(c.String("safekeepers")); err != nil {
			return nil, f, err
		}
		return log.With("tenant_id", f.tenant.String(), "timeline_id", f.timeline.String()), f, nil
	}
	if f.etcd, err = etcdClient(c); err != nil {
		return nil, f, err
	}
	log = log.With("tenant_id", f.tenant.String(), "timeline_id", f.timeline.String())
	if !resolve {
		return log, f, nil
	}
	if f.resolved, f.safekeepers, err = resolveTimeline(c.Context, f.etcd, f.tenant, f.timeline); err != nil {
		f.etcd.Close()
		return nil, f, err
	}
	// Debug: every command naming a timeline through etcd reads it
	// (timeline members would log it at each call); propose logs its own.
	log.Debug("configuration read from etcd", "generation", f.resolved.Config.Generation, "members", f.resolved.Config.All(),
		"safekeepers", strings.Join(f.safekeepers, ","))
	return log, f, nil
}

// resolveTimeline reads a timeline's configuration and its members'
// addresses. No configuration is a refusal for good (exit 4) pointing at
// timeline create: a mistyped id must never place a new timeline.
func resolveTimeline(ctx context.Context, ec *fleet.Client, tenant, timeline proto.ID) (fleet.Resolved, []string, error) {
	r, err := ec.Resolve(ctx, tenant, timeline)
	switch {
	case errors.Is(err, fleet.ErrNoConfig):
		return r, nil, cli.Exit(fmt.Sprintf("%v: check --tenant-id and --timeline-id, or create the timeline with "+
			"safekeeper timeline create --etcd-endpoints ... (it places it on live safekeepers)", err), exitPermanent)
	case errors.Is(err, fleet.ErrBadConfig):
		return r, nil, cli.Exit(err.Error(), exitPermanent)
	case err != nil:
		return r, nil, err
	}
	addrs, err := r.Addrs()
	if err != nil {
		return r, nil, err
	}
	return r, addrs, nil
}

// parseSafekeepers parses the --safekeepers list. An address given twice is
// refused: it would count one safekeeper twice toward the quorum. (Two
// spellings of one server are caught later, by safekeeper_id.)
func parseSafekeepers(s string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		if err := checkDialAddr(a); err != nil {
			return nil, usagef("--safekeepers: %q: %w", a, err)
		}
		host, port, _ := net.SplitHostPort(a)
		key := strings.ToLower(net.JoinHostPort(host, port))
		if seen[key] {
			return nil, usagef("--safekeepers: %s is listed twice; one safekeeper must not count twice toward the quorum", a)
		}
		seen[key] = true
		out = append(out, a)
	}
	return out, nil
}

// checkDialAddr checks a host:port to connect to: a host, and a port from
// 1 to 65535 (0 is only for listening: it picks a free port).
// checkUpstream checks --upstream as libpq would (proposer.CheckConnString):
// empty, or a keyword libpq does not know, is a usage error.
func checkUpstream(s string) error {
	if strings.TrimSpace(s) == "" {
		return usagef("--upstream is empty: want the primary's libpq connection string, e.g. 'host=/var/run/postgresql port=5432 user=postgres'")
	}
	if err := proposer.CheckConnString(s); err != nil {
		return usagef("--upstream: %w", err)
	}
	return nil
}

func checkDialAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return errors.New("want host:port")
	}
	if strings.ContainsFunc(host, func(r rune) bool { return r <= ' ' || r == '\'' || r == '\\' || r == '=' || r == 0x7f }) {
		return fmt.Errorf("host %q: want a host name or address (no blanks, quotes or '=')", host)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("port %q: want a number from 1 to 65535", port)
	}
	return nil
}

func parseIDs(c *cli.Context) (tenant, timeline proto.ID, err error) {
	if tenant, err = proto.ParseID(c.String("tenant-id")); err != nil {
		return tenant, timeline, usagef("--tenant-id: %w", err)
	}
	if timeline, err = proto.ParseID(c.String("timeline-id")); err != nil {
		return tenant, timeline, usagef("--timeline-id: %w", err)
	}
	return tenant, timeline, nil
}

// parseByteSize parses "1048576", "512KiB", "64MiB" or "1GiB".
func parseByteSize(s string) (int, error) {
	mult := 1
	for _, u := range []struct {
		suf string
		m   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSuffix(s, u.suf), u.m
			break
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("%q is not a size like 64MiB", s)
	}
	return n * mult, nil
}

// safekeeperFlags are --safekeepers, --tenant-id and --timeline-id, which
// every command that speaks to a timeline's safekeepers takes.
func safekeeperFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "safekeepers", Usage: "comma-separated host:port list of every safekeeper of the timeline (or --etcd-endpoints)"},
		&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)"},
		&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)"},
	}
}

// timelineDescFlags are --system-id (described by systemID) and what
// describes a timeline's primary with it: --pg-version, --wal-seg-size,
// --pg-timeline (checkTimelineFlags checks them).
func timelineDescFlags(systemID string) []cli.Flag {
	return []cli.Flag{
		&cli.Uint64Flag{Name: "system-id", Usage: systemID},
		&cli.UintFlag{Name: "pg-version", Value: 150000, Usage: "with --system-id: PG_VERSION_NUM of the primary, 150000-159999 (only the major version must match)"},
		&cli.UintFlag{Name: "wal-seg-size", Value: 16 << 20, Usage: "with --system-id: WAL segment size in bytes, a power of two from 1 MiB to 1 GiB (must match the timeline's)"},
		&cli.UintFlag{Name: "pg-timeline", Value: 1, Usage: "with --system-id: PostgreSQL timeline id (TLI) of the primary, at least 1"},
	}
}

// watchMembers follows the timeline's configuration in etcd while a
// proposer runs (nothing without --etcd-endpoints): a configuration whose
// members' addresses differ from sks ends the run (restart) and is sent on
// the channel, which closes when the watch ends. One that does not parse,
// or etcd unreachable, is logged (at most every 30 s) and the run goes on
// with the configuration it has.
func watchMembers(ctx context.Context, log *slog.Logger, tl timelineFlags, sks []string, restart func()) <-chan fleet.Resolved {
	out := make(chan fleet.Resolved, 1)
	if tl.etcd == nil {
		close(out)
		return out
	}
	go func() {
		defer close(out)
		var logged time.Time
		done := false
		tl.etcd.Watch(ctx, tl.tenant, tl.timeline, tl.resolved, func(r fleet.Resolved) {
			addrs, err := r.Addrs()
			switch {
			case done:
			case err != nil:
				log.Error("new configuration in etcd not used: a member has no address; proposing to the last one's", "err", err)
			case slices.Equal(addrs, sks):
			default:
				done = true
				out <- r
				restart()
			}
		}, func(err error) {
			if time.Since(logged) >= 30*time.Second {
				logged = time.Now()
				log.Warn("timeline configuration not readable from etcd; proposing to the last one's members", "err", err)
			}
		})
	}()
	return out
}
