package archive

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/safekeeper/safekeeper/test/pgtest"
)

// pgBackRest is pgBackRest as the benchmark runs it: its configuration
// file (the S3 repository in the benchmark's versitygw, over TLS checked
// against the benchmark's CA), run as the postgres user.
type pgBackRest struct {
	b    *bench
	bin  string
	conf string
	dir  string
	n    int // directories made so far (spool paths)
}

// The stanza every repository path holds.
const stanza = "bench"

func newPgBackRest(b *bench, bin string) *pgBackRest {
	pb := &pgBackRest{b: b, bin: bin, dir: b.dir, conf: filepath.Join(b.dir, "pgbackrest.conf")}
	for _, d := range []string{"lock", "log"} {
		pb.mkdir(d)
	}
	// The repository's endpoint is localhost, not 127.0.0.1: pgBackRest
	// 2.45 checks the certificate's names only ("unable to find hostname
	// '127.0.0.1' in certificate common name or subject alternative
	// names" for an IP address SAN), and the certificate names localhost
	// too.
	conf := strings.Join([]string{
		"[global]",
		"repo1-type=s3",
		"repo1-s3-bucket=" + b.s3.Bucket,
		"repo1-s3-endpoint=localhost",
		"repo1-storage-port=" + strings.TrimPrefix(b.s3.Addr, "127.0.0.1:"),
		"repo1-s3-region=us-east-1",
		"repo1-s3-key=" + b.s3.AccessKey,
		"repo1-s3-key-secret=" + b.s3.SecretKey,
		"repo1-s3-uri-style=path",
		"repo1-storage-ca-file=" + b.ca.CertFile,
		"archive-async=y",
		"process-max=4",
		"compress-type=zst",
		"lock-path=" + filepath.Join(pb.dir, "lock"),
		"log-path=" + filepath.Join(pb.dir, "log"),
		"log-level-console=warn",
		"",
		"[" + stanza + "]",
		"pg1-socket-path=" + b.pg.SocketDir,
		"pg1-port=" + strconv.Itoa(b.pg.Port),
		"",
	}, "\n")
	if err := os.WriteFile(pb.conf, []byte(conf), 0o600); err != nil {
		b.t.Fatal(err)
	}
	if err := pgtest.ChownToPostgres(pb.conf); err != nil {
		b.t.Fatal(err)
	}
	// The async processes outlive the commands that start them (and
	// PostgreSQL's archiver starts some): every pgBackRest process whose
	// command line names this configuration is killed at the end.
	b.t.Cleanup(pb.killStray)
	return pb
}

// mkdir makes a directory under the benchmark's directory, owned by the
// postgres user, and returns its path.
func (pb *pgBackRest) mkdir(name string) string {
	d := filepath.Join(pb.dir, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		pb.b.t.Fatal(err)
	}
	if err := pgtest.ChownToPostgres(d); err != nil {
		pb.b.t.Fatal(err)
	}
	return d
}

// newSpool makes a fresh spool directory: nothing an earlier round
// queued or acknowledged is seen by the next.
func (pb *pgBackRest) newSpool() string {
	pb.n++
	return pb.mkdir(fmt.Sprintf("spool-%d", pb.n))
}

// run runs pgbackrest with the configuration, the stanza and args, as the
// postgres user, and returns its combined output.
func (pb *pgBackRest) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := pb.b.pg.Cmd(ctx, pb.bin, append([]string{"--config=" + pb.conf, "--stanza=" + stanza}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v: %w", timeout, err)
	}
	return out.String(), err
}

// stanzaCreate makes a repository at repoPath for the primary.
func (pb *pgBackRest) stanzaCreate(repoPath string) {
	out, err := pb.run(2*time.Minute, "--repo1-path="+repoPath, "--pg1-path="+pb.b.pg.DataDir, "stanza-create")
	if err != nil {
		pb.b.t.Fatalf("pgbackrest stanza-create --repo1-path=%s: %v\n%s", repoPath, err, out)
	}
}

// archiveCommand is the primary's archive_command for repository
// repoPath, spooling in spool.
func (pb *pgBackRest) archiveCommand(repoPath, spool string) string {
	return fmt.Sprintf("%s --config=%s --stanza=%s --repo1-path=%s --spool-path=%s --pg1-path=%s archive-push %%p",
		pb.bin, pb.conf, stanza, repoPath, spool, pb.b.pg.DataDir)
}

// killStray kills every pgBackRest process left whose command line names
// the benchmark's configuration file (async archive-push and archive-get
// processes), by process id.
func (pb *pgBackRest) killStray() {
	for _, pid := range pb.processes() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// processes are the running pgBackRest processes of this configuration.
func (pb *pgBackRest) processes() []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(cl), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == "pgbackrest" && bytes.Contains(cl, []byte("--config="+pb.conf)) {
			out = append(out, pid)
		}
	}
	return out
}

// waitIdle waits until no pgBackRest process of this configuration runs
// (an async process finishes its queue and exits), so that none runs into
// the next measurement.
func (pb *pgBackRest) waitIdle() {
	pb.b.poll(2*time.Minute, "pgBackRest's async processes to exit", func() (bool, string) {
		p := pb.processes()
		return len(p) == 0, fmt.Sprintf("processes %v", p)
	})
}
