package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// FuzzVerify: whatever the text, Verify does not panic, refuses with
// ErrUnauthorized, and accepts only a token that the fuzz target itself
// signed with one of the Verifier's keys (byte for byte: a valid token has
// one spelling). The keys and the clock are fixed, so the corpus means the
// same every run.
func FuzzVerify(f *testing.F) {
	keyA, keyB, outsider := testKey(1), testKey(2), testKey(3)
	v := mustVerifier(f, keyA, keyB)
	// ours: every token the target signed with a Verifier key, and
	// whether Verify must accept it.
	ours := map[string]bool{}
	valid := []string{
		mustIssue(f, keyA, ScopeTenant, &tenantA, time.Hour),
		mustIssue(f, keyB, ScopeSafekeeperData, nil, 0),
		signed(f, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "safekeeperdata", "tenant_id": tenantB.String(), "nbf": testNow.Unix()}, keyA),
		signed(f, jwt.SigningMethodEdDSA, jwt.MapClaims{"scope": "safekeeperdata", "nbf": -1e300, "iat": 1e300}, keyB),
	}
	for _, tok := range valid {
		ours[tok] = true
		f.Add(tok)
	}
	for _, c := range []jwt.MapClaims{
		{"scope": "tenant"},
		{"scope": "admin"},
		{"scope": "tenant", "tenant_id": "0123"},
		{"scope": "safekeeperdata", "exp": testNow.Add(-time.Hour).Unix()},
		{"scope": "safekeeperdata", "exp": 1e300, "nbf": 1e300},
	} {
		tok := signed(f, jwt.SigningMethodEdDSA, c, keyA)
		ours[tok] = false
		f.Add(tok)
	}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	parts := strings.Split(valid[0], ".")
	f.Add(signed(f, jwt.SigningMethodNone, tenantClaims(), jwt.UnsafeAllowNoneSignatureType))
	f.Add(base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." + parts[1] + ".")
	f.Add(signed(f, jwt.SigningMethodHS256, tenantClaims(), []byte(pub(keyA))))
	f.Add(signed(f, jwt.SigningMethodHS256, tenantClaims(), pubPEM(f, pub(keyA))))
	f.Add(signed(f, jwt.SigningMethodES256, tenantClaims(), ec))
	f.Add(mustIssue(f, outsider, ScopeSafekeeperData, nil, 0))
	f.Add(valid[0][:len(valid[0])/2])
	f.Add(valid[0][:len(valid[0])-1])
	f.Add(parts[0] + "." + parts[1])
	f.Add("")
	f.Add("..")
	f.Add("garbage")
	f.Add("e30.e30.e30")
	f.Add(strings.Repeat("A", 100) + "." + strings.Repeat("B", 100) + "." + strings.Repeat("C", 86))

	f.Fuzz(func(t *testing.T, token string) {
		c, err := v.verifyAt(token, testNow)
		if want, signed := ours[token]; signed && want != (err == nil) {
			t.Fatalf("a token the target signed: accepted %v, want %v (%v)", err == nil, want, err)
		}
		if err != nil {
			if !errors.Is(err, ErrUnauthorized) || c != nil {
				t.Fatalf("refused with claims %+v, error %v not wrapping ErrUnauthorized", c, err)
			}
			if len(token) >= 16 && strings.Contains(err.Error(), token) {
				t.Fatalf("the error quotes the token: %v", err)
			}
			return
		}
		if _, signed := ours[token]; !signed {
			t.Fatalf("accepted a token the target did not sign (sha256 %x): %+v", sha256.Sum256([]byte(token)), c)
		}
		if c.Scope != ScopeTenant && c.Scope != ScopeSafekeeperData || c.Scope == ScopeTenant && c.TenantID == nil {
			t.Fatalf("accepted claims %+v", c)
		}
	})
}
