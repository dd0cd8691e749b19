package keyfunc

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"testing"
)

// wantHash computes Hash independently: SHA-256, first 16 bytes, unpadded
// base64url.
func wantHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// wantHMAC computes an APIKey digest independently.
func wantHMAC(secret []byte, s string) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(s))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil)[:16])
}

func TestHash(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "a", "acme", "a|b", strings.Repeat("x", 1<<20), "\x00\xff"} {
		got := Hash(s)
		if want := wantHash(s); got != want {
			t.Errorf("Hash(%.20q) = %q, want %q", s, got, want)
		}
		if len(got) != 22 {
			t.Errorf("len(Hash(%.20q)) = %d, want 22", s, len(got))
		}
		if i := strings.IndexFunc(got, func(r rune) bool {
			return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-' || r == '_')
		}); i >= 0 {
			t.Errorf("Hash(%.20q) = %q contains %q", s, got, got[i])
		}
	}
	if Hash("a") == Hash("b") {
		t.Error(`Hash("a") == Hash("b")`)
	}
	if got := string(appendHash([]byte("k:"), "acme")); got != "k:"+wantHash("acme") {
		t.Errorf("appendHash = %q, want %q", got, "k:"+wantHash("acme"))
	}
}

func TestEscape(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", ""},
		{"alice", "alice"},
		{"a|b", "a%7Cb"},
		{"100%", "100%25"},
		{"%7C", "%257C"},
		{"a\nb\r\x00", "a%0Ab%0D%00"},
		{"\x7f\x1f", "%7F%1F"},
		{"héllo wörld", "héllo wörld"},
		{"user:42#x", "user:42#x"},
	}
	for _, tt := range tests {
		if got := Escape(tt.in); got != tt.want {
			t.Errorf("Escape(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if strings.ContainsRune(Escape(tt.in), '|') {
			t.Errorf("Escape(%q) contains |", tt.in)
		}
	}
	// Escape is one-to-one: an escaped separator cannot be confused with a
	// value that spells out the escape.
	if Escape("a|b") == Escape("a%7Cb") {
		t.Error(`Escape("a|b") == Escape("a%7Cb")`)
	}
}

func TestEscapeAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun is disturbed by concurrent tests.
	if n := testing.AllocsPerRun(100, func() { _ = Escape("nothing-to-escape") }); n != 0 {
		t.Errorf("Escape of a clean string allocates %v times, want 0", n)
	}
}

func TestHeader(t *testing.T) {
	t.Parallel()
	keyOf := Header("X-Tenant")
	tests := []struct {
		name  string
		lines []string
		want  string
	}{
		{"value", []string{"x-tenant", "acme"}, "h:x-tenant:" + wantHash("acme")},
		{"first line", []string{"X-Tenant", "acme", "X-Tenant", "other"}, "h:x-tenant:" + wantHash("acme")},
		{"separators are hashed", []string{"X-Tenant", "a|b"}, "h:x-tenant:" + wantHash("a|b")},
		{"long value", []string{"X-Tenant", strings.Repeat("x", 10000)}, "h:x-tenant:" + wantHash(strings.Repeat("x", 10000))},
	}
	for _, tt := range tests {
		got, err := keyOf(newRequest("192.0.2.1:1", tt.lines...))
		if err != nil || got != tt.want {
			t.Errorf("%s: key = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
	for _, lines := range [][]string{nil, {"X-Tenant", ""}, {"X-Other", "acme"}} {
		got, err := keyOf(newRequest("192.0.2.1:1", lines...))
		if !errors.Is(err, ErrNoKey) || got != "" {
			t.Errorf("headers %q: key = %q, %v; want an error wrapping ErrNoKey", lines, got, err)
		}
		if err != nil && !strings.Contains(err.Error(), `"X-Tenant"`) {
			t.Errorf("error %q does not name the header", err)
		}
	}
}

func TestHeaderEmptyNamePanics(t *testing.T) {
	t.Parallel()
	defer func() {
		if msg, _ := recover().(string); !strings.HasPrefix(msg, "keyfunc: ") {
			t.Errorf("Header(\"\") panicked with %q, want a keyfunc: message", msg)
		}
	}()
	Header("")
}

func TestAPIKey(t *testing.T) {
	t.Parallel()
	secret := []byte("s3cr3t-server-side-value")
	const apiKey = "sk_live_0123456789abcdef"
	withSecret := APIKey("X-API-Key", secret)
	noSecret := APIKey("X-API-Key", nil)
	bearer := APIKey("authorization", secret)
	tests := []struct {
		name  string
		keyOf Func
		lines []string
		want  string
	}{
		{"HMAC", withSecret, []string{"X-API-Key", apiKey}, "key:" + wantHMAC(secret, apiKey)},
		{"header name case", withSecret, []string{"x-api-key", apiKey}, "key:" + wantHMAC(secret, apiKey)},
		{"no secret is SHA-256", noSecret, []string{"X-API-Key", apiKey}, "key:" + wantHash(apiKey)},
		{"bearer", bearer, []string{"Authorization", "Bearer " + apiKey}, "key:" + wantHMAC(secret, apiKey)},
		{"bearer case", bearer, []string{"Authorization", "bEaReR " + apiKey}, "key:" + wantHMAC(secret, apiKey)},
		{"bearer spaces", bearer, []string{"Authorization", " Bearer \t  " + apiKey + " "}, "key:" + wantHMAC(secret, apiKey)},
		{"bare token", bearer, []string{"Authorization", apiKey}, "key:" + wantHMAC(secret, apiKey)},
		{"other scheme whole", bearer, []string{"Authorization", "Basic dXNlcjpwdw=="}, "key:" + wantHMAC(secret, "Basic dXNlcjpwdw==")},
		{"scheme prefix is not bearer", bearer, []string{"Authorization", "Bearerish x"}, "key:" + wantHMAC(secret, "Bearerish x")},
		{"bearer only for Authorization", withSecret, []string{"X-API-Key", "Bearer " + apiKey}, "key:" + wantHMAC(secret, "Bearer "+apiKey)},
	}
	for _, tt := range tests {
		got, err := tt.keyOf(newRequest("192.0.2.1:1", tt.lines...))
		if err != nil || got != tt.want {
			t.Errorf("%s: key = %q, %v; want %q", tt.name, got, err, tt.want)
		}
		for _, raw := range []string{string(secret), apiKey, apiKey[:8]} {
			if strings.Contains(got, raw) {
				t.Errorf("%s: key %q contains %q", tt.name, got, raw)
			}
		}
	}
	// The same API key must give the same key through either header, and a
	// different secret a different one.
	k1, _ := withSecret(newRequest("", "X-API-Key", apiKey))
	k2, _ := bearer(newRequest("", "Authorization", "Bearer "+apiKey))
	k3, _ := APIKey("X-API-Key", []byte("another secret"))(newRequest("", "X-API-Key", apiKey))
	if k1 != k2 || k1 == k3 {
		t.Errorf("keys %q (header), %q (bearer), %q (other secret): want the first two equal and the third different", k1, k2, k3)
	}
}

func TestAPIKeyMissing(t *testing.T) {
	t.Parallel()
	secret := []byte("secret")
	tests := []struct {
		name  string
		keyOf Func
		lines []string
	}{
		{"missing", APIKey("X-API-Key", secret), nil},
		{"empty", APIKey("X-API-Key", secret), []string{"X-API-Key", ""}},
		{"no secret missing", APIKey("X-API-Key", nil), nil},
		{"bearer without token", APIKey("Authorization", secret), []string{"Authorization", "Bearer"}},
		{"bearer with spaces only", APIKey("Authorization", secret), []string{"Authorization", "Bearer   "}},
		{"blank authorization", APIKey("Authorization", secret), []string{"Authorization", "  "}},
	}
	for _, tt := range tests {
		got, err := tt.keyOf(newRequest("192.0.2.1:1", tt.lines...))
		if !errors.Is(err, ErrNoKey) || got != "" {
			t.Errorf("%s: key = %q, %v; want an error wrapping ErrNoKey", tt.name, got, err)
		}
	}
}

func TestAPIKeyCopiesSecret(t *testing.T) {
	t.Parallel()
	secret := []byte("secret")
	keyOf := APIKey("X-API-Key", secret)
	copy(secret, "XXXXXX")
	got, _ := keyOf(newRequest("", "X-API-Key", "abc"))
	if want := "key:" + wantHMAC([]byte("secret"), "abc"); got != want {
		t.Errorf("after changing the secret slice: key = %q, want %q", got, want)
	}
}

// TestAPIKeyConcurrent checks, under the race detector, that the pooled
// HMAC states are not shared between requests.
func TestAPIKeyConcurrent(t *testing.T) {
	t.Parallel()
	secret := []byte("secret")
	keyOf := APIKey("X-API-Key", secret)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				v := strings.Repeat("k", g*200+i+1)
				got, err := keyOf(newRequest("", "X-API-Key", v))
				if want := "key:" + wantHMAC(secret, v); err != nil || got != want {
					t.Errorf("key(%d bytes) = %q, %v; want %q", len(v), got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestAPIKeyEmptyHeaderPanics(t *testing.T) {
	t.Parallel()
	defer func() {
		if msg, _ := recover().(string); !strings.HasPrefix(msg, "keyfunc: ") {
			t.Errorf("APIKey(\"\", nil) panicked with %q, want a keyfunc: message", msg)
		}
	}()
	APIKey("", nil)
}

func TestDigestAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun is disturbed by concurrent tests.
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	long := strings.Repeat("k", 1000)
	tests := []struct {
		name  string
		keyOf Func
	}{
		{"Header", Header("X-Value")},
		{"APIKey with secret", APIKey("X-Value", []byte("secret"))},
		{"APIKey without secret", APIKey("X-Value", nil)},
	}
	for _, tt := range tests {
		for _, v := range []string{"short", long} {
			r := newRequest("", "X-Value", v)
			if n := testing.AllocsPerRun(100, func() { _, _ = tt.keyOf(r) }); n > 1 {
				t.Errorf("%s of a %d-byte value allocates %v times, want at most 1", tt.name, len(v), n)
			}
		}
	}
}
