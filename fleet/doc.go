// Package fleet keeps in etcd what a fleet of safekeepers must agree on and
// what changes rarely: which safekeepers exist (each registers under a
// lease), and where each timeline lives (its configuration: a generation
// number and the member node ids). Nothing that changes per commit, per
// heartbeat or per reader goes there: positions (flush_lsn, commit_lsn,
// backup_lsn) stay between the proposer and its safekeepers, so etcd's
// load follows the number of nodes and timelines, not the commit rate, and
// the commit path never waits on it. docs/architecture.md draws the split
// and docs/operations.md ("A fleet") how to run it.
//
// # Keys
//
// Under a prefix (--etcd-prefix, default /safekeeper):
//
//	<prefix>/nodes/<id>                      Node: id, zone, advertised addresses; no lease
//	<prefix>/alive/<id>                      Status: capacity and instance, under the node's lease
//	<prefix>/timelines/<tenant>/<timeline>   Config: generation, members (new_members while one changes)
//	<prefix>/placement                       bumped by every placement (their serialization point)
//	<prefix>/controller/                     the controllers' election (concurrency.Election; fleet/controller)
//
// A node's record outlives its process, so that a proposer can still dial
// a member that is down (it retries, as with static addresses) and a
// controller knows which nodes existed; its Status vanishes with its lease,
// which is what liveness means here. Ids are decimal; tenant and timeline
// ids are 32 hex digits, as everywhere else.
//
// # Registration
//
// Register creates the node's Status under a fresh lease only if no other
// holds it. A Status left by an earlier run of the same instance (the same
// host and data directory, which two live processes cannot share: bbolt
// locks the file) is taken over at once, its lease revoked. Another
// instance's Status is watched: if its lease outlives its TTL it is kept
// alive, and Register fails with a DuplicateError naming its address; if
// it expires (a dead process's) the registration goes ahead. While the
// process runs, the lease is kept alive, the Status rewritten when the
// capacity moved (at most every UpdateInterval), and a lost lease (the
// process paused longer than its TTL, etcd unreachable that long) is
// followed by a new registration as soon as etcd answers.
//
// # Configurations
//
// A timeline's configuration is written only by compare-and-swap on its
// key's revision (Place creates it: the key must not exist). Place reads
// the live nodes and every configuration at one revision, chooses
// members (Choose: distinct zones, least loaded first), and commits only
// if the placement key has not moved since, so concurrent placements are
// serialized and each sees the others' load; a controller adds its
// election fence to the same transaction. A configuration that does not
// parse is refused with an error naming its key, and a watcher keeps the
// last valid one.
package fleet
