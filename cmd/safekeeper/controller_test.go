package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestControllerAndClusterUsage: bad flags of `controller` and `cluster
// status` are usage errors (exit 2) naming the flag, found before etcd is
// dialled or a port listened on.
func TestControllerAndClusterUsage(t *testing.T) {
	eps := []string{"--etcd-endpoints", "http://127.0.0.1:1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"controller"}, "etcd-endpoints"},
		{append([]string{"controller", "--election-ttl", "500ms"}, eps...), "--election-ttl"},
		{append([]string{"controller", "--replicas", "0"}, eps...), "--replicas"},
		{append([]string{"controller", "--replicas", "16"}, eps...), "--replicas"},
		{append([]string{"controller", "--listen-http", "nowhere"}, eps...), "--listen-http"},
		{append([]string{"controller", "--advertise-http", "host"}, eps...), "--advertise-http"},
		{append(append([]string{"controller"}, eps...), "extra"), "no arguments"},
		{[]string{"controller", "--etcd-endpoints", "127.0.0.1:2379"}, "--etcd-endpoints"},
		{[]string{"cluster", "status"}, "etcd-endpoints"},
		{append(append([]string{"cluster", "status"}, eps...), "extra"), "no arguments"},
		{[]string{"cluster", "bogus"}, "cluster bogus"},
		{append([]string{"cluster", "status", "--etcd-user", "u"}, eps...), "--etcd-password-file"},
	} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"safekeeper"}, tc.args...), &out, &errb); code != exitUsage || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming %q", tc.args, code, errb.String(), exitUsage, tc.want)
		}
	}
}
