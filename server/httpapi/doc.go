// Package httpapi is a safekeeper's HTTP surface: the API's JSON models,
// the handlers that serve them, the Prometheus metrics, and the client the
// command line uses. docs/http.md lists the endpoints.
//
// # What it owns, file by file
//
//   - models.go: every JSON body of the API, one Go type each (Status,
//     TimelineSummary, Timeline, DeleteResult, ErrorBody), and
//     `safekeeper inspect`'s (Inspection), which shares the timeline's
//     durable state (TimelineState) with the API's detail. The handlers
//     write them, the Client and the CLI read them: no body is declared
//     twice.
//   - api.go: the routes, the handlers, the error answers; wal.go: GET
//     .../wal, the raw WAL of a timeline (at most MaxWALStreams at once).
//   - auth.go: Neon's tenant-scoped tokens on the HTTP API.
//   - metrics.go: the server-wide instruments (Metrics: the group commit's
//     durations, appends, refusals by reason) and the collector that
//     reports every running timeline's positions at scrape time.
//   - client.go: Client, the calls the CLI makes (status, timeline
//     list|show|delete, wal dump --http).
//
// # Lifecycle
//
// The server makes the Metrics before it opens the database (storage
// reports every group commit to ObserveCommit), then New on its listener
// with the timeline registry and a Host; Serve until the server's
// Shutdown, which stops the API (a second's grace for the requests under
// way) before it closes the registry.
//
// # Why the boundary sits here
//
// The handlers read every timeline through the registry (server/timeline)
// and decide their statuses from its sentinels (ErrNotFound is 404,
// ErrBusy 409, ErrStopped 503), never from a SQLSTATE; what they need of
// the process around it (shutting down, the disk breaker, the connection
// count, the database's size) comes through Host, which the server
// implements. So the package does not import server (a test checks), and
// a new endpoint — an online pull_timeline, a backup's status — is a
// handler here over the registry's API, with its body in models.go for the
// CLI to decode.
package httpapi
