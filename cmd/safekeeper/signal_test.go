package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/server/auth"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/tlstest"
)

// TestSIGHUPIsIgnored: logrotate or a closed terminal sends SIGHUP, whose
// default action would kill the process at once. run, propose and sync (the
// real binary) log it and go on: run keeps serving new connections, and
// SIGTERM still stops each of them cleanly.
func TestSIGHUPIsIgnored(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := harness.Binary(t)
	closed := harness.RefusedAddr(t) // nobody listens there
	_, closedPort, _ := net.SplitHostPort(closed)
	var listen string // run's, from its log
	ids := []string{"--tenant-id", strings.Repeat("a", 32), "--timeline-id", strings.Repeat("b", 32)}
	for _, tc := range []struct {
		name   string
		args   []string
		ready  func(log string) bool // the SIGHUP handler is installed
		serves func(t *testing.T)    // still does its job after SIGHUP
		code   int                   // exit code after SIGTERM
	}{
		{
			name: "run",
			args: []string{"run", "--id", "1", "--listen-pg", "127.0.0.1:0", "--listen-http", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data")},
			ready: func(log string) bool {
				var ok bool
				listen, _, ok = harness.ListenAddrs(log)
				return ok
			},
			serves: func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				host, port, _ := net.SplitHostPort(listen)
				c, err := pgconn.Connect(ctx, "host="+host+" port="+port+" user=test sslmode=disable replication=true")
				if err != nil {
					t.Fatalf("a new connection after SIGHUP: %v", err)
				}
				c.Close(ctx)
			},
		},
		{
			name: "propose",
			args: append([]string{"propose", "--upstream", "host=127.0.0.1 port=" + closedPort + " user=test sslmode=disable",
				"--safekeepers", closed}, ids...),
			ready: func(log string) bool { return strings.Contains(log, "reconnecting") },
		},
		{
			name:  "sync",
			args:  append([]string{"sync", "--safekeepers", closed, "--timeout", "60s"}, ids...),
			ready: func(log string) bool { return strings.Contains(log, "asking again") },
			code:  1, // stopped before it synced anything
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), tc.name+".log")
			logf, err := os.Create(logPath)
			if err != nil {
				t.Fatal(err)
			}
			defer logf.Close()
			cmd := exec.Command(bin, append([]string{"--log-level", "debug"}, tc.args...)...)
			cmd.Stdout, cmd.Stderr = logf, logf
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			defer func() {
				cmd.Process.Kill()
				<-done
			}()
			log := func() string {
				b, _ := os.ReadFile(logPath)
				return string(b)
			}
			alive := func() {
				t.Helper()
				select {
				case <-done:
					t.Fatalf("%s exited: %v\n%s", tc.name, cmd.ProcessState, log())
				default:
				}
			}
			harness.WaitFor(t, 30*time.Second, tc.name+" started", func() bool {
				alive()
				return tc.ready(log())
			})
			if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			harness.WaitFor(t, 10*time.Second, "SIGHUP logged", func() bool {
				alive()
				return strings.Contains(log(), "SIGHUP ignored: nothing to reload")
			})
			if tc.serves != nil {
				tc.serves(t)
			}
			alive()
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s still running 30s after SIGTERM", tc.name)
			}
			if !cmd.ProcessState.Exited() || cmd.ProcessState.ExitCode() != tc.code {
				t.Fatalf("%s after SIGTERM: %v, want exit code %d\n%s", tc.name, cmd.ProcessState, tc.code, log())
			}
		})
	}
}

// TestSIGHUPReloadsTLSAndKeys: with a certificate and auth keys, SIGHUP to
// `run` re-reads both (logged), and the server goes on.
func TestSIGHUPReloadsTLSAndKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := harness.Binary(t)
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir)
	cert, key := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	ca.Issue(t, "sk", cert, key)
	priv, pub := filepath.Join(dir, "auth.key"), filepath.Join(dir, "auth.pub")
	if err := auth.GenerateKeys(priv, pub); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "run.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "run", "--id", "1", "--listen-pg", "127.0.0.1:0", "--listen-http", "", "--data-dir", filepath.Join(dir, "data"),
		"--tls-cert", cert, "--tls-key", key, "--auth-public-key", pub)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	harness.WaitFor(t, 15*time.Second, "run listening", func() bool {
		b, _ := os.ReadFile(logPath)
		_, _, ok := harness.ListenAddrs(string(b))
		return ok
	})
	cmd.Process.Signal(syscall.SIGHUP)
	harness.WaitFor(t, 10*time.Second, "both reloads logged", func() bool {
		b, _ := os.ReadFile(logPath)
		return strings.Contains(string(b), `msg="TLS certificate reloaded" reason=SIGHUP`) && strings.Contains(string(b), `msg="auth public keys reloaded"`)
	})
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("exit after SIGTERM: %v\n%s", err, b)
	}
}

// TestSIGTERMRightAfterStartIsACleanStop: a supervisor may send SIGTERM at
// any moment, also while run is still starting. run takes SIGTERM from its
// first step on, so one that arrives as soon as the data directory is
// created (before the listener opens and the database is claimed) is a
// clean stop: exit 0, the data directory closed. Before, the handler was
// installed after the server had started and such a signal killed the
// process. Several rounds, each with a fresh data directory.
func TestSIGTERMRightAfterStartIsACleanStop(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := harness.Binary(t)
	for round := range 5 {
		dir := t.TempDir()
		data := filepath.Join(dir, "data")
		logPath := filepath.Join(dir, "run.log")
		logf, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "run", "--id", "1", "--listen-pg", "127.0.0.1:0", "--listen-http", "127.0.0.1:0", "--data-dir", data)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		// Poll without pause: the moment between creating the data directory
		// and listening is short.
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, err := os.Stat(data); err == nil {
				break
			}
			select {
			case <-done:
				b, _ := os.ReadFile(logPath)
				t.Fatalf("round %d: run exited before it created its data directory: %v\n%s", round, cmd.ProcessState, b)
			default:
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				<-done
				t.Fatalf("round %d: run did not create its data directory within 30s", round)
			}
			runtime.Gosched()
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Fatalf("round %d: run still running 30s after SIGTERM", round)
		}
		logf.Close()
		if !cmd.ProcessState.Exited() || cmd.ProcessState.ExitCode() != 0 {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("round %d: SIGTERM right after start: %v, want exit code 0\n%s", round, cmd.ProcessState, b)
		}
	}
}
