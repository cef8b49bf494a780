package auth

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, dir, name string, data ...[]byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, bytes.Join(data, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestGenerateKeys(t *testing.T) {
	dir := t.TempDir()
	privPath, pubPath := filepath.Join(dir, "auth_private_key.pem"), filepath.Join(dir, "auth_public_key.pem")
	if err := GenerateKeys(privPath, pubPath); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]fs.FileMode{privPath: 0o600, pubPath: 0o644} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("directory holds %d entries, want the 2 key files (no temporary file left)", len(entries))
	}
	priv, err := LoadPrivateKey(privPath)
	if err != nil {
		t.Fatal(err)
	}
	v, err := LoadVerifier(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.keys.Keys) != 1 || !pub(priv).Equal(v.keys.Keys[0]) {
		t.Fatalf("the public key file does not hold the private key's public key")
	}
	tok, err := Issue(priv, ScopeTenant, &tenantA, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(tok); err != nil {
		t.Fatal(err)
	}

	// A second pair is another key.
	if err := GenerateKeys(filepath.Join(dir, "2.key"), filepath.Join(dir, "2.pub")); err != nil {
		t.Fatal(err)
	}
	priv2, err := LoadPrivateKey(filepath.Join(dir, "2.key"))
	if err != nil || priv2.Equal(priv) {
		t.Fatalf("second key: %v (equal to the first: %v)", err, priv2.Equal(priv))
	}
}

// TestGenerateKeysNeverOverwrites: an existing private or public key file
// is refused with fs.ErrExist, left as it was, and nothing else written.
func TestGenerateKeysNeverOverwrites(t *testing.T) {
	for _, existing := range []string{"priv", "pub"} {
		dir := t.TempDir()
		privPath, pubPath := filepath.Join(dir, "priv"), filepath.Join(dir, "pub")
		old := writeFile(t, dir, existing, []byte("old contents"))
		err := GenerateKeys(privPath, pubPath)
		if !errors.Is(err, fs.ErrExist) || !strings.Contains(err.Error(), old) {
			t.Errorf("%s exists: %v, want fs.ErrExist naming it", existing, err)
		}
		if data, _ := os.ReadFile(old); string(data) != "old contents" {
			t.Errorf("%s overwritten: %q", existing, data)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 1 {
			t.Errorf("%s exists: %d entries in the directory, want only it", existing, len(entries))
		}
	}
	dir := t.TempDir()
	if err := GenerateKeys(filepath.Join(dir, "k"), filepath.Join(dir, ".", "k")); err == nil {
		t.Errorf("the same file for both keys: no error")
	}
	if err := GenerateKeys(filepath.Join(dir, "no", "such", "dir", "k"), filepath.Join(dir, "p")); err == nil {
		t.Errorf("a private key in a missing directory: no error")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed GenerateKeys left %d entries", len(entries))
	}
}

// TestGenerateKeysPublicFails: if the public key cannot be written, the
// private key is removed again, so that a retry does not meet it.
func TestGenerateKeysPublicFails(t *testing.T) {
	dir := t.TempDir()
	privPath := filepath.Join(dir, "priv")
	err := GenerateKeys(privPath, filepath.Join(dir, "missing", "pub"))
	if err == nil {
		t.Fatal("no error")
	}
	if _, err := os.Stat(privPath); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("private key left behind: %v", err)
	}
}

// TestRotation: with the old and the new public key listed (in two files
// or in one), tokens of both verify; a third key's do not; with only the
// new key, the old one's tokens are refused.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	oldK, newK, otherK := testKey(1), testKey(2), testKey(3)
	oldPath := writeFile(t, dir, "old.pem", pubPEM(t, pub(oldK)))
	newPath := writeFile(t, dir, "new.pem", pubPEM(t, pub(newK)))
	bothPath := writeFile(t, dir, "both.pem", pubPEM(t, pub(oldK)), pubPEM(t, pub(newK)))
	oldTok := mustIssue(t, oldK, ScopeTenant, &tenantA, time.Hour)
	newTok := mustIssue(t, newK, ScopeTenant, &tenantA, time.Hour)
	otherTok := mustIssue(t, otherK, ScopeTenant, &tenantA, time.Hour)
	for _, paths := range [][]string{{oldPath, newPath}, {newPath, oldPath}, {bothPath}} {
		v, err := LoadVerifier(paths...)
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range []string{oldTok, newTok} {
			if _, err := v.verifyAt(tok, testNow); err != nil {
				t.Errorf("%v: %v", paths, err)
			}
		}
		if _, err := v.verifyAt(otherTok, testNow); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("%v: a third key's token: %v", paths, err)
		}
	}
	v, err := LoadVerifier(newPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.verifyAt(oldTok, testNow); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("old key removed, its token: %v", err)
	}
	if _, err := v.verifyAt(newTok, testNow); err != nil {
		t.Errorf("new key: %v", err)
	}
}

// TestKeyFileExtraBlocks: text and PEM blocks that are not keys (a
// certificate, EC parameters) around the public keys are skipped.
func TestKeyFileExtraBlocks(t *testing.T) {
	dir := t.TempDir()
	k := testKey(1)
	p := writeFile(t, dir, "keys.pem",
		[]byte("# safekeeper token keys, rotated 2026-03\n"),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not even DER")}),
		[]byte("some words between blocks\n"),
		pubPEM(t, pub(k)),
		pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: []byte{6, 8, 42}}),
		[]byte("trailing text"))
	v, err := LoadVerifier(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.verifyAt(mustIssue(t, k, ScopeSafekeeperData, nil, 0), testNow); err != nil {
		t.Fatal(err)
	}
	privPath := writeFile(t, dir, "priv.pem",
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("x")}),
		privPEM(t, k))
	priv, err := LoadPrivateKey(privPath)
	if err != nil || !priv.Equal(k) {
		t.Fatalf("private key after a certificate: %v", err)
	}
}

func privPEM(t *testing.T, k any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// TestBadKeyFiles: a public key file without a usable Ed25519 public key
// is refused with ErrBadKeyFile naming the file.
func TestBadKeyFiles(t *testing.T) {
	dir := t.TempDir()
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecDER, err := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	good := writeFile(t, dir, "good.pem", pubPEM(t, pub(testKey(1))))
	for name, data := range map[string][]byte{
		"empty.pem":       nil,
		"text.pem":        []byte("hello\n"),
		"cert-only.pem":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("x")}),
		"ec.pem":          append(pubPEM(t, pub(testKey(1))), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecDER})...),
		"corrupt.pem":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("not DER")}),
		"private.pem":     privPEM(t, testKey(1)),
		"pub+private.pem": append(pubPEM(t, pub(testKey(1))), privPEM(t, testKey(1))...),
		"raw-bytes.pem":   pub(testKey(1)),
	} {
		p := writeFile(t, dir, name, data)
		_, err := LoadVerifier(good, p)
		if !errors.Is(err, ErrBadKeyFile) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v; want ErrBadKeyFile naming the file", name, err)
		}
	}
	if _, err := LoadVerifier(filepath.Join(dir, "missing.pem")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := LoadVerifier(); !errors.Is(err, ErrBadKeyFile) {
		t.Errorf("no files: %v", err)
	}
	if _, err := NewVerifier(ed25519.PublicKey{1, 2, 3}); !errors.Is(err, ErrBadKeyFile) {
		t.Errorf("short key: %v", err)
	}

	// Private key files.
	for name, data := range map[string][]byte{
		"priv-empty.pem":   nil,
		"priv-public.pem":  pubPEM(t, pub(testKey(1))),
		"priv-ec.pem":      privPEM(t, ec),
		"priv-corrupt.pem": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("not DER")}),
	} {
		p := writeFile(t, dir, name, data)
		if _, err := LoadPrivateKey(p); !errors.Is(err, ErrBadKeyFile) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v; want ErrBadKeyFile naming the file", name, err)
		}
	}
	if _, err := LoadPrivateKey(filepath.Join(dir, "missing.pem")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing private key file: %v", err)
	}
}
