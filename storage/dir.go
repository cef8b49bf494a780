package storage

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// SyncDir fsyncs directory dir, so that the entries made in it (a new
// file, a rename, a new subdirectory) survive a power loss: fsyncing a file
// makes its data durable, not its name.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// MkdirAllDurable is os.MkdirAll that also fsyncs the parent of every
// directory it creates, so that a data directory made for a new safekeeper
// (or a pull onto a replaced disk) is still there after a power loss.
func MkdirAllDurable(dir string, perm os.FileMode) error {
	dir = filepath.Clean(dir)
	var created []string // deepest first
	for d := dir; ; d = filepath.Dir(d) {
		_, err := os.Stat(d)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		created = append(created, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, perm); err != nil {
		return err
	}
	for i := len(created) - 1; i >= 0; i-- {
		if err := SyncDir(filepath.Dir(created[i])); err != nil {
			return err
		}
	}
	return nil
}
