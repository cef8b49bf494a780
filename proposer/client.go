package proposer

import (
	"context"

	"github.com/safekeeper/safekeeper/proposer/client"
)

// Security is how Run, Sync and the command line connect to the
// safekeepers (client.Security): Config and SyncConfig carry it.
type Security = client.Security

// ErrUpstreamInRecovery: --upstream names a server in recovery, not a
// primary; Run's session ends before it campaigns (client's, the same
// value).
var ErrUpstreamInRecovery = client.ErrUpstreamInRecovery

// The WAL push client and the connection checks moved to package client.
// These names stay for the callers that still use them (the server's and
// the integration tests, the command line); new code uses client's.
type (
	// Deprecated: use client.Conn.
	Conn = client.Conn
	// Deprecated: use client.DialConfig.
	DialConfig = client.DialConfig
)

// Deprecated: use client.Dial.
func Dial(ctx context.Context, cfg DialConfig) (*Conn, error) { return client.Dial(ctx, cfg) }

// Deprecated: use client.CheckSSLMode.
func CheckSSLMode(mode string) error { return client.CheckSSLMode(mode) }

// Deprecated: use client.CheckConnString.
func CheckConnString(s string) error { return client.CheckConnString(s) }

var (
	// Deprecated: use client.ErrStreamEnded.
	ErrStreamEnded = client.ErrStreamEnded
	// Deprecated: use client.ErrPasswordFileEmpty.
	ErrPasswordFileEmpty = client.ErrPasswordFileEmpty
)
