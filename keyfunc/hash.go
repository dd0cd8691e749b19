package keyfunc

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"sync"
)

// hashBytes is how much of a SHA-256 digest a key keeps: 128 bits, which
// makes accidental collisions between clients negligible.
const hashBytes = 16

// hashLen is the length of the strings Hash returns,
// base64.RawURLEncoding.EncodedLen(hashBytes).
const hashLen = 22

// Hash returns a fixed-length digest of s for use in a key: the first 16
// bytes of its SHA-256 sum in unpadded base64url (RFC 4648, section 5), 22
// characters from [A-Za-z0-9_-].
//
// Key functions hash values the client chooses freely, so that a key's
// length is bounded whatever the client sends, and no value can contain a
// separator used in keys. Hash is not a secret-keyed digest: anyone who can
// read the store can test guesses against it. APIKey with a secret avoids
// that.
func Hash(s string) string {
	var buf [hashLen]byte
	return string(appendHash(buf[:0], s))
}

// appendHash appends Hash(s) to dst and returns the extended buffer.
func appendHash(dst []byte, s string) []byte {
	return sha256Digesters.appendDigest(dst, s)
}

// sha256Digesters computes the digests of Hash.
var sha256Digesters = newDigesters(nil)

// digesters is a pool of hash states for one digest: SHA-256, or
// HMAC-SHA256 with a fixed secret. Pooling the state, with a buffer to copy
// the input through, lets a key function hash a string of any length
// without allocating.
type digesters struct{ pool sync.Pool }

// digester is a reusable hash state.
type digester struct {
	h     hash.Hash
	chunk [256]byte
	sum   [sha256.Size]byte
}

// newDigesters returns a pool computing HMAC-SHA256 keyed with secret, or
// SHA-256 if secret is empty. It keeps secret.
func newDigesters(secret []byte) *digesters {
	newHash := sha256.New
	if len(secret) > 0 {
		newHash = func() hash.Hash { return hmac.New(sha256.New, secret) }
	}
	d := &digesters{}
	d.pool.New = func() any { return &digester{h: newHash()} }
	return d
}

// appendDigest appends the digest of s, truncated to hashBytes and encoded
// in unpadded base64url, to dst.
func (p *digesters) appendDigest(dst []byte, s string) []byte {
	d := p.pool.Get().(*digester)
	d.h.Reset()
	for s != "" {
		n := copy(d.chunk[:], s)
		d.h.Write(d.chunk[:n])
		s = s[n:]
	}
	sum := d.h.Sum(d.sum[:0])
	dst = base64.RawURLEncoding.AppendEncode(dst, sum[:hashBytes])
	p.pool.Put(d)
	return dst
}

// Escape returns s with every '%', '|' and ASCII control character replaced
// by '%' and two upper-case hex digits, as in "%7C" for '|'. It returns s
// itself, without allocating, if there is nothing to escape.
//
// Key functions escape the values they put into a key unhashed, so that a
// value cannot contain the "|" that Join places between keys, and the
// escaping cannot be confused with the value: Escape is one-to-one.
func Escape(s string) string {
	n := escapedLen(s)
	if n == len(s) {
		return s
	}
	return string(appendEscape(make([]byte, 0, n), s))
}

// needsEscape reports whether Escape replaces c.
func needsEscape(c byte) bool { return c == '%' || c == '|' || c < 0x20 || c == 0x7f }

// escapedLen returns len(Escape(s)).
func escapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i]) {
			n += 2
		}
	}
	return n
}

// appendEscape appends Escape(s) to dst and returns the extended buffer.
func appendEscape(dst []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c) {
			dst = append(dst, '%', hex[c>>4], hex[c&0xf])
		} else {
			dst = append(dst, c)
		}
	}
	return dst
}

// boundedKey returns kind + ":" + Escape(s) if s is at most max bytes long,
// and kind + "#" + Hash(s) otherwise. The two forms differ in the character
// after kind, so a short value can never collide with a hashed long one.
func boundedKey(kind, s string, max int) string {
	var buf [96]byte
	b := buf[:0]
	if len(s) <= max {
		if n := len(kind) + 1 + escapedLen(s); n > len(buf) {
			b = make([]byte, 0, n)
		}
	}
	b = append(b, kind...)
	if len(s) > max {
		b = append(b, '#')
		b = appendHash(b, s)
	} else {
		b = append(b, ':')
		b = appendEscape(b, s)
	}
	return string(b)
}
