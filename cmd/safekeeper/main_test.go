package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/auth"
	"github.com/safekeeper/safekeeper/storage"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/urfave/cli/v2"
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
		{"wal", "help", "bogus"},
		{"wal", "export", "--data-dir", "/tmp/x"}, // missing --tenant-id, --timeline-id, --output
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

// TestBadValuesAreUsageErrors: a bad flag value is refused up front with
// exit code 2 and a message naming the flag, before anything is created,
// listened on or connected to.
// TestRunOnAnotherNodesDataDirExits2: a data dir claimed by --id 7 refuses
// --id 8 as a usage error naming both ids.
func TestRunOnAnotherNodesDataDirExits2(t *testing.T) {
	dir := t.TempDir()
	db, err := storage.Open(filepath.Join(dir, "safekeeper.db"), storage.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ClaimNodeID(7); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"safekeeper", "run", "--id", "8", "--data-dir", dir, "--listen-pg", "127.0.0.1:0", "--listen-http", ""}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "7") || !strings.Contains(errb.String(), "8") {
		t.Fatalf("run --id 8 on node 7's data dir: exit %d, stderr %q; want exit %d naming both ids", code, errb.String(), exitUsage)
	}
}

// TestRunOnAnUnusableDataDirExits4: a data directory run cannot use for a
// reason a restart cannot fix — not a directory, below a file, a directory
// where the database file belongs, a damaged database, permission denied —
// is exit 4 (exitPermanent, which the unit's RestartPreventExitStatus
// names) with one line naming --data-dir and the cause once ("open X:
// open X:" was doubled); a database locked by another process may pass by
// itself and stays exit 1.
func TestRunOnAnUnusableDataDirExits4(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	dbDir := filepath.Join(dir, "dbdir")
	if err := os.MkdirAll(filepath.Join(dbDir, "safekeeper.db"), 0o700); err != nil {
		t.Fatal(err)
	}
	damaged := filepath.Join(dir, "damaged")
	if err := os.Mkdir(damaged, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(damaged, "safekeeper.db"), bytes.Repeat([]byte("not a database "), 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	// runOn returns run's exit code and the last line of its stderr (the
	// error; the log comes before it).
	runOn := func(dataDir string) (int, string) {
		var out, errb bytes.Buffer
		code := run([]string{"safekeeper", "run", "--id", "1", "--data-dir", dataDir, "--listen-pg", "127.0.0.1:0", "--listen-http", ""}, &out, &errb)
		return code, lastLine(errb.String())
	}
	for _, tc := range []struct{ dataDir, cause string }{
		{file, "not a directory"},
		{filepath.Join(file, "sub"), "not a directory"},
		{dbDir, "open " + filepath.Join(dbDir, "safekeeper.db") + ": is a directory"},
		{damaged, "corrupt data: " + filepath.Join(damaged, "safekeeper.db") + ": invalid database"},
	} {
		code, stderr := runOn(tc.dataDir)
		if code != exitPermanent || !strings.HasPrefix(stderr, "safekeeper: --data-dir "+tc.dataDir+" cannot be used: ") ||
			!strings.HasSuffix(stderr, tc.cause+" (a restart cannot fix this)") {
			t.Errorf("run --data-dir %s: exit %d, stderr %q; want exit %d, a line naming --data-dir and %q", tc.dataDir, code, stderr, exitPermanent, tc.cause)
		}
		if strings.Count(stderr, "open ") > 1 {
			t.Errorf("run --data-dir %s: the path is repeated: %q", tc.dataDir, stderr)
		}
	}

	// Locked by another process (a server still stopping): exit 1.
	locked := filepath.Join(dir, "locked")
	if err := os.Mkdir(locked, 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := storage.Open(filepath.Join(locked, "safekeeper.db"), storage.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if code, stderr := runOn(locked); code != 1 || !strings.Contains(stderr, "locked") {
		t.Errorf("run on a locked database: exit %d, stderr %q; want exit 1", code, stderr)
	}

	// Permission denied: a directory only its owner may enter, run as
	// another user (root itself is never denied).
	base, err := os.MkdirTemp("", "safekeeper-denied-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	noAccess := filepath.Join(base, "owner-only")
	if err := os.Mkdir(noAccess, 0o700); err != nil {
		t.Fatal(err)
	}
	var code int
	var stderr string
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs a postgres user to be denied as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		// The binary where that user may run it.
		bin, err := os.ReadFile(harness.Binary(t))
		if err != nil {
			t.Fatal(err)
		}
		exe := filepath.Join(base, "safekeeper")
		if err := os.WriteFile(exe, bin, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe, "run", "--id", "1", "--data-dir", noAccess, "--listen-pg", "127.0.0.1:0", "--listen-http", "")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		cmd.Dir = "/"
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Run(); err != nil && cmd.ProcessState == nil {
			t.Fatal(err)
		}
		code, stderr = cmd.ProcessState.ExitCode(), lastLine(errb.String())
	} else {
		if err := os.Chmod(noAccess, 0); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(noAccess, 0o700)
		code, stderr = runOn(noAccess)
	}
	if code != exitPermanent || !strings.Contains(stderr, "--data-dir "+noAccess+" cannot be used: ") || !strings.Contains(stderr, "permission denied (a restart cannot fix this)") ||
		strings.Count(stderr, "open ") > 1 {
		t.Errorf("run on a data directory it may not enter: exit %d, stderr %q; want exit %d naming --data-dir and permission denied once", code, stderr, exitPermanent)
	}
}

func TestBadValuesAreUsageErrors(t *testing.T) {
	ids := []string{"--tenant-id", strings.Repeat("a", 32), "--timeline-id", strings.Repeat("b", 32)}
	propose := append([]string{"propose", "--upstream", "host=127.0.0.1", "--safekeepers", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"}, ids...)
	sync := append([]string{"sync", "--safekeepers", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "--timeout", "1s"}, ids...)
	dir := t.TempDir()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run", "--id", "1", "--data-dir", ""}, "--data-dir"},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--listen-pg", "127.0.0.1:99999"}, "--listen-pg"},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--listen-pg", "localhost:notaport"}, "--listen-pg"},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--listen-pg", "127.0.0.1:-1"}, "--listen-pg"},
		{append(propose, "--application-name", ""), "--application-name"},
		{append(propose, "--application-name", strings.Repeat("p", 64)), "--application-name"},
		{append(propose, "--slot", "Bad-Slot"), "--slot"},
		{append(propose, "--slot", ""), "--slot"},
		{append(propose, "--slot", strings.Repeat("s", 64)), "--slot"},
		// A keyword libpq does not know, or one pgx would send to the
		// primary as a setting: named, not a retry on the default socket.
		{append([]string{"propose", "--upstream", "hots=127.0.0.1 port=5432", "--safekeepers", "127.0.0.1:1"}, ids...),
			`--upstream: invalid connection option "hots" (libpq 15 does not know it; did you mean "host"?)`},
		{append([]string{"propose", "--upstream", "postgresql://postgres@127.0.0.1:5432/postgres?hots=x", "--safekeepers", "127.0.0.1:1"}, ids...),
			`--upstream: invalid connection option "hots"`},
		{append([]string{"propose", "--upstream", "host=127.0.0.1 keepalives=1", "--safekeepers", "127.0.0.1:1"}, ids...),
			`--upstream: connection option "keepalives" is libpq's, but the proposer's PostgreSQL client (pgx) does not support it`},
		{append([]string{"propose", "--upstream", "", "--safekeepers", "127.0.0.1:1"}, ids...), "--upstream is empty"},
		{append(propose, "--buffer-size", "1"), "--buffer-size 1: want at least 128KiB"},
		// A fleet's flags (etcd).
		{[]string{"run", "--id", "1", "--data-dir", dir, "--etcd-endpoints", "http://127.0.0.1:2379"}, "--etcd-endpoints needs --zone"},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--zone", "a"}, "--zone is registered in etcd: it needs --etcd-endpoints"},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--etcd-endpoints", "http://127.0.0.1:2379", "--zone", "a b"}, "--zone \"a b\""},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--etcd-endpoints", "http://127.0.0.1:2379", "--zone", "a", "--etcd-lease-ttl", "1s"}, "--etcd-lease-ttl 1s"},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--etcd-endpoints", "http://127.0.0.1:2379", "--zone", "a", "--advertise-pg", "nohost"}, "--advertise-pg"},
		{append([]string{"propose", "--upstream", "host=127.0.0.1", "--etcd-endpoints", "127.0.0.1:2379"}, ids...), "want URLs such as http://"},
		{append(slices.Clone(propose), "--etcd-endpoints", "http://127.0.0.1:2379"), "--safekeepers and --etcd-endpoints exclude each other"},
		{append(slices.Clone(sync), "--etcd-prefix", "/x"), "--etcd-prefix needs --etcd-endpoints"},
		{append([]string{"sync", "--etcd-endpoints", "http://127.0.0.1:2379", "--etcd-user", "u"}, ids...), "--etcd-user needs --etcd-password-file"},
		{append([]string{"timeline", "create", "--safekeepers", "127.0.0.1:1", "--system-id", "1", "--replicas", "2"}, ids...), "--replicas and --members go with --etcd-endpoints"},
		{append([]string{"timeline", "create", "--etcd-endpoints", "http://127.0.0.1:2379", "--system-id", "1", "--members", "1,x"}, ids...), "--members \"1,x\""},
		{append([]string{"timeline", "create", "--etcd-endpoints", "http://127.0.0.1:2379", "--system-id", "1", "--members", "1,2", "--replicas", "2"}, ids...), "--members and --replicas exclude each other"},
		{append([]string{"propose", "--upstream", "host=x", "--safekeepers", "a b:1"}, ids...), `--safekeepers: "a b:1": host "a b"`},
		{append([]string{"timeline", "create", "--upstream", "hots=x", "--safekeepers", "127.0.0.1:1"}, ids...), `--upstream: invalid connection option "hots"`},
		{append([]string{"timeline", "create", "--upstream", "", "--safekeepers", "127.0.0.1:1"}, ids...), "--upstream is empty"},
		{append([]string{"timeline", "create", "--safekeepers", "a b:1", "--system-id", "5"}, ids...), `host "a b"`},
		{append([]string{"timeline", "pull", "--from", "127.0.0.1:1", "--data-dir", ""}, ids...), "--data-dir"},
		{[]string{"inspect", "--data-dir", ""}, "--data-dir"},
		{append([]string{"wal", "export", "--data-dir", "", "--output", dir}, ids...), "--data-dir"},
		{append([]string{"wal", "dump", "--data-dir", ""}, ids...), "--data-dir"},
		{append(sync, "--system-id", "5", "--pg-timeline", "0"), "--pg-timeline"},
		{append(sync, "--system-id", "5", "--pg-timeline", "4294967296"), "--pg-timeline"},
		{append(sync, "--system-id", "5", "--wal-seg-size", "1000"), "--wal-seg-size"},
		{append(sync, "--system-id", "5", "--wal-seg-size", "3145728"), "--wal-seg-size"},
		{append(sync, "--system-id", "5", "--wal-seg-size", "2147483648"), "--wal-seg-size"},
		{append(sync, "--system-id", "5", "--wal-seg-size", "4311744512"), "--wal-seg-size"}, // 16 MiB + 2^32
		{append(sync, "--system-id", "5", "--pg-version", "140000"), "--pg-version"},
		{append(sync, "--system-id", "5", "--pg-version", "160000"), "--pg-version"},
		{append(sync, "--create"), "--create needs --system-id"},
		// A port no safekeeper can listen on: refused before the primary
		// (its slot) or any safekeeper is contacted.
		{append([]string{"propose", "--upstream", "host=127.0.0.1", "--safekeepers", "127.0.0.1:1,127.0.0.1:70000,127.0.0.1:3"}, ids...), `--safekeepers: "127.0.0.1:70000": port "70000": want a number from 1 to 65535`},
		{append([]string{"propose", "--upstream", "host=127.0.0.1", "--safekeepers", "127.0.0.1:0,127.0.0.1:2,127.0.0.1:3"}, ids...), `port "0"`},
		{append([]string{"sync", "--safekeepers", "127.0.0.1:1,127.0.0.1:2,localhost:65536"}, ids...), `port "65536"`},
		{append([]string{"sync", "--safekeepers", "127.0.0.1:0"}, ids...), `port "0"`},
		{append([]string{"timeline", "pull", "--from", "127.0.0.1:0", "--data-dir", dir}, ids...), `--from "127.0.0.1:0"`},
		{[]string{"status", "--http", "127.0.0.1:0"}, `--http "127.0.0.1:0"`},
		{[]string{"status", "--http", "https://127.0.0.1:99999"}, `--http "https://127.0.0.1:99999"`},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--remote-storage", "ftp://h/p"}, `--remote-storage: remote: bad storage URL "ftp://h/p": scheme "ftp" is not supported`},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--remote-storage", "s3://bucket/p?endpoint=localhost:9000"}, `endpoint "localhost:9000"`},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--remote-storage", "file://" + filepath.Join(dir, "archive"), "--archive-compression", "lz4"}, "--archive-compression"},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--remote-storage", "file://" + filepath.Join(dir, "archive"), "--archive-recipient", "age1bad"}, "--archive-recipient"},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--backup-parallel-jobs", "0"}, "--backup-parallel-jobs"},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--partial-backup-interval", "0s"}, "--partial-backup-interval"},
		{[]string{"run", "--id", "1", "--data-dir", dir, "--remote-storage", "s3://b/p", "--remote-storage-credentials-file", filepath.Join(dir, "none")}, "credentials file"},
	}
	for _, tc := range cases {
		var out, errb bytes.Buffer
		code := run(append([]string{"safekeeper"}, tc.args...), &out, &errb)
		if code != exitUsage || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and a message naming %s", tc.args, code, errb.String(), exitUsage, tc.want)
		}
	}
	for _, f := range []string{"safekeeper.db", "archive"} {
		if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Errorf("a refused run created %s: %v", f, err)
		}
	}
}

// TestGoodValuesPassValidation: the values next to the refused ones are
// accepted by the checks.
func TestGoodValuesPassValidation(t *testing.T) {
	for _, a := range []string{"127.0.0.1:0", "127.0.0.1:65535", ":5454", "[::1]:5454"} {
		if err := checkListenAddr(a); err != nil {
			t.Errorf("--listen-pg %q: %v", a, err)
		}
	}
	for _, s := range []string{"proposer", "p_1", strings.Repeat("s", 63)} {
		if err := checkSlotName(s); err != nil {
			t.Errorf("--slot %q: %v", s, err)
		}
	}
	for _, s := range []string{"proposer", "walproposer-1", strings.Repeat("p", 63)} {
		if err := checkApplicationName(s); err != nil {
			t.Errorf("--application-name %q: %v", s, err)
		}
	}
}

// TestSlotFlagIsPostgreSQLRule: --slot is checked by proto.CheckSlotName,
// PostgreSQL's rule; the error names the value and says what would do.
func TestSlotFlagIsPostgreSQLRule(t *testing.T) {
	for _, c := range []struct{ name, want string }{
		{"", "1 to 63 bytes"},
		{strings.Repeat("s", 64), "1 to 63 bytes"},
		{"Bad-Slot", "lower case letters, digits and underscores"},
	} {
		err := checkSlotName(c.name)
		var se *proto.SlotNameError
		if !errors.Is(err, proto.ErrBadSlotName) || !errors.As(err, &se) || se.Name != c.name ||
			!strings.Contains(err.Error(), strconv.Quote(c.name)) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--slot %q: %v; want a *proto.SlotNameError naming it and %q", c.name, err, c.want)
		}
	}
}

// TestHelpCommand: `help` and `help CMD [SUB]` print help and exit 0; an
// unknown command is a usage error that says so.
func TestHelpCommand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"help"}, "COMMANDS:"},
		{[]string{"help", "run"}, "--listen-pg"},
		{[]string{"h", "sync"}, "--create"},
		{[]string{"help", "wal"}, "export"},
		{[]string{"help", "wal", "export"}, "--upto"},
		{nil, "COMMANDS:"},
	} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"safekeeper"}, tc.args...), &out, &errb); code != 0 || !strings.Contains(out.String(), tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 0 and %q", tc.args, code, out.String(), errb.String(), tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"help", "bogus"}, `unknown command "bogus"`},
		{[]string{"wal", "bogus"}, `unknown command "wal bogus"`},
		{[]string{"help", "wal", "bogus"}, `unknown command "wal bogus"`},
	} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"safekeeper"}, tc.args...), &out, &errb); code != exitUsage || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errb.String(), exitUsage, tc.want)
		}
	}
}

// TestDeposedMessage: one message naming the safekeeper's address and both
// terms, without a doubled prefix, and exit code 3.
func TestDeposedMessage(t *testing.T) {
	var errb bytes.Buffer
	err := fmt.Errorf("session: %w", &proposer.DeposedError{Safekeeper: 1, Addr: "127.0.0.1:5455", Term: 4, Ours: 3})
	if code := report(deposedExit(err), &errb); code != exitDeposed {
		t.Fatalf("exit %d, want %d", code, exitDeposed)
	}
	want := "safekeeper: deposed: safekeeper 127.0.0.1:5455 is at term 4, above our term 3; another proposer owns the timeline now\n"
	if errb.String() != want {
		t.Fatalf("stderr %q, want %q", errb.String(), want)
	}
}

// TestSyncNamesSafekeepersItCannotReach: an unreachable --safekeepers
// address is reported as a safekeeper, not as the primary.
func TestSyncNamesSafekeepersItCannotReach(t *testing.T) {
	addr := harness.RefusedAddr(t) // nobody listens there
	var out, errb bytes.Buffer
	code := run([]string{"safekeeper", "sync", "--safekeepers", addr, "--tenant-id", strings.Repeat("a", 32),
		"--timeline-id", strings.Repeat("b", 32), "--timeout", "200ms"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "connect to safekeeper "+addr) || strings.Contains(errb.String(), "primary") ||
		strings.Contains(errb.String(), "proposer: ") {
		t.Fatalf("exit %d, stderr %q; want exit 1 naming safekeeper %s (and no primary, no Go package name)", code, errb.String(), addr)
	}
}

// TestReportWithoutPackageNames: the CLI's error line carries no Go package
// names, wherever they are in the chain.
func TestReportWithoutPackageNames(t *testing.T) {
	var errb bytes.Buffer
	err := fmt.Errorf("proposer: no quorum: %w", errors.Join(errors.New("proposer: connect to safekeeper a:1: refused"),
		fmt.Errorf("server: %w", errors.New("storage: no such timeline"))))
	report(err, &errb)
	if want := "safekeeper: no quorum: connect to safekeeper a:1: refused\nno such timeline\n"; errb.String() != want {
		t.Fatalf("stderr %q, want %q", errb.String(), want)
	}
}

// TestExitCodeByTypeNotText: the exit code follows the error's type — a
// usage error is 2, a cli.ExitCoder its own code, anything else 1 — never
// words in its message (a runtime failure that quotes "invalid value" or
// "Required flag" is still 1).
func TestExitCodeByTypeNotText(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{errors.New("storage: invalid value \"x\" for flag -id: Required flag flag provided but not defined No help topic"), 1},
		{fmt.Errorf("wrapped: %w", usagef("--upto: bad")), exitUsage},
		{cli.Exit("deposed", exitDeposed), exitDeposed},
	} {
		if code := report(tc.err, io.Discard); code != tc.code {
			t.Errorf("report(%q) = %d, want %d", tc.err, code, tc.code)
		}
	}
}

// TestRequiredFlagsNamed: a command run without its required flags is a
// usage error (exit 2) that names every missing flag, checked before
// anything else about the command line.
func TestRequiredFlagsNamed(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		missing string
	}{
		{[]string{"run"}, `Required flags "id, data-dir" not set`},
		{[]string{"run", "--id", "1"}, `Required flag "data-dir" not set`},
		{[]string{"propose", "--safekeepers", "127.0.0.1:1"}, `Required flags "upstream, tenant-id, timeline-id" not set`},
		{[]string{"sync"}, `Required flags "safekeepers (or etcd-endpoints), tenant-id, timeline-id" not set`},
		{[]string{"propose"}, `Required flags "upstream, safekeepers (or etcd-endpoints), tenant-id, timeline-id" not set`},
		{[]string{"timeline", "members"}, `Required flags "etcd-endpoints, tenant-id, timeline-id" not set`},
		{[]string{"wal", "export", "--data-dir", "/nonexistent"}, `Required flags "tenant-id, timeline-id, output" not set`},
	} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"safekeeper"}, tc.args...), &out, &errb); code != exitUsage || !strings.Contains(errb.String(), tc.missing) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %s", tc.args, code, errb.String(), exitUsage, tc.missing)
		}
	}
}

func TestMain(m *testing.M) { harness.Main(m) }

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"safekeeper"}, args...), &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "safekeeper ") {
			t.Errorf("%q: exit %d, %q %q", args, code, out.String(), errb.String())
		}
	}
}

// TestEveryFlagFromTheEnvironment: every flag of every command can come
// from SAFEKEEPER_<FLAG>, and every command takes the global flags after
// its name too.
func TestEveryFlagFromTheEnvironment(t *testing.T) {
	app := newApp(&bytes.Buffer{}, &bytes.Buffer{})
	var walk func(path string, cmds []*cli.Command)
	walk = func(path string, cmds []*cli.Command) {
		for _, c := range cmds {
			if c.Name == "help" {
				continue
			}
			names := map[string]bool{}
			for _, f := range c.Flags {
				names[f.Names()[0]] = true
				ev, ok := f.(interface{ GetEnvVars() []string })
				if !ok || len(ev.GetEnvVars()) == 0 {
					t.Errorf("%s %s --%s: no environment variable", path, c.Name, f.Names()[0])
				}
			}
			if len(c.Subcommands) == 0 && (!names["log-format"] || !names["log-level"]) {
				t.Errorf("%s %s: no --log-format/--log-level after the command name", path, c.Name)
			}
			walk(path+" "+c.Name, c.Subcommands)
		}
	}
	walk("safekeeper", app.Commands)

	cli := func(env map[string]string, args ...string) (int, string) {
		for k, v := range env {
			t.Setenv(k, v)
		}
		var out, errb bytes.Buffer
		code := run(append([]string{"safekeeper"}, args...), &out, &errb)
		for k := range env {
			os.Unsetenv(k)
		}
		return code, errb.String()
	}
	// A global flag after the command: a bad value is a usage error that
	// names it, a good one is taken.
	if code, stderr := cli(nil, "status", "--log-level", "loud", "--http", "127.0.0.1:1"); code != exitUsage || !strings.Contains(stderr, "--log-level") {
		t.Errorf("status --log-level loud: exit %d %q", code, stderr)
	}
	dead := harness.RefusedAddr(t) // nothing listens there
	if code, stderr := cli(nil, "status", "--log-format", "json", "--http", dead); code != 1 || !strings.Contains(stderr, "cannot reach") {
		t.Errorf("status --log-format json: exit %d %q", code, stderr)
	}
	// Flags from the environment: SAFEKEEPER_HTTP and the required ids.
	env := map[string]string{"SAFEKEEPER_HTTP": dead, "SAFEKEEPER_TENANT_ID": strings.Repeat("a", 32), "SAFEKEEPER_TIMELINE_ID": strings.Repeat("b", 32)}
	if code, stderr := cli(env, "timeline", "show"); code != 1 || !strings.Contains(stderr, "cannot reach the safekeeper's HTTP API at "+dead) {
		t.Errorf("timeline show from the environment: exit %d %q", code, stderr)
	}
	env["SAFEKEEPER_TENANT_ID"] = "xyz"
	if code, stderr := cli(env, "timeline", "show"); code != exitUsage || !strings.Contains(stderr, "tenant") {
		t.Errorf("timeline show with a bad SAFEKEEPER_TENANT_ID: exit %d %q", code, stderr)
	}
	// A flag on the command line wins over the environment.
	if code, stderr := cli(map[string]string{"SAFEKEEPER_LOG_LEVEL": "loud"}, "--log-level", "info", "status", "--http", dead); code != 1 {
		t.Errorf("--log-level info with SAFEKEEPER_LOG_LEVEL=loud: exit %d %q", code, stderr)
	}
}

// TestHelpFlagsExitZero: -h and --help print help and exit 0 at every
// level, as `safekeeper help` does.
func TestHelpFlagsExitZero(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"wal", "--help"}, {"wal", "export", "-h"}, {"timeline", "--help"},
		{"timeline", "show", "--help"}, {"run", "--help"}, {"status", "-h"}, {"inspect", "--help"}} {
		var out, errb bytes.Buffer
		code := run(append([]string{"safekeeper"}, args...), &out, &errb)
		if code != 0 || !strings.Contains(out.String(), "NAME:") || strings.Contains(errb.String(), "help requested") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out.String(), errb.String())
		}
	}
}

// TestFetchBadPortFailsAtOnce: wal fetch refuses a --safekeepers port
// outside 1-65535 before it connects anywhere, naming it, with its
// failure status 126 (PostgreSQL would read 2, the usage status, as "no
// such file" and could end recovery early).
func TestFetchBadPortFailsAtOnce(t *testing.T) {
	for _, sks := range []string{"127.0.0.1:70000", "127.0.0.1:1,127.0.0.1:0"} {
		var out, errb bytes.Buffer
		code := run([]string{"safekeeper", "wal", "fetch", "--safekeepers", sks, "--tenant-id", strings.Repeat("a", 32),
			"--timeline-id", strings.Repeat("b", 32), "--timeout", "1s", "000000010000000000000001", filepath.Join(t.TempDir(), "seg")}, &out, &errb)
		if code != exitFetchFailed || !strings.Contains(errb.String(), "--safekeepers") || !strings.Contains(errb.String(), "want a number from 1 to 65535") {
			t.Errorf("wal fetch --safekeepers %s: exit %d, stderr %q; want %d naming --safekeepers and the port", sks, code, errb.String(), exitFetchFailed)
		}
	}
}

// TestEmptyTLSCertIsUnset: SAFEKEEPER_TLS_CERT= and SAFEKEEPER_TLS_KEY=
// (empty, as a unit file's environment may leave them) are no
// certificate: --auth-public-key without --allow-auth-without-tls and
// --tls-required are refused as without the flags (exit 2), and an empty
// --tls-cert beside a key is "go together". (The data dir is a file, so a
// run that got past the checks would fail with exit 1, not serve.)
func TestEmptyTLSCertIsUnset(t *testing.T) {
	dir := t.TempDir()
	pub := filepath.Join(dir, "auth.pub")
	if err := auth.GenerateKeys(filepath.Join(dir, "auth.key"), pub); err != nil {
		t.Fatal(err)
	}
	notADir := filepath.Join(dir, "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	runArgs := []string{"run", "--id", "1", "--data-dir", notADir, "--listen-pg", "127.0.0.1:0"}
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"auth with both empty", map[string]string{"SAFEKEEPER_TLS_CERT": "", "SAFEKEEPER_TLS_KEY": ""},
			[]string{"--auth-public-key", pub}, "--auth-public-key without --tls-cert"},
		{"tls-required with both empty", map[string]string{"SAFEKEEPER_TLS_CERT": "", "SAFEKEEPER_TLS_KEY": ""},
			[]string{"--tls-required"}, "--tls-required needs --tls-cert"},
		{"tls-required with empty flags", nil, []string{"--tls-cert", "", "--tls-key", "", "--tls-required"}, "--tls-required needs --tls-cert"},
		{"an empty cert beside a key", map[string]string{"SAFEKEEPER_TLS_CERT": ""}, []string{"--tls-key", pub}, "--tls-cert and --tls-key go together"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			code := run(append(append([]string{"safekeeper"}, runArgs...), c.args...), &out, &errb)
			if code != exitUsage || !strings.Contains(errb.String(), c.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errb.String(), exitUsage, c.want)
			}
		})
	}
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndex(s, "\n")+1:]
}

// TestUnitsDoNotRestartRefusalsForGood: every systemd unit in contrib names
// exitUsage and exitPermanent in RestartPreventExitStatus, so that systemd
// does not restart, every RestartSec forever, what a restart cannot fix.
func TestUnitsDoNotRestartRefusalsForGood(t *testing.T) {
	units, err := filepath.Glob(filepath.Join("..", "..", "contrib", "systemd", "*.service"))
	if err != nil || len(units) == 0 {
		t.Fatalf("no units in contrib/systemd: %v", err)
	}
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		var codes []string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "RestartPreventExitStatus="); ok {
				codes = append(codes, strings.Fields(v)...)
			}
		}
		for _, want := range []int{exitUsage, exitPermanent} {
			if !slices.Contains(codes, strconv.Itoa(want)) {
				t.Errorf("%s: RestartPreventExitStatus %q lacks %d", filepath.Base(u), codes, want)
			}
		}
	}
}
