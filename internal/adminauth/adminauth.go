// Package adminauth holds the pieces of the admin handler's browser
// sign-in that are pure functions: the anti-forgery token derived from a
// session's secret, the same-origin check of requests that change state,
// and the keyed hash that stands for a client's key when keys are
// personal data (middleware.AdminConfig.HashKeys). docs/operations.md
// describes the sign-in and the hashed keys.
package adminauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
)

// csrfLabel is what the anti-forgery token is a MAC of.
const csrfLabel = "sluice admin csrf v1"

// CSRFToken returns the anti-forgery token of a session whose secret (the
// signed-in token, kept in an HttpOnly cookie) is secret: a MAC of a fixed
// label under it. A page of the same origin reads it from the handler and
// sends it in a header with every request that changes state; a page of
// another origin can neither read the cookie nor ask for the token, and
// cannot derive it.
func CSRFToken(secret string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(csrfLabel))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// ValidCSRF reports whether got is the anti-forgery token of secret, in
// constant time.
func ValidCSRF(secret, got string) bool {
	want := CSRFToken(secret)
	return len(got) == len(want) && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// SameOrigin reports whether r may change state as far as browsers tell:
// its Sec-Fetch-Site, when present, is same-origin or none (typed by the
// user), and its Origin, when present, is the request's own scheme and
// host. A request with neither header comes from a program, not from a
// page, and passes (it must still be authorized).
func SameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false // "null" (a sandboxed or file page) or garbage
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return strings.EqualFold(u.Scheme, scheme) && strings.EqualFold(u.Host, r.Host)
}

// KeyHash returns the keyed hash that stands for key: "h:" and the first
// 12 bytes of HMAC-SHA256(secret, key) in unpadded base64url. Without the
// secret it tells nothing of the key; with it, the handler can tell which
// key a hash stands for among the keys it knows.
func KeyHash(secret []byte, key string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(key))
	return "h:" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:12])
}
