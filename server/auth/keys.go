package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/golang-jwt/jwt/v5"
)

// ErrBadKeyFile is wrapped by every error about a key file's contents: no
// usable key in it, a key that is not Ed25519, a PEM block that does not
// parse, a private key where only public keys belong.
var ErrBadKeyFile = errors.New("auth: bad key file")

// PEM block types of the key files (RFC 7468).
const (
	pemPublicKey  = "PUBLIC KEY"  // PKIX SubjectPublicKeyInfo
	pemPrivateKey = "PRIVATE KEY" // PKCS#8, unencrypted
)

// Verifier checks tokens against a set of Ed25519 public keys. It is
// immutable and safe for concurrent use.
type Verifier struct {
	keys jwt.VerificationKeySet
}

// NewVerifier is a Verifier of keys (at least one, each
// ed25519.PublicKeySize bytes).
func NewVerifier(keys ...ed25519.PublicKey) (*Verifier, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no public keys", ErrBadKeyFile)
	}
	v := &Verifier{}
	for i, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("%w: key %d is %d bytes, want %d", ErrBadKeyFile, i, len(k), ed25519.PublicKeySize)
		}
		v.keys.Keys = append(v.keys.Keys, append(ed25519.PublicKey(nil), k...))
	}
	return v, nil
}

// LoadVerifier reads the Ed25519 public keys of one or more PEM files, each
// with one or more PKIX "PUBLIC KEY" blocks; a token verifies if any of
// them verifies it. Other PEM blocks (certificates, parameters) and text
// between blocks are skipped. Refused, naming the file: a file without an
// Ed25519 public key, a PUBLIC KEY block that does not parse or holds
// another algorithm's key, and a file that holds a private key (only the
// signer needs it; a safekeeper must not have it).
func LoadVerifier(paths ...string) (*Verifier, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("%w: no public key files given", ErrBadKeyFile)
	}
	var keys []ed25519.PublicKey
	for _, p := range paths {
		ks, err := loadPublicKeys(p)
		if err != nil {
			return nil, err
		}
		keys = append(keys, ks...)
	}
	return NewVerifier(keys...)
}

func loadPublicKeys(path string) ([]ed25519.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: public key file: %w", err)
	}
	var keys []ed25519.PublicKey
	for n := 1; ; n++ {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		switch b.Type {
		case pemPublicKey:
			k, err := x509.ParsePKIXPublicKey(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: PEM block %d (%s): %w", ErrBadKeyFile, path, n, b.Type, err)
			}
			ek, ok := k.(ed25519.PublicKey)
			if !ok {
				return nil, fmt.Errorf("%w: %s: PEM block %d is a %T, want an Ed25519 public key", ErrBadKeyFile, path, n, k)
			}
			keys = append(keys, ek)
		case pemPrivateKey, "ENCRYPTED PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY":
			return nil, fmt.Errorf("%w: %s: PEM block %d is a private key; give the safekeeper only public keys (openssl pkey -in PRIVATE -pubout)", ErrBadKeyFile, path, n)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: %s: no Ed25519 public key (a PEM \"PUBLIC KEY\" block)", ErrBadKeyFile, path)
	}
	return keys, nil
}

// LoadPrivateKey reads the Ed25519 private key of a PEM file: its first
// PKCS#8 "PRIVATE KEY" block (other blocks are skipped).
func LoadPrivateKey(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: private key file: %w", err)
	}
	for n := 1; ; n++ {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != pemPrivateKey {
			continue
		}
		k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: PEM block %d (%s): %w", ErrBadKeyFile, path, n, b.Type, err)
		}
		ek, ok := k.(ed25519.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("%w: %s: PEM block %d is a %T, want an Ed25519 private key", ErrBadKeyFile, path, n, k)
		}
		return ek, nil
	}
	return nil, fmt.Errorf("%w: %s: no Ed25519 private key (a PEM \"PRIVATE KEY\" block, PKCS#8)", ErrBadKeyFile, path)
}

// GenerateKeys makes a new Ed25519 key pair (crypto/rand) and writes the
// private key to privPath (PKCS#8 PEM, mode 0600) and the public key to
// pubPath (PKIX PEM, mode 0644). Neither may exist: an existing file is
// never overwritten (the error wraps fs.ErrExist), since overwriting a
// private key would orphan every token it signed. Each file is written to
// a temporary file in its directory, fsynced, linked to its name (which
// fails if the name exists, unlike rename) and the directory fsynced, so
// that after a crash either the whole file is there or none. If the public
// key cannot be written, the private key just written is removed again.
func GenerateKeys(privPath, pubPath string) error {
	if filepath.Clean(privPath) == filepath.Clean(pubPath) {
		return fmt.Errorf("auth: private and public key files are both %s", privPath)
	}
	for _, p := range []string{privPath, pubPath} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("auth: %s: %w; refusing to overwrite a key file", p, fs.ErrExist)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("auth: %w", err)
		}
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("auth: generate key: %w", err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if err := writeNewFile(privPath, pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: privDER}), 0o600); err != nil {
		return err
	}
	if err := writeNewFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: pemPublicKey, Bytes: pubDER}), 0o644); err != nil {
		if rerr := os.Remove(privPath); rerr == nil {
			err = fmt.Errorf("%w (private key %s removed again)", err, privPath)
		}
		return err
	}
	return nil
}

// writeNewFile writes data to path, which must not exist, durably: a
// temporary file in path's directory (created 0600, then given mode),
// fsynced, hard-linked to path, unlinked, then the directory fsynced.
func writeNewFile(path string, data []byte, mode fs.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if f != nil {
			f.Close()
		}
		os.Remove(tmp) // after the link only the temporary name goes
	}()
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	err = f.Close()
	f = nil
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("auth: %s: %w; refusing to overwrite a key file", path, fs.ErrExist)
		}
		return fmt.Errorf("auth: %w", err)
	}
	if err := os.Remove(tmp); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("auth: fsync %s: %w", dir, err)
	}
	return nil
}
