package harness

import (
	"os"
	"testing"
)

// TestTreeTicks: a tree's CPU time is its processes' own and reaped
// children's, over all descendants; other trees do not count.
func TestTreeTicks(t *testing.T) {
	pt := ProcTable{
		100: {PPID: 1, UTime: 4, CUTime: 6}, // postmaster, cutime of exited backends included
		101: {PPID: 100, UTime: 5},
		102: {PPID: 100, STime: 7},
		103: {PPID: 101, CSTime: 1},
		200: {PPID: 1, UTime: 1000},
	}
	got, err := pt.TreeTicks(100)
	if err != nil || got != 23 {
		t.Fatalf("TreeTicks(100) = %d, %v; want 23", got, err)
	}
	if _, err := pt.TreeTicks(300); err == nil {
		t.Error("TreeTicks of a missing process did not fail")
	}
	// The live /proc has at least this process.
	live, err := ReadProcs()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := live.TreeTicks(os.Getpid()); err != nil {
		t.Fatal(err)
	}
}

// TestLocalClientNotDone: WaitNoLocalClients waits for the clients'
// backends, zombies and processes on their way out (no command line
// left), not for the rest.
func TestLocalClientNotDone(t *testing.T) {
	for _, c := range []struct {
		state   byte
		cmdline string
		wait    bool
	}{
		{'S', "postgres: postgres postgres [local] idle\x00", true},
		{'Z', "", true},
		{'R', "", true}, // exiting: its memory, and with it its title, is gone; not yet a zombie
		{'S', "postgres: walsender postgres 127.0.0.1(51000) streaming 0/3000000\x00", false},
		{'S', "postgres: checkpointer \x00", false},
	} {
		if got := localClientNotDone(c.state, []byte(c.cmdline)); (got != "") != c.wait {
			t.Errorf("localClientNotDone(%c, %q) = %q, want waiting %v", c.state, c.cmdline, got, c.wait)
		}
	}
}
