package netq

import "golang.org/x/sys/unix"

// inq is FIONREAD (TIOCINQ): for a TCP socket, the bytes not yet read.
func inq(fd uintptr) (int, bool) {
	n, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ)
	return n, err == nil
}

// outq is SIOCOUTQ (TIOCOUTQ): for a TCP socket, the bytes not yet
// acknowledged by the peer.
func outq(fd uintptr) (int, bool) {
	n, err := unix.IoctlGetInt(int(fd), unix.TIOCOUTQ)
	return n, err == nil
}
