package pgwire

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/safekeeper/safekeeper/proto"
)

// Tests with pgx/v5's pgconn (and pglogrepl on top of it) as the client.

func connString(addr, extra string) string {
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf("host=%s port=%s user=alice dbname=replication connect_timeout=10 %s", host, port, extra)
}

func connect(t *testing.T, ctx context.Context, addr, extra string) *pgconn.PgConn {
	t.Helper()
	conn, err := pgconn.Connect(ctx, connString(addr, extra))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func exec(t *testing.T, ctx context.Context, conn *pgconn.PgConn, sql string) *pgconn.Result {
	t.Helper()
	res, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if len(res) != 1 {
		t.Fatalf("%s: %d results", sql, len(res))
	}
	if res[0].Err != nil {
		t.Fatalf("%s: %v", sql, res[0].Err)
	}
	return res[0]
}

// sslmode=prefer: pgconn sends SSLRequest, gets 'N', and (unlike libpq, which
// goes on on the same socket) closes and reconnects without TLS. Both
// connections reach Accept; the startup parameters and options arrive.
func TestPgconnStartupSSLPreferAndParams(t *testing.T) {
	ctx := testContext(t)
	addr, results := startServer(t, AcceptOptions{}, testWalsender(nil))
	conn := connect(t, ctx, addr,
		`sslmode=prefer replication=database application_name=pgwire_test options='-c tenant_id=0123abcd -c timeline_id=4567ef01'`)

	var eofs, oks int
	for i := 0; i < 2; i++ {
		r := <-results
		switch {
		case r.err == nil:
			oks++
		case errors.Is(r.err, io.EOF):
			eofs++ // the TLS attempt: 'N', then pgconn hung up
		default:
			t.Errorf("accept: %v", r.err)
		}
	}
	if oks != 1 || eofs != 1 {
		t.Fatalf("accepts: %d ok, %d EOF after 'N'; want 1 and 1", oks, eofs)
	}

	for name, want := range map[string]string{
		"server_version": testServerVersion, "integer_datetimes": "on", "application_name": "pgwire_test",
		"session_authorization": "alice", "in_hot_standby": "off", "DateStyle": "ISO, MDY",
	} {
		if got := conn.ParameterStatus(name); got != want {
			t.Errorf("ParameterStatus(%s) = %q, want %q", name, got, want)
		}
	}
	if conn.PID() != testKey.ProcessID || len(conn.SecretKey()) != 4 || binary.BigEndian.Uint32(conn.SecretKey()) != testKey.SecretKey {
		t.Errorf("BackendKeyData = %d/%x", conn.PID(), conn.SecretKey())
	}

	res := exec(t, ctx, conn, "SHOW_PARAMS")
	params := map[string]string{}
	for _, row := range res.Rows {
		params[string(row[0])] = string(row[1])
	}
	for k, want := range map[string]string{
		"user": "alice", "database": "replication", "replication": "database",
		"application_name": "pgwire_test", "options": "-c tenant_id=0123abcd -c timeline_id=4567ef01",
	} {
		if params[k] != want {
			t.Errorf("startup param %s = %q, want %q", k, params[k], want)
		}
	}
	opts, err := ParseOptions(params["options"])
	if err != nil || opts["tenant_id"] != "0123abcd" || opts["timeline_id"] != "4567ef01" {
		t.Errorf("ParseOptions = %v, %v", opts, err)
	}
	if mode, err := ParseReplication(params["replication"]); err != nil || mode != ReplicationLogical {
		t.Errorf("ParseReplication = %v, %v", mode, err)
	}
}

// A simple query returns a result set whose shape pgconn (and pglogrepl's
// IDENTIFY_SYSTEM parser) accepts: text format, table OID 0, type OIDs, NULL.
func TestPgconnSimpleQueryRowSet(t *testing.T) {
	ctx := testContext(t)
	addr, _ := startServer(t, AcceptOptions{}, testWalsender(nil))
	conn := connect(t, ctx, addr, "sslmode=disable replication=true")

	res := exec(t, ctx, conn, "IDENTIFY_SYSTEM")
	wantCols := []struct {
		name string
		oid  uint32
		size int16
	}{{"systemid", TextOID, -1}, {"timeline", Int4OID, 4}, {"xlogpos", TextOID, -1}, {"dbname", TextOID, -1}}
	if len(res.FieldDescriptions) != len(wantCols) {
		t.Fatalf("%d columns", len(res.FieldDescriptions))
	}
	for i, fd := range res.FieldDescriptions {
		w := wantCols[i]
		if fd.Name != w.name || fd.DataTypeOID != w.oid || fd.DataTypeSize != w.size || fd.TypeModifier != -1 ||
			fd.Format != 0 || fd.TableOID != 0 || fd.TableAttributeNumber != 0 {
			t.Errorf("column %d = %+v", i, fd)
		}
	}
	if len(res.Rows) != 1 || string(res.Rows[0][0]) != testSystemID || string(res.Rows[0][1]) != "1" ||
		string(res.Rows[0][2]) != "0/16B3748" || res.Rows[0][3] != nil {
		t.Errorf("rows = %q", res.Rows)
	}
	if res.CommandTag.String() != "IDENTIFY_SYSTEM" {
		t.Errorf("tag = %q", res.CommandTag.String())
	}

	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if sys.SystemID != testSystemID || sys.Timeline != 1 || sys.XLogPos != 0x16B3748 || sys.DBName != "" {
		t.Errorf("IdentifySystem = %+v", sys)
	}

	// An empty query gets EmptyQueryResponse; a notice arrives as a notice.
	if _, err := conn.Exec(ctx, "").ReadAll(); err != nil {
		t.Errorf("empty query: %v", err)
	}
	exec(t, ctx, conn, "NOTICE")
}

// ErrorResponse arrives as *pgconn.PgError with the SQLSTATE; the connection
// stays usable (ReadyForQuery follows), as with the real walsender.
func TestPgconnErrorResponse(t *testing.T) {
	ctx := testContext(t)
	addr, _ := startServer(t, AcceptOptions{}, testWalsender(nil))
	conn := connect(t, ctx, addr, "sslmode=disable replication=true")

	for _, tc := range []struct{ sql, code, msg string }{
		{"FAIL", UndefinedFile, "requested WAL segment 000000010000000000000002 has already been removed"},
		{"FAIL_PLAIN", InternalError, "wrapped: disk on fire"},
		{"NO SUCH COMMAND", SyntaxError, `syntax error at or near "NO SUCH COMMAND"`},
	} {
		_, err := conn.Exec(ctx, tc.sql).ReadAll()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			t.Fatalf("%s: err = %v, want *pgconn.PgError", tc.sql, err)
		}
		if pgErr.Code != tc.code || pgErr.Message != tc.msg || pgErr.Severity != "ERROR" || pgErr.SeverityUnlocalized != "ERROR" {
			t.Errorf("%s: %+v", tc.sql, pgErr)
		}
		exec(t, ctx, conn, "IDENTIFY_SYSTEM")
	}
}

// The extended query protocol is refused with 08P01 once per Sync, and the
// connection keeps working.
func TestPgconnExtendedProtocolRefused(t *testing.T) {
	ctx := testContext(t)
	addr, _ := startServer(t, AcceptOptions{}, testWalsender(nil))
	conn := connect(t, ctx, addr, "sslmode=disable replication=true")

	check := func(what string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != ProtocolViolation ||
			pgErr.Message != "extended query protocol not supported in a replication connection" {
			t.Fatalf("%s: err = %v, want 08P01", what, err)
		}
		exec(t, ctx, conn, "IDENTIFY_SYSTEM") // in sync again
	}
	_, err := conn.Prepare(ctx, "s1", "IDENTIFY_SYSTEM", nil)
	check("Prepare", err)
	_, err = conn.ExecParams(ctx, "IDENTIFY_SYSTEM", nil, nil, nil, nil).Close()
	check("ExecParams", err)
	_, err = conn.ExecParams(ctx, "IDENTIFY_SYSTEM", [][]byte{[]byte("1")}, []uint32{Int4OID}, nil, nil).Close()
	check("ExecParams with a parameter", err)
}

// CopyBoth through pglogrepl: StartReplication, XLogData and keepalive from
// the server parsed by pglogrepl, standby status update encoded by pglogrepl
// decoded here, 'h' and 'z' from the client, CopyDone both ways, then the
// connection goes on.
func TestPgconnCopyBothReplication(t *testing.T) {
	ctx := testContext(t)
	events := make(chan streamEvent, 16)
	addr, _ := startServer(t, AcceptOptions{}, testWalsender(events))
	conn := connect(t, ctx, addr, "sslmode=disable replication=true")

	const start = 0x1000000
	err := pglogrepl.StartReplication(ctx, conn, "s1", start, pglogrepl.StartReplicationOptions{Mode: pglogrepl.PhysicalReplication, Timeline: 1})
	if err != nil {
		t.Fatal(err)
	}
	recvCopy := func() []byte {
		t.Helper()
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok {
			t.Fatalf("got %T, want CopyData", msg)
		}
		return cd.Data
	}

	d := recvCopy()
	if d[0] != 'w' {
		t.Fatalf("first message %q", d[0])
	}
	xld, err := pglogrepl.ParseXLogData(d[1:])
	if err != nil {
		t.Fatal(err)
	}
	end := pglogrepl.LSN(start + len(testWAL))
	if xld.WALStart != start || xld.ServerWALEnd != end || !bytes.Equal(xld.WALData, testWAL) ||
		time.Since(xld.ServerTime).Abs() > time.Minute {
		t.Errorf("XLogData = start %s end %s time %v, %d bytes", xld.WALStart, xld.ServerWALEnd, xld.ServerTime, len(xld.WALData))
	}
	d = recvCopy()
	ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(d[1:])
	if d[0] != 'k' || err != nil || ka.ServerWALEnd != end || ka.ReplyRequested {
		t.Errorf("keepalive = %q %+v %v", d[0], ka, err)
	}

	// 'r' encoded by pglogrepl; the server echoes the flush position.
	clientTime := time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC)
	err = pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: end, WALFlushPosition: end - 100, WALApplyPosition: start + 8, ClientTime: clientTime, ReplyRequested: true})
	if err != nil {
		t.Fatal(err)
	}
	want := StandbyStatusUpdate{Write: proto.LSN(end), Flush: proto.LSN(end - 100), Apply: start + 8, SendTime: TimeToPG(clientTime), ReplyRequested: true}
	if got := <-events; got != want {
		t.Errorf("server decoded %+v, want %+v", got, want)
	}
	d = recvCopy()
	ka, err = pglogrepl.ParsePrimaryKeepaliveMessage(d[1:])
	if err != nil || ka.ServerWALEnd != end-100 {
		t.Errorf("echo keepalive = %+v %v", ka, err)
	}

	// 'h' and a large 'z' (an unknown 200 KiB key is skipped).
	hsf := HotStandbyFeedback{SendTime: 42, Xmin: 1000, XminEpoch: 1, CatalogXmin: 900, CatalogXminEpoch: 1}
	cf := ConsumerFeedback{TimelineSize: 1 << 30, ReceivedLSN: 0x3000, DiskConsistentLSN: 0x2000, RemoteConsistentLSN: 0x1000, ReplyTime: 77}
	z := cf.Append(nil)
	z[1]++ // one more key
	z = append(z, "big_unknown_key\x00"...)
	big := bytes.Repeat([]byte{0xAB}, 200<<10)
	z = append(z, byte(len(big)>>24), byte(len(big)>>16), byte(len(big)>>8), byte(len(big)))
	z = append(z, big...)
	conn.Frontend().Send(&pgproto3.CopyData{Data: hsf.Append(nil)})
	conn.Frontend().Send(&pgproto3.CopyData{Data: z})
	if err := conn.Frontend().Flush(); err != nil {
		t.Fatal(err)
	}
	if got := <-events; got != hsf {
		t.Errorf("server decoded %+v, want %+v", got, hsf)
	}
	if got := <-events; got != cf {
		t.Errorf("server decoded %+v, want %+v", got, cf)
	}

	// The client ends the stream: CopyDone, CopyDone, START_STREAMING,
	// START_REPLICATION, ReadyForQuery; the connection is usable again.
	if _, err := pglogrepl.SendStandbyCopyDone(ctx, conn); err != nil {
		t.Fatal(err)
	}
	exec(t, ctx, conn, "IDENTIFY_SYSTEM")
}

// With a TLS config, SSLRequest gets 'S' and the session runs over TLS.
func TestPgconnTLS(t *testing.T) {
	ctx := testContext(t)
	addr, _ := startServer(t, AcceptOptions{TLSConfig: testTLSConfig(t)}, testWalsender(nil))
	conn := connect(t, ctx, addr, "sslmode=require replication=true")
	res := exec(t, ctx, conn, "SHOW_TLS")
	if string(res.Rows[0][0]) != "on" {
		t.Errorf("TLS = %s", res.Rows[0][0])
	}
	exec(t, ctx, conn, "IDENTIFY_SYSTEM")
}

func testTLSConfig(t *testing.T) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}
