// Command safekeeper makes PostgreSQL's write-ahead log durable on a quorum
// of safekeepers and serves it back. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/cmd/safekeeper/server"
)

// exitUsage is the exit code for bad flags or arguments.
const exitUsage = 2

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// usageError marks an error in the command line itself.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func run(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	err := app.Run(args)
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "safekeeper: %v\n", err)
	var ue usageError
	var ec cli.ExitCoder
	switch {
	case errors.As(err, &ue):
		return exitUsage
	case strings.Contains(err.Error(), "flag provided but not defined"), strings.Contains(err.Error(), "Required flag"),
		strings.Contains(err.Error(), "invalid value"), strings.Contains(err.Error(), "No help topic"):
		return exitUsage // urfave/cli's own parse errors (it has no error types for them)
	case errors.As(err, &ec):
		return ec.ExitCode()
	}
	return 1
}

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:            "safekeeper",
		Usage:           "keep PostgreSQL's WAL durable on a quorum of safekeepers and serve it back",
		Writer:          stdout,
		ErrWriter:       stderr,
		HideHelpCommand: true,
		ExitErrHandler:  func(*cli.Context, error) {}, // run() reports errors and picks the exit code
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			return usageError{err}
		},
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "log format: text or json", EnvVars: []string{"SAFEKEEPER_LOG_FORMAT"}},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "log level: debug, info, warn or error", EnvVars: []string{"SAFEKEEPER_LOG_LEVEL"}},
		},
		Commands: []*cli.Command{runCommand(), proposeCommand(), syncCommand(), walCommand()},
	}
}

func logger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", c.String("log-level"))
	}
	opts := &slog.HandlerOptions{Level: level}
	w := c.App.ErrWriter
	switch c.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", c.String("log-format"))
}

func runCommand() *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "run a safekeeper server",
		Description: "Listens for PostgreSQL-protocol connections: proposers push WAL with START_WAL_PUSH,\n" +
			"replication clients read it back. SIGTERM or SIGINT: stop accepting, make received WAL\n" +
			"durable, answer and close every stream, exit 0.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Flags: []cli.Flag{
			&cli.Uint64Flag{Name: "id", Required: true, Usage: "this safekeeper's node id: positive, unique among the safekeepers of a timeline (reported to proposers, which refuse to count one id twice)"},
			&cli.StringFlag{Name: "listen-pg", Value: "127.0.0.1:5454", Usage: "host:port of the PostgreSQL-protocol listener"},
			&cli.StringFlag{Name: "data-dir", Required: true, Usage: "directory of the safekeeper's bbolt database (created if missing)"},
			&cli.BoolFlag{Name: "unsafe-no-fsync", Hidden: true, Usage: "TESTS AND BENCHMARKS ONLY: never fsync; a crash loses acknowledged WAL"},
			&cli.DurationFlag{Name: "wal-sender-timeout", Value: 60 * time.Second, Usage: "disconnect a replication client silent this long; it is asked for a reply after half of it (at most 10s); 0 disables, like PostgreSQL's wal_sender_timeout = 0"},
			&cli.DurationFlag{Name: "retention-interval", Value: time.Second, Usage: "least time between two WAL removal passes of a timeline"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("run takes no arguments, got %q", c.Args().Slice())
			}
			if c.Uint64("id") == 0 {
				return usagef("--id must be a positive node id, unique among the safekeepers of a timeline")
			}
			if _, _, err := net.SplitHostPort(c.String("listen-pg")); err != nil {
				return usagef("--listen-pg %q: want host:port", c.String("listen-pg"))
			}
			walSenderTimeout := c.Duration("wal-sender-timeout")
			switch {
			case walSenderTimeout < 0:
				return usagef("--wal-sender-timeout %v: want a duration ≥ 0 (0 disables the timeout)", walSenderTimeout)
			case walSenderTimeout == 0:
				walSenderTimeout = -1 // server.Config: negative disables
			}
			if c.Duration("retention-interval") <= 0 {
				return usagef("--retention-interval %v: want a positive duration", c.Duration("retention-interval"))
			}
			log, err := logger(c)
			if err != nil {
				return err
			}
			dir := c.String("data-dir")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			if c.Bool("unsafe-no-fsync") {
				log.Warn("UNSAFE: fsync is off; a crash loses acknowledged WAL")
			}
			srv, err := server.New(server.Config{
				NodeID: c.Uint64("id"), ListenPG: c.String("listen-pg"), DataDir: dir,
				Logger: log, UnsafeNoFsync: c.Bool("unsafe-no-fsync"),
				WalSenderTimeout: walSenderTimeout, RetentionInterval: c.Duration("retention-interval"),
			})
			if err != nil {
				return err
			}
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
			served := make(chan error, 1)
			go func() { served <- srv.Serve() }()
			select {
			case s := <-sig:
				log.Info("shutting down", "signal", s.String())
			case err := <-served:
				srv.Shutdown(context.Background())
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				return err
			}
			<-served
			log.Info("stopped")
			return nil
		},
	}
}
