package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/server"
)

// exitUsage is the exit code for bad flags or arguments.
const exitUsage = 2

// exitPermanent is the exit code of a refusal for good: a restart cannot
// fix it; an operator must act. `run` with a data directory it cannot use
// (permission denied, not a directory, a read-only file system, a damaged
// database), `propose` and `sync` on a timeline no safekeeper holds,
// `propose` refused by the safekeepers for good (another system
// id, segment size or major version; a primary of an older PostgreSQL
// timeline, which a standby was promoted from; a forked timeline history),
// `sync` refused so. The systemd units name it in
// RestartPreventExitStatus, next to exitUsage.
const exitPermanent = 4

// permanentError marks an error a restart cannot fix: exit exitPermanent.
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

func main() {
	if server.Version == "dev" { // not set by the Makefile's -ldflags (git describe)
		server.Version = buildVersion()
	}
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// buildVersion is the VCS revision the binary was built from (with
// "-dirty" for uncommitted changes), as the HTTP API reports it.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

// usageError marks an error in the command line itself.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// requireFlags is urfave/cli's check of required flags, returning a
// usageError (its own error has no type to tell it by): commands declare no
// flag Required and call it first.
func requireFlags(c *cli.Context, names ...string) error {
	var missing []string
	for _, n := range names {
		if !c.IsSet(n) {
			missing = append(missing, n)
		}
	}
	return missingFlags(missing)
}

// missingFlags is the usage error naming the required flags missing (nil
// when none is).
func missingFlags(missing []string) error {
	switch len(missing) {
	case 0:
		return nil
	case 1:
		return usagef("Required flag %q not set", missing[0])
	}
	return usagef("Required flags %q not set", strings.Join(missing, ", "))
}

func run(args []string, stdout, stderr io.Writer) int {
	return report(newApp(stdout, stderr).Run(args), stderr)
}

// report writes a command's error to stderr and returns the exit code.
func report(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "safekeeper: %s\n", pgwire.ClientText(err.Error()))
	var ue usageError
	var pe permanentError
	var ec cli.ExitCoder
	switch {
	case errors.As(err, &ue):
		return exitUsage
	case errors.As(err, &pe):
		return exitPermanent
	case errors.As(err, &ec):
		return ec.ExitCode()
	}
	return 1
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:           "safekeeper",
		Usage:          "keep PostgreSQL's WAL durable on a quorum of safekeepers and serve it back",
		Version:        server.Version,
		Writer:         stdout,
		ErrWriter:      stderr,
		ExitErrHandler: func(*cli.Context, error) {}, // run() reports errors and picks the exit code
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			if errors.Is(err, flag.ErrHelp) { // -h, --help: the help, exit 0
				return cli.ShowAppHelp(c)
			}
			return usageError{err}
		},
		// Without an Action urfave/cli answers an unknown command with its
		// help action, "No help topic for 'bogus'".
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("unknown command %q; 'safekeeper help' lists the commands", c.Args().First())
			}
			return cli.ShowAppHelp(c)
		},
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "log format: text or json", EnvVars: []string{"SAFEKEEPER_LOG_FORMAT"}},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "log level: debug, info, warn or error", EnvVars: []string{"SAFEKEEPER_LOG_LEVEL"}},
		},
		Commands: []*cli.Command{runCommand(), proposeCommand(), syncCommand(), statusCommand(), inspectCommand(), walCommand(), archiveCommand(), timelineCommand(), controllerCommand(), clusterCommand(), nodeCommand(), tokenCommand(), versionCommand(), helpCommand()},
	}
	finishFlags(app.Commands, app.Flags)
	return app
}

// finishFlags gives every flag of every command an environment variable,
// SAFEKEEPER_<FLAG> (--data-dir: SAFEKEEPER_DATA_DIR), unless it names its
// own, and gives every command the global flags too, so that they may come
// after the command name (`safekeeper run --log-format json`); logger reads
// whichever was given.
func finishFlags(cmds []*cli.Command, global []cli.Flag) {
	for _, f := range global {
		setEnv(f)
	}
	for _, c := range cmds {
		if c.Name == "help" {
			continue
		}
		// -h and --help show the command's help and exit 0, whatever the
		// command does with other usage errors.
		onUsage := c.OnUsageError
		c.OnUsageError = func(ctx *cli.Context, err error, sub bool) error {
			if errors.Is(err, flag.ErrHelp) {
				if len(ctx.Command.Subcommands) > 0 {
					return cli.ShowSubcommandHelp(ctx)
				}
				return cli.ShowCommandHelp(ctx, ctx.Command.Name)
			}
			if onUsage != nil {
				return onUsage(ctx, err, sub)
			}
			return usageError{err}
		}
		for _, f := range c.Flags {
			setEnv(f)
		}
		have := map[string]bool{}
		for _, f := range c.Flags {
			for _, n := range f.Names() {
				have[n] = true
			}
		}
		if len(c.Subcommands) > 0 {
			finishFlags(c.Subcommands, global)
			continue
		}
		for _, g := range global {
			if !have[g.Names()[0]] {
				c.Flags = append(c.Flags, copyFlag(g))
			}
		}
		// Every command checks the global flags, whether it logs or not.
		before := c.Before
		c.Before = func(ctx *cli.Context) error {
			if _, err := logger(ctx); err != nil {
				if onUsage != nil { // the command's own exit code for bad flags (wal fetch: 126)
					return onUsage(ctx, err, false)
				}
				return err
			}
			if before != nil {
				return before(ctx)
			}
			return nil
		}
	}
}

// envName is the environment variable of flag name.
func envName(name string) string {
	return "SAFEKEEPER_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

func setEnv(f cli.Flag) {
	name := f.Names()[0]
	switch f := f.(type) {
	case *cli.StringFlag:
		if len(f.EnvVars) == 0 {
			f.EnvVars = []string{envName(name)}
		}
	case *cli.BoolFlag:
		if len(f.EnvVars) == 0 {
			f.EnvVars = []string{envName(name)}
		}
	case *cli.DurationFlag:
		if len(f.EnvVars) == 0 {
			f.EnvVars = []string{envName(name)}
		}
	case *cli.Uint64Flag:
		if len(f.EnvVars) == 0 {
			f.EnvVars = []string{envName(name)}
		}
	case *cli.UintFlag:
		if len(f.EnvVars) == 0 {
			f.EnvVars = []string{envName(name)}
		}
	case *cli.IntFlag:
		if len(f.EnvVars) == 0 {
			f.EnvVars = []string{envName(name)}
		}
	case *cli.Int64Flag:
		if len(f.EnvVars) == 0 {
			f.EnvVars = []string{envName(name)}
		}
	case *cli.StringSliceFlag:
		if len(f.EnvVars) == 0 {
			f.EnvVars = []string{envName(name)}
		}
	case *cmdLineStringFlag:
		if len(f.EnvVars) == 0 {
			f.EnvVars = []string{envName(name)}
		}
	default:
		panic(fmt.Sprintf("flag --%s: %T has no environment variable set (add it to setEnv)", name, f))
	}
}

// cmdLineStringFlag is a StringFlag that can tell whether the command line
// gave it: cli.Context.IsSet says yes to its environment variable too.
type cmdLineStringFlag struct {
	cli.StringFlag
	set *flag.FlagSet // the command's, once parsed
}

func (f *cmdLineStringFlag) Apply(set *flag.FlagSet) error {
	f.set = set
	return f.StringFlag.Apply(set)
}

// onCommandLine reports whether the command line of c's command gave the
// cmdLineStringFlag name (false for any other flag).
func onCommandLine(c *cli.Context, name string) bool {
	for _, fl := range c.Command.Flags {
		f, ok := fl.(*cmdLineStringFlag)
		if !ok || f.Name != name || f.set == nil {
			continue
		}
		given := false
		f.set.Visit(func(x *flag.Flag) { given = given || x.Name == name })
		return given
	}
	return false
}

// copyFlag is a fresh copy of a global (string) flag for a command.
func copyFlag(f cli.Flag) cli.Flag {
	sf := *f.(*cli.StringFlag)
	return &sf
}

// globalFlag is the value of a global flag given before or after the
// command name (the innermost wins), else its environment variable, else
// its default. (urfave/cli sets a flag from its environment variable at
// every level that defines it, so a value equal to the variable's is taken
// only when no level has another.)
func globalFlag(c *cli.Context, name string) string {
	env, hasEnv := os.LookupEnv(envName(name))
	var set []string
	for _, x := range c.Lineage() {
		for _, n := range x.LocalFlagNames() {
			if n == name {
				set = append(set, x.String(name))
			}
		}
	}
	for _, v := range set {
		if !hasEnv || v != env {
			return v
		}
	}
	if len(set) > 0 {
		return set[0]
	}
	return c.String(name)
}

// versionCommand is `safekeeper version` (also `safekeeper --version`):
// the VCS revision the binary was built from.
func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version (the VCS revision built) and exit",
		Flags: []cli.Flag{jsonFlag()},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("version takes no arguments, got %q", c.Args().Slice())
			}
			if c.Bool("json") {
				return writeJSONLine(c, map[string]string{"version": server.Version, "go": runtime.Version()})
			}
			fmt.Fprintf(c.App.Writer, "safekeeper %s\n", server.Version)
			return nil
		},
	}
}

// helpCommand is `safekeeper help [COMMAND [SUBCOMMAND]]`. It replaces
// urfave/cli's own help command, which answers an unknown name with "No help
// topic" instead of a usage error.
func helpCommand() *cli.Command {
	return &cli.Command{
		Name:      "help",
		Aliases:   []string{"h"},
		Usage:     "show the list of commands, or one command's help",
		ArgsUsage: "[COMMAND [SUBCOMMAND]]",
		HideHelp:  true, // no "help help" subcommand: ShowCommandHelp then looks at the app's commands
		Action: func(c *cli.Context) error {
			args := c.Args().Slice()
			if len(args) == 0 {
				return cli.ShowAppHelp(c)
			}
			if len(args) > 2 {
				return usagef("help takes at most a command and a subcommand, got %q", args)
			}
			cmd := c.App.Command(args[0])
			if cmd == nil {
				return usagef("unknown command %q; 'safekeeper help' lists the commands", args[0])
			}
			if len(args) == 2 && cmd.Command(args[1]) == nil {
				return usagef("unknown command \"%s %s\"; 'safekeeper help %s' lists its subcommands", args[0], args[1], args[0])
			}
			// The same as `safekeeper COMMAND --help`: urfave/cli's
			// ShowCommandHelp cannot list the subcommands of a command that
			// has not run (they are sorted into categories when it runs).
			return c.App.RunContext(c.Context, append(append([]string{c.App.Name}, args...), "--help"))
		},
	}
}

// ignoreSIGHUP makes SIGHUP harmless until stop is called: its default
// action would kill the process at once, without a clean shutdown, when
// logrotate signals it or its terminal closes. There is no configuration to
// reload, so it is only logged.
func ignoreSIGHUP(log *slog.Logger) (stop func()) { return onSIGHUP(log, nil) }

// onSIGHUP runs reload on every SIGHUP until stop is called (nil: the
// signal is only logged).
func onSIGHUP(log *slog.Logger, reload func()) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-hup:
				if reload == nil {
					log.Info("SIGHUP ignored: nothing to reload")
				} else {
					reload()
				}
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
		<-exited
	}
}

func logger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(globalFlag(c, "log-level"))); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", globalFlag(c, "log-level"))
	}
	opts := &slog.HandlerOptions{Level: level}
	w := c.App.ErrWriter
	switch globalFlag(c, "log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", globalFlag(c, "log-format"))
}

// defaultProcs is the GOMAXPROCS of `propose` unless the GOMAXPROCS
// environment variable sets it. Each WAL message crosses a chain of short
// hops between goroutines (primary's socket, the driver, a writer per
// safekeeper, their readers); with more Ps than that chain keeps busy, the
// runtime wakes another OS thread for each hop (futex, context switch,
// sysmon polling at its fastest rate) instead of handing over on the
// running one. Measured with make bench-e2e on 2 CPUs (docs/performance.md):
// the proposer's CPU per transaction fell 18%. `run` keeps Go's default
// (every CPU): with one P, ingest of many timelines and a reader catching
// up while ingest runs were 20-40% slower in make bench-scale.
const defaultProcs = 1

// setProcs applies defaultProcs unless GOMAXPROCS is set in the
// environment (the operator's word wins).
func setProcs() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(defaultProcs)
	}
}

// dataDirError is err, from creating or opening the data directory dir
// (or starting the server on it), as run reports it: a permanentError when
// the directory cannot be used for a reason a restart cannot fix — a file
// system error on a path (permission denied, not a directory, a directory
// where the database file belongs, a read-only file system) or a damaged
// database (server.ErrCorrupt). Everything else (a full disk, the
// database locked by another process, a port in use) may pass by itself
// and stays exit 1.
func dataDirError(dir string, err error) error {
	var pe *fs.PathError
	unusable := errors.Is(err, server.ErrCorrupt)
	if errors.As(err, &pe) {
		for _, e := range []error{fs.ErrPermission, syscall.ENOTDIR, syscall.EISDIR, syscall.EROFS} {
			unusable = unusable || errors.Is(pe.Err, e)
		}
	}
	if !unusable {
		return err
	}
	return permanentError{fmt.Errorf("--data-dir %s cannot be used: %w (a restart cannot fix this)", dir, err)}
}

// checkListenAddr checks a host:port to listen on: the port must be a
// number from 0 to 65535 (0 picks a free one); the host may be empty (every
// interface).
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("want host:port")
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q: want a number from 0 to 65535", port)
	}
	return nil
}

// parsePGSize parses a size as PostgreSQL writes its memory settings: a
// number with an optional unit B, kB, MB, GB or TB (1024-based, as
// PostgreSQL's), plain bytes without one. With allowUnlimited, -1 means no
// limit (returned as -1).
func parsePGSize(s string, allowUnlimited bool) (int64, error) {
	t := strings.TrimSpace(s)
	if allowUnlimited && t == "-1" {
		return -1, nil
	}
	mult := int64(1)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"kB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"TB", 1 << 40}, {"B", 1}} {
		if strings.HasSuffix(t, u.suf) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suf)), u.m
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<60)/mult {
		want := "a size like 1GB or 512MB"
		if allowUnlimited {
			want += ", or -1"
		}
		return 0, fmt.Errorf("%q: want %s", s, want)
	}
	return n * mult, nil
}

// checkDataDir refuses an empty --data-dir (SAFEKEEPER_DATA_DIR= in an
// environment file): it would mean the current directory.
func checkDataDir(c *cli.Context) error {
	if strings.TrimSpace(c.String("data-dir")) == "" {
		return usagef("--data-dir must name a directory, got an empty string")
	}
	return nil
}
