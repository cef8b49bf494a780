// Package backup is the safekeeper's uploader: it carries every timeline's
// committed WAL into the archive (storage/archive), whole segments once
// they lie below commit_lsn and the unfinished segment as a partial object
// every PartialInterval while it changes, and moves backup_lsn.
//
// Who uploads. Every safekeeper of a timeline runs an uploader, and no
// central service says which of them works: each looks at the archive
// before it writes. A whole segment another safekeeper already stored
// (same content: its header's checksum) only moves backup_lsn here; one
// nobody stored is uploaded by the safekeeper whose turn comes first: each
// waits, before its first attempt at a segment (from when it finds the
// segment complete), a delay of its own in [Takeover/2, Takeover) derived
// from its node id and the timeline (the same safekeeper goes first for
// every segment of a timeline, and the timelines spread over the
// safekeepers; the floor gives the active uploader the time to store a
// segment before the others look for it); one that just uploaded the
// segments before goes on without waiting (and without looking first:
// the store refuses a name that exists), so a backlog drains at the
// store's pace and the active uploader adds no delay; one with a backlog
// of more than one segment that finds no partial object, nor the segment
// before the backlog, stored lately (nobody at work, as after a restart)
// does not wait either, unless it found segments another stored within
// the last minute (the WAL stalled, then several segments completed at
// once: their uploader goes on). The partial object is written
// by whoever finds the newest one unchanged for PartialInterval plus its
// delay: the one writing keeps it fresh, and when it dies or lags another
// takes over within seconds. Two writers at once are harmless: objects
// are created once (the store refuses a second create), a second writer
// of the same content finds it there, and different content for one name
// is refused loudly as a split brain (archive.ErrConflict).
package backup
