package adminauth

import (
	"crypto/tls"
	"net/http/httptest"
	"testing"
)

func TestCSRFToken(t *testing.T) {
	t.Parallel()
	a, b := CSRFToken("secret-a"), CSRFToken("secret-b")
	if a == b || a != CSRFToken("secret-a") || len(a) != 43 {
		t.Fatalf("tokens %q and %q", a, b)
	}
	for _, tc := range []struct {
		secret, got string
		want        bool
	}{
		{"secret-a", a, true},
		{"secret-a", b, false},
		{"secret-a", "", false},
		{"secret-a", a[:42], false},
		{"", CSRFToken(""), true},
	} {
		if got := ValidCSRF(tc.secret, tc.got); got != tc.want {
			t.Errorf("ValidCSRF(%q, %q) = %v, want %v", tc.secret, tc.got, got, tc.want)
		}
	}
}

func TestSameOrigin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		host, origin string
		site         string
		tls          bool
		want         bool
	}{
		{"a program: no headers", "127.0.0.1:9090", "", "", false, true},
		{"same origin", "127.0.0.1:9090", "http://127.0.0.1:9090", "same-origin", false, true},
		{"same origin, host case", "Admin.example:9090", "http://admin.example:9090", "", false, true},
		{"typed by the user", "127.0.0.1:9090", "", "none", false, true},
		{"another port", "127.0.0.1:9090", "http://127.0.0.1:8080", "", false, false},
		{"another site", "127.0.0.1:9090", "http://evil.example", "cross-site", false, false},
		{"same site, other origin", "127.0.0.1:9090", "http://127.0.0.1:9090", "same-site", false, false},
		{"cross-site by fetch metadata alone", "127.0.0.1:9090", "", "cross-site", false, false},
		{"null origin", "127.0.0.1:9090", "null", "", false, false},
		{"http origin to https", "admin.example", "http://admin.example", "", true, false},
		{"https", "admin.example", "https://admin.example", "same-origin", true, true},
	} {
		r := httptest.NewRequest("POST", "/bans", nil)
		r.Host = tc.host
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if tc.site != "" {
			r.Header.Set("Sec-Fetch-Site", tc.site)
		}
		if tc.tls {
			r.TLS = &tls.ConnectionState{}
		}
		if got := SameOrigin(r); got != tc.want {
			t.Errorf("%s: SameOrigin = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestKeyHash(t *testing.T) {
	t.Parallel()
	h := KeyHash([]byte("s"), "user:alice")
	if len(h) != 18 || h[:2] != "h:" || h == KeyHash([]byte("t"), "user:alice") || h == KeyHash([]byte("s"), "user:bob") || h != KeyHash([]byte("s"), "user:alice") {
		t.Fatalf("KeyHash %q", h)
	}
}
