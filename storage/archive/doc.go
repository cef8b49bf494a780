// Package archive is the WAL archive in object storage (storage/remote):
// how a timeline's segments, its unfinished segment and its PostgreSQL
// history files are laid out as objects, the object format (a header with
// the checksum of the content, then the content, zstd-compressed by
// default and optionally encrypted to age recipients), and putting and
// getting them with every check a reader needs: an object is verified
// against its checksum on every read, and an object of a name that exists
// with other content is refused loudly (ErrConflict), never replaced.
//
// Layout, under the store's root, for tenant T and timeline L (hex):
//
//	T/L/wal/TTTTTTTTXXXXXXXXYYYYYYYY             a whole segment, named as in pg_wal
//	T/L/wal/TTTTTTTT.history                     a PostgreSQL timeline history file
//	T/L/partial/TTTTTTTTXXXXXXXXYYYYYYYY.EEEEEEEEEEEEEEEE.partial
//	                                             the unfinished segment, WAL up to E
//
// Names under wal/ sort by PostgreSQL timeline, then position; partials of
// one segment sort by their end, so the newest is the last one listed
// under partial/ (where the uploader keeps only the newest few).
//
// The tools over a whole timeline's archive (`safekeeper archive`, and the
// uploader's retention) live here too, so that the command line and the
// server share them: Scan (inventory.go) lists the archive and reads one
// header and the history files, and says what it holds, segments by
// PostgreSQL timeline, the newest partial, sizes, the gaps and the
// segments named against the history; Verify (verify.go) reads it all as a
// restore would and decodes its WAL with proto/xlog; Prune and DeleteAll
// (prune.go) delete from it, oldest first, never the newest partial nor a
// history file.
package archive
