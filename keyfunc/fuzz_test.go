package keyfunc

import (
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/keytext"
)

// fuzzTrusted is the trusted proxy list of the fuzz tests.
var fuzzTrusted = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("192.0.2.10/32"),
}

func isFuzzTrusted(a netip.Addr) bool {
	for _, p := range fuzzTrusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// checkIPKey fails t unless key is "ip:" followed by the canonical text of a
// prefix grouped by v4Bits and v6Bits, and returns that prefix.
func checkIPKey(t *testing.T, key string, v4Bits, v6Bits int) netip.Prefix {
	t.Helper()
	rest, ok := strings.CutPrefix(key, "ip:")
	if !ok {
		t.Fatalf("key %q does not start with ip:", key)
	}
	var p netip.Prefix
	if strings.Contains(rest, "/") {
		var err error
		if p, err = netip.ParsePrefix(rest); err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
	} else {
		a, err := netip.ParseAddr(rest)
		if err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	want := v6Bits
	if p.Addr().Is4() {
		want = v4Bits
	}
	if p.Bits() != want || p != p.Masked() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
		t.Fatalf("key %q is not a canonical /%d", key, want)
	}
	if got := string(keytext.AppendIP(nil, p.Addr(), v4Bits, v6Bits)); got != rest {
		t.Fatalf("key %q is not in canonical form %q", key, got)
	}
	return p
}

func FuzzRemoteAddr(f *testing.F) {
	for _, s := range []string{
		"192.0.2.1:1234", "192.0.2.1", "[2001:db8::1]:443", "2001:db8::1",
		"[fe80::1%eth0]:80", "::ffff:192.0.2.1", "[::ffff:192.0.2.1]:80",
		"", "@", "[192.0.2.1]:80", "192.0.2.1:", "[::1", "fe80::1%",
	} {
		f.Add(s)
	}
	keyOf := RemoteIP()
	f.Fuzz(func(t *testing.T, remote string) {
		key, err := keyOf(newRequest(remote))

		// Whatever netip accepts as an address, with or without a port,
		// RemoteIP accepts, and keys by that address.
		var want netip.Addr
		if ap, err := netip.ParseAddrPort(remote); err == nil {
			want = ap.Addr()
		} else if a, err := netip.ParseAddr(remote); err == nil {
			want = a
		} else if inner, ok := strings.CutPrefix(remote, "["); ok && strings.HasSuffix(inner, "]") {
			if a, err := netip.ParseAddr(inner[:len(inner)-1]); err == nil && a.Is6() {
				want = a
			}
		}
		if err != nil {
			if !errors.Is(err, ErrNoKey) || key != "" {
				t.Fatalf("RemoteIP(%q) = %q, %v; want an error wrapping ErrNoKey", remote, key, err)
			}
			if want.IsValid() {
				t.Fatalf("RemoteIP(%q) failed but netip parses %v", remote, want)
			}
			return
		}
		if !want.IsValid() {
			t.Fatalf("RemoteIP(%q) = %q but netip rejects the address", remote, key)
		}
		checkIPKey(t, key, DefaultIPv4Prefix, DefaultIPv6Prefix)
		if w := "ip:" + string(keytext.AppendIP(nil, want, DefaultIPv4Prefix, DefaultIPv6Prefix)); key != w {
			t.Fatalf("RemoteIP(%q) = %q, want %q", remote, key, w)
		}
	})
}

// fuzzRequest returns a request from remote whose header has the lines of
// value separated by newlines, set exactly as given.
func fuzzRequest(remote, header, value string) *testRequest {
	r := newRequest(remote)
	r.header[http.CanonicalHeaderKey(header)] = strings.Split(value, "\n")
	return r
}

// fuzzProxy checks the invariants shared by the X-Forwarded-For and
// Forwarded walks and returns the key, or "" if the peer is not an address.
// Client addresses are not grouped, so that the key names the address.
func fuzzProxy(t *testing.T, header, remote, value, left string) string {
	keyOf, err := ClientIP(ProxyConfig{Trusted: fuzzTrusted, Header: header, IPv6Prefix: 128})
	if err != nil {
		t.Fatal(err)
	}
	r := fuzzRequest(remote, header, value)
	key, err := keyOf(r)
	peerKey, peerErr := RemoteIPWithPrefix(32, 128)(r)
	if err != nil || peerErr != nil {
		if !errors.Is(err, ErrNoKey) || peerErr == nil || key != "" {
			t.Fatalf("key = %q, %v; RemoteIP error %v: want both to fail with ErrNoKey", key, err, peerErr)
		}
		return ""
	}
	client := checkIPKey(t, key, 32, 128).Addr()
	peer, _ := parseHost(remote)

	// A peer that is not a trusted proxy is keyed by its own address,
	// whatever it sends.
	if !isFuzzTrusted(peer) && key != peerKey {
		t.Fatalf("untrusted peer %q: key = %q, want %q", remote, key, peerKey)
	}
	// Once the walk has found an untrusted client, nothing a client adds
	// to the left of the header, as a new line or in the same line, can
	// change the key.
	if !isFuzzTrusted(client) {
		for _, v := range []string{left + "\n" + value, left + "," + value} {
			if got, _ := keyOf(fuzzRequest(remote, header, v)); got != key {
				t.Fatalf("prepending %q changed the key from %q to %q", left, key, got)
			}
		}
	}
	return key
}

// refXFF is a plain reference for the X-Forwarded-For walk: it builds the
// whole list of entries before walking it.
func refXFF(lines []string, peer netip.Addr) netip.Addr {
	var entries []string
	for _, l := range lines {
		entries = append(entries, strings.Split(l, ",")...)
	}
	client := peer
	for i, n := len(entries)-1, 0; i >= 0 && n < MaxProxyHops; i, n = i-1, n+1 {
		e := strings.Trim(entries[i], " \t")
		if e == "" {
			continue
		}
		a, ok := parseHost(e)
		if !ok {
			return client
		}
		if !isFuzzTrusted(a) {
			return a
		}
		client = a
	}
	return client
}

func FuzzXForwardedFor(f *testing.F) {
	for _, s := range [][3]string{
		{"10.0.0.1:1", "198.51.100.7", "1.1.1.1"},
		{"10.0.0.1:1", "1.1.1.1, 198.51.100.7, 10.0.0.2", "2.2.2.2"},
		{"203.0.113.5:1", "198.51.100.7", ""},
		{"10.0.0.1:1", "198.51.100.7, garbage, 10.0.0.2", "x"},
		{"[2001:db8::1]:1", "1.1.1.1\n198.51.100.7, 2001:db8::2", ","},
		{"10.0.0.1:1", "10.0.0.5, 10.0.0.4", "198.51.100.1"},
		{"10.0.0.1:1", "[2001:db8:cafe::17]:4711, ::ffff:10.0.0.3", ""},
		{"10.0.0.1:1", ",,, ,", "1.1.1.1"},
		{"@", "198.51.100.7", ""},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, remote, xff, left string) {
		key := fuzzProxy(t, "X-Forwarded-For", remote, xff, left)
		if key == "" {
			return
		}
		peer, _ := parseHost(remote)
		want := peer
		if isFuzzTrusted(peer) {
			want = refXFF(strings.Split(xff, "\n"), peer)
		}
		if w := ipKey(nil, want, 32, 128); key != w {
			t.Fatalf("X-Forwarded-For %q from %q: key = %q, reference %q", xff, remote, key, w)
		}
	})
}

func FuzzForwarded(f *testing.F) {
	for _, s := range [][3]string{
		{"10.0.0.1:1", "for=198.51.100.7", "for=1.1.1.1"},
		{"10.0.0.1:1", `for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.2`, ""},
		{"10.0.0.1:1", "for=_hidden, for=10.0.0.2", "for=1.1.1.1"},
		{"10.0.0.1:1", `for=198.51.100.9;ext="a, for=1.1.1.1"`, ""},
		{"10.0.0.1:1", "For=198.51.100.7:_x;by=unknown\nfor=10.0.0.3", `for="`},
		{"203.0.113.5:1", "for=198.51.100.7", ""},
		{"10.0.0.1:1", "for=unknown", ""},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, remote, fwd, left string) {
		fuzzProxy(t, "Forwarded", remote, fwd, left)
	})
}
