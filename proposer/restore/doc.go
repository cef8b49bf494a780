// Package restore is `safekeeper wal fetch`, PostgreSQL's restore_command
// over the safekeepers: Fetch returns a WAL segment or history file, read
// from a safekeeper that holds it committed, with the segment holding the
// end of the WAL cut at the end of the committed WAL (docs/proposer.md,
// "safekeeper wal fetch: restore_command").
//
// It is a client of the safekeepers (proposer/client: TIMELINE_STATUS and
// their walsenders) that decides one thing of its own, where the
// committed WAL ends; when a quorum holds WAL above commit_lsn and no
// proposer is live to commit it, it runs proposer.Sync. That is why it
// sits above package proposer rather than beside the driver: it uses the
// proposer, the proposer never uses it. One call is one file; nothing is
// kept between calls.
package restore
