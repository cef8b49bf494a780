// Package etcdtest starts real etcd servers for tests: one member (Start)
// or a cluster of n (StartCluster), each an etcd process on 127.0.0.1 over
// a temporary directory, with the faults an outage test needs (Stop, Kill,
// Pause, and Start again on the same data directory and address).
//
// It is written against etcd 3.4 (Debian 12's etcd-server, 3.4.23, which
// .ci/run installs). The binary is $ETCD when set, else etcd on PATH; a
// missing binary fails the test (never a skip), naming how to install it.
//
// # Addresses
//
// No port is picked by the harness. Clients: each member listens on
// http://127.0.0.1:0, so the kernel chooses its port, and the harness reads
// the port it got from /proc (test/procnet): etcd logs the address it
// bound only once the member has joined a quorum, too late for a member
// restarted while quorum is lost. Endpoint and Endpoints are those real
// addresses.
//
// Peers: the members of a cluster must name each other's peer URLs before
// any of them starts, which no kernel-chosen port allows. They talk over
// Unix domain sockets instead, which etcd 3.4 listens on and dials for
// unix:// peer URLs: member i's peer URL is unix://peer-i:0, the socket
// file "peer-i:0" in the cluster's directory, the working directory of
// every member (etcd takes a unix URL's host part as the socket's path,
// relative to its working directory, and wants that host part in
// host:port form, hence the ":0", which names nothing). So the raft
// traffic between members uses no TCP port at all, and each cluster's
// sockets live in a directory of its own.
//
// A member must advertise a client URL before it knows its port, so every
// member advertises the placeholder http://127.0.0.1:0 in the member list:
// give a client Endpoints, and do not let it sync its endpoints from the
// member list (clientv3.Config.AutoSyncInterval 0, the default). The
// gRPC gateway, which would dial that placeholder, is off.
//
// A member started again (Server.Start after Stop or Kill) binds the port
// its first run got, as test/harness does for a safekeeper restarted on
// the same ports (its Safekeeper.Start says why that is safe): clients
// configured with Endpoints reach it again. If the port was taken while
// the member was down (etcd exits with "address already in use"), Start
// waits until it can be bound and tries again, within its deadline.
//
// # Lifecycle
//
// StartCluster (or Start) → Endpoints for clients → faults on a member
// (Stop, Kill, Pause/Resume, Start) → cleanup, registered with t.Cleanup
// before the first process starts: it kills every etcd process the
// cluster started (paused ones too), logs the tail of each member's log if
// the test failed, and the directory (t.TempDir) is removed. StartCluster
// returns once every member answers /health with true: it has a leader and
// can commit. Server.Start returns once the member listens, which can be
// before it has a quorum; WaitHealthy waits for that.
//
// # TLS
//
// StartTLS serves the client URLs over TLS (https://) with the given
// certificate and requires client certificates of the given CA (etcd's
// --client-cert-auth); the harness's /health requests present the client
// certificate it is given.
//
// The methods that fail the test (StartCluster, Start, StartTLS,
// WaitHealthy) are for the test's goroutine only. It imports nothing from
// this module but test/procnet and test/harness (its log helpers).
package etcdtest
