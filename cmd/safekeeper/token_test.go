package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/auth"
)

func runCmd(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(append([]string{"safekeeper"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

// keygen writes a key pair into a new directory and returns the paths.
func keygen(t *testing.T) (priv, pub string) {
	t.Helper()
	dir := t.TempDir()
	priv, pub = filepath.Join(dir, "auth_private_key.pem"), filepath.Join(dir, "auth_public_key.pem")
	if code, out, errs := runCmd("token", "keygen", "--private-key", priv, "--public-key", pub); code != 0 || out != "" || errs != "" {
		t.Fatalf("token keygen: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	return priv, pub
}

// TestTokenKeygenIssueVerify: keygen, then issue prints the token alone on
// one line, and it verifies with the public key for what was asked.
func TestTokenKeygenIssueVerify(t *testing.T) {
	priv, pub := keygen(t)
	for p, want := range map[string]os.FileMode{priv: 0o600, pub: 0o644} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
	v, err := auth.LoadVerifier(pub)
	if err != nil {
		t.Fatal(err)
	}
	tenant := strings.Repeat("ab", 16)
	id, _ := proto.ParseID(tenant)
	other := proto.ID{1}
	for _, tc := range []struct {
		args     []string
		scope    auth.Scope
		ttl      time.Duration
		tenantOK bool
		adminOK  bool
	}{
		{[]string{"--scope", "tenant", "--tenant-id", tenant}, auth.ScopeTenant, 24 * time.Hour, true, false},
		{[]string{"--scope", "tenant", "--tenant-id", strings.ToUpper(tenant), "--ttl", "1h"}, auth.ScopeTenant, time.Hour, true, false},
		{[]string{"--scope", "safekeeperdata", "--ttl", "90s"}, auth.ScopeSafekeeperData, 90 * time.Second, true, true},
		{[]string{"--scope", "safekeeperdata", "--ttl", "0"}, auth.ScopeSafekeeperData, 0, true, true},
		// An empty --tenant-id (SAFEKEEPER_TENANT_ID= in an environment file) is none.
		{[]string{"--scope", "safekeeperdata", "--tenant-id", ""}, auth.ScopeSafekeeperData, 24 * time.Hour, true, true},
	} {
		before := time.Now().Truncate(time.Second)
		code, out, errs := runCmd(append([]string{"token", "issue", "--private-key", priv}, tc.args...)...)
		after := time.Now()
		if code != 0 || errs != "" {
			t.Fatalf("%q: exit %d, stderr %q", tc.args, code, errs)
		}
		tok, ok := strings.CutSuffix(out, "\n")
		if !ok || tok == "" || strings.ContainsAny(tok, "\n \t") {
			t.Fatalf("%q: stdout %q, want the token alone on one line", tc.args, out)
		}
		c, err := v.Verify(tok)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if c.Scope != tc.scope {
			t.Errorf("%q: scope %q", tc.args, c.Scope)
		}
		if (c.CheckTenant(id) == nil) != tc.tenantOK || (c.CheckTenant(other) == nil) != tc.adminOK || (c.CheckAdmin() == nil) != tc.adminOK {
			t.Errorf("%q: claims %+v grant the wrong things", tc.args, c)
		}
		switch {
		case tc.ttl == 0 && !c.ExpiresAt.IsZero():
			t.Errorf("%q: exp %v, want none", tc.args, c.ExpiresAt)
		case tc.ttl > 0 && (c.ExpiresAt.Before(before.Add(tc.ttl)) || c.ExpiresAt.After(after.Add(tc.ttl))):
			t.Errorf("%q: exp %v, want %v from now", tc.args, c.ExpiresAt, tc.ttl)
		}
	}
}

func TestTokenKeygenJSON(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "k"), filepath.Join(dir, "k.pub")
	code, out, errs := runCmd("token", "keygen", "--private-key", priv, "--public-key", pub, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil || got["private_key"] != priv || got["public_key"] != pub || !strings.HasSuffix(out, "}\n") {
		t.Fatalf("stdout %q (%v)", out, err)
	}
}

// TestTokenKeygenNeverOverwrites: an existing file is an error (exit 1)
// naming it, and stays as it was.
func TestTokenKeygenNeverOverwrites(t *testing.T) {
	priv, pub := keygen(t)
	old, err := os.ReadFile(priv)
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--private-key", priv, "--public-key", pub + ".new"},
		{"--private-key", priv + ".new", "--public-key", pub},
	} {
		code, _, errs := runCmd(append([]string{"token", "keygen"}, args...)...)
		if code != 1 || !strings.Contains(errs, "refusing to overwrite") || strings.Count(errs, "\n") != 1 {
			t.Errorf("%q: exit %d, stderr %q; want exit 1, one line", args, code, errs)
		}
	}
	if now, _ := os.ReadFile(priv); !bytes.Equal(now, old) {
		t.Errorf("the private key changed")
	}
	for _, p := range []string{priv + ".new", pub + ".new"} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s written by a refused keygen: %v", p, err)
		}
	}
}

// TestTokenUsageErrors: bad flags are usage errors (exit 2) with a one-line
// message naming the problem, and print no token.
func TestTokenUsageErrors(t *testing.T) {
	priv, _ := keygen(t)
	tenant := strings.Repeat("cd", 16)
	issue := []string{"token", "issue", "--private-key", priv}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(issue, "--scope", "admin"), `--scope "admin"`},
		{append(issue, "--scope", ""), "--scope"},
		{append(issue, "--scope", "Tenant", "--tenant-id", tenant), "--scope"},
		{append(issue, "--scope", "tenant"), "needs --tenant-id"},
		{append(issue, "--scope", "tenant", "--tenant-id", ""), "needs --tenant-id"},
		{append(issue, "--scope", "safekeeperdata", "--tenant-id", tenant), "takes no --tenant-id"},
		{append(issue, "--scope", "tenant", "--tenant-id", "abc"), "--tenant-id"},
		{append(issue, "--scope", "tenant", "--tenant-id", strings.Repeat("x", 32)), "--tenant-id"},
		{append(issue, "--scope", "safekeeperdata", "--ttl", "-1h"), "--ttl"},
		{append(issue, "--scope", "safekeeperdata", "--ttl", "500ms"), "--ttl"},
		{append(issue, "--scope", "safekeeperdata", "--ttl", "tomorrow"), "ttl"},
		{append(issue, "--scope", "safekeeperdata", "extra"), "no arguments"},
		{[]string{"token", "issue", "--scope", "safekeeperdata"}, "private-key"},
		{[]string{"token", "issue", "--private-key", priv}, "scope"},
		{[]string{"token", "keygen", "--private-key", priv + "2"}, "public-key"},
		{[]string{"token", "keygen", "--private-key", "", "--public-key", priv + "3"}, "--private-key"},
		{[]string{"token", "bogus"}, "token bogus"},
	} {
		code, out, errs := runCmd(tc.args...)
		if code != exitUsage || !strings.Contains(errs, tc.want) || strings.Count(errs, "\n") != 1 || out != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d, one line naming %s", tc.args, code, out, errs, exitUsage, tc.want)
		}
	}
}

// TestTokenIssueBadKeyFile: a missing or wrong private key file is an
// error (exit 1) naming it.
func TestTokenIssueBadKeyFile(t *testing.T) {
	_, pub := keygen(t)
	for _, p := range []string{filepath.Join(t.TempDir(), "missing.pem"), pub} {
		code, out, errs := runCmd("token", "issue", "--private-key", p, "--scope", "safekeeperdata")
		if code != 1 || out != "" || !strings.Contains(errs, p) {
			t.Errorf("--private-key %s: exit %d, stdout %q, stderr %q; want exit 1 naming the file", p, code, out, errs)
		}
	}
}
