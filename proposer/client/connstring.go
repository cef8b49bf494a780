package client

import (
	"fmt"
	"slices"
	"sort"

	"github.com/jackc/pgx/v5/pgconn"
)

// libpqKeywords are the connection keywords of PostgreSQL 15's libpq, in
// its order (PQconndefaults of libpq 15.18): a connection string libpq
// takes uses these and no others; psql answers any other with `invalid
// connection option "..."`.
var libpqKeywords = []string{
	"service", "user", "password", "passfile", "channel_binding", "connect_timeout", "dbname", "host", "hostaddr", "port",
	"client_encoding", "options", "application_name", "fallback_application_name", "keepalives", "keepalives_idle",
	"keepalives_interval", "keepalives_count", "tcp_user_timeout", "sslmode", "sslcompression", "sslcert", "sslkey",
	"sslpassword", "sslrootcert", "sslcrl", "sslcrldir", "sslsni", "requirepeer", "ssl_min_protocol_version",
	"ssl_max_protocol_version", "gssencmode", "krbsrvname", "gsslib", "replication", "target_session_attrs",
}

// startupKeywords are the libpq keywords that go to the server in the
// startup packet, as libpq sends them: pgconn passes every key it does not
// use itself there (Config.RuntimeParams), and of libpq's keywords the
// server takes only these; any other there is refused (FATAL 42704
// unrecognized configuration parameter), at every reconnect.
var startupKeywords = []string{"application_name", "client_encoding", "options", "replication"}

// pgxOnlyKeys are keys pgconn takes as its own settings that libpq 15 does
// not know (pgconn's ParseConfig, notRuntimeParams).
var pgxOnlyKeys = []string{"servicefile", "krbspn", "sslnegotiation", "min_protocol_version", "max_protocol_version", "sslcertmode", "require_auth"}

// ConnStringError is a connection string (Config.Upstream) with a keyword
// the proposer cannot use: one libpq does not know (Unsupported false: a
// typo, "hots=" for "host=", which pgconn would send to the server as a
// setting while it connects to the default socket), or one of libpq's
// that pgconn does not support and would send to the server as a setting
// (Unsupported true: keepalives, hostaddr, requirepeer, ...).
type ConnStringError struct {
	Keyword     string
	Unsupported bool
	// Suggest is a libpq keyword close to an unknown Keyword ("host" for
	// "hots"), or "".
	Suggest string
	// Err is pgconn's refusal when the keyword could not be named.
	Err error
}

func (e *ConnStringError) Error() string {
	switch {
	case e.Keyword == "":
		return fmt.Sprintf("proposer: connection string: %v", e.Err)
	case e.Unsupported:
		return fmt.Sprintf("proposer: connection option %q is libpq's, but the proposer's PostgreSQL client (pgx) does not support it: it would send it to the server as a setting, which refuses it; remove it", e.Keyword)
	case e.Suggest != "":
		return fmt.Sprintf("proposer: invalid connection option %q (libpq 15 does not know it; did you mean %q?)", e.Keyword, e.Suggest)
	}
	return fmt.Sprintf("proposer: invalid connection option %q (libpq 15 does not know it)", e.Keyword)
}

func (e *ConnStringError) Unwrap() error { return e.Err }

// CheckConnString checks a libpq connection string (keyword/value or URL)
// as libpq 15 would, before it is used to connect: a syntax error is
// pgconn's *ParseConfigError; a keyword libpq does not know, or one of
// libpq's that pgconn would send to the server as a setting, is a
// *ConnStringError naming it. pgconn alone takes any unknown keyword and
// sends it to the server as a setting, and a mistyped "host" then leaves
// the default Unix socket, so the proposer would retry forever.
func CheckConnString(s string) error {
	cfg, err := pgconn.ParseConfig(s)
	if err != nil {
		return err
	}
	if _, err := pgconn.ParseConfigWithOptions(s, pgconn.ParseConfigOptions{ConnStringAllowedKeys: libpqKeywords}); err != nil {
		// pgconn's refusal does not name the key for a program: find it.
		// An unknown key is a setting for the server (RuntimeParams),
		// unless the environment put it there (PGTZ: timezone).
		env, envErr := pgconn.ParseConfig("")
		for _, k := range sortedKeys(cfg.RuntimeParams) {
			if slices.Contains(libpqKeywords, k) || (envErr == nil && env.RuntimeParams[k] == cfg.RuntimeParams[k]) {
				continue
			}
			return &ConnStringError{Keyword: k, Suggest: closestKeyword(k), Err: err}
		}
		for _, k := range pgxOnlyKeys {
			if _, e := pgconn.ParseConfigWithOptions(s, pgconn.ParseConfigOptions{ConnStringAllowedKeys: append(slices.Clone(libpqKeywords), k)}); e == nil {
				return &ConnStringError{Keyword: k, Suggest: closestKeyword(k), Err: err}
			}
		}
		return &ConnStringError{Err: err}
	}
	for _, k := range sortedKeys(cfg.RuntimeParams) {
		if slices.Contains(libpqKeywords, k) && !slices.Contains(startupKeywords, k) {
			return &ConnStringError{Keyword: k, Unsupported: true}
		}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// closestKeyword is the libpq keyword at most two edits from k (the
// closest, the first in libpqKeywords' order among equals), or "".
func closestKeyword(k string) string {
	best, bestD := "", 3
	for _, w := range libpqKeywords {
		if d := editDistance(k, w); d < bestD {
			best, bestD = w, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
