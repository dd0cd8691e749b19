package keyfunc

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
)

// benchKey is where benchmarks store their result, so that the work is not
// optimised away.
var benchKey string

func benchRequest(remote string, header ...string) Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return FromHTTP(r)
}

func runKeyBench(b *testing.B, keyOf Func, r Request) {
	b.Helper()
	b.ReportAllocs()
	for b.Loop() {
		key, err := keyOf(r)
		if err != nil {
			b.Fatal(err)
		}
		benchKey = key
	}
}

func BenchmarkRemoteIP(b *testing.B) {
	keyOf := RemoteIP()
	b.Run("v4", func(b *testing.B) { runKeyBench(b, keyOf, benchRequest("192.0.2.1:51234")) })
	b.Run("v6", func(b *testing.B) { runKeyBench(b, keyOf, benchRequest("[2001:db8:1:2:3:4:5:6]:51234")) })
}

// chain returns a header of n entries in the worst case for the walk: the
// client leftmost, behind n-1 trusted proxies.
func chain(n int, entry func(i int) string) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = entry(i)
	}
	return strings.Join(parts, ", ")
}

// BenchmarkXForwardedFor measures the walk over attacker-sized headers. The
// walk stops after MaxProxyHops entries, so its cost levels off.
func BenchmarkXForwardedFor(b *testing.B) {
	keyOf := mustTrustedProxies(b, "X-Forwarded-For", "10.0.0.0/8")
	for _, n := range []int{1, 10, 100, 1000} {
		xff := chain(n, func(i int) string {
			if i == 0 {
				return "198.51.100.7"
			}
			return fmt.Sprintf("10.0.%d.%d", i/256, i%256)
		})
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			runKeyBench(b, keyOf, benchRequest("10.0.0.1:1", "X-Forwarded-For", xff))
		})
	}
}

func BenchmarkForwarded(b *testing.B) {
	keyOf := mustTrustedProxies(b, "Forwarded", "10.0.0.0/8")
	for _, n := range []int{1, 10, 100, 1000} {
		fwd := chain(n, func(i int) string {
			if i == 0 {
				return `for="[2001:db8:cafe::17]:4711";proto=https`
			}
			return fmt.Sprintf("for=10.0.%d.%d;proto=https;by=10.0.0.1", i/256, i%256)
		})
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			runKeyBench(b, keyOf, benchRequest("10.0.0.1:1", "Forwarded", fwd))
		})
	}
}

func BenchmarkAPIKey(b *testing.B) {
	token := "sk_live_" + strings.Repeat("0123456789abcdef", 4)
	b.Run("hmac", func(b *testing.B) {
		runKeyBench(b, APIKey("Authorization", []byte("secret")), benchRequest("192.0.2.1:1", "Authorization", "Bearer "+token))
	})
	b.Run("sha256", func(b *testing.B) {
		runKeyBench(b, APIKey("X-API-Key", nil), benchRequest("192.0.2.1:1", "X-API-Key", token))
	})
}

func BenchmarkFirst(b *testing.B) {
	// The anonymous case falls through User to RemoteIP.
	runKeyBench(b, First(User(userFromContext), RemoteIP()), benchRequest("192.0.2.1:51234"))
}

func BenchmarkJoin(b *testing.B) {
	runKeyBench(b, Join(RemoteIP(), Method(), Route()), benchRequest("192.0.2.1:51234"))
}
