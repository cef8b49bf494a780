// Package proposer is the walproposer: the client side of the WAL push
// protocol (README_PROTO.md), which streams a PostgreSQL primary's WAL to a
// quorum of safekeepers and reports quorum durability back to the primary
// as a synchronous standby.
//
// Layers, bottom up, and where each lives:
//
//   - proposer/client: the connections, with no decision in them — the
//     START_WAL_PUSH stream to a safekeeper (Conn), Security, the physical
//     replication connection to the primary or a safekeeper's walsender
//     (Replication), TIMELINE_STATUS (ProbeTimeline), and timeline pull's
//     reads of a peer (PeerState, CopyWAL).
//   - proposer/session: the pure decisions of one term, with no IO, no
//     clock and no logging (test/purity_test.go holds it to that, as it
//     does acceptor) — the Core (term choice, election, start points,
//     commit_lsn, truncate_lsn, the deposed check), the Session around it
//     (each safekeeper's place in the protocol, campaign and election,
//     ProposerElected, WAL with at most MaxInFlight requests unanswered
//     and MaxInFlightBytes sent beyond the last request answered,
//     heartbeats, dropping a connection that breaks the protocol) and the
//     slot merge. Each call returns a Ready for the caller to carry out,
//     its events (greeted, campaigning, elected, ...) included, which the
//     caller logs (eventlog.go). Run, Sync and the deterministic simulation
//     (test/sim) all drive it.
//   - Run (this package: driver.go, safekeepers.go, catchup.go, buffer.go):
//     the IO around the session. One owner goroutine per term owns the
//     session, the WAL buffer (the session's WALSource), the catch-up
//     streams and the clock it ticks the session with; one reader
//     goroutine per connection (primary, each safekeeper, each catch-up
//     stream) feeds it through bounded channels, and one writer goroutine
//     per safekeeper connection sends what the owner queued. The owner
//     never blocks on a socket.
//   - Sync (sync.go): the same session without WAL of its own, for
//     `safekeeper sync`: its WALSource is copy streams from the donor.
//     CreateTimeline (create.go) greets every safekeeper once, allowed to
//     create the timeline: the step before a new timeline's first Run.
//   - proposer/restore: `safekeeper wal fetch`, which uses Sync; it sits
//     above this package.
//
// Lifecycle of Run: a session connects to the primary (IDENTIFY_SYSTEM,
// SHOW wal_segment_size / server_version_num), asks every safekeeper for
// the timeline (TIMELINE_STATUS: a live proposer to wait for, lease.go; a
// timeline that refuses this primary for good, refusal.go), takes its slot,
// greets every safekeeper, campaigns once a quorum greeted, elects on a
// quorum of grants, sends ProposerElected, starts replication and streams.
// A safekeeper that reconnects is re-greeted, re-granted the same ballot
// and gets a new ProposerElected. Any primary failure or refused vote ends
// the session and Run starts a new one, with a higher term, after a
// backoff; a higher term after the election ends Run with a *DeposedError,
// a refusal by the primary that no retry can heal (authorization, slot
// name) with a *RejectedError, and one by so many safekeepers that no
// quorum is left (another cluster's timeline, an older or forked
// PostgreSQL timeline) with an *IncompatibleError. docs/proposer.md has
// the reasoning. When Run returns it logs one "safekeeper link stats" line
// per safekeeper (linkstats.go): its SafeKeeperResponses and the longest
// wait for one with a request outstanding, max_response_gap, against the
// protocol's 100 ms. While it runs it shows its state, positions, lag
// behind the primary and each link's state in Config.Stats (stats.go),
// which cmd/safekeeper serves as Prometheus metrics and /readyz; the
// package itself serves nothing. A primary that cannot be reached is
// warned about once, then once a minute (outage.go).
package proposer
