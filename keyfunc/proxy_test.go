package keyfunc

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// testTrusted is the trusted proxy list of the proxy tests.
var testTrusted = []string{"10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.10"}

func mustTrustedProxies(t testing.TB, header string, cidrs ...string) Func {
	t.Helper()
	fn, err := TrustedProxies(header, cidrs...)
	if err != nil {
		t.Fatalf("TrustedProxies(%q, %q): %v", header, cidrs, err)
	}
	return fn
}

// proxyTest is one request to a ClientIP Func: the peer, the header lines
// of the configured header, and the expected key.
type proxyTest struct {
	name   string
	remote string
	lines  []string
	want   string
}

func runProxyTests(t *testing.T, header string, tests []proxyTest) {
	t.Helper()
	keyOf := mustTrustedProxies(t, header, testTrusted...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRequest(tt.remote)
			for _, l := range tt.lines {
				r.header.Add(header, l)
			}
			got, err := keyOf(r)
			if err != nil {
				t.Fatalf("key(%q, %q): %v", tt.remote, tt.lines, err)
			}
			if got != tt.want {
				t.Errorf("key(%q, %q) = %q, want %q", tt.remote, tt.lines, got, tt.want)
			}
		})
	}
}

func TestClientIPXForwardedFor(t *testing.T) {
	t.Parallel()
	const proxy = "10.0.0.1:5000"
	runProxyTests(t, "X-Forwarded-For", []proxyTest{
		{"untrusted peer ignores header", "203.0.113.5:1", []string{"198.51.100.7"}, "ip:203.0.113.5"},
		{"untrusted IPv6 peer ignores header", "[2001:db8:1:2::9]:1", []string{"198.51.100.7"}, "ip:2001:db8:1:2::/64"},
		{"no header", proxy, nil, "ip:10.0.0.1"},
		{"one hop", proxy, []string{"198.51.100.7"}, "ip:198.51.100.7"},
		{"spoofed entries left of client", proxy, []string{"1.1.1.1, 2.2.2.2, 198.51.100.7"}, "ip:198.51.100.7"},
		{"trusted hops skipped", proxy, []string{"1.1.1.1, 198.51.100.7, 10.0.0.3, 2001:db8:ffff::1"}, "ip:198.51.100.7"},
		{"single-address trusted proxy", "192.0.2.10:1", []string{"1.1.1.1, 198.51.100.7, 192.0.2.10"}, "ip:198.51.100.7"},
		{"neighbour of single-address proxy is untrusted", proxy, []string{"198.51.100.7, 192.0.2.11"}, "ip:192.0.2.11"},
		{"multiple lines", proxy, []string{"1.1.1.1, 198.51.100.7", "10.0.0.3"}, "ip:198.51.100.7"},
		{"multiple lines client in last", proxy, []string{"1.1.1.1", "198.51.100.7, 10.0.0.3"}, "ip:198.51.100.7"},
		{"multiple lines all trusted in last", proxy, []string{"198.51.100.7", "10.0.0.4", "10.0.0.3"}, "ip:198.51.100.7"},
		{"garbage in the middle", proxy, []string{"198.51.100.7, garbage, 10.0.0.2"}, "ip:10.0.0.2"},
		{"garbage rightmost", proxy, []string{"198.51.100.7, garbage"}, "ip:10.0.0.1"},
		{"garbage line", proxy, []string{"198.51.100.7", "garbage", "10.0.0.2"}, "ip:10.0.0.2"},
		{"unknown", proxy, []string{"198.51.100.7, unknown"}, "ip:10.0.0.1"},
		{"host name", proxy, []string{"198.51.100.7, evil.example"}, "ip:10.0.0.1"},
		{"all trusted uses leftmost", proxy, []string{"10.0.0.5, 10.0.0.4, 10.0.0.3"}, "ip:10.0.0.5"},
		{"empty entries skipped", proxy, []string{"198.51.100.7,, ,10.0.0.2,"}, "ip:198.51.100.7"},
		{"only empty entries", proxy, []string{" , ,"}, "ip:10.0.0.1"},
		{"empty line", proxy, []string{""}, "ip:10.0.0.1"},
		{"tabs and spaces", proxy, []string{"\t198.51.100.7 ,\t10.0.0.2 "}, "ip:198.51.100.7"},
		{"IPv4 with port", proxy, []string{"198.51.100.7:4711"}, "ip:198.51.100.7"},
		{"IPv6 with port", proxy, []string{"[2001:db8:cafe:1::17]:4711"}, "ip:2001:db8:cafe:1::/64"},
		{"IPv6 grouped", proxy, []string{"2001:db8:cafe:1:2:3:4:5"}, "ip:2001:db8:cafe:1::/64"},
		{"IPv6 zone stripped", proxy, []string{"fe80::1%eth0"}, "ip:fe80::/64"},
		{"IPv4-mapped client", proxy, []string{"::ffff:198.51.100.7"}, "ip:198.51.100.7"},
		{"IPv4-mapped trusted hop", proxy, []string{"198.51.100.7, ::ffff:10.0.0.9"}, "ip:198.51.100.7"},
		{"zoned trusted hop", proxy, []string{"198.51.100.7, 2001:db8:ffff::1%eth0"}, "ip:198.51.100.7"},
		{"IPv4-mapped peer", "[::ffff:10.0.0.1]:5000", []string{"198.51.100.7"}, "ip:198.51.100.7"},
		{"IPv6 peer", "[2001:db8:ffff::2]:5000", []string{"198.51.100.7"}, "ip:198.51.100.7"},
		{"bare peer", "10.0.0.1", []string{"198.51.100.7"}, "ip:198.51.100.7"},
		{"bracketed IPv4 is garbage", proxy, []string{"198.51.100.7, [10.0.0.2]"}, "ip:10.0.0.1"},
	})
}

// TestClientIPSpoofing checks that a client that connects directly cannot
// change its key, whatever it sends.
func TestClientIPSpoofing(t *testing.T) {
	t.Parallel()
	const remote = "203.0.113.5:1234"
	want, err := RemoteIP()(newRequest(remote))
	if err != nil {
		t.Fatal(err)
	}
	spoofs := []string{
		"198.51.100.7", "10.0.0.1", "127.0.0.1", "::1", "unknown", "",
		"198.51.100.7, 10.0.0.1", "garbage", strings.Repeat("10.0.0.1,", 1000),
		"for=198.51.100.7", `for="[2001:db8::1]:80"`,
	}
	for _, header := range []string{"X-Forwarded-For", "Forwarded", "X-Real-IP"} {
		keyOf := mustTrustedProxies(t, header, testTrusted...)
		for _, spoof := range spoofs {
			r := newRequest(remote, "X-Forwarded-For", spoof, "Forwarded", spoof, "X-Real-IP", spoof)
			if got, err := keyOf(r); err != nil || got != want {
				t.Errorf("%s from untrusted peer with %q: key = %q, %v; want %q", header, spoof, got, err, want)
			}
		}
	}
}

func TestClientIPHopLimit(t *testing.T) {
	t.Parallel()
	keyOf := mustTrustedProxies(t, "X-Forwarded-For", "10.0.0.0/8")
	// chain returns the client followed by n trusted hops 10.0.i.0 for i
	// counting down from n, so the rightmost hop is 10.0.1.0.
	chain := func(n int) string {
		parts := []string{"198.51.100.7"}
		for i := n; i >= 1; i-- {
			parts = append(parts, fmt.Sprintf("10.0.%d.%d", i/256, i%256))
		}
		return strings.Join(parts, ", ")
	}
	tests := []struct {
		hops int
		want string
	}{
		{MaxProxyHops - 1, "ip:198.51.100.7"}, // client is the 64th entry
		{MaxProxyHops, "ip:10.0.0.64"},        // client is the 65th entry
		{1000, "ip:10.0.0.64"},
	}
	for _, tt := range tests {
		got, err := keyOf(newRequest("10.0.0.1:1", "X-Forwarded-For", chain(tt.hops)))
		if err != nil || got != tt.want {
			t.Errorf("%d trusted hops: key = %q, %v; want %q", tt.hops, got, err, tt.want)
		}
	}
	// Empty entries count towards the limit, so that commas cost as much
	// as addresses.
	xff := "198.51.100.7" + strings.Repeat(",", MaxProxyHops)
	if got, _ := keyOf(newRequest("10.0.0.1:1", "X-Forwarded-For", xff)); got != "ip:10.0.0.1" {
		t.Errorf("client behind %d empty entries: key = %q, want the peer", MaxProxyHops, got)
	}
}

func TestClientIPForwarded(t *testing.T) {
	t.Parallel()
	const proxy = "10.0.0.1:5000"
	runProxyTests(t, "Forwarded", []proxyTest{
		{"untrusted peer ignores header", "203.0.113.5:1", []string{"for=198.51.100.7"}, "ip:203.0.113.5"},
		{"no header", proxy, nil, "ip:10.0.0.1"},
		{"token", proxy, []string{"for=198.51.100.7"}, "ip:198.51.100.7"},
		{"quoted", proxy, []string{`for="198.51.100.7"`}, "ip:198.51.100.7"},
		{"quoted IPv6 with port", proxy, []string{`for="[2001:db8:cafe:1::17]:4711"`}, "ip:2001:db8:cafe:1::/64"},
		{"quoted IPv6 without port", proxy, []string{`for="[2001:db8:cafe:1::17]"`}, "ip:2001:db8:cafe:1::/64"},
		{"quoted IPv4 with port", proxy, []string{`for="198.51.100.7:4711"`}, "ip:198.51.100.7"},
		{"unquoted IPv6 as some proxies send", proxy, []string{"for=2001:db8:cafe:1::17"}, "ip:2001:db8:cafe:1::/64"},
		{"unquoted bracketed IPv6", proxy, []string{"for=[2001:db8:cafe:1::17]:80"}, "ip:2001:db8:cafe:1::/64"},
		{"obfuscated port", proxy, []string{`for="198.51.100.7:_abc-1.x"`}, "ip:198.51.100.7"},
		{"parameter name case", proxy, []string{"For=198.51.100.7"}, "ip:198.51.100.7"},
		{"other parameters", proxy, []string{"proto=https;for=198.51.100.7;by=10.0.0.1;host=example.com"}, "ip:198.51.100.7"},
		{"quoted parameters with separators", proxy, []string{`host="a;b=c";for=198.51.100.7`}, "ip:198.51.100.7"},
		{"spaces around pairs", proxy, []string{" for=198.51.100.7 ; proto=http "}, "ip:198.51.100.7"},
		{"empty pairs", proxy, []string{";for=198.51.100.7;;proto=http;"}, "ip:198.51.100.7"},
		{"walk skips trusted", proxy, []string{"for=1.1.1.1, for=198.51.100.7;proto=https, for=10.0.0.2"}, "ip:198.51.100.7"},
		{"multiple lines", proxy, []string{"for=1.1.1.1, for=198.51.100.7", `for="[2001:db8:ffff::1]"`}, "ip:198.51.100.7"},
		{"all trusted uses leftmost", proxy, []string{"for=10.0.0.5, for=10.0.0.4"}, "ip:10.0.0.5"},
		{"hidden identifier stops", proxy, []string{"for=198.51.100.7, for=_hidden, for=10.0.0.2"}, "ip:10.0.0.2"},
		{"unknown stops", proxy, []string{"for=198.51.100.7, for=unknown"}, "ip:10.0.0.1"},
		{"quoted unknown stops", proxy, []string{`for=198.51.100.7, for="unknown"`}, "ip:10.0.0.1"},
		{"element without for stops", proxy, []string{"for=198.51.100.7, proto=https"}, "ip:10.0.0.1"},
		{"repeated for stops", proxy, []string{"for=198.51.100.7;for=1.1.1.1"}, "ip:10.0.0.1"},
		{"unterminated quote stops", proxy, []string{`for="198.51.100.7`}, "ip:10.0.0.1"},
		{"escape in for stops", proxy, []string{`for="\198.51.100.7"`}, "ip:10.0.0.1"},
		{"comma inside quotes stops", proxy, []string{`for=198.51.100.9;ext="a, b"`}, "ip:10.0.0.1"},
		{"forged element in quotes stops", proxy, []string{`for=1.1.1.1;ext="x, for=198.51.100.7"`}, "ip:10.0.0.1"},
		{"garbage after value stops", proxy, []string{"for=198.51.100.7 x"}, "ip:10.0.0.1"},
		{"space around equals stops", proxy, []string{"for = 198.51.100.7"}, "ip:10.0.0.1"},
		{"no value stops", proxy, []string{"for="}, "ip:10.0.0.1"},
		{"empty parameter name stops", proxy, []string{"=x;for=198.51.100.7"}, "ip:10.0.0.1"},
		{"bare XFF value stops", proxy, []string{"198.51.100.7"}, "ip:10.0.0.1"},
		{"bracketed IPv4 stops", proxy, []string{`for="[198.51.100.7]"`}, "ip:10.0.0.1"},
		{"bad port stops", proxy, []string{`for="198.51.100.7:http"`}, "ip:10.0.0.1"},
		{"empty elements skipped", proxy, []string{"for=198.51.100.7, ,, for=10.0.0.2"}, "ip:198.51.100.7"},
	})
}

func TestClientIPRealIP(t *testing.T) {
	t.Parallel()
	const proxy = "10.0.0.1:5000"
	runProxyTests(t, "X-Real-IP", []proxyTest{
		{"untrusted peer ignores header", "203.0.113.5:1", []string{"198.51.100.7"}, "ip:203.0.113.5"},
		{"trusted peer", proxy, []string{"198.51.100.7"}, "ip:198.51.100.7"},
		{"IPv6", proxy, []string{"2001:db8:cafe:1::17"}, "ip:2001:db8:cafe:1::/64"},
		{"spaces", proxy, []string{" 198.51.100.7 "}, "ip:198.51.100.7"},
		{"no header", proxy, nil, "ip:10.0.0.1"},
		{"garbage", proxy, []string{"garbage"}, "ip:10.0.0.1"},
		{"list", proxy, []string{"198.51.100.7, 1.1.1.1"}, "ip:10.0.0.1"},
		{"two lines", proxy, []string{"198.51.100.7", "1.1.1.1"}, "ip:10.0.0.1"},
	})
}

func TestClientIPHeaderCase(t *testing.T) {
	t.Parallel()
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	tests := []struct {
		header string
		line   string
	}{
		{"X-Forwarded-For", "198.51.100.7"},
		{"x-forwarded-for", "198.51.100.7"},
		{"X-FORWARDED-FOR", "198.51.100.7"},
		{"forwarded", "for=198.51.100.7"},
		{"FORWARDED", "for=198.51.100.7"},
		{"x-real-ip", "198.51.100.7"},
		{"X-Real-Ip", "198.51.100.7"},
	}
	for _, tt := range tests {
		keyOf, err := ClientIP(ProxyConfig{Trusted: trusted, Header: tt.header})
		if err != nil {
			t.Errorf("ClientIP(Header: %q): %v", tt.header, err)
			continue
		}
		r := newRequest("10.0.0.1:1", tt.header, tt.line)
		if got, err := keyOf(r); err != nil || got != "ip:198.51.100.7" {
			t.Errorf("ClientIP(Header: %q) key = %q, %v; want ip:198.51.100.7", tt.header, got, err)
		}
	}
}

func TestClientIPConfigErrors(t *testing.T) {
	t.Parallel()
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	tests := []struct {
		name string
		cfg  ProxyConfig
		want []string // substrings of the error
	}{
		{"unsupported header", ProxyConfig{Trusted: trusted, Header: "X-Client-IP"},
			[]string{`"X-Client-IP"`, `"X-Forwarded-For"`, `"Forwarded"`, `"X-Real-IP"`}},
		{"empty header", ProxyConfig{Trusted: trusted},
			[]string{`""`, `"X-Forwarded-For"`}},
		{"header with spaces", ProxyConfig{Trusted: trusted, Header: " X-Forwarded-For"},
			[]string{`" X-Forwarded-For"`}},
		{"no trusted proxies", ProxyConfig{Header: "X-Forwarded-For"},
			[]string{"no trusted proxies"}},
		{"invalid prefix", ProxyConfig{Trusted: []netip.Prefix{trusted[0], {}}, Header: "X-Forwarded-For"},
			[]string{"prefix 1", "invalid"}},
		{"IPv4 prefix too long", ProxyConfig{Trusted: trusted, Header: "X-Forwarded-For", IPv4Prefix: 33},
			[]string{"IPv4 prefix length 33"}},
		{"IPv6 prefix negative", ProxyConfig{Trusted: trusted, Header: "X-Forwarded-For", IPv6Prefix: -1},
			[]string{"IPv6 prefix length -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fn, err := ClientIP(tt.cfg)
			if err == nil || fn != nil {
				t.Fatalf("ClientIP(%+v) = %v, %v; want an error", tt.cfg, fn, err)
			}
			if !strings.HasPrefix(err.Error(), "keyfunc: ClientIP: ") {
				t.Errorf("error %q lacks the keyfunc: ClientIP: prefix", err)
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %s", err, s)
				}
			}
		})
	}
}

func TestTrustedProxies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cidrs  []string
		remote string
		want   string // key for X-Forwarded-For: 198.51.100.7
	}{
		{[]string{"10.0.0.0/8"}, "10.1.2.3:1", "ip:198.51.100.7"},
		{[]string{"10.1.2.3/8"}, "10.9.9.9:1", "ip:198.51.100.7"}, // host bits masked
		{[]string{"192.0.2.10"}, "192.0.2.10:1", "ip:198.51.100.7"},
		{[]string{"192.0.2.10"}, "192.0.2.11:1", "ip:192.0.2.11"},
		{[]string{"2001:db8::1"}, "[2001:db8::1]:1", "ip:198.51.100.7"},
		{[]string{"2001:db8::1"}, "[2001:db8::2]:1", "ip:2001:db8::/64"},
		{[]string{"fe80::1%eth0"}, "[fe80::1%eth1]:1", "ip:198.51.100.7"},
		{[]string{"::ffff:10.0.0.0/104"}, "10.1.2.3:1", "ip:198.51.100.7"},
		{[]string{"::ffff:10.0.0.1"}, "10.0.0.1:1", "ip:198.51.100.7"},
		{[]string{"2001:db8::/32"}, "10.0.0.1:1", "ip:10.0.0.1"},
	}
	for _, tt := range tests {
		keyOf := mustTrustedProxies(t, "X-Forwarded-For", tt.cidrs...)
		r := newRequest(tt.remote, "X-Forwarded-For", "198.51.100.7")
		if got, err := keyOf(r); err != nil || got != tt.want {
			t.Errorf("TrustedProxies(%q) from %s: key = %q, %v; want %q", tt.cidrs, tt.remote, got, err, tt.want)
		}
	}
}

func TestTrustedProxiesErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		header string
		cidrs  []string
		want   string
	}{
		{"X-Forwarded-For", []string{"10.0.0.0/8", "10.0.0.0/33"}, `"10.0.0.0/33"`},
		{"X-Forwarded-For", []string{"nonsense"}, `"nonsense"`},
		{"X-Forwarded-For", []string{""}, `""`},
		{"X-Forwarded-For", []string{"10.0.0.1:80"}, `"10.0.0.1:80"`},
		{"X-Forwarded-For", nil, "no trusted proxies"},
		{"True-Client-IP", []string{"10.0.0.0/8"}, `"True-Client-IP"`},
	}
	for _, tt := range tests {
		fn, err := TrustedProxies(tt.header, tt.cidrs...)
		if err == nil || fn != nil {
			t.Errorf("TrustedProxies(%q, %q) = %v, %v; want an error", tt.header, tt.cidrs, fn, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), "keyfunc: ") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("TrustedProxies(%q, %q) error %q does not mention %s", tt.header, tt.cidrs, err, tt.want)
		}
	}
}

func TestClientIPPrefixes(t *testing.T) {
	t.Parallel()
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	keyOf, err := ClientIP(ProxyConfig{Trusted: trusted, Header: "X-Forwarded-For", IPv4Prefix: 24, IPv6Prefix: 48})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ remote, xff, want string }{
		{"10.0.0.1:1", "198.51.100.7", "ip:198.51.100.0/24"},
		{"10.0.0.1:1", "2001:db8:cafe:1::17", "ip:2001:db8:cafe::/48"},
		// The trust check uses the whole address, not the grouped prefix.
		{"10.0.0.1:1", "198.51.100.7, 10.0.0.2", "ip:198.51.100.0/24"},
		{"203.0.113.5:1", "198.51.100.7", "ip:203.0.113.0/24"},
	}
	for _, tt := range tests {
		if got, err := keyOf(newRequest(tt.remote, "X-Forwarded-For", tt.xff)); err != nil || got != tt.want {
			t.Errorf("key(%s, %q) = %q, %v; want %q", tt.remote, tt.xff, got, err, tt.want)
		}
	}
}

func TestClientIPCopiesConfig(t *testing.T) {
	t.Parallel()
	cfg := ProxyConfig{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Header: "x-forwarded-for"}
	keyOf, err := ClientIP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Trusted[0] = netip.MustParsePrefix("192.0.2.0/24")
	if got, _ := keyOf(newRequest("10.0.0.1:1", "X-Forwarded-For", "198.51.100.7")); got != "ip:198.51.100.7" {
		t.Errorf("after changing cfg.Trusted: key = %q, want ip:198.51.100.7", got)
	}
	if cfg.Header != "x-forwarded-for" || cfg.IPv4Prefix != 0 || cfg.IPv6Prefix != 0 {
		t.Errorf("ClientIP changed its argument: %+v", cfg)
	}
}

func TestClientIPBadPeer(t *testing.T) {
	t.Parallel()
	keyOf := mustTrustedProxies(t, "X-Forwarded-For", "10.0.0.0/8")
	got, err := keyOf(newRequest("@", "X-Forwarded-For", "198.51.100.7"))
	if !errors.Is(err, ErrNoKey) || got != "" {
		t.Errorf("key from a Unix socket peer = %q, %v; want an error wrapping ErrNoKey", got, err)
	}
}

func TestClientIPAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun is disturbed by concurrent tests.
	xff := mustTrustedProxies(t, "X-Forwarded-For", "10.0.0.0/8")
	fwd := mustTrustedProxies(t, "Forwarded", "10.0.0.0/8")
	real := mustTrustedProxies(t, "X-Real-IP", "10.0.0.0/8")
	chain := "198.51.100.7" + strings.Repeat(", 10.0.0.2", 50)
	fchain := `for="[2001:db8::1]:80";proto=https` + strings.Repeat(", for=10.0.0.2;by=10.0.0.3", 50)
	tests := []struct {
		name  string
		keyOf Func
		r     Request
	}{
		{"XFF", xff, newRequest("10.0.0.1:1", "X-Forwarded-For", chain)},
		{"Forwarded", fwd, newRequest("10.0.0.1:1", "Forwarded", fchain)},
		{"X-Real-IP", real, newRequest("10.0.0.1:1", "X-Real-IP", "198.51.100.7")},
	}
	for _, tt := range tests {
		got := testing.AllocsPerRun(100, func() {
			if _, err := tt.keyOf(tt.r); err != nil {
				t.Fatal(err)
			}
		})
		if got > 1 {
			t.Errorf("%s allocates %v times, want at most 1", tt.name, got)
		}
	}
}
