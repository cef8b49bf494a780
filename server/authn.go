package server

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
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
//   - HTTP: Authorization: Bearer (the scheme in any case). /metrics,
//     /healthz, /readyz and /v1/status stay open (as Neon's); a
//     timeline's GET and GET .../wal take its tenant's token or a
//     safekeeperdata one; listing every timeline, every DELETE (a
//     timeline's or a tenant's) and pprof take safekeeperdata: stricter
//     than Neon, so that a compute's tenant token cannot destroy WAL the
//     safekeepers acknowledged. 401 without a valid token, 403 when it
//     does not cover the request.
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

// httpAccess is what an HTTP endpoint needs.
type httpAccess int

const (
	accessOpen   httpAccess = iota // /metrics, /healthz, /readyz, /v1/status
	accessTenant                   // the {tenant_id} of the path, or safekeeperdata
	accessAdmin                    // safekeeperdata only
)

// checkHTTP authorises r for access; nil when allowed.
func (a *httpAPI) checkHTTP(r *http.Request, access httpAccess) error {
	if a.s.auth == nil || access == accessOpen {
		return nil
	}
	token, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		return &apiError{http.StatusUnauthorized, "unauthorized", "missing Authorization: Bearer token"}
	}
	claims, err := a.s.auth.v.Load().Verify(token)
	if err != nil {
		a.s.log.Info("HTTP request refused: bad token", "peer", r.RemoteAddr, "path", r.URL.Path, "err", err)
		return &apiError{http.StatusUnauthorized, "unauthorized", "invalid token"}
	}
	switch access {
	case accessAdmin:
		err = claims.CheckAdmin()
	case accessTenant:
		tenant, perr := proto.ParseID(r.PathValue("tenant_id"))
		if perr != nil {
			return &apiError{http.StatusBadRequest, "bad_id", "tenant_id: " + perr.Error()}
		}
		err = claims.CheckTenant(tenant)
	}
	if errors.Is(err, auth.ErrForbidden) {
		a.s.log.Info("HTTP request refused: token does not cover it", "peer", r.RemoteAddr, "path", r.URL.Path, "err", err)
		return &apiError{http.StatusForbidden, "forbidden", "the token does not allow this request"}
	}
	return err
}

// bearerToken is the token of an Authorization header value "Bearer
// TOKEN". The scheme's name is case-insensitive (RFC 7235 §2.1: "bearer",
// "BEARER"), and spaces or tabs may separate it from the token.
func bearerToken(h string) (string, bool) {
	i := strings.IndexAny(h, " \t")
	if i < 0 || !strings.EqualFold(h[:i], "Bearer") {
		return "", false
	}
	token := strings.Trim(h[i:], " \t")
	return token, token != ""
}

// guard wraps h with the access check.
func (a *httpAPI) guard(access httpAccess, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := a.checkHTTP(r, access); err != nil {
			writeError(w, err)
			return
		}
		h(w, r)
	}
}
