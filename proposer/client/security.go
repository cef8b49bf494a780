package client

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Security is how the proposer, sync, wal fetch and timeline pull connect
// to safekeepers: libpq's sslmode and sslrootcert (pgconn implements them),
// and the password a safekeeper asks for (a token, when auth is on).
type Security struct {
	// SSLMode is libpq's: disable (the default), allow, prefer, require,
	// verify-ca or verify-full.
	SSLMode string
	// SSLRootCert is the CA file verify-ca and verify-full check the
	// safekeeper's certificate against.
	SSLRootCert string
	// Password is sent when a safekeeper asks for one (a token), unless
	// PasswordFile is set. It stays fixed for the life of the value.
	Password string
	// PasswordFile, when set, is read again at every new connection to a
	// safekeeper, and its content, trimmed of surrounding whitespace, is
	// the password (it overrides Password): a token rotated in the file
	// (docs/security.md) is taken by the next connection without restarting
	// the client. A file that cannot be read, or is empty, fails that
	// connection attempt with an error naming the file; the caller's usual
	// retry tries again. Write a new token to a temporary file and rename
	// it over the old one, so that no connection reads half of it.
	PasswordFile string
}

// ErrPasswordFileEmpty: Security.PasswordFile holds nothing but whitespace
// (perhaps it is being rewritten in place); the connection attempt fails.
var ErrPasswordFileEmpty = errors.New("proposer: token file is empty")

// CheckSSLMode reports whether mode is one of libpq's sslmodes.
func CheckSSLMode(mode string) error {
	switch mode {
	case "", "disable", "allow", "prefer", "require", "verify-ca", "verify-full":
		return nil
	}
	return fmt.Errorf("sslmode %q: want disable, allow, prefer, require, verify-ca or verify-full", mode)
}

// password is the password to send: PasswordFile's content, read now,
// or Password.
func (s Security) password() (string, error) {
	if s.PasswordFile == "" {
		return s.Password, nil
	}
	b, err := os.ReadFile(s.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("proposer: read token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%w: %s", ErrPasswordFileEmpty, s.PasswordFile)
	}
	return tok, nil
}

// params is the part of a connection string that Security sets. With a
// PasswordFile it reads the file, so call it once per connection attempt.
func (s Security) params() (string, error) {
	pw, err := s.password()
	if err != nil {
		return "", err
	}
	mode := s.SSLMode
	if mode == "" {
		mode = "disable"
	}
	p := "sslmode=" + mode
	if s.SSLRootCert != "" {
		p += " sslrootcert=" + quoteConnValue(s.SSLRootCert)
	}
	if pw != "" {
		p += " password=" + quoteConnValue(pw)
	}
	return p, nil
}

// quoteConnValue quotes a keyword/value connection string value.
func quoteConnValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
