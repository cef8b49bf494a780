package harness

import (
	"strconv"
	"strings"
	"testing"
)

// TestMachine: the first model name, MemTotal in bytes, the three load
// averages; "" or 0 for what the file does not hold; this machine's own
// files parse.
func TestMachine(t *testing.T) {
	cpuinfo := "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n\nprocessor\t: 1\nmodel name\t: other\n"
	if got := cpuModel(cpuinfo); got != "Intel(R) Xeon(R) CPU @ 2.20GHz" {
		t.Errorf("cpuModel = %q", got)
	}
	if got := cpuModel("processor\t: 0\nCPU implementer\t: 0x41\n"); got != "" {
		t.Errorf("cpuModel without a model name = %q", got)
	}
	if got := memTotal("MemFree:  100 kB\nMemTotal:       16318412 kB\n"); got != 16318412<<10 {
		t.Errorf("memTotal = %d", got)
	}
	if got := memTotal("MemTotal: many kB\n"); got != 0 {
		t.Errorf("memTotal of a bad line = %d", got)
	}
	if got := loadAvg("0.52 0.58 0.59 2/1234 56789\n"); got != "0.52 0.58 0.59" {
		t.Errorf("loadAvg = %q", got)
	}
	if got := loadAvg("0.52\n"); got != "" {
		t.Errorf("loadAvg of a short line = %q", got)
	}

	if MemTotal() == 0 {
		t.Error("MemTotal() = 0 on this machine")
	}
	f := strings.Fields(LoadAvg())
	if len(f) != 3 {
		t.Fatalf("LoadAvg() = %q", LoadAvg())
	}
	for _, x := range f {
		if _, err := strconv.ParseFloat(x, 64); err != nil {
			t.Errorf("LoadAvg() = %q: %v", LoadAvg(), err)
		}
	}
}
