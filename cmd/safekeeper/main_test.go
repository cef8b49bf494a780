package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestUsageErrorsExit2(t *testing.T) {
	cases := [][]string{
		{"run", "--id", "1"}, // missing --data-dir
		{"run", "--data-dir", "/tmp/x", "--id", "notanumber"}, // bad value
		{"run", "--no-such-flag"},
		{"--log-level", "loud", "run", "--id", "1", "--data-dir", t.TempDir()},
		{"--log-format", "xml", "run", "--id", "1", "--data-dir", t.TempDir()},
		{"run", "--id", "1", "--data-dir", t.TempDir(), "extra-arg"},
		{"no-such-command"},
		{"run", "--id", "0", "--data-dir", t.TempDir()},
		{"run", "--id", "1", "--data-dir", t.TempDir(), "--listen-pg", "nope"},
		{"run", "--id", "1", "--data-dir", t.TempDir(), "--wal-sender-timeout", "-1s"},
		{"run", "--id", "1", "--data-dir", t.TempDir(), "--retention-interval", "0s"},
		{"propose", "--upstream", "host=127.0.0.1", "--safekeepers", "127.0.0.1:1,127.0.0.1:1,127.0.0.1:2",
			"--tenant-id", strings.Repeat("a", 32), "--timeline-id", strings.Repeat("b", 32)},
		{"sync", "--safekeepers", "127.0.0.1:1,localhost:2,LOCALHOST:2",
			"--tenant-id", strings.Repeat("a", 32), "--timeline-id", strings.Repeat("b", 32)},
	}
	for _, args := range cases {
		var out, errb bytes.Buffer
		code := run(append([]string{"safekeeper"}, args...), &out, &errb)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d (stderr %q)", args, code, exitUsage, errb.String())
		}
		if !strings.Contains(errb.String(), "safekeeper:") && !strings.Contains(errb.String(), "Incorrect Usage") {
			t.Errorf("%q: no clear message on stderr: %q", args, errb.String())
		}
	}
}

func TestEveryFlagHasHelp(t *testing.T) {
	app := newApp(&bytes.Buffer{}, &bytes.Buffer{})
	for _, f := range app.Flags {
		if d, ok := f.(interface{ GetUsage() string }); ok && d.GetUsage() == "" {
			t.Errorf("global flag %v has no help text", f.Names())
		}
	}
	for _, c := range app.Commands {
		if c.Usage == "" {
			t.Errorf("command %s has no usage", c.Name)
		}
		for _, f := range c.Flags {
			if d, ok := f.(interface{ GetUsage() string }); ok && d.GetUsage() == "" {
				t.Errorf("%s: flag %v has no help text", c.Name, f.Names())
			}
		}
		for _, sc := range c.Subcommands {
			for _, f := range sc.Flags {
				if d, ok := f.(interface{ GetUsage() string }); ok && d.GetUsage() == "" {
					t.Errorf("%s %s: flag %v has no help text", c.Name, sc.Name, f.Names())
				}
			}
		}
	}
}

func TestHelpExitsZero(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"safekeeper", "run", "--help"}, &out, &bytes.Buffer{}); code != 0 {
		t.Fatalf("run --help: exit %d", code)
	}
	if !strings.Contains(out.String(), "--listen-pg") {
		t.Fatalf("help does not list --listen-pg:\n%s", out.String())
	}
}
