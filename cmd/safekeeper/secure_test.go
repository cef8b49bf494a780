package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server"
	"github.com/safekeeper/safekeeper/server/auth"
	"github.com/safekeeper/safekeeper/test/tlstest"
)

// TestHTTPCommandsOverHTTPSWithTokens: against a safekeeper with a
// certificate and auth, the HTTP commands reach https:// verified with
// --http-cacert, present --token-file or SAFEKEEPER_TOKEN, and report a
// refusal as one line with its status; /v1/status stays open.
func TestHTTPCommandsOverHTTPSWithTokens(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir)
	cert, key := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	ca.Issue(t, "sk", cert, key)
	priv, pub := filepath.Join(dir, "auth.key"), filepath.Join(dir, "auth.pub")
	if err := auth.GenerateKeys(priv, pub); err != nil {
		t.Fatal(err)
	}
	pk, _ := auth.LoadPrivateKey(priv)
	tenant, timeline := proto.ID{0xa1}, proto.ID{0xb2}
	admin, _ := auth.Issue(pk, auth.ScopeSafekeeperData, nil, time.Hour, time.Now())
	mine, _ := auth.Issue(pk, auth.ScopeTenant, &tenant, time.Hour, time.Now())
	other := proto.ID{0xa9}
	theirs, _ := auth.Issue(pk, auth.ScopeTenant, &other, time.Hour, time.Now())
	srv, err := server.New(server.Config{NodeID: 5, ListenPG: "127.0.0.1:0", ListenHTTP: "127.0.0.1:0", DataDir: t.TempDir(), UnsafeNoFsync: true,
		TLSCertFile: cert, TLSKeyFile: key, AuthPublicKeys: []string{pub}})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-served
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := proposer.Dial(ctx, proposer.DialConfig{AllowTimelineCreation: true, Addr: srv.Addr().String(), TenantID: tenant, TimelineID: timeline,
		Security: proposer.Security{SSLMode: "verify-full", SSLRootCert: ca.CertFile, Password: mine}})
	if err != nil {
		t.Fatalf("push over verify-full with the tenant's token: %v", err)
	}
	defer pc.Close()
	pc.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: 1, TenantID: tenant,
		TimelineID: timeline, PgTimeline: 1, WalSegSize: 16 << 20, ProposerUUID: proto.ID{1}})
	if _, err := pc.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	https := []string{"--http", "https://" + srv.HTTPAddr().String(), "--http-cacert", ca.CertFile}
	ids := []string{"--tenant-id", tenant.String(), "--timeline-id", timeline.String()}
	cli := func(env string, args ...string) (int, string, string) {
		if env != "" {
			t.Setenv("SAFEKEEPER_TOKEN", env)
			defer os.Unsetenv("SAFEKEEPER_TOKEN")
		}
		var out, errb bytes.Buffer
		code := run(append([]string{"safekeeper"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, out, stderr := cli("", append([]string{"status"}, https...)...); code != 0 || !strings.Contains(out, "node id") {
		t.Fatalf("status over https without a token: exit %d %s%s", code, out, stderr)
	}
	if code, _, stderr := cli("", append([]string{"timeline", "list"}, https...)...); code != 1 || !strings.Contains(stderr, "HTTP 401") {
		t.Fatalf("timeline list without a token: exit %d %q", code, stderr)
	}
	if code, out, stderr := cli(admin, append([]string{"timeline", "list"}, https...)...); code != 0 || !strings.Contains(out, timeline.String()) {
		t.Fatalf("timeline list with SAFEKEEPER_TOKEN (safekeeperdata): exit %d %s%s", code, out, stderr)
	}
	tokFile := filepath.Join(dir, "token")
	os.WriteFile(tokFile, []byte(mine+"\n"), 0o600)
	if code, out, stderr := cli("", append(append([]string{"timeline", "show", "--token-file", tokFile}, https...), ids...)...); code != 0 || !strings.Contains(out, "proposer") {
		t.Fatalf("timeline show with the tenant's --token-file: exit %d %s%s", code, out, stderr)
	}
	if code, _, stderr := cli(theirs, append(append([]string{"timeline", "show"}, https...), ids...)...); code != 1 || !strings.Contains(stderr, "HTTP 403") {
		t.Fatalf("timeline show with another tenant's token: exit %d %q", code, stderr)
	}
	if code, _, stderr := cli(mine, append(append([]string{"wal", "dump"}, https...), ids...)...); code != 0 {
		t.Fatalf("wal dump --http over https with the tenant's token: exit %d %q", code, stderr)
	}
	if code, _, stderr := cli(theirs, append(append([]string{"wal", "dump"}, https...), ids...)...); code != 1 || !strings.Contains(stderr, "HTTP 403") {
		t.Fatalf("wal dump with another tenant's token: exit %d %q", code, stderr)
	}
	// The system's roots do not know the test CA.
	if code, _, stderr := cli(admin, "timeline", "list", "--http", "https://"+srv.HTTPAddr().String()); code != 1 || !strings.Contains(stderr, "certificate") {
		t.Fatalf("https without --http-cacert: exit %d %q", code, stderr)
	}
}

// TestSecurityFromTokenFile: --token-file reaches the proposer as a file
// to read at every connection (so a token rotated in it is taken without
// a restart), an empty one is a usage error at start, and
// $SAFEKEEPER_TOKEN stays a fixed password.
func TestSecurityFromTokenFile(t *testing.T) {
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("tok1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) (proposer.Security, error) {
		var sec proposer.Security
		var err error
		app := &cli.App{Flags: securityFlags(), Action: func(c *cli.Context) error {
			sec, err = securityFrom(c)
			return nil
		}}
		if rerr := app.Run(append([]string{"x"}, args...)); rerr != nil {
			t.Fatal(rerr)
		}
		return sec, err
	}
	t.Setenv("SAFEKEEPER_TOKEN", "from-env")
	sec, err := parse("--token-file", tokFile)
	if err != nil || sec.PasswordFile != tokFile || sec.Password != "" {
		t.Fatalf("--token-file: %+v, %v; want PasswordFile %s and no fixed Password", sec, err, tokFile)
	}
	sec, err = parse()
	if err != nil || sec.Password != "from-env" || sec.PasswordFile != "" {
		t.Fatalf("SAFEKEEPER_TOKEN: %+v, %v; want the fixed Password from-env", sec, err)
	}
	if err := os.WriteFile(tokFile, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var ue usageError
	if _, err := parse("--token-file", tokFile); !errors.As(err, &ue) {
		t.Fatalf("an empty --token-file: %v, want a usage error", err)
	}
}

// TestRunKeyFilesAreUsageErrors: a --tls-cert, --tls-key or
// --auth-public-key file that is missing or holds no usable key is a usage
// error (exit 2) naming the flag and the file, before the data directory is
// created or a port listened on.
func TestRunKeyFilesAreUsageErrors(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir)
	cert, key := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	ca.Issue(t, "sk", cert, key)
	pub := filepath.Join(dir, "auth.pub")
	if err := auth.GenerateKeys(filepath.Join(dir, "auth.key"), pub); err != nil {
		t.Fatal(err)
	}
	missing := func(name string) string { return filepath.Join(dir, name) }
	data := filepath.Join(t.TempDir(), "data")
	runArgs := []string{"run", "--id", "1", "--data-dir", data, "--listen-pg", "127.0.0.1:0", "--listen-http", ""}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--tls-cert", missing("missing.crt"), "--tls-key", missing("missing.key")}, []string{"--tls-cert", missing("missing.crt")}},
		{[]string{"--tls-cert", cert, "--tls-key", missing("missing.key")}, []string{"--tls-key", missing("missing.key")}},
		{[]string{"--tls-cert", key, "--tls-key", cert}, []string{"--tls-cert", key, cert}}, // swapped: no certificate in it
		{[]string{"--tls-cert", cert, "--tls-key", key, "--auth-public-key", pub, "--auth-public-key", missing("missing.pub")}, []string{"--auth-public-key", missing("missing.pub")}},
		{[]string{"--auth-public-key", cert, "--allow-auth-without-tls"}, []string{"--auth-public-key", cert}}, // no public key in it
	} {
		var out, errb bytes.Buffer
		code := run(append(append([]string{"safekeeper"}, runArgs...), c.args...), &out, &errb)
		ok := code == exitUsage && strings.Count(errb.String(), "\n") == 1
		for _, w := range c.want {
			ok = ok && strings.Contains(errb.String(), w)
		}
		if !ok {
			t.Errorf("run %q: exit %d, stderr %q; want exit %d, one line naming %q", c.args, code, errb.String(), exitUsage, c.want)
		}
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("a refused run created its data directory: %v", err)
	}
}
