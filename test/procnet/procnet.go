// Package procnet reads from /proc which TCP addresses a process listens
// on: how a test learns the port a server it started bound for itself
// (port 0) when the server does not say, or says only once it is ready
// (versitygw in test/s3test, etcd in test/etcdtest). Linux only; it
// imports nothing from this module.
package procnet

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// Listening returns the TCP addresses (IPv4 and IPv6) that process pid
// has sockets listening on: the inodes of its sockets (/proc/PID/fd)
// matched against the listening sockets of /proc/PID/net/tcp and tcp6.
// An empty result with a nil error means none (yet).
func Listening(pid int) ([]netip.AddrPort, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var out []netip.AddrPort
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if errors.Is(err, os.ErrNotExist) && table == "tcp6" {
			continue // a kernel without IPv6
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] { // 0A: LISTEN
				continue
			}
			if ap, err := parseAddr(fields[1]); err == nil {
				out = append(out, ap)
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// parseAddr parses a local_address of /proc/net/tcp or tcp6: the address
// as hex 32-bit words, each printed in the machine's byte order, a colon,
// the port in hex.
func parseAddr(s string) (netip.AddrPort, error) {
	addrHex, portHex, ok := strings.Cut(s, ":")
	if !ok || (len(addrHex) != 8 && len(addrHex) != 32) {
		return netip.AddrPort{}, fmt.Errorf("procnet: bad address %q", s)
	}
	raw, err := hex.DecodeString(addrHex)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("procnet: bad address %q: %v", s, err)
	}
	for i := 0; i < len(raw); i += 4 { // each word's value, laid out as in memory
		binary.NativeEndian.PutUint32(raw[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("procnet: bad port in %q: %v", s, err)
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}
