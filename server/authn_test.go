package server

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proposer"
	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/server/auth"
	"github.com/safekeeper/safekeeper/test/tlstest"
)

// TestTokenAuth: with --auth-public-key, a tenant-A token pushes to and
// reads tenant A's timeline and is refused on tenant B's for push (which
// then creates nothing), read, slots and HTTP; a safekeeperdata token may
// do everything; expired, wrong-key, alg "none" and HMAC-with-the-public-key
// tokens, and no token at all, get FATAL 28P01 in PostgreSQL's words;
// /metrics, /healthz and /v1/status stay open; the Bearer scheme is taken
// in any case; every DELETE needs a safekeeperdata token.
func TestTokenAuth(t *testing.T) {
	pub, key := testKeys(t, t.TempDir(), "auth")
	now := time.Now()
	issue := func(scope auth.Scope, tenant *proto.ID, ttl time.Duration, at time.Time) string {
		t.Helper()
		tok, err := auth.Issue(key, scope, tenant, ttl, at)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	tenantA, tenantB := tTenant, proto.ID{0xab, 2}
	tokA := issue(auth.ScopeTenant, &tenantA, time.Hour, now)
	tokB := issue(auth.ScopeTenant, &tenantB, time.Hour, now)
	admin := issue(auth.ScopeSafekeeperData, nil, time.Hour, now)

	s := startTestServer(t, t.TempDir(), func(c *Config) {
		c.ListenHTTP = "127.0.0.1:0"
		c.AuthPublicKeys = []string{pub}
		c.AllowAuthWithoutTLS = true
		c.EnablePprof = true
	})
	addr := s.Addr().String()
	host, port := hostOf(addr), addr[len(hostOf(addr))+1:]
	ctx := testCtx(t)
	push := func(tenant proto.ID, tok string) error {
		c, err := proposer.Dial(ctx, proposer.DialConfig{AllowTimelineCreation: true, Addr: addr, TenantID: tenant, TimelineID: tTimeline, Security: proposer.Security{Password: tok}})
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tenant,
			TimelineID: tTimeline, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xcc}}); err != nil {
			return err
		}
		_, err = c.Recv(ctx)
		return err
	}
	wantPg := func(what string, err error, code string) {
		t.Helper()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != code {
			t.Fatalf("%s: %v, want SQLSTATE %s", what, err, code)
		}
	}
	// Push: own tenant yes, another no (and nothing is created there).
	if err := push(tenantA, tokA); err != nil {
		t.Fatalf("push to tenant A with A's token: %v", err)
	}
	wantPg("push to tenant B with A's token", push(tenantB, tokA), pgwire.InvalidAuthorizationSpecification)
	if keys, _ := s.db.Timelines(); len(keys) != 1 {
		t.Fatalf("timelines after the refused push: %v", keys)
	}
	if err := push(tenantB, admin); err != nil {
		t.Fatalf("push to tenant B with a safekeeperdata token: %v", err)
	}

	// Read and slots.
	conn := func(tenant proto.ID, tok string) (*pgconn.PgConn, error) {
		return pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=reader password=%s sslmode=disable replication=true options='-c tenant_id=%s -c timeline_id=%s'",
			host, port, tok, tenant, tTimeline))
	}
	cA, err := conn(tenantB, tokA)
	if err != nil {
		t.Fatalf("connect with A's token: %v", err)
	}
	defer cA.Close(ctx)
	for _, q := range []string{"IDENTIFY_SYSTEM", "TIMELINE_STATUS", `CREATE_REPLICATION_SLOT "s" PHYSICAL`, `DROP_REPLICATION_SLOT "s"`, "START_REPLICATION 0/1000000"} {
		_, err := cA.Exec(ctx, q).ReadAll()
		wantPg(q+" on tenant B with A's token", err, pgwire.InvalidAuthorizationSpecification)
	}
	// Setting names are case-insensitive (as PostgreSQL's): another case
	// of tenant_id names tenant B all the same, and A's token is refused
	// there rather than served its own tenant's timeline.
	for _, opts := range []string{"-c TENANT_ID=%s -c timeline_id=%s", "-c Tenant_Id=%s -c TIMELINE_ID=%s", "--TENANT-ID=%s --timeline-id=%s"} {
		c, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=reader password=%s sslmode=disable replication=true options='%s'",
			host, port, tokA, fmt.Sprintf(opts, tenantB, tTimeline)))
		if err != nil {
			t.Fatalf("connect with A's token and options %q: %v", opts, err)
		}
		_, err = c.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll()
		c.Close(ctx)
		wantPg("IDENTIFY_SYSTEM with A's token and options "+opts, err, pgwire.InvalidAuthorizationSpecification)
	}
	// Another tenant's timeline that does not exist gets the same 28000 as
	// one that does: a token tells nothing of what other tenants store.
	{
		c, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=reader password=%s sslmode=disable replication=true options='-c tenant_id=%s -c timeline_id=%s'",
			host, port, tokA, tenantB, proto.ID{0x99, 9}))
		if err != nil {
			t.Fatalf("connect with A's token: %v", err)
		}
		_, err = c.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll()
		c.Close(ctx)
		wantPg("IDENTIFY_SYSTEM on a timeline of tenant B that does not exist, with A's token", err, pgwire.InvalidAuthorizationSpecification)
	}
	cB, err := conn(tenantB, tokB)
	if err != nil {
		t.Fatalf("connect with B's token: %v", err)
	}
	defer cB.Close(ctx)
	// (TIMELINE_STATUS: the timeline holds no WAL yet, IDENTIFY_SYSTEM would wait for it.)
	for _, q := range []string{"TIMELINE_STATUS", `CREATE_REPLICATION_SLOT "s" PHYSICAL`, `DROP_REPLICATION_SLOT "s"`} {
		if _, err := cB.Exec(ctx, q).ReadAll(); err != nil {
			t.Fatalf("%s on tenant B with B's token: %v", q, err)
		}
	}

	// Bad tokens: FATAL 28P01, PostgreSQL's words, nothing about why.
	_, otherPriv, _ := ed25519.GenerateKey(nil)
	wrongKey, _ := auth.Issue(otherPriv, auth.ScopeTenant, &tenantA, time.Hour, now)
	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"scope": "safekeeperdata"}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	pubPEM, err := readFile(pub)
	if err != nil {
		t.Fatal(err)
	}
	hmac, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"scope": "safekeeperdata"}).SignedString(pubPEM)
	for name, tok := range map[string]string{
		"expired": issue(auth.ScopeTenant, &tenantA, time.Minute, now.Add(-time.Hour)), "wrong key": wrongKey,
		"alg none": none, "HMAC with the public key": hmac, "no token": "", "garbage": "not.a.token",
	} {
		_, err := conn(tenantA, tok)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != pgwire.InvalidPassword || pe.Severity != "FATAL" || pe.Message != `password authentication failed for user "reader"` {
			t.Errorf("%s token: %v, want FATAL 28P01 password authentication failed", name, err)
		}
	}

	// HTTP.
	base := "http://" + s.HTTPAddr().String()
	get := func(method, path, tok string) int {
		req, _ := http.NewRequest(method, base+path, nil)
		switch {
		case strings.Contains(tok, " ") || strings.Contains(tok, "\t"):
			req.Header.Set("Authorization", tok) // a whole header value
		case tok != "":
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	tlB := fmt.Sprintf("/v1/tenant/%s/timeline/%s", tenantB, tTimeline)
	for _, c := range []struct {
		method, path, tok string
		want              int
	}{
		{"GET", "/metrics", "", 200}, {"GET", "/healthz", "", 200}, {"GET", "/v1/status", "", 200},
		{"GET", "/v1/tenant/timeline", "", 401}, {"GET", "/v1/tenant/timeline", "garbage", 401}, {"GET", "/v1/tenant/timeline", hmac, 401},
		{"GET", "/v1/tenant/timeline", tokA, 403}, {"GET", "/v1/tenant/timeline", admin, 200},
		{"GET", tlB, tokA, 403}, {"GET", tlB, tokB, 200}, {"GET", tlB, admin, 200},
		// The scheme's name in any case (RFC 7235); another scheme is none.
		{"GET", tlB, "bearer " + tokB, 200}, {"GET", tlB, "BEARER " + tokB, 200}, {"GET", tlB, "Bearer\t " + tokB, 200},
		{"GET", tlB, "Basic " + tokB, 401}, {"GET", tlB, "Bearer" + tokB, 401}, {"GET", tlB, "Bearers " + tokB, 401},
		// Every DELETE needs safekeeperdata: a tenant token, even its own
		// tenant's, cannot destroy acknowledged WAL.
		{"DELETE", tlB, tokA, 403}, {"DELETE", tlB + "?force=true", tokB, 403}, {"DELETE", "/v1/tenant/" + tenantB.String() + "?force=true", tokB, 403},
		{"DELETE", "/v1/tenant/" + tenantA.String() + "?force=true", tokA, 403}, {"GET", tlB, tokB, 200},
		{"DELETE", tlB + "?force=true", admin, 200}, {"GET", tlB, admin, 404}, {"DELETE", "/v1/tenant/" + tenantA.String() + "?force=true", admin, 200},
		{"GET", "/debug/pprof/", tokA, 403}, {"GET", "/debug/pprof/", "", 401}, {"GET", "/debug/pprof/", admin, 200},
	} {
		if got := get(c.method, c.path, c.tok); got != c.want {
			t.Errorf("%s %s with token %.12q: %d, want %d", c.method, c.path, c.tok, got, c.want)
		}
	}
}

func readFile(path string) ([]byte, error) { return os.ReadFile(path) }

// TestTokenNeedsTLS: with auth on and no --allow-auth-without-tls, a
// plaintext connection is refused before any password is asked (FATAL
// 28000); over TLS (verify-full against the test's CA) the token is taken.
func TestTokenNeedsTLS(t *testing.T) {
	dir := t.TempDir()
	pub, key := testKeys(t, dir, "auth")
	admin := adminToken(t, key)
	ca := tlstest.NewCA(t, dir)
	cert, ckey := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	ca.Issue(t, "sk", cert, ckey)
	s := startTestServer(t, t.TempDir(), func(c *Config) {
		c.AuthPublicKeys = []string{pub}
		c.TLSCertFile, c.TLSKeyFile = cert, ckey
	})
	addr := s.Addr().String()
	host, port := hostOf(addr), addr[len(hostOf(addr))+1:]
	ctx := testCtx(t)
	_, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=u password=%s sslmode=disable replication=true", host, port, admin))
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != pgwire.InvalidAuthorizationSpecification {
		t.Fatalf("token over plaintext: %v, want FATAL 28000", err)
	}
	c, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=u password=%s sslmode=verify-full sslrootcert=%s replication=true", host, port, admin, ca.CertFile))
	if err != nil {
		t.Fatalf("token over TLS: %v", err)
	}
	c.Close(ctx)
}

// TestPasswordFileReadAtEveryConnection: a proposer whose Security names a
// token file reads it at every new connection, so after a rotation as
// docs/security.md describes (a new key on the safekeeper, a new token in
// the file) the same client connects again without a restart — while the
// old token, which a client reading the file once would keep sending, is
// refused. A token file that is empty or gone fails the attempt with an
// error, not a panic or a connection without a password.
func TestPasswordFileReadAtEveryConnection(t *testing.T) {
	dir := t.TempDir()
	pub := filepath.Join(dir, "auth.pub")
	newToken := func(name string) string {
		t.Helper()
		p, key := testKeys(t, dir, name)
		tok := adminToken(t, key)
		// Only this pair's public key is on the safekeeper (a rename, as an
		// operator's deploy would).
		if err := os.Rename(p, pub); err != nil {
			t.Fatal(err)
		}
		return tok
	}
	tokFile := filepath.Join(dir, "token")
	writeToken := func(tok string) {
		t.Helper()
		tmp := tokFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, tokFile); err != nil {
			t.Fatal(err)
		}
	}
	oldTok := newToken("old")
	writeToken(oldTok)

	s := startTestServer(t, t.TempDir(), func(c *Config) {
		c.AuthPublicKeys = []string{pub}
		c.AllowAuthWithoutTLS = true
	})
	ctx := testCtx(t)
	client := proposer.DialConfig{AllowTimelineCreation: true, Addr: s.Addr().String(), TenantID: tTenant, TimelineID: tTimeline,
		Security: proposer.Security{PasswordFile: tokFile}}
	push := func(dc proposer.DialConfig) error {
		c, err := proposer.Dial(ctx, dc)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.Send(&proto.ServerInfo{ProtocolVersion: proto.ProtocolVersion, PgVersion: 150018, SystemID: tSysID, TenantID: tTenant,
			TimelineID: tTimeline, PgTimeline: 1, WalSegSize: tSeg, ProposerUUID: proto.ID{0xcc}}); err != nil {
			return err
		}
		m, err := c.Recv(ctx)
		if err != nil {
			return err
		}
		if _, ok := m.(*proto.SafeKeeperInfo); !ok {
			return fmt.Errorf("greeting answered with %T, want SafeKeeperInfo", m)
		}
		return nil
	}
	if err := push(client); err != nil {
		t.Fatalf("push with the token file before the rotation: %v", err)
	}

	// Rotate: the safekeeper gets only the new public key (SIGHUP), the
	// token file the new token.
	newTok := newToken("new")
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	writeToken(newTok)

	fixed := client
	fixed.Security = proposer.Security{Password: oldTok}
	var pe *pgconn.PgError
	if err := push(fixed); !errors.As(err, &pe) || pe.Code != pgwire.InvalidPassword {
		t.Fatalf("push with the old token after the rotation: %v, want FATAL 28P01", err)
	}
	if err := push(client); err != nil {
		t.Fatalf("push with the same client after the token file got the new token: %v (the file was not read again)", err)
	}

	// A token file being rewritten in place (empty) or gone fails the
	// attempt with an error; the next attempt may succeed.
	if err := os.WriteFile(tokFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := push(client); !errors.Is(err, proposer.ErrPasswordFileEmpty) {
		t.Fatalf("push with an empty token file: %v, want ErrPasswordFileEmpty", err)
	}
	if err := os.Remove(tokFile); err != nil {
		t.Fatal(err)
	}
	if err := push(client); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("push with the token file removed: %v, want fs.ErrNotExist", err)
	}
	writeToken(newTok)
	if err := push(client); err != nil {
		t.Fatalf("push once the token file is back: %v", err)
	}
}

// TestAuthPhaseRefusals: before authentication a client cannot make the
// server wait for or allocate more than PostgreSQL takes. A PasswordMessage
// whose length word announces more than 64 KiB (PG_MAX_AUTH_TOKEN_LENGTH) is
// refused from its header with FATAL 08P01, without the server waiting for
// the body; one of the largest size taken is read and judged (28P01); another
// message type is FATAL 08P01.
func TestAuthPhaseRefusals(t *testing.T) {
	pub, _ := testKeys(t, t.TempDir(), "auth")
	s := startTestServer(t, t.TempDir(), func(c *Config) {
		c.AuthPublicKeys = []string{pub}
		c.AllowAuthWithoutTLS = true
		c.AuthenticationTimeout = time.Minute // a server waiting for the body would answer after this
	})
	frame := func(typ byte, length uint32, body []byte) []byte {
		b := append([]byte{typ}, binary.BigEndian.AppendUint32(nil, length)...)
		return append(b, body...)
	}
	const maxBody = 65535 - 4 // the length word counts itself
	password := func(n int) []byte {
		return frame('p', uint32(4+n), append(bytes.Repeat([]byte{'x'}, n-1), 0))
	}
	for _, tc := range []struct {
		name     string
		send     []byte
		code     string
		msgStart string
	}{
		{"password message announcing more than 64 KiB, body never sent", frame('p', 4+maxBody+1, nil), pgwire.ProtocolViolation, "invalid message length"},
		{"password message announcing 1 GiB, body never sent", frame('p', 1<<30, nil), pgwire.ProtocolViolation, "invalid message length"},
		{"password message of the largest size taken", password(maxBody), pgwire.InvalidPassword, "password authentication failed"},
		{"a query instead of a password", frame('Q', 4+2, []byte{'x', 0}), pgwire.ProtocolViolation, "expected password response"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", s.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// Well below AuthenticationTimeout: the answer must not wait for it.
			c.SetDeadline(time.Now().Add(5 * time.Second))
			startup := binary.BigEndian.AppendUint32(nil, 196608)
			for _, kv := range []string{"user", "u", "replication", "true", ""} {
				startup = append(append(startup, kv...), 0)
			}
			if _, err := c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(4+len(startup))), startup...)); err != nil {
				t.Fatal(err)
			}
			r := bufio.NewReader(c)
			typ, body := readBackendMessage(t, r)
			if typ != 'R' || len(body) != 4 || binary.BigEndian.Uint32(body) != 3 {
				t.Fatalf("got %q %x, want AuthenticationCleartextPassword", typ, body)
			}
			if _, err := c.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			typ, body = readBackendMessage(t, r)
			if typ != 'E' {
				t.Fatalf("got message %q, want an ErrorResponse", typ)
			}
			f := errorFields(body)
			if f['S'] != "FATAL" || f['C'] != tc.code || !strings.HasPrefix(f['M'], tc.msgStart) {
				t.Fatalf("got %s %s %q, want FATAL %s %q...", f['S'], f['C'], f['M'], tc.code, tc.msgStart)
			}
		})
	}
}

// readBackendMessage reads one backend message: its type and body.
func readBackendMessage(t *testing.T, r *bufio.Reader) (byte, []byte) {
	t.Helper()
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		t.Fatalf("reading a message header: %v", err)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > 1<<20 {
		t.Fatalf("message %q with length %d", hdr[0], n)
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatalf("reading a message body: %v", err)
	}
	return hdr[0], body
}

// errorFields splits an ErrorResponse body into its fields.
func errorFields(body []byte) map[byte]string {
	f := map[byte]string{}
	for len(body) > 1 {
		i := bytes.IndexByte(body[1:], 0)
		if i < 0 {
			break
		}
		f[body[0]] = string(body[1 : 1+i])
		body = body[2+i:]
	}
	return f
}

// testKeys makes an Ed25519 key pair NAME.key and NAME.pub in dir and
// returns the public key's file and the private key.
func testKeys(t *testing.T, dir, name string) (pub string, key ed25519.PrivateKey) {
	t.Helper()
	priv, pub := filepath.Join(dir, name+".key"), filepath.Join(dir, name+".pub")
	if err := auth.GenerateKeys(priv, pub); err != nil {
		t.Fatal(err)
	}
	key, err := auth.LoadPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return pub, key
}

// adminToken is a safekeeperdata token of key, valid for an hour.
func adminToken(t *testing.T, key ed25519.PrivateKey) string {
	t.Helper()
	tok, err := auth.Issue(key, auth.ScopeSafekeeperData, nil, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
