package keyfunc

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/sluicehq/sluice/internal/arena"
	"github.com/sluicehq/sluice/internal/keytext"
)

// Default prefix lengths by which RemoteIP and ClientIP group client
// addresses: one key per IPv4 address, one key per IPv6 /64.
//
// A single IPv6 host is usually handed a whole /64 and can pick a new
// address from it for every request, so counting /128s would give every
// such client an unlimited supply of fresh counters.
const (
	DefaultIPv4Prefix = 32
	DefaultIPv6Prefix = 64
)

// errBadRemoteAddr is returned when the peer address is not an IP address,
// for example on a Unix socket listener. It is built once so that the
// failing path does not allocate on every request.
var errBadRemoteAddr = fmt.Errorf("keyfunc: remote address is not an IP address: %w", ErrNoKey)

// RemoteIP returns a Func that keys a request by the address of the peer
// that sent it, Request.RemoteAddr, grouped by DefaultIPv4Prefix and
// DefaultIPv6Prefix. The key is "ip:" followed by the address, such as
// "ip:192.0.2.1", or by the masked prefix when the address is grouped, such
// as "ip:2001:db8:1:2::/64".
//
// RemoteAddr may be "host:port", "[host]:port" or a bare host. IPv6 zones
// are stripped and IPv4-mapped IPv6 addresses (::ffff:192.0.2.1) are keyed
// as the IPv4 address, so one client has one key however it connected.
//
// RemoteIP never reads a header. Use it when the server faces clients
// directly; behind a reverse proxy every request comes from the proxy, so use
// ClientIP instead. The Func returns an error wrapping ErrNoKey when
// RemoteAddr is not an IP address.
func RemoteIP() Func { return remoteIP(DefaultIPv4Prefix, DefaultIPv6Prefix) }

// RemoteIPWithPrefix is like RemoteIP but groups IPv4 addresses by their
// first v4Bits bits and IPv6 addresses by their first v6Bits bits. A prefix
// of the full length (32 or 128) keys each address on its own; a prefix of 0
// puts every client of that family in one bucket.
//
// RemoteIPWithPrefix panics if v4Bits is not in [0, 32] or v6Bits is not in
// [0, 128].
func RemoteIPWithPrefix(v4Bits, v6Bits int) Func {
	if err := checkPrefixBits(v4Bits, v6Bits); err != nil {
		panic("keyfunc: RemoteIPWithPrefix: " + err.Error())
	}
	return remoteIP(v4Bits, v6Bits)
}

func remoteIP(v4Bits, v6Bits int) Func {
	return func(r Request) (string, error) {
		remote := r.RemoteAddr()
		if v4Bits == 32 {
			// Most peers are IPv4 addresses keyed on their own: the key
			// is the address as written.
			if host, ok := plainIPv4(remote); ok {
				return textKey(r, host), nil
			}
		}
		addr, ok := parseHost(remote)
		if !ok {
			return "", errBadRemoteAddr
		}
		return ipKey(r, addr, v4Bits, v6Bits), nil
	}
}

// plainIPv4 returns the host of s when s is an IPv4 address in the
// dotted-decimal form netip.Addr.String writes, alone or followed by a
// port, as parseHost accepts it. Its text is then the canonical form
// keytext.AppendIP would give the parsed address with a prefix of 32 bits. It
// reports false for anything else, which parseHost then decides.
func plainIPv4(s string) (string, bool) {
	fields, val, digits := 0, 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case '0' <= c && c <= '9':
			if digits == 1 && val == 0 {
				return "", false // a leading zero, which netip rejects
			}
			if val = val*10 + int(c-'0'); val > 255 {
				return "", false
			}
			digits++
		case c == '.':
			if digits == 0 || fields == 3 {
				return "", false
			}
			fields, val, digits = fields+1, 0, 0
		case c == ':' && fields == 3 && digits > 0:
			if !isPort(s[i+1:]) {
				return "", false
			}
			return s[:i], true
		default:
			return "", false
		}
	}
	if fields != 3 || digits == 0 {
		return "", false
	}
	return s, true
}

// checkPrefixBits reports an error if either prefix length is out of range.
func checkPrefixBits(v4Bits, v6Bits int) error {
	if v4Bits < 0 || v4Bits > 32 {
		return fmt.Errorf("IPv4 prefix length %d out of range [0, 32]", v4Bits)
	}
	if v6Bits < 0 || v6Bits > 128 {
		return fmt.Errorf("IPv6 prefix length %d out of range [0, 128]", v6Bits)
	}
	return nil
}

// ipKey returns "ip:" followed by the canonical form of addr, carved for
// r (see carve). The key is built in a stack buffer.
func ipKey(r Request, addr netip.Addr, v4Bits, v6Bits int) string {
	var buf [64]byte // "ip:" + the longest IPv6 text (39) + "/128"
	b := append(buf[:0], "ip:"...)
	b = keytext.AppendIP(b, addr, v4Bits, v6Bits)
	return carve(r, b)
}

// textKey returns "ip:" followed by host, which is already in canonical
// form (see plainIPv4), at most 15 bytes.
func textKey(r Request, host string) string {
	var buf [24]byte
	return carve(r, append(append(buf[:0], "ip:"...), host...))
}

// carve returns a copy of b carved from a shared chunk: a fraction of an
// allocation per key. The chunk is r's when r carries one (the request
// view of package middleware's Handler), else one of a pool's.
func carve(r Request, b []byte) string {
	if h, ok := r.(arena.Holder); ok {
		return h.Arena().String(b)
	}
	a := arena.Get()
	k := a.String(b)
	arena.Put(a)
	return k
}

// CanonicalIP returns the prefix a client address is counted under: addr
// with its zone stripped, unmapped to IPv4 if it is an IPv4-mapped IPv6
// address, and masked to v4Bits or v6Bits according to its family. Keys
// name the prefix by its address alone when it covers a single address
// ("ip:192.0.2.1"), in CIDR notation otherwise ("ip:2001:db8:1:2::/64").
//
// CanonicalIP returns the zero Prefix if addr is invalid or the prefix
// length for its family is out of range.
func CanonicalIP(addr netip.Addr, v4Bits, v6Bits int) netip.Prefix {
	return keytext.CanonicalIP(addr, v4Bits, v6Bits)
}

// parseHost parses an address as found in RemoteAddr and in forwarding
// headers: "host:port", "[host]:port", "[host]" or a bare host. It strips
// the IPv6 zone and unmaps IPv4-mapped addresses, so that neither notation
// can be used to alias an address past a prefix check. It does not allocate
// unless s is not an address.
func parseHost(s string) (netip.Addr, bool) {
	host, port, bracketed, ok := splitHostPort(s)
	if !ok || (port != "" && !isPort(port)) {
		return netip.Addr{}, false
	}
	return parseAddr(host, bracketed)
}

// splitHostPort splits s into a host and a port, which is "" if s has none.
// Brackets are required around an IPv6 address followed by a port; an
// address with more than one colon and no brackets is a bare IPv6 address.
func splitHostPort(s string) (host, port string, bracketed, ok bool) {
	if s == "" {
		return "", "", false, false
	}
	if s[0] == '[' {
		end := strings.LastIndexByte(s, ']')
		if end < 0 {
			return "", "", false, false
		}
		host, rest := s[1:end], s[end+1:]
		if rest == "" {
			return host, "", true, true
		}
		if rest[0] != ':' || len(rest) == 1 {
			return "", "", false, false
		}
		return host, rest[1:], true, true
	}
	i := strings.IndexByte(s, ':')
	if i < 0 || strings.IndexByte(s[i+1:], ':') >= 0 {
		return s, "", false, true // bare IPv4 or bare IPv6
	}
	if i == len(s)-1 {
		return "", "", false, false // "host:" with an empty port
	}
	return s[:i], s[i+1:], false, true
}

// parseAddr parses host as an IP address, stripping an IPv6 zone before
// parsing (which avoids interning it) and unmapping IPv4-mapped addresses.
// A bracketed host must be IPv6.
func parseAddr(host string, bracketed bool) (netip.Addr, bool) {
	if i := strings.IndexByte(host, '%'); i >= 0 {
		// Zones belong to IPv6 only, and must not be empty.
		if i == len(host)-1 || strings.IndexByte(host[:i], ':') < 0 {
			return netip.Addr{}, false
		}
		host = host[:i]
	}
	addr, err := netip.ParseAddr(host)
	if err != nil || (bracketed && !addr.Is6()) {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// isPort reports whether s is a decimal port number in [0, 65535], as
// netip.ParseAddrPort accepts it.
func isPort(s string) bool {
	if s == "" {
		return false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return false
		}
		if n = n*10 + int(c-'0'); n > 65535 {
			return false
		}
	}
	return true
}
