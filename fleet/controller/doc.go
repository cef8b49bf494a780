// Package controller is the fleet's controller: any number of processes
// run it (`safekeeper controller`), one leads, and only the leader writes
// to etcd. It places new timelines (POST
// /v1/tenant/{tenant_id}/timeline/{timeline_id}, fleet.Client.Place), and
// shows the fleet (GET /v1/cluster, GET /metrics). Moving timelines between
// nodes is the next step: Controller.Lead is where it goes.
//
// # Leadership and the fence
//
// Each controller holds an etcd session (a lease of Config.ElectionTTL,
// kept alive) and campaigns in a concurrency.Election under
// fleet.Client.ElectionPrefix with its advertised HTTP address as the
// value; the oldest key leads. A leader that stops keeping its lease alive
// (the process paused, etcd out of reach) loses its key when the lease
// expires, and another campaigner becomes the leader; the old one may not
// know yet when it wakes up. So no write relies on what the controller
// believes: every write it makes is a transaction that also compares the
// leader key's create revision with the one it won
// (Compare(CreateRevision(election.Key()), "=", election.Rev())). A
// deposed leader's write fails that compare and changes nothing
// (fleet.ErrFenced); the controller then drops its leadership and
// campaigns again, as it does when its session ends.
//
// # Lifecycle
//
// New checks the Config; Run serves the HTTP API on Config.Listener,
// campaigns, leads until the session is lost, campaigns again, and
// refreshes its view of the fleet (for /metrics) every
// Config.RefreshInterval, until its context ends: then it resigns (revokes
// its lease, so another controller takes over at once) and closes the
// listener.
//
// The controller holds no state of its own: everything is in etcd, so a
// controller down (or all of them) changes nothing for running timelines,
// whose proposers and safekeepers never talk to it; and `safekeeper
// timeline create --etcd-endpoints` places a timeline without it (the
// same fleet.Client.Place, without a fence). The package is the logic;
// cmd/safekeeper turns flags into its Config.
package controller
