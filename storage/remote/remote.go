package remote

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"
)

var (
	// ErrExists: Create found an object of that name; it is unchanged.
	ErrExists = errors.New("remote: object exists")
	// ErrNotFound: no object of that name.
	ErrNotFound = errors.New("remote: no such object")
	// ErrBadName: a name that is not a clean relative key (see CheckName).
	ErrBadName = errors.New("remote: bad object name")
	// ErrBadURL: a --remote-storage URL this build cannot use.
	ErrBadURL = errors.New("remote: bad storage URL")
	// ErrUnavailable: the store did not do what was asked: unreachable,
	// an error status, a missing bucket, credentials refused. The message
	// says which; retrying later may succeed.
	ErrUnavailable = errors.New("remote: storage unavailable")
	// ErrRefused: the store answered, and refused for a reason that a
	// retry does not fix: no such bucket, credentials refused, no
	// conditional writes. Such errors wrap ErrUnavailable too.
	ErrRefused = errors.New("remote: storage refused")
)

// Options are what a store needs beyond its URL.
type Options struct {
	// CredentialsFile is an AWS shared credentials file for s3:// URLs
	// (profile AWS_PROFILE, else "default"); empty: the standard chain
	// (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, the shared file,
	// the instance role on AWS).
	CredentialsFile string
}

// Object describes a stored object.
type Object struct {
	Name     string
	Size     int64
	Modified time.Time
}

// Storage is an object store.
type Storage interface {
	// Create stores data as the object name, unless one of that name
	// exists: then it returns an error wrapping ErrExists and the object
	// stays as it was. Once Create returns nil the object is durable; a
	// crash before that leaves no object (and no part of one) visible.
	Create(ctx context.Context, name string, data []byte) error
	// Read returns n bytes of the object from offset off (n < 0: to its
	// end; fewer when it ends first). off may be the object's size (an
	// empty read), not more.
	Read(ctx context.Context, name string, off, n int64) (io.ReadCloser, error)
	// Stat describes the object name.
	Stat(ctx context.Context, name string) (Object, error)
	// List calls fn for every object whose name starts with prefix, in
	// byte order of the names; an error from fn ends it and is returned.
	List(ctx context.Context, prefix string, fn func(Object) error) error
	// Delete removes the object name; one that does not exist is no error.
	Delete(ctx context.Context, name string) error
	// Check tells whether the store can be used: it exists, the
	// credentials are accepted, and a probe object can be created, read
	// and deleted. The error names the problem.
	Check(ctx context.Context) error
	// String is the store's URL, without credentials.
	String() string
}

// Open returns the store a --remote-storage URL names:
//
//	file:///absolute/path   a local directory (or a mounted share)
//	s3://BUCKET/PREFIX?endpoint=http://HOST:PORT&region=R
//	                        an S3 bucket (no endpoint: AWS), path-style
//
// Open contacts no store: Check does.
func Open(raw string, o Options) (Storage, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrBadURL, redact(raw), err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("%w %q: a file URL names a local path (file:///path), not host %q", ErrBadURL, raw, u.Host)
		}
		if u.Opaque != "" || !strings.HasPrefix(u.Path, "/") {
			return nil, fmt.Errorf("%w %q: the path must be absolute (file:///path)", ErrBadURL, raw)
		}
		if u.RawQuery != "" {
			return nil, fmt.Errorf("%w %q: a file URL takes no options", ErrBadURL, raw)
		}
		return NewDir(u.Path)
	case "s3":
		return openS3(raw, u, o)
	case "":
		return nil, fmt.Errorf("%w %q: give a URL, such as file:///var/lib/safekeeper-archive", ErrBadURL, raw)
	default:
		return nil, fmt.Errorf("%w %q: scheme %q is not supported (file:// and s3:// are)", ErrBadURL, redact(raw), u.Scheme)
	}
}

// CheckName reports whether name is a clean object key: not empty,
// relative, slash-separated, no empty, "." or ".." element, no element
// starting with a dot (the directory backend's temporary files), no
// backslash or control character, at most 1024 bytes (S3's limit).
func CheckName(name string) error {
	bad := func(why string) error { return fmt.Errorf("%w %q: %s", ErrBadName, name, why) }
	switch {
	case name == "":
		return bad("empty")
	case len(name) > 1024:
		return bad("longer than 1024 bytes")
	case strings.HasPrefix(name, "/"):
		return bad("absolute")
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f || r == '\\' {
			return bad("control character or backslash")
		}
	}
	for _, el := range strings.Split(name, "/") {
		switch {
		case el == "":
			return bad("empty element")
		case strings.HasPrefix(el, "."):
			return bad("an element starts with a dot")
		}
	}
	return nil
}

// probe creates, reads back and deletes a small object with a random name
// under the store's root: what Check does once it knows the store exists.
func probe(ctx context.Context, s Storage) error {
	var r [8]byte
	if _, err := rand.Read(r[:]); err != nil {
		return err
	}
	name := "probe-" + hex.EncodeToString(r[:])
	body := []byte("safekeeper remote storage probe " + name)
	if err := s.Create(ctx, name, body); err != nil {
		return fmt.Errorf("%s: cannot create an object: %w", s, err)
	}
	defer s.Delete(context.WithoutCancel(ctx), name)
	rc, err := s.Read(ctx, name, 0, -1)
	if err != nil {
		return fmt.Errorf("%s: cannot read an object back: %w", s, err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return fmt.Errorf("%s: cannot read an object back: %w", s, err)
	}
	if string(got) != string(body) {
		return fmt.Errorf("%w: %s: an object read back differs from what was written", ErrUnavailable, s)
	}
	if err := s.Create(ctx, name, body); !errors.Is(err, ErrExists) {
		return fmt.Errorf("%w: %w: %s: a second create of one name was not refused (%v): the store does not support conditional writes (If-None-Match), which the archive needs", ErrUnavailable, ErrRefused, s, err)
	}
	if err := s.Delete(ctx, name); err != nil {
		return fmt.Errorf("%s: cannot delete an object: %w", s, err)
	}
	return nil
}
