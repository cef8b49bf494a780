package proposer

import (
	"fmt"
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
	// Password is sent when a safekeeper asks for one.
	Password string
}

// CheckSSLMode reports whether mode is one of libpq's sslmodes.
func CheckSSLMode(mode string) error {
	switch mode {
	case "", "disable", "allow", "prefer", "require", "verify-ca", "verify-full":
		return nil
	}
	return fmt.Errorf("sslmode %q: want disable, allow, prefer, require, verify-ca or verify-full", mode)
}

// params is the part of a connection string that Security sets.
func (s Security) params() string {
	mode := s.SSLMode
	if mode == "" {
		mode = "disable"
	}
	p := "sslmode=" + mode
	if s.SSLRootCert != "" {
		p += " sslrootcert=" + quoteConnValue(s.SSLRootCert)
	}
	if s.Password != "" {
		p += " password=" + quoteConnValue(s.Password)
	}
	return p
}

// quoteConnValue quotes a keyword/value connection string value.
func quoteConnValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
