package harness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// listeningMsg is the message of the line `safekeeper run` logs once both
// listeners are bound: pg= and http= name the addresses it got.
const listeningMsg = "safekeeper listening"

// ListenAddrs returns the addresses named by the last "safekeeper
// listening" line of log, a `safekeeper run` log in either format (text or
// JSON): pg is the PostgreSQL-protocol listener's, http the HTTP API's (""
// when it is off). ok is false when log has no such line yet. A process
// started with --listen-pg 127.0.0.1:0 reports the port it bound here.
func ListenAddrs(log string) (pg, http string, ok bool) {
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := logFields(sc.Text())
		if fields["msg"] == listeningMsg && fields["pg"] != "" {
			pg, http, ok = fields["pg"], fields["http"], true
		}
	}
	return pg, http, ok
}

// logFields parses one slog line: a JSON object, or the text handler's
// key=value pairs (a value with spaces or quotes is a Go-quoted string).
// Only string-valued keys are kept from JSON; a line that is neither
// parses to what could be read of it.
func logFields(line string) map[string]string {
	out := map[string]string{}
	if strings.HasPrefix(line, "{") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			for k, v := range m {
				if s, ok := v.(string); ok {
					out[k] = s
				}
			}
		}
		return out
	}
	for line != "" {
		line = strings.TrimLeft(line, " ")
		key, rest, found := strings.Cut(line, "=")
		if !found || key == "" || strings.ContainsAny(key, " \"") {
			return out
		}
		var val string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return out
			}
			val, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else {
			val, rest, _ = strings.Cut(rest, " ")
		}
		out[key] = val
		line = rest
	}
	return out
}

// RefusedAddr returns a 127.0.0.1 address where nothing listens for the
// rest of the test: a TCP socket the harness binds to port 0 and never
// listens on, so a connection to it is refused at once (RST) and no other
// socket can take the port while the test runs. For a peer that is down
// or was never there. The socket is closed at cleanup.
func RefusedAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("harness: socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("harness: bind 127.0.0.1:0: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("harness: getsockname: %v", err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
