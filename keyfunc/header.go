package keyfunc

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
)

// Header returns a Func that keys a request by the value of the named
// header. The key is "h:", the header name in lower case, ":" and the Hash
// of the first value: "X-Tenant: acme" gives
// "h:x-tenant:giszrYfBSKCiClunzV68qg". The value is always hashed: it is
// chosen by the client, so it could otherwise be long or contain
// separators.
//
// Header trusts the value completely: any client can send any value and so
// choose its own counter. Use it for values set by something you trust, such
// as a gateway that authenticates the request, or combine it with an
// address using Join.
//
// The Func returns an error wrapping ErrNoKey when the header is missing or
// empty. Header panics if name is empty.
func Header(name string) Func {
	if name == "" {
		panic("keyfunc: Header expects a header name")
	}
	prefix := "h:" + Escape(strings.ToLower(name)) + ":"
	errMissing := fmt.Errorf("keyfunc: header %q missing: %w", name, ErrNoKey)
	canonical := http.CanonicalHeaderKey(name) // spares net/http a copy per lookup
	return func(r Request) (string, error) {
		v := r.Header(canonical)
		if v == "" {
			return "", errMissing
		}
		var buf [64]byte
		b := append(buf[:0], prefix...)
		b = appendHash(b, v)
		return string(b), nil
	}
}

// APIKey returns a Func that keys a request by the API key in the named
// header. The key is "key:" and a 22-character digest of the API key: the
// first 16 bytes of HMAC-SHA256 keyed with secret, in unpadded base64url.
//
// With a secret, the store holds nothing from which an API key can be
// guessed: a leaked key name cannot be tested against candidate API keys
// without the secret. If secret is empty, the digest is a plain SHA-256, the
// same as Hash, which anyone who can read the store can test guesses
// against. Either way the API key itself never appears in a key. Changing
// the secret changes every key, which resets every client's count.
//
// If header is "Authorization" (in any case), a "Bearer" scheme (in any
// case) is stripped, so "Authorization: Bearer abc" and "X-API-Key: abc"
// give the same key; other values of the header are used whole.
//
// APIKey checks only that an API key is present, not that it is valid: an
// unauthenticated client can send a fresh value with every request. Limit
// by the key after authentication, or combine it with an address.
//
// The Func returns an error wrapping ErrNoKey when the header is missing or
// empty. APIKey panics if header is empty. It copies secret.
func APIKey(header string, secret []byte) Func {
	if header == "" {
		panic("keyfunc: APIKey expects a header name")
	}
	bearer := strings.EqualFold(header, "Authorization")
	errMissing := fmt.Errorf("keyfunc: API key header %q missing: %w", header, ErrNoKey)
	canonical := http.CanonicalHeaderKey(header)
	digests := sha256Digesters
	if len(secret) > 0 {
		digests = newDigesters(bytes.Clone(secret))
	}
	return func(r Request) (string, error) {
		v := r.Header(canonical)
		if bearer {
			v = stripBearer(v)
		}
		if v == "" {
			return "", errMissing
		}
		var buf [32]byte
		b := append(buf[:0], "key:"...)
		b = digests.appendDigest(b, v)
		return string(b), nil
	}
}

// stripBearer returns the token of a "Bearer" Authorization value, or v
// itself if it uses another scheme.
func stripBearer(v string) string {
	const scheme = "Bearer"
	v = trimOWS(v)
	if len(v) < len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return v
	}
	rest := v[len(scheme):]
	if rest == "" {
		return "" // the scheme without a token
	}
	if rest[0] != ' ' && rest[0] != '\t' {
		return v // another scheme, such as "Bearerish"
	}
	return trimOWS(rest)
}
