package harness

import (
	"os"
	"strconv"
	"strings"
)

// What a benchmark report says of the machine it ran on, from /proc.

// CPUModel is the first "model name" of /proc/cpuinfo; "" if there is none
// (some architectures do not name one).
func CPUModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return cpuModel(string(b))
}

func cpuModel(cpuinfo string) string {
	for _, line := range strings.Split(cpuinfo, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// MemTotal is the machine's memory in bytes, MemTotal of /proc/meminfo; 0
// if it cannot be read.
func MemTotal() uint64 {
	b, _ := os.ReadFile("/proc/meminfo")
	return memTotal(string(b))
}

func memTotal(meminfo string) uint64 {
	for _, line := range strings.Split(meminfo, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// LoadAvg is the 1, 5 and 15 minute load averages of /proc/loadavg, such
// as "0.52 0.58 0.59": the machine is shared, and a report says how busy
// it was. "" if it cannot be read.
func LoadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return loadAvg(string(b))
}

func loadAvg(s string) string {
	f := strings.Fields(s)
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
