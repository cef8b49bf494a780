package pgwire

import "golang.org/x/sys/unix"

// inq is how many bytes the socket fd has received and not yet given to a
// read (0 when that cannot be asked).
func inq(fd uintptr) int {
	n, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ) // FIONREAD: for a TCP socket, unread bytes
	if err != nil {
		return 0
	}
	return n
}

// outq is how many bytes written to the socket fd its peer has not
// acknowledged (SIOCOUTQ); ok false when that cannot be asked.
func outq(fd uintptr) (n int, ok bool) {
	n, err := unix.IoctlGetInt(int(fd), unix.TIOCOUTQ) // SIOCOUTQ
	return n, err == nil
}
