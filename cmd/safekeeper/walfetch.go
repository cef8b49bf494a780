package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proposer/restore"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/storage/archive"
)

// Exit codes of `wal fetch`, by PostgreSQL's reading of a restore_command's:
// any non-zero status but these means "no such file", which at the end of
// the archive ends recovery; a status above 125 (as a shell reports a
// command it cannot run) makes recovery stop with FATAL instead, so a
// failure can never pass for the end of the WAL and promote a server
// without its last commits.
const (
	exitFetchNotFound = 1
	exitFetchFailed   = 126
)

// fetchExit is a `wal fetch` failure with its exit code.
type fetchExit struct {
	err  error
	code int
}

func (e fetchExit) Error() string { return e.err.Error() }
func (e fetchExit) ExitCode() int { return e.code }

// fetchFailed makes err a failure that stops recovery. A usage error
// keeps its message but not its type, whose exit code (2) PostgreSQL
// would take for "no such file".
func fetchFailed(err error) error {
	var fe fetchExit
	if err == nil || errors.As(err, &fe) {
		return err
	}
	return fetchExit{err: errors.New(err.Error()), code: exitFetchFailed}
}

func walFetchCommand() *cli.Command {
	return &cli.Command{
		Name:      "fetch",
		Usage:     "restore_command: copy one WAL segment or history file from the safekeepers or the archive",
		UsageText: "safekeeper wal fetch {--safekeepers H:P,... (or --etcd-endpoints URLS) | --remote-storage URL | both} --tenant-id HEX --timeline-id HEX FILE PATH\n\n   restore_command = 'safekeeper wal fetch --safekeepers ... --tenant-id ... --timeline-id ... %f %p'",
		Description: "Writes the WAL file FILE (%f: a segment name or TTTTTTTT.history) to PATH (%p), read from\n" +
			"any live safekeeper that holds it. The segment holding the end of the WAL is written up to\n" +
			"the end of the committed WAL and zero-padded, under its own name, so recovery replays every\n" +
			"commit the primary saw acknowledged and then finds the end of WAL. Before that it makes sure\n" +
			"the end is settled: if a quorum holds WAL above commit_lsn (the primary died before the\n" +
			"proposer passed on the last commit_lsn) it waits up to --settle-timeout for a live proposer\n" +
			"to commit it, and with no proposer streaming it commits it itself, as `safekeeper sync` does.\n\n" +
			"Exit status: 0 written; 1 no such file (a segment at or past the end of the WAL, of another\n" +
			"PostgreSQL timeline, a history file the safekeepers do not hold): PostgreSQL reads that as the\n" +
			"end of the archive. 126 for every other failure, bad flags included (no quorum, timeline not\n" +
			"found, segment removed, a read failed): PostgreSQL then stops recovery with FATAL instead of\n" +
			"promoting without the WAL it could not get.\n\n" +
			"With --remote-storage and no --safekeepers the archive is the only source: whole segments as\n" +
			"archived (their checksum checked), the segment of the newest partial object up to its end,\n" +
			"zero-padded; exit 1 at or past the archive's end, 126 for a segment missing below it (a gap)\n" +
			"or a corrupt object. With both, the safekeepers answer first, and a whole segment they no\n" +
			"longer hold (or cannot serve) is read from the archive.\n" +
			"--etcd-endpoints in place of --safekeepers reads the timeline's members and their addresses\n" +
			"from its configuration in etcd; etcd unreachable or no configuration is exit 126.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return fetchFailed(err) },
		Before: func(c *cli.Context) error {
			if c.String("safekeepers") == "" && c.String("remote-storage") == "" && c.String("etcd-endpoints") == "" {
				return fetchFailed(errors.New("give --safekeepers (or --etcd-endpoints), --remote-storage, or both"))
			}
			return fetchFailed(requireFlags(c, "tenant-id", "timeline-id"))
		},
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "safekeepers", Usage: "comma-separated host:port list of every safekeeper of the timeline", EnvVars: []string{"SAFEKEEPER_SAFEKEEPERS"}},
			&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required)", EnvVars: []string{"SAFEKEEPER_TENANT_ID"}},
			&cli.StringFlag{Name: "timeline-id", Usage: "timeline id, 32 hex digits (required)", EnvVars: []string{"SAFEKEEPER_TIMELINE_ID"}},
			&cli.DurationFlag{Name: "timeout", Value: 2 * time.Minute, Usage: "give up (exit 126) after this long"},
			&cli.DurationFlag{Name: "settle-timeout", Value: 10 * time.Second, Usage: "how long a live proposer is given to commit the WAL a quorum holds above commit_lsn"},
		}, slices.Concat(securityFlags(), archiveReadFlags(), etcdFlags())...),
		Action: func(c *cli.Context) error {
			return fetchFailed(func() error {
				if c.NArg() != 2 {
					return fmt.Errorf("wal fetch takes FILE (%%f) and PATH (%%p), got %q", c.Args().Slice())
				}
				tenant, timeline, err := parseIDs(c)
				if err != nil {
					return err
				}
				log, err := logger(c)
				if err != nil {
					return err
				}
				log = log.With("tenant_id", tenant.String(), "timeline_id", timeline.String())
				var addrs []string
				for _, a := range strings.Split(c.String("safekeepers"), ",") {
					if a = strings.TrimSpace(a); a != "" {
						if err := checkDialAddr(a); err != nil {
							return fmt.Errorf("--safekeepers: %q: %w", a, err)
						}
						addrs = append(addrs, a)
					}
				}
				if len(addrs) == 0 && c.IsSet("safekeepers") {
					return errors.New("--safekeepers: no address given")
				}
				if c.String("etcd-endpoints") != "" {
					if len(addrs) > 0 {
						return errors.New("--safekeepers and --etcd-endpoints exclude each other: the addresses come from one or the other")
					}
					ec, err := etcdClient(c)
					if err != nil {
						return err
					}
					r, err := ec.Resolve(c.Context, tenant, timeline)
					ec.Close()
					if err != nil {
						return err
					}
					if addrs, err = r.Addrs(); err != nil {
						return err
					}
				}
				name, path := c.Args().Get(0), c.Args().Get(1)
				ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
				c.Context = ctx
				defer cancel()
				sec, err := securityFrom(c)
				if err != nil {
					return err
				}
				store, codec, err := openArchive(c, nil)
				if err != nil {
					return err
				}
				var ar *archive.Archive
				if store != nil {
					ar = archive.Open(store, codec, proto.TimelineKey{TenantID: tenant, TimelineID: timeline})
				}
				var f restore.Fetched
				streamed := len(addrs) == 0
				if streamed {
					// Straight into the file as it is decoded.
					err = writeFetched(path, func(w io.Writer) error {
						f, err = restore.FetchArchive(ctx, ar, name, w)
						return err
					})
				} else {
					f, err = restore.Fetch(ctx, restore.FetchConfig{Safekeepers: addrs, TenantID: tenant, TimelineID: timeline, Security: sec,
						Logger: log, SettleTimeout: c.Duration("settle-timeout")}, name)
					if err != nil && !errors.Is(err, restore.ErrNotFound) && ar != nil {
						log.Info("the safekeepers could not serve the file; trying the archive", "file", name, "err", err)
						if af, ok, aerr := restore.FetchArchivedSegment(ctx, ar, name); aerr != nil {
							err = fmt.Errorf("%w; the archive: %w", err, aerr)
						} else if ok {
							f, err = af, nil
						}
					}
				}
				if errors.Is(err, restore.ErrNotFound) {
					return fetchExit{err: err, code: exitFetchNotFound}
				}
				if err != nil {
					return err
				}
				if !streamed {
					if err := writeFetched(path, func(w io.Writer) error { _, err := w.Write(f.Data); return err }); err != nil {
						return err
					}
				}
				log.Info("fetched", "file", name, "from", f.From, "start", f.Start, "end", f.End,
					"zero_padded", f.Padded || (f.Start != 0 && int(f.End-f.Start) < len(f.Data)), "synced", f.Synced)
				return nil
			}())
		},
	}
}

// writeFetched writes a file to path through a temporary file in its
// directory, renamed into place once write returned nil: PostgreSQL never
// sees a part of it, nor a file whose fetch failed. write's error is
// returned as it is.
func writeFetched(path string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".fetch-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	// Whole writes of 1 MiB, not the decoder's pieces.
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err := write(bw); err != nil {
		tmp.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
