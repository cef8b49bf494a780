package remote

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/safekeeper/safekeeper/storage"
)

// Dir is a Storage in a local directory (file:///path), for one machine
// or a mounted network share. An object is a file under the root, its
// name the object's (slashes are directories). Create writes a temporary
// file next to it (a name starting with a dot, which no object has),
// fsyncs it, links it to the object's name (link fails if the name exists,
// so two writers cannot both win) and fsyncs the directory: a crash leaves
// the object whole or absent, and at most a temporary file, which List
// does not show.
type Dir struct {
	root string
}

// NewDir returns the store rooted at directory root, making it (durably)
// if it does not exist.
func NewDir(root string) (*Dir, error) {
	root = filepath.Clean(root)
	if err := storage.MkdirAllDurable(root, 0o700); err != nil {
		return nil, fmt.Errorf("remote: %w", err)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("remote: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s is not a directory", ErrBadURL, root)
	}
	return &Dir{root: root}, nil
}

func (d *Dir) String() string { return "file://" + d.root }

// Check tells whether the directory is there and objects can be written
// in it.
func (d *Dir) Check(ctx context.Context) error {
	fi, err := os.Stat(d.root)
	if err != nil {
		return fmt.Errorf("%w: %w: %v", ErrUnavailable, ErrRefused, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %w: %s is not a directory", ErrUnavailable, ErrRefused, d.root)
	}
	if err := probe(ctx, d); err != nil {
		// A local directory that cannot take a file does not heal by
		// waiting (permissions, a read-only mount).
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return nil
}

func (d *Dir) path(name string) (string, error) {
	if err := CheckName(name); err != nil {
		return "", err
	}
	return filepath.Join(d.root, filepath.FromSlash(name)), nil
}

func (d *Dir) Create(ctx context.Context, name string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := d.path(name)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(p); err == nil {
		return fmt.Errorf("%w: %s", ErrExists, name)
	}
	dir := filepath.Dir(p)
	if err := storage.MkdirAllDurable(dir, 0o700); err != nil {
		return fmt.Errorf("remote: %w", err)
	}
	var suffix [8]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return fmt.Errorf("remote: %w", err)
	}
	tmp := filepath.Join(dir, "."+filepath.Base(p)+".tmp-"+hex.EncodeToString(suffix[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("remote: %w", err)
	}
	defer os.Remove(tmp) // the object, once linked, is another name for it
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("remote: writing %s: %w", name, err)
	}
	if err := os.Link(tmp, p); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%w: %s", ErrExists, name)
		}
		return fmt.Errorf("remote: %w", err)
	}
	if err := storage.SyncDir(dir); err != nil {
		return fmt.Errorf("remote: %w", err)
	}
	return nil
}

func (d *Dir) Read(ctx context.Context, name string, off, n int64) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := d.path(name)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("remote: %w", err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err == nil && (off < 0 || off > fi.Size()) {
		err = fmt.Errorf("offset %d outside the object's %d bytes", off, fi.Size())
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("remote: reading %s: %w", name, err)
	}
	if n < 0 {
		n = fi.Size() - off
	}
	return readCloser{io.NewSectionReader(f, off, n), f}, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

func (d *Dir) Stat(ctx context.Context, name string) (Object, error) {
	if err := ctx.Err(); err != nil {
		return Object{}, err
	}
	p, err := d.path(name)
	if err != nil {
		return Object{}, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && !fi.Mode().IsRegular()) {
		return Object{}, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return Object{}, fmt.Errorf("remote: %w", err)
	}
	return Object{Name: name, Size: fi.Size(), Modified: fi.ModTime()}, nil
}

func (d *Dir) List(ctx context.Context, prefix string, fn func(Object) error) error {
	// Walk only the directory the prefix is in.
	base := d.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		base = filepath.Join(d.root, filepath.FromSlash(prefix[:i]))
	}
	var objs []Object
	err := filepath.WalkDir(base, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // no such directory: nothing under the prefix
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if strings.HasPrefix(e.Name(), ".") && p != base {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil // a temporary file
		}
		if !e.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(d.root, p)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		if !strings.HasPrefix(name, prefix) {
			return nil
		}
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // deleted meanwhile
		}
		if err != nil {
			return err
		}
		objs = append(objs, Object{Name: name, Size: fi.Size(), Modified: fi.ModTime()})
		return nil
	})
	if err != nil {
		return fmt.Errorf("remote: listing %q: %w", prefix, err)
	}
	// A directory walk is in order per directory, not of the whole names
	// ("a/b" comes before "a.b" in it, after it in byte order).
	slices.SortFunc(objs, func(a, b Object) int { return strings.Compare(a.Name, b.Name) })
	for _, o := range objs {
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

func (d *Dir) Delete(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := d.path(name)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remote: %w", err)
	}
	if err := storage.SyncDir(filepath.Dir(p)); err != nil {
		return fmt.Errorf("remote: %w", err)
	}
	return nil
}
