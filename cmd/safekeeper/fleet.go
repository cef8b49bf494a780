package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/server"
)

// A fleet (docs/operations.md "A fleet"): the etcd flags every command that
// names a timeline's safekeepers accepts in place of --safekeepers, and
// run's registration.

func etcdFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "etcd-endpoints", Usage: "comma-separated etcd client URLs (e.g. http://10.0.0.1:2379,...): the fleet's registry of safekeepers and timeline configurations"},
		&cli.StringFlag{Name: "etcd-prefix", Value: fleet.DefaultPrefix, Usage: "key prefix of this fleet in etcd"},
		&cli.StringFlag{Name: "etcd-cacert", Usage: "PEM CA bundle that verifies etcd's certificates (TLS)"},
		&cli.StringFlag{Name: "etcd-cert", Usage: "PEM client certificate for etcd (TLS client authentication)"},
		&cli.StringFlag{Name: "etcd-key", Usage: "PEM private key of --etcd-cert"},
		&cli.StringFlag{Name: "etcd-user", Usage: "etcd user (etcd's own authentication); the password is read from --etcd-password-file"},
		&cli.StringFlag{Name: "etcd-password-file", Usage: "file holding the password of --etcd-user (its first line)"},
	}
}

// etcdClient connects to the etcd the flags name; nil when
// --etcd-endpoints is not set.
func etcdClient(c *cli.Context) (*fleet.Client, error) {
	eps := c.String("etcd-endpoints")
	if eps == "" {
		for _, f := range []string{"etcd-prefix", "etcd-cacert", "etcd-cert", "etcd-key", "etcd-user", "etcd-password-file"} {
			if c.IsSet(f) {
				return nil, usagef("--%s needs --etcd-endpoints", f)
			}
		}
		return nil, nil
	}
	var list []string
	for _, e := range strings.Split(eps, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if !strings.HasPrefix(e, "http://") && !strings.HasPrefix(e, "https://") {
			return nil, usagef("--etcd-endpoints %q: want URLs such as http://127.0.0.1:2379", e)
		}
		list = append(list, e)
	}
	if len(list) == 0 {
		return nil, usagef("--etcd-endpoints is empty")
	}
	cfg := fleet.ClientConfig{Endpoints: list, Prefix: c.String("etcd-prefix"),
		CACert: c.String("etcd-cacert"), Cert: c.String("etcd-cert"), Key: c.String("etcd-key"), User: c.String("etcd-user")}
	switch pf := c.String("etcd-password-file"); {
	case pf != "" && cfg.User == "":
		return nil, usagef("--etcd-password-file goes with --etcd-user")
	case pf != "":
		b, err := os.ReadFile(pf)
		if err != nil {
			return nil, usagef("--etcd-password-file: %w", err)
		}
		cfg.Password, _, _ = strings.Cut(strings.TrimRight(string(b), "\r\n"), "\n")
	case cfg.User != "":
		return nil, usagef("--etcd-user needs --etcd-password-file")
	}
	cli, err := fleet.Connect(cfg)
	if err != nil {
		return nil, usageError{err}
	}
	return cli, nil
}

// runFleetFlags are run's registration flags, with etcdFlags.
func runFleetFlags() []cli.Flag {
	return append(etcdFlags(),
		&cli.StringFlag{Name: "zone", Usage: "availability zone of this safekeeper (with --etcd-endpoints): a timeline's members are placed in distinct zones"},
		&cli.StringFlag{Name: "advertise-pg", Usage: "host:port proposers and readers dial for --listen-pg, registered in etcd (default: --listen-pg's address, unless it listens on all interfaces)"},
		&cli.StringFlag{Name: "advertise-http", Usage: "host:port of the HTTP API as registered in etcd (default: --listen-http's address, unless it listens on all interfaces)"},
		&cli.DurationFlag{Name: "etcd-lease-ttl", Value: 10 * time.Second, Usage: "time to live of the registration's lease: a safekeeper silent this long is no longer live"},
	)
}

// checkFleetFlags checks run's fleet flags before anything starts.
func checkFleetFlags(c *cli.Context) error {
	if c.String("etcd-endpoints") == "" {
		for _, f := range []string{"zone", "advertise-pg", "advertise-http"} {
			if c.IsSet(f) {
				return usagef("--%s is registered in etcd: it needs --etcd-endpoints", f)
			}
		}
		return nil
	}
	if c.String("zone") == "" {
		return usagef("--etcd-endpoints needs --zone: placement spreads a timeline over zones")
	}
	if z := c.String("zone"); strings.ContainsAny(z, " \t\n/") {
		return usagef("--zone %q: want a name without spaces or slashes", z)
	}
	for _, f := range []string{"advertise-pg", "advertise-http"} {
		if a := c.String(f); a != "" {
			if err := checkDialAddr(a); err != nil {
				return usagef("--%s %q: %w", f, a, err)
			}
		}
	}
	if c.Duration("etcd-lease-ttl") < 2*time.Second {
		return usagef("--etcd-lease-ttl %v: want at least 2s", c.Duration("etcd-lease-ttl"))
	}
	return nil
}

// advertised is the address to register for a listener: the flag, else
// the address bound (a port 0 resolved), unless that is every interface.
func advertised(flag, name string, bound net.Addr) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if bound == nil {
		return "", nil
	}
	host, port, err := net.SplitHostPort(bound.String())
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		return "", usagef("--%s is needed: the listener is on all interfaces (%s), which names no address to dial", name, bound)
	}
	return net.JoinHostPort(host, port), nil
}

// register registers the started server in etcd when the flags ask for it;
// the returned stop revokes the registration. A live process holding the
// id is a usage error (exit 2) naming its address.
func register(c *cli.Context, srv *server.Server, cfg server.Config, log *slog.Logger) (stop func(), err error) {
	ec, err := etcdClient(c)
	if err != nil || ec == nil {
		return func() {}, err
	}
	node := fleet.Node{ID: cfg.NodeID, Zone: c.String("zone")}
	if node.PG, err = advertised(c.String("advertise-pg"), "advertise-pg", srv.Addr()); err != nil {
		ec.Close()
		return nil, err
	}
	if h := srv.HTTPAddr(); h != nil {
		if node.HTTP, err = advertised(c.String("advertise-http"), "advertise-http", h); err != nil {
			ec.Close()
			return nil, err
		}
		if srv.TLSEnabled() && !strings.HasPrefix(node.HTTP, "https://") {
			node.HTTP = "https://" + node.HTTP // the API serves HTTPS: clients must know
		}
	}
	host, _ := os.Hostname()
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		dir = cfg.DataDir
	}
	rc := fleet.RegisterConfig{
		Node: node, Instance: host + ":" + dir, Version: server.Version, TTL: c.Duration("etcd-lease-ttl"), Logger: log,
		Capacity: func() fleet.Capacity {
			l := srv.Load()
			return fleet.Capacity{Timelines: l.Timelines, MaxTimelines: l.MaxTimelines, DiskFreeBytes: l.DiskFree, DiskTotalBytes: l.DiskTotal}
		},
	}
	registered := func(reg *fleet.Registration) {
		log.Info("registered in etcd", "node_id", node.ID, "zone", node.Zone, "advertise_pg", node.PG, "advertise_http", node.HTTP,
			"etcd_endpoints", ec.Endpoints(), "etcd_prefix", ec.Prefix())
	}
	// A short look first: with etcd down the server starts serving at
	// once; with it up, the registration may wait out a dead process's
	// lease (up to its TTL).
	pctx, cancel := context.WithTimeout(c.Context, 2*time.Second)
	err = ec.Ping(pctx)
	cancel()
	var reg *fleet.Registration
	if err == nil {
		ctx, cancel := context.WithTimeout(c.Context, time.Minute)
		reg, err = ec.Register(ctx, rc)
		cancel()
	}
	var dup *fleet.DuplicateError
	switch {
	case errors.As(err, &dup):
		ec.Close()
		return nil, usageError{err}
	case err == nil:
		registered(reg)
		return func() { reg.Close(); ec.Close() }, nil
	}
	// etcd does not answer: serve the timelines stored here anyway (their
	// proposers know the address) and register once it does.
	log.Warn("etcd unavailable at start; serving, and registering once it answers", "err", err)
	bg, stopBG := context.WithCancel(context.Background())
	done := make(chan *fleet.Registration, 1)
	go func() {
		defer close(done)
		for wait := time.Second; bg.Err() == nil; wait = min(2*wait, 10*time.Second) {
			reg, err := ec.Register(bg, rc)
			if err == nil {
				registered(reg)
				done <- reg
				return
			}
			if bg.Err() == nil {
				log.Warn("etcd registration failed; retrying", "err", err, "retry_in", wait.String())
			}
			select {
			case <-bg.Done():
			case <-time.After(wait):
			}
		}
	}()
	return func() {
		stopBG()
		if reg := <-done; reg != nil {
			reg.Close()
		}
		ec.Close()
	}, nil
}

// placementExit is the exit of a placement that failed: a configuration in
// etcd that does not parse is for an operator to fix (exit 4); no room or
// etcd unreachable may pass (exit 1).
func placementExit(err error) error {
	switch {
	case errors.Is(err, fleet.ErrBadConfig):
		return cli.Exit(fmt.Sprintf("%v; nothing was placed: fix or delete the key", err), exitPermanent)
	case errors.Is(err, fleet.ErrNotMembers):
		return cli.Exit(err.Error(), exitPermanent)
	case errors.Is(err, fleet.ErrUnavailable):
		return fmt.Errorf("placement waits for etcd: %w", err)
	}
	return fmt.Errorf("placement: %w", err)
}

// describeMembers is a configuration in words: each member with its zone,
// address and liveness.
func describeMembers(cfg fleet.Config, members []fleet.NodeView) string {
	one := func(ids []uint64) string {
		var parts []string
		for _, id := range ids {
			if members == nil { // no views: the ids alone
				parts = append(parts, strconv.FormatUint(id, 10))
				continue
			}
			for _, m := range members {
				if m.ID != id {
					continue
				}
				state := "down"
				if m.Live() {
					state = "live"
				}
				if m.PG == "" {
					parts = append(parts, fmt.Sprintf("%d (never registered)", id))
				} else {
					parts = append(parts, fmt.Sprintf("%d (zone %s, %s, %s)", id, m.Zone, m.PG, state))
				}
			}
		}
		return strings.Join(parts, ", ")
	}
	s := fmt.Sprintf("generation %d, members %s", cfg.Generation, one(cfg.Members))
	if len(cfg.NewMembers) > 0 {
		s += "; changing to " + one(cfg.NewMembers)
	}
	return s
}

func timelineMembersCommand() *cli.Command {
	return &cli.Command{
		Name:      "members",
		Usage:     "print a timeline's configuration in etcd: its generation and member safekeepers",
		UsageText: "safekeeper timeline members --etcd-endpoints URLS --tenant-id HEX --timeline-id HEX [--json]",
		Description: "Reads the timeline's configuration key in etcd (written by timeline create, changed only by\n" +
			"compare-and-swap) and the members' registrations. --json prints\n" +
			"{\"generation\": N, \"members\": [ids]}, with \"new_members\": [ids] while the membership changes,\n" +
			"\"migration\": the move asked for (timeline migrate, node drain) while it is under way or failed,\n" +
			"and \"safekeepers\": each member's id, zone, advertised addresses and liveness.\n" +
			"Exit codes: 0, 1 etcd unreachable, 2 usage, 4 no configuration (or one that does not parse).",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "etcd-endpoints", "tenant-id", "timeline-id") },
		Flags: slices.Concat([]cli.Flag{jsonFlag(),
			&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)"},
			&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)"},
		}, etcdFlags()),
		Action: func(c *cli.Context) error {
			_, tl, err := timelineArgs(c)
			if err != nil {
				return err
			}
			defer tl.etcd.Close()
			r := tl.resolved
			// A move asked for and not done (or failed): where the change
			// stands before its joint configuration, or why it stopped.
			m, moving, err := tl.etcd.Migration(c.Context, tl.tenant, tl.timeline)
			if err != nil {
				return err
			}
			if !c.Bool("json") {
				fmt.Fprintf(c.App.Writer, "timeline %s/%s: %s\n", tl.tenant, tl.timeline, describeMembers(r.Config, r.Members))
				switch {
				case moving && m.Error != "":
					fmt.Fprintf(c.App.Writer, "the move to %v failed: %s\n", m.Members, m.Error)
				case moving:
					fmt.Fprintf(c.App.Writer, "a move to %v is under way (%s)\n", m.Members, m.Reason)
				}
				return nil
			}
			type sk struct {
				ID            uint64 `json:"id"`
				Zone          string `json:"zone,omitempty"`
				AdvertisePG   string `json:"advertise_pg,omitempty"`
				AdvertiseHTTP string `json:"advertise_http,omitempty"`
				Live          bool   `json:"live"`
			}
			var sks []sk
			for _, m := range r.Members {
				sks = append(sks, sk{ID: m.ID, Zone: m.Zone, AdvertisePG: m.PG, AdvertiseHTTP: m.HTTP, Live: m.Live()})
			}
			out := map[string]any{"tenant_id": tl.tenant.String(), "timeline_id": tl.timeline.String(),
				"generation": r.Config.Generation, "members": r.Config.Members, "safekeepers": sks}
			if len(r.Config.NewMembers) > 0 {
				out["new_members"] = r.Config.NewMembers
			}
			if moving {
				out["migration"] = m
			}
			return writeJSONLine(c, out)
		},
	}
}
