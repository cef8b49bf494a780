package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/test/harness"
	"github.com/safekeeper/safekeeper/test/pgtest"
	"github.com/safekeeper/safekeeper/test/tlstest"
)

// TestTLSEndToEnd: three safekeepers with --tls-required, certificates
// from a CA the test made, and token auth; the proposer reaches them with
// --safekeeper-sslmode verify-full and its tenant's token (--token-file),
// so commits on a stock primary wait for a quorum over TLS; psql,
// pg_receivewal and a hot standby (primary_conninfo) read from a
// safekeeper with sslmode=verify-full and the tenant's token as password;
// plaintext psql is refused with FATAL 28000, another tenant's token with
// 28000 too; the certificate is rotated while the proposer and the
// standby stream, new connections get the new one, and the streams go on;
// sync works over verify-full with a safekeeperdata token.
func TestTLSEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test: skipped in -short mode")
	}
	dir := pgtest.Dir(t, "tlstest-") // the postgres user reads ca.crt here
	ca := tlstest.NewCA(t, dir)
	pg := pgtest.Start(t, pgtest.Options{Conf: []string{"synchronous_standby_names = 'proposer'", "wal_sender_timeout = '20s'"}})
	// Tokens: the timeline's tenant, another tenant, and safekeeperdata.
	pubKey, privKey := filepath.Join(dir, "auth.pub"), filepath.Join(t.TempDir(), "auth.key")
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(harness.Binary(t), args...).Output()
		if err != nil {
			t.Fatalf("safekeeper %q: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	run("token", "keygen", "--private-key", privKey, "--public-key", pubKey)
	tenantTok := run("token", "issue", "--private-key", privKey, "--scope", "tenant", "--tenant-id", tenantID.String())
	otherTok := run("token", "issue", "--private-key", privKey, "--scope", "tenant", "--tenant-id", proto.ID{0x99}.String())
	adminTok := run("token", "issue", "--private-key", privKey, "--scope", "safekeeperdata", "--ttl", "1h")
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(tenantTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var sks []*harness.Safekeeper
	var certs [][2]string
	for id := uint64(1); id <= 3; id++ {
		cd := t.TempDir()
		cert, key := filepath.Join(cd, "server.crt"), filepath.Join(cd, "server.key")
		ca.Issue(t, fmt.Sprintf("safekeeper %d", id), cert, key)
		certs = append(certs, [2]string{cert, key})
		sks = append(sks, harness.StartSafekeeper(t, id, "--tls-cert", cert, "--tls-key", key, "--tls-required", "--auth-public-key", pubKey))
	}
	addrs := harness.Addrs(sks)
	prop := harness.StartProposer(t, harness.ProposerOptions{Upstream: pg.ConnString(), Safekeepers: addrs,
		Tenant: tenantID.String(), Timeline: timelineID.String(), Create: true, Slot: "proposer", ApplicationName: "proposer", Debug: true,
		Args: []string{"--safekeeper-sslmode", "verify-full", "--safekeeper-sslrootcert", ca.CertFile, "--token-file", tokenFile}})
	harness.WaitSyncStandby(t, pg, prop, "proposer", 60*time.Second) // streaming over TLS

	pg.Exec(t, "CREATE TABLE t(x int); INSERT INTO t VALUES (1)") // waits for the quorum

	host, port, _ := strings.Cut(sks[0].Addr, ":")
	options := fmt.Sprintf("-c tenant_id=%s -c timeline_id=%s", tenantID, timelineID)
	// No client certificate: libpq would look for ~/.postgresql/postgresql.crt,
	// which the postgres user cannot read under root's HOME.
	noClient := fmt.Sprintf("sslcert=%s sslkey=%s", filepath.Join(dir, "none.crt"), filepath.Join(dir, "none.key"))
	verify := fmt.Sprintf("host=%s port=%s user=postgres sslmode=verify-full sslrootcert=%s %s password=%s", host, port, ca.CertFile, noClient, tenantTok)
	// psql, verified; psql in plaintext, refused as hostssl refuses it.
	out := pg.Run(t, "psql", "-XAtq", "-d", verify+" replication=true options='"+options+"'", "-c", "IDENTIFY_SYSTEM")
	if !strings.Contains(out, "|1|") {
		t.Fatalf("IDENTIFY_SYSTEM over verify-full: %q", out)
	}
	plain, err := pg.Cmd(context.Background(), "psql", "-XAtq", "-d",
		fmt.Sprintf("host=%s port=%s user=postgres sslmode=disable replication=true", host, port), "-c", "IDENTIFY_SYSTEM").CombinedOutput()
	if err == nil || !strings.Contains(string(plain), `no pg_hba.conf entry for replication connection from host "127.0.0.1", user "postgres", no encryption`) {
		t.Fatalf("plaintext psql with --tls-required: %v %s", err, plain)
	}
	// Another tenant's token: authenticated, but not for this timeline.
	denied, err := pg.Cmd(context.Background(), "psql", "-XAtq", "-d",
		strings.Replace(verify, tenantTok, otherTok, 1)+" replication=true options='"+options+"'", "-c", "IDENTIFY_SYSTEM").CombinedOutput()
	if err == nil || !strings.Contains(string(denied), "permission denied for timeline") {
		t.Fatalf("psql with another tenant's token: %v %s", err, denied)
	}
	// No token: PostgreSQL's words.
	none, err := pg.Cmd(context.Background(), "psql", "-XAtqw", "-d",
		strings.Replace(verify, "password="+tenantTok, "", 1)+" replication=true", "-c", "IDENTIFY_SYSTEM").CombinedOutput()
	if err == nil || !strings.Contains(string(none), "password") {
		t.Fatalf("psql without a token: %v %s", err, none)
	}

	// pg_receivewal over verify-full, up to what is committed now.
	end, _ := proto.ParseLSN(pg.Exec(t, "SELECT pg_current_wal_flush_lsn()"))
	recv := pgtest.Dir(t, "tlsrecv-")
	if b, err := pg.Cmd(harness.Context(t, 60*time.Second), "pg_receivewal", "-D", recv, "--no-loop", "-E", end.String(),
		"-d", verify+" options='"+options+"'").CombinedOutput(); err != nil {
		t.Fatalf("pg_receivewal over verify-full: %v\n%s", err, b)
	}
	if names, _ := filepath.Glob(filepath.Join(recv, "0000000100000000000000*")); len(names) == 0 {
		t.Fatal("pg_receivewal wrote no segment")
	}

	// A hot standby whose primary_conninfo verifies the safekeeper.
	sb := harness.StartStandby(t, pg, sks[0], harness.StandbyOptions{Tenant: tenantID.String(), Timeline: timelineID.String(),
		ConnString: fmt.Sprintf("sslmode=verify-full sslrootcert=%s %s password=%s", ca.CertFile, noClient, tenantTok)})
	standbyHas := func(n int) bool {
		out, err := sb.Query(context.Background(), "SELECT count(*) FROM t")
		return err == nil && out == strconv.Itoa(n)
	}
	harness.WaitFor(t, 90*time.Second, "the standby to replay over TLS", func() bool { return standbyHas(1) })

	// Rotation on safekeeper 1 while the proposer and the standby stream.
	served := func() *big.Int {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// pgconn, unlike libpq, fails on a missing sslcert file: none given.
		c, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=postgres sslmode=verify-full sslrootcert=%s password=%s replication=true", host, port, ca.CertFile, tenantTok))
		if err != nil {
			return nil
		}
		defer c.Close(context.Background())
		return c.Conn().(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber
	}
	before := served()
	rotated := ca.Issue(t, "safekeeper 1 rotated", certs[0][0], certs[0][1])
	harness.WaitFor(t, 30*time.Second, "safekeeper 1 serving the rotated certificate", func() bool {
		s := served()
		return s != nil && s.Cmp(rotated) == 0
	})
	pg.Exec(t, "INSERT INTO t VALUES (2)") // the quorum still answers
	harness.WaitFor(t, 60*time.Second, "the standby to replay after the rotation", func() bool { return standbyHas(2) })
	if !strings.Contains(sks[0].Log(), "TLS certificate reloaded") {
		t.Fatal("safekeeper 1 did not log the reload")
	}
	t.Logf("rotated safekeeper 1's certificate %v -> %v under live streams", before, rotated)

	// sync over verify-full (the proposer stopped first: sync defers to a
	// live one).
	prop.Stop(10 * time.Second)
	syncCmd := func(args ...string) *exec.Cmd {
		cmd := exec.CommandContext(harness.Context(t, 60*time.Second), harness.Binary(t), args...)
		cmd.Env = append(os.Environ(), "SAFEKEEPER_TOKEN="+adminTok)
		return cmd
	}
	b, err := syncCmd("sync", "--force",
		"--safekeepers", strings.Join(addrs, ","), "--tenant-id", tenantID.String(), "--timeline-id", timelineID.String(),
		"--safekeeper-sslmode", "verify-full", "--safekeeper-sslrootcert", ca.CertFile).CombinedOutput()
	if err != nil {
		t.Fatalf("sync over verify-full: %v\n%s", err, b)
	}
	// And a wrong CA is refused by the client's verification.
	other := tlstest.NewCA(t, t.TempDir())
	b, err = syncCmd("sync", "--force", "--timeout", "5s",
		"--safekeepers", strings.Join(addrs, ","), "--tenant-id", tenantID.String(), "--timeline-id", timelineID.String(),
		"--safekeeper-sslmode", "verify-full", "--safekeeper-sslrootcert", other.CertFile).CombinedOutput()
	if err == nil || !strings.Contains(string(b), "certificate") {
		t.Fatalf("sync with the wrong CA: %v\n%s", err, b)
	}
}
