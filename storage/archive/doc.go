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
package archive
