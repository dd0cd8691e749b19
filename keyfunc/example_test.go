package keyfunc_test

import (
	"context"
	"fmt"
	"net/http/httptest"

	"github.com/sluicehq/sluice/keyfunc"
)

func ExampleRemoteIP() {
	keyOf := keyfunc.RemoteIP()
	for _, addr := range []string{
		"192.0.2.1:51234",
		"[::ffff:192.0.2.1]:51234", // IPv4 on a dual-stack listener
		"[2001:db8:1:2::a]:443",
		"[2001:db8:1:2:ffff::b]:443", // same /64, same key
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr
		r.Header.Set("X-Forwarded-For", "198.51.100.1") // never read
		key, err := keyOf(keyfunc.FromHTTP(r))
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(key)
	}
	// Output:
	// ip:192.0.2.1
	// ip:192.0.2.1
	// ip:2001:db8:1:2::/64
	// ip:2001:db8:1:2::/64
}

// ExampleClientIP shows how to choose the key function that finds the
// client's address. There is no safe default: pick exactly ONE, based on how
// requests reach the server.
//
//   - [keyfunc.RemoteIP]: the server is directly on the internet, with no
//     reverse proxy in front. No header is read.
//
//   - [keyfunc.ClientIP] with "X-Forwarded-For" or "Forwarded": the server
//     is behind one or more reverse proxies (a load balancer, a CDN) whose
//     address ranges you can list. The header is walked from the right,
//     skipping your proxies; it is ignored for requests that do not come
//     from one of them.
//
//   - [keyfunc.ClientIP] with "X-Real-IP": your only proxy sets X-Real-IP
//     and overwrites any value the client sent, on every request (nginx with
//     proxy_set_header X-Real-IP $remote_addr).
//
// Listing a proxy that also forwards requests it did not receive from your
// own infrastructure lets clients choose their keys. If the server is
// reachable both directly and through the proxies, ClientIP is still
// correct: direct requests are keyed by their own address.
func ExampleClientIP() {
	// Pick ONE; the others are shown commented for reference.

	// (1) Behind load balancers in 10.0.0.0/8 that append to
	// X-Forwarded-For.
	keyOf, err := keyfunc.TrustedProxies("X-Forwarded-For", "10.0.0.0/8")
	if err != nil {
		panic(err) // a configuration error, such as a bad CIDR
	}

	// (2) Behind proxies that send RFC 7239 Forwarded, configured with
	// explicit prefixes and a coarser IPv6 grouping.
	//
	// keyOf, err := keyfunc.ClientIP(keyfunc.ProxyConfig{
	//     Trusted:    []netip.Prefix{netip.MustParsePrefix("2001:db8:ffff::/48")},
	//     Header:     "Forwarded",
	//     IPv6Prefix: 56,
	// })

	// (3) Behind a single nginx on this host that overwrites X-Real-IP.
	//
	// keyOf, err := keyfunc.TrustedProxies("X-Real-IP", "127.0.0.1", "::1")

	// (4) Directly on the internet.
	//
	// keyOf := keyfunc.RemoteIP()

	// Through the load balancer: the client tried to pick its own key by
	// sending X-Forwarded-For, and the balancer appended the real address.
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.7:40000"
	r.Header.Set("X-Forwarded-For", "1.2.3.4, 198.51.100.23")
	key, _ := keyOf(keyfunc.FromHTTP(r))
	fmt.Println(key)

	// Directly, bypassing the balancer: the header is ignored.
	r = httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "203.0.113.9:50000"
	r.Header.Set("X-Forwarded-For", "198.51.100.23")
	key, _ = keyOf(keyfunc.FromHTTP(r))
	fmt.Println(key)
	// Output:
	// ip:198.51.100.23
	// ip:203.0.113.9
}

// userKey is the context key under which an authentication middleware
// stores the user ID.
type userKey struct{}

func userFromContext(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(userKey{}).(string)
	return id, ok
}

// ExampleFirst counts signed-in users by their ID, wherever they connect
// from, and everyone else by address.
func ExampleFirst() {
	keyOf := keyfunc.First(keyfunc.User(userFromContext), keyfunc.RemoteIP())

	anonymous := httptest.NewRequest("GET", "/", nil)
	anonymous.RemoteAddr = "192.0.2.1:51234"

	signedIn := anonymous.WithContext(context.WithValue(anonymous.Context(), userKey{}, "42"))

	for _, req := range []keyfunc.Request{keyfunc.FromHTTP(anonymous), keyfunc.FromHTTP(signedIn)} {
		key, _ := keyOf(req)
		fmt.Println(key)
	}
	// Output:
	// ip:192.0.2.1
	// user:42
}

// ExampleJoin gives each client its own limit per route.
func ExampleJoin() {
	keyOf := keyfunc.Join(keyfunc.RemoteIP(), keyfunc.Route())

	r := httptest.NewRequest("POST", "/login", nil)
	r.RemoteAddr = "192.0.2.1:51234"
	r.Pattern = "POST /login" // set by http.ServeMux when the route matches
	key, _ := keyOf(keyfunc.FromHTTP(r))
	fmt.Println(key)
	// Output: ip:192.0.2.1|route:POST /login
}
