package harness

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// MappedRSS returns the resident kilobytes of process pid's mappings of the
// file at path (the Rss lines of /proc/PID/smaps; pid 0 is this process).
func MappedRSS(pid int, path string) (int, error) {
	proc := "self"
	if pid != 0 {
		proc = strconv.Itoa(pid)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%s/smaps", proc))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	kb, in := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") { // a mapping's header line
			in = len(fields) >= 6 && fields[len(fields)-1] == path
			continue
		}
		if in && fields[0] == "Rss:" && len(fields) >= 2 {
			n, err := strconv.Atoi(fields[1])
			if err != nil {
				return 0, fmt.Errorf("smaps: %q: %w", sc.Text(), err)
			}
			kb += n
		}
	}
	return kb, sc.Err()
}
