package keyfunc

import (
	"encoding/binary"
	"errors"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

func TestRemoteIP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		remote string
		want   string
	}{
		{"192.0.2.1:1234", "ip:192.0.2.1"},
		{"192.0.2.1", "ip:192.0.2.1"},
		{"192.0.2.1:0", "ip:192.0.2.1"},
		{"192.0.2.1:65535", "ip:192.0.2.1"},
		{"[2001:db8:1:2:3:4:5:6]:443", "ip:2001:db8:1:2::/64"},
		{"2001:db8:1:2:3:4:5:6", "ip:2001:db8:1:2::/64"},
		{"[2001:db8:1:2::1]", "ip:2001:db8:1:2::/64"},
		{"[2001:DB8:1:2::ABCD]:80", "ip:2001:db8:1:2::/64"},
		{"[::1]:8080", "ip:::/64"},
		{"[fe80::1%eth0]:80", "ip:fe80::/64"},
		{"fe80::1%eth0", "ip:fe80::/64"},
		{"[::ffff:192.0.2.1]:80", "ip:192.0.2.1"},
		{"::ffff:192.0.2.1", "ip:192.0.2.1"},
		{"[::ffff:c000:201]:80", "ip:192.0.2.1"},
		{"[::ffff:192.0.2.1%eth0]:80", "ip:192.0.2.1"},
	}
	keyOf := RemoteIP()
	for _, tt := range tests {
		t.Run(tt.remote, func(t *testing.T) {
			t.Parallel()
			got, err := keyOf(newRequest(tt.remote))
			if err != nil {
				t.Fatalf("RemoteIP(%q): %v", tt.remote, err)
			}
			if got != tt.want {
				t.Errorf("RemoteIP(%q) = %q, want %q", tt.remote, got, tt.want)
			}
		})
	}
}

func TestRemoteIPInvalid(t *testing.T) {
	t.Parallel()
	for _, remote := range []string{
		"",
		"@",                 // Unix socket
		"/run/app.sock",     // Unix socket path
		"example.com:80",    // host name
		"192.0.2.1:",        // empty port
		"192.0.2.1:http",    // named port
		"192.0.2.1:65536",   // port out of range
		"192.0.2.1:-1",      // negative port
		"192.0.2.1:80:90",   // neither host:port nor IPv6
		"[192.0.2.1]:80",    // brackets around IPv4
		"[2001:db8::1",      // unclosed bracket
		"[2001:db8::1]80",   // no colon before the port
		"[2001:db8::1]:",    // empty port after brackets
		"2001:db8::1]:80",   // stray bracket
		"192.0.2.1%eth0",    // zone on IPv4
		"fe80::1%",          // empty zone
		"01.2.3.4",          // leading zero
		"192.0.2.1 ",        // trailing space
		" 192.0.2.1:80",     // leading space
		"192.0.2.256",       // octet out of range
		"2001:db8::1::2",    // two "::"
		"[[2001:db8::1]]:8", // double brackets
	} {
		t.Run(remote, func(t *testing.T) {
			t.Parallel()
			got, err := RemoteIP()(newRequest(remote))
			if !errors.Is(err, ErrNoKey) {
				t.Fatalf("RemoteIP(%q) = %q, %v; want an error wrapping ErrNoKey", remote, got, err)
			}
			if got != "" {
				t.Errorf("RemoteIP(%q) returned key %q with its error", remote, got)
			}
		})
	}
}

func TestRemoteIPIgnoresHeaders(t *testing.T) {
	t.Parallel()
	r := newRequest("192.0.2.1:1234",
		"X-Forwarded-For", "198.51.100.7",
		"X-Real-IP", "198.51.100.8",
		"Forwarded", "for=198.51.100.9",
	)
	got, err := RemoteIP()(r)
	if err != nil || got != "ip:192.0.2.1" {
		t.Errorf("RemoteIP = %q, %v; want %q", got, err, "ip:192.0.2.1")
	}
}

func TestRemoteIPWithPrefix(t *testing.T) {
	t.Parallel()
	tests := []struct {
		v4, v6 int
		remote string
		want   string
	}{
		{24, 48, "192.0.2.77:1", "ip:192.0.2.0/24"},
		{24, 48, "[2001:db8:1:2::1]:1", "ip:2001:db8:1::/48"},
		{32, 128, "192.0.2.77:1", "ip:192.0.2.77"},
		{32, 128, "[2001:db8:1:2::1%eth0]:1", "ip:2001:db8:1:2::1"},
		{16, 56, "[::ffff:192.0.2.77]:1", "ip:192.0.0.0/16"},
		{0, 0, "192.0.2.77:1", "ip:0.0.0.0/0"},
		{0, 0, "[2001:db8::1]:1", "ip:::/0"},
		{31, 127, "[2001:db8::3]:1", "ip:2001:db8::2/127"},
	}
	for _, tt := range tests {
		got, err := RemoteIPWithPrefix(tt.v4, tt.v6)(newRequest(tt.remote))
		if err != nil || got != tt.want {
			t.Errorf("RemoteIPWithPrefix(%d, %d)(%q) = %q, %v; want %q", tt.v4, tt.v6, tt.remote, got, err, tt.want)
		}
	}
}

func TestRemoteIPWithPrefixPanics(t *testing.T) {
	t.Parallel()
	for _, bits := range [][2]int{{-1, 64}, {33, 64}, {32, -1}, {32, 129}} {
		func() {
			defer func() {
				msg, _ := recover().(string)
				if !strings.HasPrefix(msg, "keyfunc: RemoteIPWithPrefix: ") {
					t.Errorf("RemoteIPWithPrefix(%d, %d) panicked with %q, want a keyfunc: message", bits[0], bits[1], msg)
				}
			}()
			RemoteIPWithPrefix(bits[0], bits[1])
		}()
	}
}

// TestRemoteIPOneKeyPerIPv6Prefix checks that a client cannot escape its
// limit by rotating through the addresses of its /64.
func TestRemoteIPOneKeyPerIPv6Prefix(t *testing.T) {
	t.Parallel()
	n := 1_000_000
	if testing.Short() {
		n = 10_000
	}
	keyOf := RemoteIP()
	base := netip.MustParseAddr("2001:db8:1:2::").As16()
	const want = "ip:2001:db8:1:2::/64"
	r := newRequest("")
	buf := make([]byte, 0, 64)
	for i := range uint64(n) {
		// Multiplying by an odd constant permutes the interface IDs, so
		// every address is distinct and all bits of the host part vary.
		a := base
		binary.BigEndian.PutUint64(a[8:], i*0x9e3779b97f4a7c15)
		buf = append(buf[:0], '[')
		buf = netip.AddrFrom16(a).AppendTo(buf)
		buf = append(buf, "]:443"...)
		r.remote = string(buf)
		got, err := keyOf(r)
		if err != nil || got != want {
			t.Fatalf("address %d (%s): key = %q, %v; want %q", i, r.remote, got, err, want)
		}
	}
}

func TestCanonicalIP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr   netip.Addr
		v4, v6 int
		want   netip.Prefix
	}{
		{netip.MustParseAddr("192.0.2.1"), 32, 64, netip.MustParsePrefix("192.0.2.1/32")},
		{netip.MustParseAddr("::ffff:192.0.2.1"), 32, 64, netip.MustParsePrefix("192.0.2.1/32")},
		{netip.MustParseAddr("::ffff:192.0.2.1"), 24, 64, netip.MustParsePrefix("192.0.2.0/24")},
		{netip.MustParseAddr("2001:db8:1:2:3::1"), 32, 64, netip.MustParsePrefix("2001:db8:1:2::/64")},
		{netip.MustParseAddr("fe80::1%eth0"), 32, 128, netip.MustParsePrefix("fe80::1/128")},
		{netip.Addr{}, 32, 64, netip.Prefix{}},
		{netip.MustParseAddr("192.0.2.1"), 33, 64, netip.Prefix{}},
		{netip.MustParseAddr("2001:db8::1"), 32, 129, netip.Prefix{}},
	}
	for _, tt := range tests {
		if got := CanonicalIP(tt.addr, tt.v4, tt.v6); got != tt.want {
			t.Errorf("CanonicalIP(%v, %d, %d) = %v, want %v", tt.addr, tt.v4, tt.v6, got, tt.want)
		}
	}
}

func TestRemoteIPAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun is disturbed by concurrent tests.
	tests := []struct {
		remote string
		max    float64
	}{
		{"192.0.2.1:1234", 1},
		{"[2001:db8:1:2::1]:1234", 1},
	}
	keyOf := RemoteIP()
	for _, tt := range tests {
		hr := httptest.NewRequest("GET", "/", nil)
		hr.RemoteAddr = tt.remote
		r := FromHTTP(hr)
		got := testing.AllocsPerRun(100, func() {
			if _, err := keyOf(r); err != nil {
				t.Fatal(err)
			}
		})
		if got > tt.max {
			t.Errorf("RemoteIP(%q) allocates %v times per request, want at most %v", tt.remote, got, tt.max)
		}
	}
}

// TestPlainIPv4 checks RemoteIP's shortcut for IPv4 peers against the
// general path: wherever it takes the address as written, parsing it
// gives the same key, and it never accepts what parsing rejects.
func TestPlainIPv4(t *testing.T) {
	t.Parallel()
	check := func(s string) {
		t.Helper()
		host, ok := plainIPv4(s)
		addr, parsed := parseHost(s)
		switch {
		case ok && !parsed:
			t.Fatalf("plainIPv4(%q) = %q, but parseHost rejects it", s, host)
		case ok && ipKey(nil, addr, 32, 64) != "ip:"+host:
			t.Fatalf("plainIPv4(%q) = %q, but the key of the parsed address is %q", s, host, ipKey(nil, addr, 32, 64))
		case !ok && parsed && addr.Is4() && !strings.ContainsAny(s, "[%") && !strings.HasPrefix(s, "::"):
			t.Fatalf("plainIPv4(%q) rejects an IPv4 address parseHost accepts", s)
		}
	}
	for _, s := range []string{
		"", "0.0.0.0", "255.255.255.255", "255.255.255.255:65535", "192.0.2.1:0",
		"01.2.3.4", "1.2.3.04:1", "00.1.2.3", "0.1.2.3", "256.1.1.1", "1.2.3.256",
		"1.2.3", "1.2.3.4.5", "1..2.3", ".1.2.3.4", "1.2.3.4.", "1.2.3.4:",
		"1.2.3.4:65536", "1.2.3.4:80:90", "1.2.3.4%eth0", "1.2.3.4:+80", "1.2.3.4:0080",
		"1.2.3.4:99999999999999999999", "[1.2.3.4]:80", "::ffff:1.2.3.4", "1.2.3.4 ",
		"1.2.3.4:8a", "1.2.3.1000", "1.2.3.4:80 ",
	} {
		check(s)
	}
	// Random addresses, most of them nearly valid: four fields of one to
	// four digits, a port of up to six digits, and now and then a byte
	// replaced.
	var seed uint64 = 1
	next := func(n uint64) uint64 {
		seed = seed*6364136223846793005 + 1442695040888963407
		return (seed >> 33) % n
	}
	b := make([]byte, 0, 32)
	for range 300_000 {
		b = b[:0]
		for f := range 4 {
			if f > 0 {
				b = append(b, '.')
			}
			for range next(4) + 1 {
				b = append(b, byte('0'+next(10)))
			}
		}
		if next(2) == 0 {
			b = append(b, ':')
			for range next(7) {
				b = append(b, byte('0'+next(10)))
			}
		}
		if next(4) == 0 {
			b[next(uint64(len(b)))] = "0123456789.:%[ x"[next(16)]
		}
		check(string(b))
	}
}
