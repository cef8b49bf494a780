package auth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/safekeeper/safekeeper/proto"
)

// testNow is the fixed clock of these tests.
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// testKey is a fixed Ed25519 key (from seed byte b), so that tokens, and
// so the fuzz corpus, are the same every run.
func testKey(b byte) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed([]byte(strings.Repeat(string(rune(b)), ed25519.SeedSize)))
}

func pub(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

func mustVerifier(t testing.TB, keys ...ed25519.PrivateKey) *Verifier {
	t.Helper()
	var pubs []ed25519.PublicKey
	for _, k := range keys {
		pubs = append(pubs, pub(k))
	}
	v, err := NewVerifier(pubs...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

var tenantA = proto.ID{0xa1, 0xa2, 15: 0xaf}
var tenantB = proto.ID{0xb1, 0xb2, 15: 0xbf}

func mustIssue(t testing.TB, k ed25519.PrivateKey, scope Scope, tenant *proto.ID, ttl time.Duration) string {
	t.Helper()
	tok, err := Issue(k, scope, tenant, ttl, testNow)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// signed is a token of any claims and method, signed with key.
func signed(t testing.TB, m jwt.SigningMethod, claims jwt.MapClaims, key any) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(m, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// edHeader is the header Issue writes.
const edHeader = `{"alg":"EdDSA","typ":"JWT"}`

// rawSigned signs header and payload as written, byte for byte, with k.
func rawSigned(t testing.TB, k ed25519.PrivateKey, header, payload string) string {
	t.Helper()
	s := base64.RawURLEncoding.EncodeToString([]byte(header)) + "." + base64.RawURLEncoding.EncodeToString([]byte(payload))
	return s + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(k, []byte(s)))
}

func tenantClaims() jwt.MapClaims {
	return jwt.MapClaims{"scope": "tenant", "tenant_id": tenantA.String()}
}

func pubPEM(t testing.TB, k ed25519.PublicKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func TestIssueVerifyRoundTrip(t *testing.T) {
	k := testKey(1)
	v := mustVerifier(t, k)
	for _, tc := range []struct {
		scope  Scope
		tenant *proto.ID
		ttl    time.Duration
	}{
		{ScopeTenant, &tenantA, time.Hour},
		{ScopeTenant, &tenantB, 0},
		{ScopeSafekeeperData, nil, 24 * time.Hour},
		{ScopeSafekeeperData, nil, 0},
	} {
		tok := mustIssue(t, k, tc.scope, tc.tenant, tc.ttl)
		c, err := v.verifyAt(tok, testNow)
		if err != nil {
			t.Fatalf("%s %v: %v", tc.scope, tc.tenant, err)
		}
		if c.Scope != tc.scope || (c.TenantID == nil) != (tc.tenant == nil) || (c.TenantID != nil && *c.TenantID != *tc.tenant) {
			t.Errorf("claims %+v, want scope %s tenant %v", c, tc.scope, tc.tenant)
		}
		if !c.IssuedAt.Equal(testNow) {
			t.Errorf("iat %v, want %v", c.IssuedAt, testNow)
		}
		if tc.ttl == 0 && !c.ExpiresAt.IsZero() {
			t.Errorf("ttl 0: exp %v, want none", c.ExpiresAt)
		}
		if tc.ttl > 0 && !c.ExpiresAt.Equal(testNow.Add(tc.ttl)) {
			t.Errorf("exp %v, want %v", c.ExpiresAt, testNow.Add(tc.ttl))
		}
	}
}

// TestTokenIsNeonShaped: the claims are Neon's names, the header EdDSA.
func TestTokenIsNeonShaped(t *testing.T) {
	tok := mustIssue(t, testKey(1), ScopeTenant, &tenantA, time.Hour)
	parts := strings.Split(tok, ".")
	h, _ := base64.RawURLEncoding.DecodeString(parts[0])
	p, _ := base64.RawURLEncoding.DecodeString(parts[1])
	if !strings.Contains(string(h), `"alg":"EdDSA"`) {
		t.Errorf("header %s", h)
	}
	want := `{"scope":"tenant","tenant_id":"` + tenantA.String() + `","exp":1772370000,"iat":1772366400}`
	if string(p) != want {
		t.Errorf("payload %s, want %s", p, want)
	}
}

// TestOpenSSLKeys: keys made by `openssl genpkey -algorithm ed25519` and
// `openssl pkey -pubout` (Neon's recipe) load and work together.
func TestOpenSSLKeys(t *testing.T) {
	priv, err := LoadPrivateKey("testdata/testonly_openssl_private.pem")
	if err != nil {
		t.Fatal(err)
	}
	v, err := LoadVerifier("testdata/testonly_openssl_public.pem")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.verifyAt(mustIssue(t, priv, ScopeSafekeeperData, nil, time.Minute), testNow); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyRefuses: every token Verify must refuse, refused with
// ErrUnauthorized.
func TestVerifyRefuses(t *testing.T) {
	k := testKey(1)
	v := mustVerifier(t, k)
	good := mustIssue(t, k, ScopeTenant, &tenantA, time.Hour)
	parts := strings.Split(good, ".")
	pubKey := pub(k)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// The signature segment with other trailing bits: the same 64 bytes to
	// a lenient decoder, a second spelling of the token.
	sig := parts[2]
	last := strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", sig[len(sig)-1])
	nonCanonical := parts[0] + "." + parts[1] + "." + sig[:len(sig)-1] +
		string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last^1])
	otherPayload := base64.RawURLEncoding.EncodeToString([]byte(`{"scope":"safekeeperdata"}`))

	cases := []struct {
		name, token string
	}{
		{"empty", ""},
		{"garbage", "not a token"},
		{"two segments", parts[0] + "." + parts[1]},
		{"four segments", good + ".x"},
		{"truncated", good[:len(good)-10]},
		{"signature cut off", parts[0] + "." + parts[1] + "."},
		{"padded", good + "=="},
		{"newline inside", parts[0] + "." + parts[1] + "." + sig[:10] + "\n" + sig[10:]},
		{"space after", good + " "},
		{"non-canonical base64", nonCanonical},
		{"too long", parts[0] + "." + strings.Repeat("A", MaxTokenLen) + "." + parts[2]},
		{"payload swapped", parts[0] + "." + otherPayload + "." + parts[2]},
		{"header swapped", base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"EdDSA"}`)) + "." + parts[1] + "." + parts[2]},
		{"alg none", signed(t, jwt.SigningMethodNone, tenantClaims(), jwt.UnsafeAllowNoneSignatureType)},
		{"alg none keeping the signature", base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + parts[1] + "." + parts[2]},
		{"HS256 keyed with the public key's bytes", signed(t, jwt.SigningMethodHS256, tenantClaims(), []byte(pubKey))},
		{"HS256 keyed with the public key's PEM", signed(t, jwt.SigningMethodHS256, tenantClaims(), pubPEM(t, pubKey))},
		{"HS512 keyed with the public key's bytes", signed(t, jwt.SigningMethodHS512, tenantClaims(), []byte(pubKey))},
		{"RS256", signed(t, jwt.SigningMethodRS256, tenantClaims(), rsaKey)},
		{"PS256", signed(t, jwt.SigningMethodPS256, tenantClaims(), rsaKey)},
		{"ES256", signed(t, jwt.SigningMethodES256, tenantClaims(), ecKey)},
		{"EdDSA by another key", mustIssue(t, testKey(2), ScopeTenant, &tenantA, time.Hour)},
		{"expired", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "tenant", "tenant_id": tenantA.String(), "exp": testNow.Add(-Leeway - time.Second).Unix()}, k)},
		{"not yet valid", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "safekeeperdata", "nbf": testNow.Add(Leeway + time.Second).Unix()}, k)},
		{"exp not a number", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "safekeeperdata", "exp": "tomorrow"}, k)},
		{"no scope", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"tenant_id": tenantA.String()}, k)},
		{"unknown scope", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "superuser"}, k)},
		{"Neon's pageserverapi scope", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "pageserverapi"}, k)},
		{"Neon's admin scope", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "admin"}, k)},
		{"scope in capitals", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "Tenant", "tenant_id": tenantA.String()}, k)},
		{"scope not a string", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": 1}, k)},
		{"tenant without tenant_id", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "tenant"}, k)},
		{"tenant with null tenant_id", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "tenant", "tenant_id": nil}, k)},
		{"tenant_id short", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "tenant", "tenant_id": "abcd"}, k)},
		{"tenant_id not hex", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "tenant", "tenant_id": strings.Repeat("g", 32)}, k)},
		{"tenant_id empty", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "tenant", "tenant_id": ""}, k)},
		{"tenant_id a number", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "tenant", "tenant_id": 12}, k)},
		{"safekeeperdata with a bad tenant_id", signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "safekeeperdata", "tenant_id": "x"}, k)},
		{"claims not an object", parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`[1]`)) + "." + parts[2]},
		// Signed, but meaning different things to different decoders.
		{"tenant_id twice", rawSigned(t, k, edHeader, `{"scope":"tenant","tenant_id":"`+tenantB.String()+`","tenant_id":"`+tenantA.String()+`"}`)},
		{"scope twice", rawSigned(t, k, edHeader, `{"scope":"safekeeperdata","tenant_id":"`+tenantA.String()+`","scope":"tenant"}`)},
		{"exp twice", rawSigned(t, k, edHeader, fmt.Sprintf(`{"scope":"safekeeperdata","exp":%d,"exp":%d}`, testNow.Add(-time.Hour).Unix(), testNow.Add(time.Hour).Unix()))},
		{"a key twice in a nested object", rawSigned(t, k, edHeader, `{"scope":"safekeeperdata","x":{"a":1,"a":2}}`)},
		{"Tenant_Id", rawSigned(t, k, edHeader, `{"scope":"tenant","Tenant_Id":"`+tenantA.String()+`"}`)},
		{"tenant_id and TENANT_ID", rawSigned(t, k, edHeader, `{"scope":"tenant","tenant_id":"`+tenantA.String()+`","TENANT_ID":"`+tenantB.String()+`"}`)},
		{"Scope", rawSigned(t, k, edHeader, `{"Scope":"safekeeperdata"}`)},
		{"scope with a long s (U+017F), which encoding/json folds to s", rawSigned(t, k, edHeader, `{"\u017fcope":"safekeeperdata"}`)},
		{"EXP", rawSigned(t, k, edHeader, fmt.Sprintf(`{"scope":"safekeeperdata","EXP":%d}`, testNow.Add(time.Hour).Unix()))},
		{"tenant_id spelt with an escape, twice", rawSigned(t, k, edHeader, `{"scope":"tenant","tenant_id":"`+tenantA.String()+`","tenant\u005fid":"`+tenantB.String()+`"}`)},
		{"crit header", rawSigned(t, k, `{"alg":"EdDSA","typ":"JWT","crit":["exp"]}`, `{"scope":"safekeeperdata"}`)},
		{"empty crit header", rawSigned(t, k, `{"alg":"EdDSA","crit":[]}`, `{"scope":"safekeeperdata"}`)},
		{"alg twice in the header", rawSigned(t, k, `{"alg":"HS256","alg":"EdDSA"}`, `{"scope":"safekeeperdata"}`)},
	}
	for _, tc := range cases {
		c, err := v.verifyAt(tc.token, testNow)
		if !errors.Is(err, ErrUnauthorized) || c != nil {
			t.Errorf("%s: claims %+v, err %v; want ErrUnauthorized", tc.name, c, err)
			continue
		}
		if tc.token != "" && len(tc.token) > 20 && strings.Contains(err.Error(), tc.token[len(tc.token)-20:]) {
			t.Errorf("%s: the error quotes the token: %v", tc.name, err)
		}
	}
	if _, err := v.verifyAt(good, testNow); err != nil {
		t.Fatalf("the good token itself: %v", err)
	}
	// The refusals above are for what they show, not for rawSigned: the
	// same shapes spelt once verify, other claims and nesting included.
	for _, payload := range []string{
		`{"scope":"tenant","tenant_id":"` + tenantA.String() + `"}`,
		`{"scope":"safekeeperdata","tenant\u005fid":"` + tenantA.String() + `","aud":["a","a"],"x":{"a":{"b":[1,{"c":2}]}},"Extra":1}`,
	} {
		if _, err := v.verifyAt(rawSigned(t, k, edHeader, payload), testNow); err != nil {
			t.Errorf("payload %s: %v", payload, err)
		}
	}
}

// TestExpiryLeeway: exp and nbf hold within Leeway, not beyond.
func TestExpiryLeeway(t *testing.T) {
	k := testKey(1)
	v := mustVerifier(t, k)
	tok := mustIssue(t, k, ScopeSafekeeperData, nil, time.Minute)
	exp := testNow.Add(time.Minute)
	for _, tc := range []struct {
		at time.Time
		ok bool
	}{
		{testNow, true},
		{exp.Add(-time.Second), true},
		{exp.Add(Leeway - time.Second), true},
		{exp.Add(Leeway + time.Second), false},
		{exp.Add(time.Hour), false},
	} {
		_, err := v.verifyAt(tok, tc.at)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrUnauthorized)) {
			t.Errorf("at exp%+v: %v, want ok=%v", tc.at.Sub(exp), err, tc.ok)
		}
	}
	if _, err := v.Verify(tok); !errors.Is(err, jwt.ErrTokenExpired) || !errors.Is(err, ErrUnauthorized) {
		t.Errorf("Verify at the wall clock of a token expired in 2026-03: %v", err)
	}
	nbf := signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "safekeeperdata", "nbf": testNow.Add(Leeway - time.Second).Unix()}, k)
	if _, err := v.verifyAt(nbf, testNow); err != nil {
		t.Errorf("nbf within the leeway: %v", err)
	}
	never := mustIssue(t, k, ScopeSafekeeperData, nil, 0)
	if _, err := v.verifyAt(never, testNow.AddDate(100, 0, 0)); err != nil {
		t.Errorf("ttl 0, a century later: %v", err)
	}
}

// TestSafekeeperDataWithTenantID: Neon permits a tenant_id on a
// safekeeperdata token; it is kept and grants nothing more.
func TestSafekeeperDataWithTenantID(t *testing.T) {
	k := testKey(1)
	tok := signed(t, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "safekeeperdata", "tenant_id": tenantA.String()}, k)
	c, err := mustVerifier(t, k).verifyAt(tok, testNow)
	if err != nil || c.TenantID == nil || *c.TenantID != tenantA {
		t.Fatalf("claims %+v, %v", c, err)
	}
	if c.CheckTenant(tenantB) != nil || c.CheckAdmin() != nil {
		t.Errorf("safekeeperdata grants every tenant and admin")
	}
}

// TestNilVerifier refuses rather than panics.
func TestNilVerifier(t *testing.T) {
	var v *Verifier
	if _, err := v.Verify(mustIssue(t, testKey(1), ScopeSafekeeperData, nil, 0)); !errors.Is(err, ErrUnauthorized) {
		t.Fatal(err)
	}
}

func TestCheckTenantAndAdmin(t *testing.T) {
	a, b := tenantA, tenantB
	for _, tc := range []struct {
		name           string
		c              *Claims
		tenantA, admin bool
	}{
		{"tenant A", &Claims{Scope: ScopeTenant, TenantID: &a}, true, false},
		{"tenant B", &Claims{Scope: ScopeTenant, TenantID: &b}, false, false},
		{"tenant without id", &Claims{Scope: ScopeTenant}, false, false},
		{"safekeeperdata", &Claims{Scope: ScopeSafekeeperData}, true, true},
		{"unknown scope", &Claims{Scope: "admin", TenantID: &a}, false, false},
		{"nil", nil, false, false},
	} {
		if err := tc.c.CheckTenant(tenantA); (err == nil) != tc.tenantA || (err != nil && !errors.Is(err, ErrForbidden)) {
			t.Errorf("%s: CheckTenant(A) = %v, want allowed=%v", tc.name, err, tc.tenantA)
		}
		if err := tc.c.CheckAdmin(); (err == nil) != tc.admin || (err != nil && !errors.Is(err, ErrForbidden)) {
			t.Errorf("%s: CheckAdmin() = %v, want allowed=%v", tc.name, err, tc.admin)
		}
	}
}

func TestIssueRefuses(t *testing.T) {
	k := testKey(1)
	a := tenantA
	for _, tc := range []struct {
		name   string
		priv   ed25519.PrivateKey
		scope  Scope
		tenant *proto.ID
		ttl    time.Duration
	}{
		{"unknown scope", k, "admin", nil, time.Hour},
		{"empty scope", k, "", nil, time.Hour},
		{"tenant without id", k, ScopeTenant, nil, time.Hour},
		{"safekeeperdata with id", k, ScopeSafekeeperData, &a, time.Hour},
		{"negative ttl", k, ScopeSafekeeperData, nil, -time.Second},
		{"ttl under a second", k, ScopeSafekeeperData, nil, 500 * time.Millisecond},
		{"no key", nil, ScopeSafekeeperData, nil, time.Hour},
		{"short key", k[:10], ScopeSafekeeperData, nil, time.Hour},
	} {
		if tok, err := Issue(tc.priv, tc.scope, tc.tenant, tc.ttl, testNow); !errors.Is(err, ErrBadClaims) || tok != "" {
			t.Errorf("%s: %q, %v; want ErrBadClaims", tc.name, tok, err)
		}
	}
}

func TestParseScope(t *testing.T) {
	for _, s := range []string{"tenant", "safekeeperdata"} {
		if sc, err := ParseScope(s); err != nil || string(sc) != s {
			t.Errorf("ParseScope(%q) = %q, %v", s, sc, err)
		}
	}
	for _, s := range []string{"", "Tenant", "admin", "pageserverapi", "safekeeperdata "} {
		if _, err := ParseScope(s); !errors.Is(err, ErrBadClaims) {
			t.Errorf("ParseScope(%q): %v", s, err)
		}
	}
}
