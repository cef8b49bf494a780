package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a test certificate authority.
type CA struct {
	Cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	CertFile string // PEM, mode 0644
	Pool     *x509.CertPool
	dir      string
	serial   int64
}

// NewCA makes a CA and writes its certificate to dir/ca.crt. dir must be
// readable by whoever verifies with it.
func NewCA(t testing.TB, dir string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "safekeeper test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &CA{Cert: cert, key: key, CertFile: filepath.Join(dir, "ca.crt"), Pool: x509.NewCertPool(), dir: dir, serial: 1}
	ca.Pool.AddCert(cert)
	writePEM(t, ca.CertFile, "CERTIFICATE", der, 0o644)
	return ca
}

// Issue makes a server certificate for 127.0.0.1, ::1 and localhost with
// the common name cn and writes it to certFile and keyFile (mode 0600; the
// key file goes to the safekeeper, which runs as the test's user). It
// returns the certificate's serial number.
func (ca *CA) Issue(t testing.TB, cn, certFile, keyFile string) *big.Int {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(12 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, // a server's, or a client's (etcd's client certificates)
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// Key first, then the certificate: a watcher that sees the new
	// certificate finds its key already there.
	writePEM(t, keyFile, "PRIVATE KEY", kder, 0o600)
	writePEM(t, certFile, "CERTIFICATE", der, 0o644)
	return tmpl.SerialNumber
}

// ClientConfig is a tls.Config trusting only the CA, for serverName.
func (ca *CA) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{RootCAs: ca.Pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
}

// writePEM writes one PEM block atomically (temporary file, rename), so a
// reader never sees half a file.
func writePEM(t testing.TB, path, typ string, der []byte, mode os.FileMode) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
