package auth

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/safekeeper/safekeeper/proto"
)

var (
	// ErrUnauthorized is wrapped by every refusal of Verify: no valid token.
	// The text after it says why, for the log; the client is not told.
	ErrUnauthorized = errors.New("auth: unauthorized")
	// ErrForbidden is wrapped by CheckTenant and CheckAdmin: a valid token
	// that does not grant what was asked.
	ErrForbidden = errors.New("auth: forbidden")
	// ErrBadClaims is wrapped by Issue's refusals: a scope, tenant or ttl
	// that makes no token Verify would accept.
	ErrBadClaims = errors.New("auth: bad claims")
)

// Scope is a token's "scope" claim, as Neon names it.
type Scope string

const (
	// ScopeTenant grants one tenant's timelines: pushing and reading WAL,
	// the tenant's HTTP endpoints. Its token carries tenant_id.
	ScopeTenant Scope = "tenant"
	// ScopeSafekeeperData grants every tenant and the admin endpoints: what
	// the storage controller, peer safekeepers and the operator use.
	ScopeSafekeeperData Scope = "safekeeperdata"
)

// ParseScope parses a scope's name: "tenant" or "safekeeperdata".
func ParseScope(s string) (Scope, error) {
	switch sc := Scope(s); sc {
	case ScopeTenant, ScopeSafekeeperData:
		return sc, nil
	}
	return "", fmt.Errorf("%w: scope %q: want %q or %q", ErrBadClaims, s, ScopeTenant, ScopeSafekeeperData)
}

// Leeway is how far exp and nbf may be past (or ahead) and a token still
// verify: clocks of the issuer and the safekeeper a few seconds apart, as
// NTP keeps them, must not refuse a fresh token or cut one short.
const Leeway = 5 * time.Second

// MaxTokenLen is the longest token Verify reads. Ours are about 200 bytes;
// the bound keeps a client from making the server decode megabytes.
const MaxTokenLen = 8 << 10

// Claims is what a verified token grants.
type Claims struct {
	Scope Scope
	// TenantID is the token's tenant for ScopeTenant; for
	// ScopeSafekeeperData it is nil unless the token names one (Neon
	// permits it; it grants nothing more).
	TenantID *proto.ID
	// ExpiresAt is exp; zero if the token has none (never expires).
	ExpiresAt time.Time
	// IssuedAt is iat; zero if the token has none.
	IssuedAt time.Time
}

// CheckTenant permits access to tenant: nil for ScopeSafekeeperData or a
// ScopeTenant token of that tenant, an error wrapping ErrForbidden
// otherwise (also for nil Claims).
func (c *Claims) CheckTenant(tenant proto.ID) error {
	switch {
	case c == nil:
		return fmt.Errorf("%w: no claims", ErrForbidden)
	case c.Scope == ScopeSafekeeperData:
		return nil
	case c.Scope == ScopeTenant && c.TenantID != nil && *c.TenantID == tenant:
		return nil
	case c.Scope == ScopeTenant && c.TenantID != nil:
		return fmt.Errorf("%w: token of tenant %s, not of tenant %s", ErrForbidden, *c.TenantID, tenant)
	}
	return fmt.Errorf("%w: scope %q does not grant tenant %s", ErrForbidden, c.Scope, tenant)
}

// CheckAdmin permits what concerns every tenant (listing timelines, the
// admin endpoints): nil only for ScopeSafekeeperData, an error wrapping
// ErrForbidden otherwise.
func (c *Claims) CheckAdmin() error {
	if c != nil && c.Scope == ScopeSafekeeperData {
		return nil
	}
	if c == nil {
		return fmt.Errorf("%w: no claims", ErrForbidden)
	}
	return fmt.Errorf("%w: scope %q, want %q", ErrForbidden, c.Scope, ScopeSafekeeperData)
}

// tokenClaims is a token's claims on the wire. Neon's safekeeper reads
// exactly scope and tenant_id; the registered claims bring exp, nbf and iat
// (checked by jwt's validator) and the rest, ignored.
type tokenClaims struct {
	Scope    string  `json:"scope"`
	TenantID *string `json:"tenant_id,omitempty"`
	jwt.RegisteredClaims
}

// Verify checks token (a JWT in compact form) against the Verifier's keys
// and returns what it grants. The rules are in the package comment; every
// refusal wraps ErrUnauthorized.
func (v *Verifier) Verify(token string) (*Claims, error) {
	return v.verifyAt(token, time.Now())
}

// verifyAt is Verify at time now.
func (v *Verifier) verifyAt(token string, now time.Time) (*Claims, error) {
	if v == nil || len(v.keys.Keys) == 0 {
		return nil, fmt.Errorf("%w: no verification keys", ErrUnauthorized)
	}
	if len(token) > MaxTokenLen {
		return nil, fmt.Errorf("%w: token of %d bytes, more than %d", ErrUnauthorized, len(token), MaxTokenLen)
	}
	if strings.Count(token, ".") != 2 {
		return nil, fmt.Errorf("%w: token malformed: want three dot-separated segments", ErrUnauthorized)
	}
	if i := strings.IndexFunc(token, func(r rune) bool { return !isTokenChar(r) }); i >= 0 {
		return nil, fmt.Errorf("%w: token malformed: byte %d is not base64url or '.'", ErrUnauthorized, i)
	}
	p := jwt.NewParser(
		jwt.WithValidMethods([]string{jwt.SigningMethodEdDSA.Alg()}),
		jwt.WithLeeway(Leeway),
		jwt.WithTimeFunc(func() time.Time { return now }),
		jwt.WithStrictDecoding(),
	)
	var tc tokenClaims
	_, err := p.ParseWithClaims(token, &tc, func(t *jwt.Token) (any, error) {
		// WithValidMethods has refused every other alg; this keeps an HMAC
		// from ever being handed key bytes should that change.
		if t.Method != jwt.SigningMethodEdDSA {
			return nil, fmt.Errorf("alg %v is not EdDSA", t.Header["alg"])
		}
		return v.keys, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnauthorized, err)
	}
	if err := checkStrict(token); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnauthorized, err)
	}
	c := &Claims{Scope: Scope(tc.Scope)}
	if tc.ExpiresAt != nil {
		c.ExpiresAt = tc.ExpiresAt.Time
	}
	if tc.IssuedAt != nil {
		c.IssuedAt = tc.IssuedAt.Time
	}
	if tc.TenantID != nil {
		id, err := proto.ParseID(*tc.TenantID)
		if err != nil {
			return nil, fmt.Errorf("%w: tenant_id: %w", ErrUnauthorized, err)
		}
		c.TenantID = &id
	}
	switch c.Scope {
	case ScopeTenant:
		if c.TenantID == nil {
			return nil, fmt.Errorf("%w: scope %q without tenant_id", ErrUnauthorized, c.Scope)
		}
	case ScopeSafekeeperData:
	default:
		return nil, fmt.Errorf("%w: scope %q is not one a safekeeper accepts (%q, %q)", ErrUnauthorized, c.Scope, ScopeTenant, ScopeSafekeeperData)
	}
	return c, nil
}

// claimNames are the payload keys json.Unmarshal fills tokenClaims from.
// It matches keys to them case-insensitively (with Unicode folding:
// "ſcope" is "scope" to it), so any other spelling is refused rather than
// read as one of them.
var claimNames = []string{"scope", "tenant_id", "exp", "nbf", "iat", "iss", "sub", "aud", "jti"}

// maxJSONDepth bounds the nesting checkJSON walks; our claims are flat.
const maxJSONDepth = 16

// checkStrict refuses what jwt's parser lets through but a token must not
// hold, so that one token means one thing to every reader: a key twice in
// the header or the payload (which one wins differs between decoders), a
// payload key that is one of claimNames in another case, and a "crit"
// header (RFC 7515 §4.1.11: a recipient must refuse extensions it does not
// understand, and this one understands none). token has been verified, so
// its segments decode.
func checkStrict(token string) error {
	parts := strings.Split(token, ".")
	header, err := base64.RawURLEncoding.Strict().DecodeString(parts[0])
	if err != nil {
		return fmt.Errorf("header: %w", err)
	}
	payload, err := base64.RawURLEncoding.Strict().DecodeString(parts[1])
	if err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	err = checkJSON(header, func(key string) error {
		if strings.EqualFold(key, "crit") {
			return fmt.Errorf("header %q: no critical extension is understood here", key)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("header: %w", err)
	}
	err = checkJSON(payload, func(key string) error {
		for _, n := range claimNames {
			if key != n && strings.EqualFold(key, n) {
				return fmt.Errorf("claim %q: the claim is %q", key, n)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("claims: %w", err)
	}
	return nil
}

// checkJSON checks that b is one JSON object with no key twice in any
// object within, calling top for each of its own keys.
func checkJSON(b []byte, top func(key string) error) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return errors.New("not a JSON object")
	}
	if err := checkObject(dec, top, 1); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON object")
	}
	return nil
}

// checkObject reads the rest of an object whose '{' dec has read.
func checkObject(dec *json.Decoder, check func(key string) error, depth int) error {
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, ok := tok.(string)
		if !ok {
			return fmt.Errorf("key %v is not a string", tok)
		}
		if seen[key] {
			return fmt.Errorf("key %q twice", key)
		}
		seen[key] = true
		if check != nil {
			if err := check(key); err != nil {
				return err
			}
		}
		if err := checkValue(dec, depth); err != nil {
			return err
		}
	}
	_, err := dec.Token() // '}'
	return err
}

// checkValue reads one value, checking the objects within.
func checkValue(dec *json.Decoder, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	if depth >= maxJSONDepth {
		return fmt.Errorf("nested more than %d deep", maxJSONDepth)
	}
	if d == '{' {
		return checkObject(dec, nil, depth+1)
	}
	for dec.More() { // '['
		if err := checkValue(dec, depth+1); err != nil {
			return err
		}
	}
	_, err = dec.Token() // ']'
	return err
}

// isTokenChar reports whether r may appear in a compact JWT: base64url
// without padding, and the dots.
func isTokenChar(r rune) bool {
	return 'A' <= r && r <= 'Z' || 'a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '-' || r == '_' || r == '.'
}

// Issue signs a token of scope with priv: tenant must be given for
// ScopeTenant and nil for ScopeSafekeeperData. It carries iat = now and, if
// ttl > 0, exp = now + ttl (whole seconds, rounded down, as JWT's
// NumericDate). ttl 0 makes a token that never expires: allowed because
// Neon's tooling uses such tokens, but then only removing its key from
// every safekeeper revokes it. A negative ttl, or one under a second, is
// refused.
func Issue(priv ed25519.PrivateKey, scope Scope, tenant *proto.ID, ttl time.Duration, now time.Time) (string, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return "", fmt.Errorf("%w: private key of %d bytes, want %d", ErrBadClaims, len(priv), ed25519.PrivateKeySize)
	}
	if _, err := ParseScope(string(scope)); err != nil {
		return "", err
	}
	switch {
	case scope == ScopeTenant && tenant == nil:
		return "", fmt.Errorf("%w: scope %q needs a tenant id", ErrBadClaims, scope)
	case scope == ScopeSafekeeperData && tenant != nil:
		return "", fmt.Errorf("%w: scope %q covers every tenant; it takes no tenant id", ErrBadClaims, scope)
	case ttl < 0:
		return "", fmt.Errorf("%w: ttl %v is negative", ErrBadClaims, ttl)
	case ttl > 0 && ttl < time.Second:
		return "", fmt.Errorf("%w: ttl %v is under a second (exp has whole seconds)", ErrBadClaims, ttl)
	}
	tc := tokenClaims{Scope: string(scope)}
	if tenant != nil {
		s := tenant.String()
		tc.TenantID = &s
	}
	tc.IssuedAt = jwt.NewNumericDate(now)
	if ttl > 0 {
		tc.ExpiresAt = jwt.NewNumericDate(now.Add(ttl))
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodEdDSA, tc).SignedString(priv)
	if err != nil {
		return "", fmt.Errorf("auth: sign: %w", err)
	}
	return s, nil
}
