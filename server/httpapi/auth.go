package httpapi

import (
	"errors"
	"net/http"
	"strings"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/auth"
)

// Authentication on the HTTP API (Config.Verifier): Neon's tenant-scoped
// tokens in Authorization: Bearer (the scheme in any case). /metrics,
// /healthz, /readyz and /v1/status stay open (as Neon's); a timeline's GET
// and GET .../wal take its tenant's token or a safekeeperdata one; listing
// every timeline, every DELETE (a timeline's or a tenant's) and pprof take
// safekeeperdata: stricter than Neon, so that a compute's tenant token
// cannot destroy WAL the safekeepers acknowledged. 401 without a valid
// token, 403 when it does not cover the request.

// httpAccess is what an HTTP endpoint needs.
type httpAccess int

const (
	accessOpen   httpAccess = iota // /metrics, /healthz, /readyz, /v1/status
	accessTenant                   // the {tenant_id} of the path, or safekeeperdata
	accessAdmin                    // safekeeperdata only
)

// checkHTTP authorises r for access; nil when allowed.
func (a *API) checkHTTP(r *http.Request, access httpAccess) error {
	if a.cfg.Verifier == nil || access == accessOpen {
		return nil
	}
	token, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		return &apiError{http.StatusUnauthorized, "unauthorized", "missing Authorization: Bearer token"}
	}
	claims, err := a.cfg.Verifier().Verify(token)
	if err != nil {
		a.log.Info("HTTP request refused: bad token", "peer", r.RemoteAddr, "path", r.URL.Path, "err", err)
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
		a.log.Info("HTTP request refused: token does not cover it", "peer", r.RemoteAddr, "path", r.URL.Path, "err", err)
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
func (a *API) guard(access httpAccess, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := a.checkHTTP(r, access); err != nil {
			writeError(w, err)
			return
		}
		h(w, r)
	}
}
