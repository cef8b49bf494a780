/*
Package storage is the safekeeper's durable storage: the control state and the
WAL of every timeline, in one bbolt file per data directory (conventionally
DATADIR/safekeeper.db, mode 0600). A *Timeline implements acceptor.Storage, so
the pure acceptor state machine persists through it without knowing about
bbolt; this package imports acceptor, never the reverse.

# What it owns

  - The file and its lock: Open takes bbolt's exclusive flock (shared with
    Options.ReadOnly) and gives up after Options.Timeout with ErrLocked, so an
    offline tool started next to a running server fails at once and clearly.
  - The on-disk layout and the control record encoding (below).
  - The node id the file belongs to (ClaimNodeID: recorded once, never
    changed; refusing another id is the server's decision).
  - The group commit: concurrent Commit calls of many timelines become one
    bbolt write transaction and one fsync, written by the first of them.
  - The retention horizon (State.RemovedUpTo), which only RemoveWAL moves.

It does not decide what to store: which WAL to truncate, what commit_lsn is,
when WAL may be removed are the acceptor's and the server's decisions.

# On-disk layout

	meta/                         bucket
	  format   -> u32 BE 2        Open refuses any other format
	  node_id  -> node record     the node id owning the file (node.go)
	timelines/                    bucket
	  <tenant_id ‖ timeline_id>/  bucket per timeline, 32-byte name
	    control -> control record (acceptor.State)
	    pg_history -> PostgreSQL history file of pg_timeline, once > 1
	                  (framed: magic "SKPH", version 1, the bytes, crc32c)
	    wal/                      bucket, FillPercent 1.0
	      <u64 BE LSN>/           extent: a bucket per Commit and segment
	        <u64 BE LSN> -> chunk WAL bytes starting at that LSN
	    slots/                    bucket, optional (see slots.go)
	      <slot name> -> slot record
	    slot_tombstones/          bucket, optional: the slots dropped
	      <slot name> 0 <u64 BE incarnation> -> tombstone record

Extent and chunk keys are the big-endian LSN of their first byte (an
extent's key is its first chunk's), so cursor order is LSN order and a read
at any LSN is a Seek (then Prev) among the extents, the same inside the
extent, then Next calls. Chunks are contiguous (each starts where the
previous ends), hold at most Options.MaxChunkSize bytes (default 256 KiB,
never more than 1 MiB) and, like extents, never cross a WAL segment boundary
(State.WalSegSize), so retention deletes whole segments as whole extents.
Each Commit writes the WAL staged since the last one as new extents, one per
segment it touches; extents of earlier commits are never rewritten except to
trim the one a truncation cuts.

Why a bucket per Commit rather than chunks straight under wal/: bbolt
rewrites, on every commit, the whole leaf page that receives a new key, and
never splits a leaf of four keys or fewer, so appending chunks to one bucket
rewrote the three or four chunks before each new one (4.9 bytes written per
WAL byte for 128 KiB commits, 7.3 for 16 KiB ones). A new extent is a tree
of its own, written once; what a commit rewrites besides it is one leaf of
24-byte extent headers and the path above it: about 1.2 bytes per WAL byte
at 128 KiB (storage's BenchmarkCommit reports the figures).

Format 1 (chunks straight under wal/) is refused; there is no in-place
upgrade.

The control record, all integers big-endian:

	magic "SKCS" | version u32 (1) | tenant_id [16] | timeline_id [16] |
	system_id u64 | pg_version u32 | wal_seg_size u32 | pg_timeline u32 |
	voted_for.term u64 | voted_for.uuid [16] | timeline_start_lsn u64 |
	flush_lsn u64 | commit_lsn u64 | truncate_lsn u64 | removed_up_to u64 |
	n u32 | n × (term u64, start_lsn u64) | crc32c u32 (Castagnoli, over all
	the bytes before it)

A decoder refuses a wrong magic, an unknown version, a CRC mismatch or a
length that does not match n, with an error wrapping ErrCorrupt.

The node record (node.go, magic "SKND"), the slot records (slots.go,
magic "SKSL", version 2; version 1 is still read) and the tombstone records
(magic "SKST") are framed the same way: magic, version u32, a body of their
own, crc32c u32 over the bytes before it. The framing has one home,
record.go, which checks length, magic, version and CRC for all of them;
each record's file keeps only its body layout.

# Durability order

WriteWAL and TruncateWAL only stage changes in memory (WriteWAL copies the
caller's bytes). Commit(state) hands the staged truncations and writes, in
the order they were staged, and the encoded state to the group commit, which
applies them with those of every other waiting Commit in one db.Update:
truncations delete the extents and chunks at and above their LSN and trim the
chunk that straddles it, writes put new extents, the control record is
replaced. bbolt
writes the dirty pages, fsyncs (fdatasync), then writes and fsyncs the meta
page that makes the transaction visible. Only after that returns are the
callers woken; if the transaction failed, all of them get the error and none
of their changes is durable (a Commit refused for its own bad LSNs is refused
alone, before it changes anything). So:

  - a Commit that returned nil survives a crash, with everything staged
    before it;
  - a crash at any moment leaves each timeline exactly as of some Commit: a
    truncation is never durable without the state and writes committed with
    it, so WAL above a truncation point is never served again once that
    truncation has been acknowledged;
  - CreateTimeline writes the timeline bucket, its WAL bucket and its control
    record in one transaction: after a crash the timeline exists whole or not
    at all.

Commits taking more than Options.SlowCommit (1 s) are logged with their
duration. Options.UnsafeNoFsync removes the fsyncs and with them every
guarantee above; it exists for tests and benchmarks.

bbolt runs with NoFreelistSync (as etcd does): the list of free pages is not
written by every commit but rebuilt when the file is opened, by walking the
tree. This changes no durability guarantee (the free pages are derived from
the committed tree, which is fsynced as before); it saves the freelist pages
of every commit (one to four, more after retention freed many pages) at the
cost of a walk over the tree's pages at Open. A clean Close writes the list
once, in a last transaction, so a restart reads it from its page instead (a
few milliseconds where the walk took 0.1 s for 562 MB of WAL written in
128 KiB commits); the first commit after that Open drops it again, and an
Open after a crash walks the tree.

Group commit is a leader hand-off, not db.Batch: Batch may rerun its
functions and would run the callers' side effects twice, and it delays
commits by a timer. The first Commit that finds no transaction in progress
leads: it takes every pending request (its own among them), writes them in
one transaction, wakes their callers and hands the lead to the first request
that arrived meanwhile. So while one fsync is in progress the next batch
accumulates; the commits per fsync grow with load, no request waits for a
timer, and a lone committer (one busy timeline) writes its own transaction
without waking another goroutine and being woken back (an earlier dedicated
committer goroutine cost two wake-ups per commit). RemoveWAL and
CreateTimeline are rare and use their own transactions.

# Reading

ReadWAL serves committed WAL only, never staged bytes. It opens a read
transaction, seeks, copies the chunks into the caller's buffer and closes the
transaction before returning: bbolt slices are valid only inside their
transaction, and a read transaction held open (for instance across a slow
network send to a replica) pins the old pages and blocks the writer's remap
when the file grows, which would stall every timeline's commits. Readers
limit what they serve to commit_lsn or flush_lsn themselves. A read below the
oldest retained WAL fails with ErrWALRemoved.

# Export

Export writes a timeline's committed WAL from a database file opened
read-only as PostgreSQL segment files (`safekeeper wal export`), each one
durably (temporary file, fsync, rename, directory fsync); ExportWithProgress
also reports the bytes done. `safekeeper wal dump --data-dir` needs no API
of its own: it opens the file read-only the same way and reads the range
with ReadWAL, one short transaction per MiB.

# Concurrency

A DB is safe for concurrent use and hands out one *Timeline per timeline.
WriteWAL, TruncateWAL and Commit of a timeline belong to its one owner
goroutine; ReadWAL, EndLSN, RemovedUpTo and RemoveWAL may be called from any
goroutine.
*/
package storage
