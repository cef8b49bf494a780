package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"filippo.io/age"
	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/storage/archive"
	"github.com/safekeeper/safekeeper/storage/remote"
)

// The archive's flags, shared by run, wal fetch and archive: where the
// store is (--remote-storage), its credentials, and how objects are
// written (compression, age recipients) and read (age identities).

const remoteStorageUsage = "the WAL archive: file:///path (a local directory or a mounted share) or " +
	"s3://BUCKET/PREFIX?endpoint=http://HOST:PORT&region=R (S3 or an S3-compatible store, path-style; no endpoint: AWS); " +
	"S3 credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, the shared credentials file, or --remote-storage-credentials-file"

// archiveReadFlags are the flags of a command that reads the archive.
func archiveReadFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "remote-storage", Usage: remoteStorageUsage},
		&cli.StringFlag{Name: "remote-storage-credentials-file", Usage: "AWS shared credentials file for an s3:// --remote-storage (profile AWS_PROFILE, else default), instead of the environment"},
		&cli.StringSliceFlag{Name: "archive-identity-file", Usage: "age identity file (age-keygen's output) to decrypt an encrypted archive; repeat while keys rotate"},
	}
}

// archiveWriteFlags are run's: the read flags and how objects are written.
func archiveWriteFlags() []cli.Flag {
	return append(archiveReadFlags(),
		&cli.StringFlag{Name: "archive-compression", Value: "zstd", Usage: "compression of archived WAL: zstd or none"},
		&cli.StringSliceFlag{Name: "archive-recipient", Usage: "encrypt archived WAL to this age recipient (age1...); repeat for several (rotation: add the new key, later drop the old)"},
		&cli.StringFlag{Name: "archive-recipients-file", Usage: "file of age recipients to encrypt archived WAL to, one per line (as age -R)"},
		&cli.IntFlag{Name: "backup-parallel-jobs", Value: 4, Usage: "most WAL segments uploaded to the archive at once"},
		&cli.DurationFlag{Name: "partial-backup-interval", Value: 10 * time.Second, Usage: "upload the unfinished segment (up to commit_lsn) this often while it changes"},
		&cli.StringFlag{Name: "archive-retention", Value: "0", Usage: "delete WAL from the archive once it was stored longer ago than this (7d, 36h, 90m; whole segments, oldest first, never the newest partial nor a history file); 0 keeps it all. Keep what your oldest base backup needs"},
		&cli.DurationFlag{Name: "backup-takeover", Value: 3 * time.Second, Hidden: true, Usage: "longest wait for another safekeeper to upload before this one does"},
	)
}

// openArchive opens the --remote-storage store. With warn set (run) it
// checks it too: exit 2 naming the problem when the store refuses (a
// missing bucket, refused credentials, a directory it cannot write), and
// a warning when it cannot be reached (run starts while the store is down
// and archives once it is back). Readers (wal fetch, archive) do not
// check: their first read says what is wrong, and read-only credentials
// must do for them. It returns a nil store without --remote-storage.
func openArchive(c *cli.Context, warn func(string, ...any)) (remote.Storage, *archive.Codec, error) {
	raw := c.String("remote-storage")
	if raw == "" {
		return nil, nil, nil
	}
	codec, err := archiveCodec(c) // first: a refused flag creates nothing
	if err != nil {
		return nil, nil, err
	}
	store, err := remote.Open(raw, remote.Options{CredentialsFile: c.String("remote-storage-credentials-file")})
	if err != nil {
		return nil, nil, usagef("--remote-storage: %w", err)
	}
	if warn == nil {
		return store, codec, nil
	}
	ctx, cancel := context.WithTimeout(c.Context, 30*time.Second)
	defer cancel()
	if err := store.Check(ctx); err != nil {
		if errors.Is(err, remote.ErrRefused) {
			return nil, nil, usagef("--remote-storage: %w", err)
		}
		warn("the archive's store cannot be reached; starting anyway, uploads retry until it is back", "store", store.String(), "err", err)
	}
	return store, codec, nil
}

// archiveCodec is the flags' object codec: compression, recipients,
// identities (each file read and parsed now: a bad one is a usage error).
func archiveCodec(c *cli.Context) (*archive.Codec, error) {
	codec := &archive.Codec{Compress: true}
	switch v := c.String("archive-compression"); v {
	case "zstd", "": // "": a command without the flag
	case "none":
		codec.Compress = false
	default:
		return nil, usagef("--archive-compression %q: want zstd or none", v)
	}
	for _, r := range c.StringSlice("archive-recipient") {
		rc, err := age.ParseX25519Recipient(strings.TrimSpace(r))
		if err != nil {
			return nil, usagef("--archive-recipient %q: %w", r, err)
		}
		codec.Recipients = append(codec.Recipients, rc)
	}
	if f := c.String("archive-recipients-file"); f != "" {
		fh, err := os.Open(f)
		if err != nil {
			return nil, usagef("--archive-recipients-file: %w", err)
		}
		rs, err := age.ParseRecipients(fh)
		fh.Close()
		if err != nil {
			return nil, usagef("--archive-recipients-file %s: %w", f, err)
		}
		codec.Recipients = append(codec.Recipients, rs...)
	}
	for _, f := range c.StringSlice("archive-identity-file") {
		fh, err := os.Open(f)
		if err != nil {
			return nil, usagef("--archive-identity-file: %w", err)
		}
		ids, err := age.ParseIdentities(fh)
		fh.Close()
		if err != nil {
			return nil, usagef("--archive-identity-file %s: %w", f, err)
		}
		codec.Identities = append(codec.Identities, ids...)
	}
	return codec, nil
}
