// Package s3test starts a real S3-compatible server for tests: versitygw
// (Apache-2.0) with its posix backend, on 127.0.0.1 at a port the server
// binds itself (port 0), over a temporary directory in which each bucket
// is a directory and each object a file (what a test flips a byte in).
//
// The versitygw binary is found, in order: $VERSITYGW; versitygw on PATH;
// the cache .ci/run installs it to,
// ${XDG_CACHE_HOME:-$HOME/.cache}/safekeeper/versitygw-v1.8.0/versitygw.
// A missing binary fails the test (never a skip), naming how to install it.
//
// StartWith serves TLS instead (Options.CertFile and KeyFile, e.g. from
// test/tlstest): Endpoint is then https://127.0.0.1:PORT, which a client
// verifies against the test's CA (the safekeeper through AWS_CA_BUNDLE).
package s3test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/test/procnet"
)

// Version is the versitygw release the tests are written against.
const Version = "v1.8.0"

// Server is a running versitygw.
type Server struct {
	// Endpoint is its URL, http://127.0.0.1:PORT (https with TLS).
	Endpoint string
	// Addr is 127.0.0.1:PORT.
	Addr string
	// Root is the posix backend's directory: Root/BUCKET/KEY is an object.
	Root string
	// Bucket is a bucket made for the test.
	Bucket string
	// AccessKey and SecretKey are the only credentials it accepts.
	AccessKey, SecretKey string
	// LogFile holds its output.
	LogFile string

	cmd *exec.Cmd
}

// CachePath is where .ci/run installs the versitygw binary.
func CachePath() string {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "safekeeper", "versitygw-"+Version, "versitygw")
}

// Binary returns the versitygw binary's path, or an error naming where it
// looked and how to install it.
func Binary() (string, error) {
	if p := os.Getenv("VERSITYGW"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("s3test: VERSITYGW=%s: %v", p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	if p := CachePath(); fileExists(p) {
		return p, nil
	}
	return "", fmt.Errorf("s3test: versitygw not found ($VERSITYGW, PATH, %s); install it with "+
		"GOBIN=%s go install github.com/versity/versitygw/cmd/versitygw@%s (or run .ci/run)",
		CachePath(), filepath.Dir(CachePath()), Version)
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// Options shapes StartWith.
type Options struct {
	// CertFile and KeyFile, both set, make the server speak TLS only
	// (versitygw --cert, --key) with that certificate, PEM.
	CertFile, KeyFile string
}

// Start starts a server with one empty bucket and registers a cleanup that
// kills it and removes its directory (logging its output if t failed).
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start as o says.
func StartWith(t testing.TB, o Options) *Server {
	t.Helper()
	if (o.CertFile == "") != (o.KeyFile == "") {
		t.Fatalf("s3test: give both CertFile and KeyFile, or neither (got %q, %q)", o.CertFile, o.KeyFile)
	}
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := &Server{
		Root:      filepath.Join(dir, "root"),
		Bucket:    "archive",
		AccessKey: "safekeeper-test",
		SecretKey: randomHex(16),
		LogFile:   filepath.Join(dir, "versitygw.log"),
	}
	if err := os.MkdirAll(filepath.Join(s.Root, s.Bucket), 0o755); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(s.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	args := []string{"--access", s.AccessKey, "--secret", s.SecretKey, "--port", "127.0.0.1:0", "--quiet"}
	if o.CertFile != "" {
		args = append(args, "--cert", o.CertFile, "--key", o.KeyFile)
	}
	s.cmd = exec.Command(bin, append(args, "posix", s.Root)...)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// Its credentials are given as flags; it must not pick up a test's
	// or the machine's AWS variables.
	s.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("s3test: start %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-exited
		if t.Failed() {
			if b, err := os.ReadFile(s.LogFile); err == nil {
				t.Logf("versitygw log:\n%s", lastLines(string(b), 40))
			}
		}
	})
	// It binds port 0 but prints the port it was given, not the one it
	// got: read its listening socket from /proc.
	deadline := time.Now().Add(30 * time.Second)
	for {
		port, err := listeningPort(s.cmd.Process.Pid)
		if err == nil && port != 0 {
			s.Addr = "127.0.0.1:" + strconv.Itoa(port)
			if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
				c.Close()
				break
			}
		}
		select {
		case err := <-exited:
			exited <- err
			b, _ := os.ReadFile(s.LogFile)
			t.Fatalf("s3test: versitygw exited (%v):\n%s", err, b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("s3test: versitygw is not listening after 30 s (last: %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Endpoint = "http://" + s.Addr
	if o.CertFile != "" {
		s.Endpoint = "https://" + s.Addr
	}
	return s
}

// URL is the --remote-storage URL of prefix in the test's bucket.
func (s *Server) URL(prefix string) string {
	return fmt.Sprintf("s3://%s/%s?endpoint=%s&region=us-east-1", s.Bucket, strings.Trim(prefix, "/"), url.QueryEscape(s.Endpoint))
}

// Env is the environment a client needs for the credentials.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s.SecretKey}
}

// SetEnv sets the credentials in the test's environment (t.Setenv: not for
// parallel tests).
func (s *Server) SetEnv(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", s.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s.SecretKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
}

// ObjectPath is the file holding object key of the test's bucket.
func (s *Server) ObjectPath(key string) string {
	return filepath.Join(s.Root, s.Bucket, filepath.FromSlash(key))
}

// Stop kills the server (a store that went away); Start another for one
// that comes back.
func (s *Server) Stop() { _ = s.cmd.Process.Kill() }

// listeningPort is the TCP port process pid listens on, 0 if none yet.
func listeningPort(pid int) (int, error) {
	addrs, err := procnet.Listening(pid)
	if err != nil || len(addrs) == 0 {
		return 0, err
	}
	return int(addrs[0].Port()), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
