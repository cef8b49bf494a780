package procnet

import (
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
)

// The test process's own listeners are found, with their addresses and
// the ports the kernel gave them; a connected (not listening) socket is
// not.
func TestListeningFindsOwnListeners(t *testing.T) {
	var want []netip.AddrPort
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if addr == "[::1]:0" {
				t.Logf("no IPv6 loopback here: %v", err)
				continue
			}
			t.Fatal(err)
		}
		defer l.Close()
		want = append(want, l.Addr().(*net.TCPAddr).AddrPort())
	}
	c, err := net.Dial("tcp", want[0].String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	got, err := Listening(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("Listening = %v, want it to contain %v", got, w)
		}
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if slices.Contains(got, local) {
		t.Errorf("Listening = %v contains the connected socket %v", got, local)
	}
}

func TestListeningOfNoProcess(t *testing.T) {
	if _, err := Listening(-1); err == nil {
		t.Error("Listening(-1) = nil error")
	}
}

// The table's addresses are as a little-endian machine prints them.
func TestParseAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:1F90":                         "127.0.0.1:8080",
		"00000000:0050":                         "0.0.0.0:80",
		"00000000000000000000000001000000:0016": "[::1]:22",
	} {
		got, err := parseAddr(in)
		if err != nil || got.String() != want {
			t.Errorf("parseAddr(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0100007F", "0100007:1F90", "zz00007F:1F90", "0100007F:1F9000"} {
		if got, err := parseAddr(bad); err == nil {
			t.Errorf("parseAddr(%q) = %v, want an error", bad, got)
		}
	}
}
