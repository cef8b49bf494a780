package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/fleet"
	"github.com/safekeeper/safekeeper/fleet/controller"
)

// The fleet's controller (package fleet/controller) and `cluster status`
// (docs/operations.md, "Controller").

func controllerCommand() *cli.Command {
	return &cli.Command{
		Name:  "controller",
		Usage: "run a fleet controller: places and moves timelines; any number run, one leads (etcd election)",
		UsageText: "safekeeper controller --etcd-endpoints URLS [--listen-http 127.0.0.1:7677] [--replicas 3] [--election-ttl 10s]\n" +
			"    [--move-parallel 4] [--catch-up-timeout 10m] [--dead-node-timeout 30m]",
		Description: "Campaigns for the leadership in etcd (under --etcd-prefix's controller/) and, while it leads,\n" +
			"places timelines: POST /v1/tenant/{tenant_id}/timeline/{timeline_id} (body {\"replicas\": N}, optional).\n" +
			"Every write it makes is fenced by its election key's revision: a controller deposed while\n" +
			"paused writes nothing (503). A follower answers placements 503 naming the leader. It serves\n" +
			"GET /v1/cluster (what `cluster status --json` prints), /metrics and /healthz on --listen-http.\n" +
			"The leader also moves timelines: the requests of `timeline migrate` and `node drain`, a change\n" +
			"found half done, and the timelines of a node without a lease for --dead-node-timeout, each to\n" +
			"a live node (docs/operations.md, \"Moving timelines\"); a move whose new members do not catch\n" +
			"up within --catch-up-timeout is rolled back.\n" +
			"Nothing needs it to run: timelines keep running, and `timeline create --etcd-endpoints` places\n" +
			"without it. Exit codes: 0 after SIGTERM/SIGINT, 1 the listener failed, 2 usage.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "etcd-endpoints") },
		Flags: slices.Concat([]cli.Flag{
			&cli.StringFlag{Name: "listen-http", Value: "127.0.0.1:7677", Usage: "host:port of the controller's HTTP API (port 0: any free port, logged)"},
			&cli.StringFlag{Name: "advertise-http", Usage: "host:port other controllers and operators reach this one at when it leads (default: --listen-http's address, unless it listens on all interfaces)"},
			&cli.IntFlag{Name: "replicas", Value: fleet.DefaultReplicas, Usage: fmt.Sprintf("members of a placed timeline when the request names none (1 to %d)", controller.MaxReplicas)},
			&cli.DurationFlag{Name: "election-ttl", Value: 10 * time.Second, Usage: "time to live of the election lease (whole seconds, at least 1s): a leader silent this long is replaced"},
			&cli.IntFlag{Name: "move-parallel", Value: 4, Usage: "timeline moves under way at once, at most"},
			&cli.DurationFlag{Name: "catch-up-timeout", Value: 10 * time.Minute, Usage: "how long a move waits for its new members to copy the timeline and catch up before it rolls back"},
			&cli.DurationFlag{Name: "dead-node-timeout", Value: 30 * time.Minute, Usage: "move the timelines of a node that holds no lease this long to live nodes (0: never)"},
		}, etcdFlags()),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("controller takes no arguments, got %q", c.Args().Slice())
			}
			log, err := logger(c)
			if err != nil {
				return err
			}
			if err := checkListenAddr(c.String("listen-http")); err != nil {
				return usagef("--listen-http %q: %w", c.String("listen-http"), err)
			}
			if a := c.String("advertise-http"); a != "" {
				if err := checkDialAddr(a); err != nil {
					return usagef("--advertise-http %q: %w", a, err)
				}
			}
			if r := c.Int("replicas"); r < 1 || r > controller.MaxReplicas {
				return usagef("--replicas %d: want 1 to %d", r, controller.MaxReplicas)
			}
			if ttl := c.Duration("election-ttl"); ttl < time.Second {
				return usagef("--election-ttl %v: want at least 1s", ttl)
			}
			if n := c.Int("move-parallel"); n < 1 {
				return usagef("--move-parallel %d: want at least 1", n)
			}
			if d := c.Duration("catch-up-timeout"); d <= 0 {
				return usagef("--catch-up-timeout %v: want a positive duration", d)
			}
			dead := c.Duration("dead-node-timeout")
			switch {
			case dead < 0:
				return usagef("--dead-node-timeout %v: want a positive duration, or 0 for never", dead)
			case dead == 0:
				dead = -1 // never
			}
			ec, err := etcdClient(c)
			if err != nil {
				return err
			}
			defer ec.Close()
			ln, err := net.Listen("tcp", c.String("listen-http"))
			if err != nil {
				return fmt.Errorf("listen for the HTTP API: %w", err)
			}
			adv, err := advertised(c.String("advertise-http"), "advertise-http", ln.Addr())
			if err != nil {
				ln.Close()
				return err
			}
			k, err := controller.New(controller.Config{Client: ec, Listener: ln, Advertise: adv, Replicas: c.Int("replicas"),
				ElectionTTL: c.Duration("election-ttl"), Logger: log, MoveParallel: c.Int("move-parallel"),
				CatchUpTimeout: c.Duration("catch-up-timeout"), DeadNodeTimeout: dead})
			if err != nil {
				ln.Close()
				return usageError{err}
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			defer ignoreSIGHUP(log)()
			log.Info("controller listening", "http", ln.Addr().String(), "advertise", adv, "etcd_endpoints", ec.Endpoints(), "etcd_prefix", ec.Prefix())
			err = k.Run(ctx)
			log.Info("controller stopped")
			return err
		},
	}
}

func clusterCommand() *cli.Command {
	return &cli.Command{
		Name:            "cluster",
		Usage:           "the fleet in etcd: its safekeepers, zones, timelines below quorum, controller",
		OnUsageError:    func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Subcommands:     []*cli.Command{clusterStatusCommand()},
		HideHelpCommand: true,
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("unknown command \"cluster %s\"; 'safekeeper help cluster' lists its subcommands", c.Args().First())
			}
			return cli.ShowSubcommandHelp(c)
		},
	}
}

func clusterStatusCommand() *cli.Command {
	return &cli.Command{
		Name:      "status",
		Usage:     "print the fleet as etcd holds it (no controller needed)",
		UsageText: "safekeeper cluster status --etcd-endpoints URLS [--json]",
		Description: "Reads etcd at one revision: every safekeeper (id, zone, advertised addresses, live or down,\n" +
			"the timelines its configurations name, its reported capacity), the zones, the timelines with\n" +
			"fewer live members than a majority of their members (listed), the controller leader, and the\n" +
			"keys that do not parse (each named; the rest is shown without them). --json prints the object\n" +
			"a controller's GET /v1/cluster answers.\n" +
			"Exit codes: 0 (whatever the fleet's state), 1 etcd unreachable, 2 usage.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "etcd-endpoints") },
		Flags:        append([]cli.Flag{jsonFlag()}, etcdFlags()...),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("cluster status takes no arguments, got %q", c.Args().Slice())
			}
			ec, err := etcdClient(c)
			if err != nil {
				return err
			}
			defer ec.Close()
			s, err := ec.Status(c.Context)
			if err != nil {
				if errors.Is(err, fleet.ErrUnavailable) {
					return fmt.Errorf("cannot read the fleet: %w", err)
				}
				return err
			}
			if c.Bool("json") {
				return writeJSONLine(c, s)
			}
			printCluster(c.App.Writer, s)
			return nil
		},
	}
}

// printCluster is `cluster status` in text.
func printCluster(w io.Writer, s fleet.ClusterStatus) {
	live, down := s.LiveNodes()
	leader := s.Leader
	if leader == "" {
		leader = "none"
	}
	fmt.Fprintf(w, "safekeepers: %d live, %d down; timelines: %d; below quorum: %d; controller leader: %s\n",
		live, down, s.Timelines, len(s.BelowQuorum), leader)
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SAFEKEEPER\tZONE\tSTATE\tTIMELINES\tCAPACITY\tPG\tHTTP")
	for _, n := range s.Nodes {
		state, capacity := "down", "-"
		if n.Live {
			state = "live"
			max := "unlimited"
			if n.Capacity.MaxTimelines > 0 {
				max = fmt.Sprint(n.Capacity.MaxTimelines)
			}
			capacity = fmt.Sprintf("%d/%s timelines, disk %s free of %s", n.Capacity.Timelines, max,
				sizeText(n.Capacity.DiskFreeBytes), sizeText(n.Capacity.DiskTotalBytes))
		}
		http := n.AdvertiseHTTP
		if http == "" {
			http = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", n.ID, n.Zone, state, n.Timelines, capacity, n.AdvertisePG, http)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ZONE\tSAFEKEEPERS\tLIVE")
	for _, z := range s.Zones {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", z.Zone, z.Nodes, z.Live)
	}
	tw.Flush()
	if len(s.BelowQuorum) > 0 {
		fmt.Fprintln(w, "\ntimelines below quorum (fewer live members than a majority: no commit until members return):")
		for _, q := range s.BelowQuorum {
			line := fmt.Sprintf("  %s/%s generation %d, members %v, live %v", q.Tenant, q.Timeline, q.Generation, q.Members, q.Live)
			if len(q.NewMembers) > 0 {
				line += fmt.Sprintf(", new members %v", q.NewMembers)
			}
			fmt.Fprintln(w, line)
		}
	}
	if len(s.Errors) > 0 {
		fmt.Fprintln(w, "\nkeys that do not parse (left out above; fix or delete them):")
		for _, e := range s.Errors {
			fmt.Fprintln(w, "  error: "+strings.ReplaceAll(e, "\n", " "))
		}
	}
}

// sizeText is bytes in binary units.
func sizeText(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}
