// Package tlstest makes a certificate authority for tests and issues server
// certificates from it, so that every TLS test verifies the way an operator
// would configure it: sslmode=verify-full (or a tls.Config with RootCAs)
// against a CA the test made, never InsecureSkipVerify: a test that
// skipped the check would pass with a broken one.
//
// What it owns:
//
//   - A CA (NewCA): an ECDSA P-256 key and a self-signed CA certificate
//     valid for a day around now, written to dir/ca.crt (mode 0644) and
//     kept in a CertPool.
//   - Server certificates (CA.Issue): for 127.0.0.1, ::1 and localhost,
//     with a common name the test chooses and a new serial number each,
//     written as PEM to the certificate and key files the test names (the
//     key 0600, first; each file replaced atomically by a rename), so that
//     a server watching them for rotation never reads half a pair. The
//     serial number is returned, for a test that checks which certificate
//     a server presents.
//   - Client configuration (CA.ClientConfig): a tls.Config that trusts
//     only the CA, for a server name.
//
// The files are PEM so that PostgreSQL's programs (psql, pg_receivewal, a
// standby's walreceiver) can read them when they run as the postgres user:
// the directory given to NewCA must be readable by that user
// (test/pgtest's Dir makes one). There is no lifecycle beyond the files:
// they live in the directories the test gave, which its cleanup removes.
//
// Used by the server's and the CLI's TLS tests and by test/e2e's TLS
// pipeline; it imports nothing from this module.
package tlstest
