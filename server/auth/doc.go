// Package auth owns the safekeeper's bearer tokens: Neon's model of
// tenant-scoped JWTs signed with Ed25519, so that tokens minted by Neon
// tooling (neon_local, the storage controller) and by `safekeeper token
// issue` are interchangeable.
//
// # The threat
//
// Anyone who can reach a safekeeper's ports can otherwise push WAL into any
// timeline (and so destroy a tenant's history by winning an election with a
// high term), read any tenant's WAL (its whole database, row by row), or
// delete timelines over HTTP. A token limits a client to one tenant, or
// marks it as the operator's (scope safekeeperdata). The safekeeper holds
// only public keys: a stolen safekeeper disk or configuration lets nobody
// mint tokens. Tokens are bearer secrets: whoever holds one is its tenant
// until it expires, so they belong on encrypted connections and never in
// logs (no error of this package quotes a token).
//
// # What it owns
//
//   - keys.go: key files. Ed25519 public keys as PKIX "PUBLIC KEY" PEM
//     blocks, private keys as PKCS#8 "PRIVATE KEY" blocks (what
//     `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout`
//     write, and what Neon reads). LoadVerifier reads one or more public key
//     files, each with one or more keys; GenerateKeys writes a new pair
//     durably and never over an existing file; LoadPrivateKey reads the
//     signing key back.
//   - token.go: Verify (signature, algorithm, time claims, scope) and Issue,
//     Claims and the permission checks CheckTenant and CheckAdmin.
//
// # The rules of Verify
//
//   - Only alg EdDSA (Ed25519). "none", HS256/384/512 (so also the classic
//     confusion of an HMAC keyed with the public key's bytes), RS*, PS*
//     and ES* are refused before any key is tried.
//   - A token verifies if any of the Verifier's keys verifies it: key
//     rotation lists the old and the new public key until every old token
//     has expired.
//   - exp and nbf are checked when present, with a leeway of Leeway (5 s)
//     for clocks a little apart; iat is not checked (nor is it by Neon).
//     A token without exp never expires: Neon's own tooling mints such
//     tokens, so they are accepted; Issue makes them only when asked
//     (ttl 0).
//   - The text must be at most MaxTokenLen bytes of base64url and two dots,
//     every segment canonical base64url without padding: a valid token has
//     exactly one spelling.
//   - Claims: scope "tenant" with tenant_id (32 hex digits), or
//     "safekeeperdata" (every tenant and the admin endpoints; a tenant_id
//     there, which Neon permits, grants nothing more). Any other scope
//     (Neon's pageserverapi, admin, generations_api, ...), a tenant scope
//     without tenant_id, or a tenant_id that is not 32 hex digits is
//     refused. Other claims (iss, sub, aud, jti, ...) are ignored.
//   - One meaning per token: a key twice in the header or the claims (at
//     any depth; decoders differ on which one wins), a claim named in
//     another case ("Tenant_Id", "EXP", even "ſcope": encoding/json would
//     match it case-insensitively) and a "crit" header (no extension is
//     understood here, RFC 7515 §4.1.11) are refused.
//
// Every refusal of Verify wraps ErrUnauthorized, with the reason after it
// for the server's log; a client is told only that it is unauthorized. A
// valid token for the wrong tenant is ErrForbidden, from CheckTenant or
// CheckAdmin.
//
// # Why the boundary sits here
//
// The package knows tokens and keys, not connections: it imports no net,
// reads files only when told to, and takes the time as an argument where
// it matters (Issue), so the server's connection and HTTP code decide where
// a token comes from (a startup packet's password, an Authorization
// header) and what it guards, and this package is tested without a server.
package auth
