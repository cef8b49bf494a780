package storage

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// ReleaseMapped gives back this process's mappings of the database file's
// pages: every page bbolt's read-only shared mmap has touched (lookups,
// readers' WAL) counts in the process's resident memory until the mapping
// goes. madvise(MADV_DONTNEED) on a shared file mapping drops only the page
// table entries: the data stays in the page cache (and on disk), and the
// next access maps it again, so nothing is lost and no reader sees anything
// else. The server calls it when ingest has gone quiet.
func (db *DB) ReleaseMapped() error {
	if err := db.checkOpen(); err != nil {
		return err
	}
	// A read transaction holds bbolt's mmap lock: no remap while madvise
	// runs, and its size (the high-water mark of the pages in use) is
	// inside the mapping.
	return db.bolt.View(func(tx *bolt.Tx) error {
		data, size := db.bolt.Info().Data, tx.Size()
		if data == 0 || size <= 0 {
			return nil
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, data, uintptr(size), unix.MADV_DONTNEED); errno != 0 {
			return fmt.Errorf("storage: madvise %s: %w", db.Path(), errno)
		}
		return nil
	})
}
