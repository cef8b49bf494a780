package server

import (
	"fmt"
	"sync/atomic"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/proto/pgwire"
	"github.com/safekeeper/safekeeper/server/auth"
)

// Authentication (Config.AuthPublicKeys): Neon's tenant-scoped tokens.
//
//   - On the PostgreSQL port the server asks for a password
//     (AuthenticationCleartextPassword) and takes it as a token; only over
//     TLS unless Config.AllowAuthWithoutTLS. A bad token is FATAL 28P01 with
//     PostgreSQL's wording, which does not say what was wrong; the log
//     says, with the peer.
//   - A tenant token works on its own tenant's timelines only: the push
//     greeting, every reader command and slot command check the timeline's
//     tenant (FATAL or ERROR 28000 otherwise).
//   - HTTP: Authorization: Bearer, with the same keys (server/httpapi's
//     auth.go).
//
// The public keys are re-read with the TLS certificate (ReloadTLS, on
// SIGHUP); a file that does not load keeps the previous keys.

// authState holds the verifier; nil pointer: auth is off.
type authState struct {
	paths []string
	v     atomic.Pointer[auth.Verifier]
}

func newAuthState(paths []string) (*authState, error) {
	v, err := auth.LoadVerifier(paths...)
	if err != nil {
		return nil, err
	}
	a := &authState{paths: paths}
	a.v.Store(v)
	return a, nil
}

func (a *authState) reload() error {
	v, err := auth.LoadVerifier(a.paths...)
	if err != nil {
		return err
	}
	a.v.Store(v)
	return nil
}

// errAuthFailed is PostgreSQL's answer to a wrong password: it names the
// user, not the reason.
func errAuthFailed(user string) *pgwire.Error {
	return pgwire.Errorf(pgwire.InvalidPassword, "password authentication failed for user %q", user)
}

// errTenantDenied refuses a timeline its token does not cover.
func errTenantDenied(key proto.TimelineKey) *pgwire.Error {
	return pgwire.Errorf(pgwire.InvalidAuthorizationSpecification, "permission denied for timeline %s: the token does not cover tenant %s", key, key.TenantID)
}

// authenticate runs the password exchange of a new connection when auth is
// on. It returns the token's claims (nil when auth is off), or the FATAL
// error to end the connection with.
func (s *Server) authenticate(pc *pgwire.Conn, user string) (*auth.Claims, error) {
	if s.auth == nil {
		return nil, nil
	}
	token, err := pc.RequestPassword()
	if err != nil {
		return nil, err
	}
	claims, err := s.auth.v.Load().Verify(token)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errAuthFailed(user), err)
	}
	return claims, nil
}

// allows reports whether claims (nil: auth off) cover timeline key.
func allows(claims *auth.Claims, authOn bool, key proto.TimelineKey) error {
	if !authOn {
		return nil
	}
	if claims.CheckTenant(key.TenantID) != nil {
		return errTenantDenied(key)
	}
	return nil
}
