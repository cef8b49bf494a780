package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// TLS (Config.TLSCertFile, TLSKeyFile): one certificate for the
// PostgreSQL port (an SSLRequest is answered 'S', TLS 1.2 or later) and the
// HTTP API (HTTPS). It is re-read on ReloadTLS (SIGHUP) and when either
// file changes (checked every tlsWatchInterval), so a certificate rotates
// without a restart; a file that does not load keeps the previous
// certificate, and the failure is logged.

// tlsWatchInterval is how often the certificate files are checked for a
// change.
const tlsWatchInterval = 2 * time.Second

type certSource struct {
	certFile, keyFile string
	log               *slog.Logger
	cur               atomic.Pointer[tls.Certificate]

	mu   sync.Mutex // serialises loads; guards seen
	seen [2]fileStamp
}

// fileStamp tells a changed file: its modification time and size.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stamp(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}
}

// newCertSource loads the pair; the first load must succeed.
func newCertSource(certFile, keyFile string, log *slog.Logger) (*certSource, error) {
	c := &certSource{certFile: certFile, keyFile: keyFile, log: log}
	if err := c.load(); err != nil {
		return nil, err
	}
	return c, nil
}

// load reads the pair and, if it is valid, makes it current.
func (c *certSource) load() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := [2]fileStamp{stamp(c.certFile), stamp(c.keyFile)}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		c.seen = seen // not retried until a file changes again
		return fmt.Errorf("TLS certificate %s, key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cur.Store(&cert)
	c.seen = seen
	return nil
}

// reload loads the pair again, logging the outcome; a failure keeps the
// previous certificate.
func (c *certSource) reload(why string) error {
	err := c.load()
	if err != nil {
		c.log.Error("TLS certificate not reloaded; keeping the previous one", "reason", why, "err", err)
		return err
	}
	subject := ""
	if leaf := c.cur.Load().Leaf; leaf != nil {
		subject = leaf.Subject.String() + ", expires " + leaf.NotAfter.UTC().Format(time.RFC3339)
	}
	c.log.Info("TLS certificate reloaded", "reason", why, "cert", c.certFile, "subject", subject)
	return nil
}

// watch reloads the pair whenever a file's stamp changes, until ctx ends.
func (c *certSource) watch(ctx context.Context) {
	t := time.NewTicker(tlsWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		changed := [2]fileStamp{stamp(c.certFile), stamp(c.keyFile)} != c.seen
		c.mu.Unlock()
		if changed {
			c.reload("file changed")
		}
	}
}

func (c *certSource) config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.cur.Load(), nil
		},
	}
}

// ReloadTLS re-reads the certificate and key files (on SIGHUP). Without
// TLS it does nothing and returns nil; a file that does not load keeps the
// previous certificate and is returned.
func (s *Server) ReloadTLS() error {
	if s.certs == nil {
		return nil
	}
	return s.certs.reload("SIGHUP")
}

// Reload re-reads what SIGHUP re-reads: the TLS certificate and key, and
// the auth public keys. A file that does not load keeps what was loaded
// before; the errors are returned (and logged).
func (s *Server) Reload() error {
	var errs []error
	if err := s.ReloadTLS(); err != nil {
		errs = append(errs, err)
	}
	if s.auth != nil {
		if err := s.auth.reload(); err != nil {
			s.log.Error("auth public keys not reloaded; keeping the previous ones", "err", err)
			errs = append(errs, err)
		} else {
			s.log.Info("auth public keys reloaded", "files", s.auth.paths)
		}
	}
	return errors.Join(errs...)
}

// Reloadable reports whether Reload has anything to re-read.
func (s *Server) Reloadable() bool { return s.certs != nil || s.auth != nil }

// TLSEnabled reports whether the server has a certificate.
func (s *Server) TLSEnabled() bool { return s.certs != nil }
