package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/safekeeper/safekeeper/proto"
)

// DefaultPrefix is the keys' prefix when none is given (--etcd-prefix).
const DefaultPrefix = "/safekeeper"

// opTimeout bounds one request to etcd: past it the caller gets an error
// naming etcd rather than a wait.
const opTimeout = 5 * time.Second

// ClientConfig is how to reach etcd: the flags --etcd-endpoints,
// --etcd-prefix, --etcd-cacert, --etcd-cert, --etcd-key, --etcd-user and
// --etcd-password-file.
type ClientConfig struct {
	Endpoints []string
	Prefix    string // default DefaultPrefix
	// CACert verifies the members' certificates (TLS on when set or when
	// an endpoint is https://); Cert and Key are this client's.
	CACert, Cert, Key string
	// User and Password: etcd's own authentication (etcdctl --user).
	User, Password string
	// DialTimeout bounds the first connection; default 5 s.
	DialTimeout time.Duration
}

// Client is a connection to etcd and the keys of one fleet.
type Client struct {
	cli       *clientv3.Client
	prefix    string
	endpoints string
}

// Connect makes a client of cfg. etcd need not be up: requests made while
// it is down fail with an error naming it (Unavailable).
func Connect(cfg ClientConfig) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("fleet: no etcd endpoints")
	}
	prefix := strings.TrimRight(cfg.Prefix, "/")
	if cfg.Prefix == "" {
		prefix = DefaultPrefix
	}
	if prefix != "" && !strings.HasPrefix(prefix, "/") {
		return nil, fmt.Errorf("fleet: etcd prefix %q: want a path starting with /", cfg.Prefix)
	}
	c := clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Username:             cfg.User,
		Password:             cfg.Password,
		Logger:               zap.NewNop(), // errors reach the caller, named
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = opTimeout
	}
	if (cfg.Cert == "") != (cfg.Key == "") {
		return nil, errors.New("fleet: --etcd-cert and --etcd-key go together")
	}
	secure := cfg.CACert != "" || cfg.Cert != ""
	for _, e := range cfg.Endpoints {
		secure = secure || strings.HasPrefix(e, "https://")
	}
	if secure {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.CACert != "" {
			pem, err := os.ReadFile(cfg.CACert)
			if err != nil {
				return nil, fmt.Errorf("fleet: --etcd-cacert: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("fleet: --etcd-cacert %s: no PEM certificate in it", cfg.CACert)
			}
		}
		if cfg.Cert != "" {
			pair, err := tls.LoadX509KeyPair(cfg.Cert, cfg.Key)
			if err != nil {
				return nil, fmt.Errorf("fleet: --etcd-cert/--etcd-key: %w", err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		c.TLS = tc
	}
	cli, err := clientv3.New(c)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	return &Client{cli: cli, prefix: prefix, endpoints: strings.Join(cfg.Endpoints, ",")}, nil
}

// Ping reports whether etcd answers a read within ctx.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.cli.Get(ctx, c.prefix+"/", clientv3.WithCountOnly())
	return c.unavailable(err)
}

// Close closes the connection.
func (c *Client) Close() error { return c.cli.Close() }

// Etcd is the etcd client, for what this package does not wrap (the
// controller's election).
func (c *Client) Etcd() *clientv3.Client { return c.cli }

// Prefix is the fleet's key prefix.
func (c *Client) Prefix() string { return c.prefix }

// Endpoints is the endpoints as given, for messages.
func (c *Client) Endpoints() string { return c.endpoints }

// ErrUnavailable wraps every failure to reach etcd: the message names its
// endpoints.
var ErrUnavailable = errors.New("etcd unavailable")

// unavailable names etcd in err.
func (c *Client) unavailable(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w (%s): %v", ErrUnavailable, c.endpoints, err)
}

func (c *Client) nodeKey(id uint64) string  { return c.prefix + "/nodes/" + strconv.FormatUint(id, 10) }
func (c *Client) aliveKey(id uint64) string { return c.prefix + "/alive/" + strconv.FormatUint(id, 10) }
func (c *Client) nodesPrefix() string       { return c.prefix + "/nodes/" }
func (c *Client) alivePrefix() string       { return c.prefix + "/alive/" }
func (c *Client) timelinesPrefix() string   { return c.prefix + "/timelines/" }
func (c *Client) placementKey() string      { return c.prefix + "/placement" }
func (c *Client) ElectionPrefix() string    { return c.prefix + "/controller/" }
func (c *Client) TimelineKey(tenant, timeline proto.ID) string {
	return c.timelinesPrefix() + tenant.String() + "/" + timeline.String()
}

// ctx bounds one request.
func opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, opTimeout)
}
