package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/test/tlstest"
)

// TestTLS: with a certificate, a client with sslmode=verify-full against
// the test's CA connects over TLS (and so does HTTPS); with --tls-required
// a plaintext client gets FATAL 28000 as pg_hba.conf's hostssl gives it; a
// rewritten certificate is served to new connections without a restart,
// while a connection opened before keeps going; a file that does not load
// keeps the previous certificate.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir)
	certFile, keyFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	serial1 := ca.Issue(t, "sk-1", certFile, keyFile)
	s := startTestServer(t, t.TempDir(), func(c *Config) {
		c.ListenHTTP = "127.0.0.1:0"
		c.TLSCertFile, c.TLSKeyFile, c.TLSRequired = certFile, keyFile, true
	})
	addr := s.Addr().String()
	host, port := hostOf(addr), addr[len(hostOf(addr))+1:]
	connect := func(sslmode string) (*pgconn.PgConn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=tester sslmode=%s sslrootcert=%s replication=true", host, port, sslmode, ca.CertFile))
	}
	servedSerial := func(c *pgconn.PgConn) *big.Int {
		tc, ok := c.Conn().(*tls.Conn)
		if !ok {
			t.Fatalf("connection is not TLS: %T", c.Conn())
		}
		return tc.ConnectionState().PeerCertificates[0].SerialNumber
	}
	c1, err := connect("verify-full")
	if err != nil {
		t.Fatalf("verify-full: %v", err)
	}
	defer c1.Close(context.Background())
	if got := servedSerial(c1); got.Cmp(serial1) != 0 {
		t.Fatalf("served certificate %v, want %v", got, serial1)
	}
	if _, err := c1.Exec(context.Background(), "").ReadAll(); err != nil {
		t.Fatalf("a query over TLS: %v", err)
	}
	// Plaintext is refused as hostssl refuses it.
	_, err = connect("disable")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != pgwire.InvalidAuthorizationSpecification || pe.Severity != "FATAL" ||
		pe.Message != `no pg_hba.conf entry for replication connection from host "127.0.0.1", user "tester", no encryption` {
		t.Fatalf("plaintext with TLS required: %v", err)
	}
	// HTTPS with the same certificate.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig("127.0.0.1")}, Timeout: 10 * time.Second}
	resp, err := hc.Get("https://" + s.HTTPAddr().String() + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("HTTPS /healthz: %v %v", resp, err)
	}
	resp.Body.Close()

	// Rotation: new files are picked up by the watcher.
	serial2 := ca.Issue(t, "sk-1 rotated", certFile, keyFile)
	waitFor(t, "the rotated certificate served", func() bool {
		c, err := connect("verify-full")
		if err != nil {
			return false
		}
		defer c.Close(context.Background())
		return servedSerial(c).Cmp(serial2) == 0
	})
	if _, err := c1.Exec(context.Background(), "").ReadAll(); err != nil {
		t.Fatalf("the connection opened before the rotation: %v", err)
	}
	// A broken file: ReloadTLS fails and the rotated certificate stays.
	if err := os.WriteFile(certFile, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.ReloadTLS(); err == nil {
		t.Fatal("ReloadTLS of a broken file succeeded")
	}
	c3, err := connect("verify-full")
	if err != nil {
		t.Fatalf("after a broken reload: %v", err)
	}
	defer c3.Close(context.Background())
	if got := servedSerial(c3); got.Cmp(serial2) != 0 {
		t.Fatalf("after a broken reload the served certificate is %v, want %v", got, serial2)
	}
}
