package keyfunc

import (
	"fmt"
	"net/netip"
	"strings"
)

// The forwarding headers ClientIP can read, in canonical form.
const (
	headerXFF       = "X-Forwarded-For"
	headerForwarded = "Forwarded"
	headerRealIP    = "X-Real-IP"
)

// MaxProxyHops is the most entries of an X-Forwarded-For or Forwarded header
// that ClientIP examines, counted from the right. A chain longer than that,
// made only of trusted proxies, is cut short at the last trusted entry
// reached, so the work per request does not grow with a header an attacker
// pads.
const MaxProxyHops = 64

// ProxyConfig configures ClientIP.
type ProxyConfig struct {
	// Trusted lists the reverse proxies allowed to report the client's
	// address: the peer that sent the request must be in one of these
	// prefixes for Header to be read at all, and the proxies that appear in
	// the header are recognised by the same list. It must not be empty.
	//
	// IPv4 peers match IPv4 prefixes only; an IPv4-mapped prefix such as
	// ::ffff:10.0.0.0/104 is treated as 10.0.0.0/8.
	Trusted []netip.Prefix

	// Header names the header the trusted proxies set, one of
	// "X-Forwarded-For", "Forwarded" (RFC 7239) or "X-Real-IP", in any
	// case.
	Header string

	// IPv4Prefix and IPv6Prefix group client addresses as
	// RemoteIPWithPrefix does. Zero means DefaultIPv4Prefix and
	// DefaultIPv6Prefix.
	IPv4Prefix, IPv6Prefix int
}

// ClientIP returns a Func that keys a request by the address of the client
// behind a set of trusted reverse proxies. Keys have the same form as
// RemoteIP's: "ip:192.0.2.1", "ip:2001:db8:1:2::/64".
//
// If the peer that sent the request is not in cfg.Trusted, the forwarding
// header is ignored and the peer's address is the key, exactly as with
// RemoteIP: a client that connects directly cannot choose its key by sending
// the header itself. If the peer is trusted, the client is found as follows.
//
//   - X-Forwarded-For: every header line, in order, is read as one
//     comma-separated list, which is walked from right to left. Trusted
//     entries are skipped and the first untrusted entry is the client. If
//     every entry is trusted, the leftmost is the client.
//   - Forwarded: the same walk over the for= parameter of each element.
//     Quoted values, "[2001:db8::1]:4711" and obfuscated ports are
//     understood. An obfuscated identifier ("_hidden", "unknown") or an
//     element without a for= parameter stops the walk as a malformed entry
//     does.
//   - X-Real-IP: the header must be present exactly once and hold a single
//     address. Use it only if every trusted proxy overwrites the header on
//     every request.
//
// The walk fails closed: at an entry that is not an address it stops and
// keys the request by the last trusted hop it reached (the peer itself if it
// stopped at the rightmost entry), never by anything to the left of the
// malformed entry. A missing or unusable header likewise keys the request by
// the peer, so misconfigured proxies put all their clients in one bucket
// rather than letting them choose their keys. At most MaxProxyHops entries
// are examined.
//
// Entries may carry a port ("192.0.2.1:4711", "[2001:db8::1]:4711"); zones
// are stripped and IPv4-mapped addresses unmapped before they are checked
// against cfg.Trusted.
//
// ClientIP returns an error if cfg.Header is not one of the accepted
// headers, cfg.Trusted is empty or holds an invalid prefix, or a prefix
// length is out of range. The Func returns an error wrapping ErrNoKey when
// the peer address is not an IP address.
func ClientIP(cfg ProxyConfig) (Func, error) { return clientIP("ClientIP", cfg) }

// TrustedProxies is shorthand for ClientIP with the given header and the
// trusted proxies given as strings: CIDR prefixes ("10.0.0.0/8",
// "2001:db8::/32") or single addresses, which stand for a /32 or /128.
//
// TrustedProxies returns an error naming the first entry that is neither,
// and the errors of ClientIP.
func TrustedProxies(header string, cidrs ...string) (Func, error) {
	trusted := make([]netip.Prefix, 0, len(cidrs))
	for _, s := range cidrs {
		p, err := parseTrusted(s)
		if err != nil {
			return nil, fmt.Errorf("keyfunc: TrustedProxies: bad proxy %q: %w", s, err)
		}
		trusted = append(trusted, p)
	}
	return clientIP("TrustedProxies", ProxyConfig{Trusted: trusted, Header: header})
}

// clientIP implements ClientIP; name is the function named in errors.
func clientIP(name string, cfg ProxyConfig) (Func, error) {
	var header string
	switch {
	case strings.EqualFold(cfg.Header, headerXFF):
		header = headerXFF
	case strings.EqualFold(cfg.Header, headerForwarded):
		header = headerForwarded
	case strings.EqualFold(cfg.Header, headerRealIP):
		header = headerRealIP
	default:
		return nil, fmt.Errorf("keyfunc: %s: unsupported header %q: use %q, %q or %q",
			name, cfg.Header, headerXFF, headerForwarded, headerRealIP)
	}
	if len(cfg.Trusted) == 0 {
		return nil, fmt.Errorf("keyfunc: %s: no trusted proxies: use RemoteIP when no proxy is in front of the server", name)
	}
	trusted := make([]netip.Prefix, len(cfg.Trusted))
	for i, p := range cfg.Trusted {
		if !p.IsValid() {
			return nil, fmt.Errorf("keyfunc: %s: trusted prefix %d is invalid", name, i)
		}
		trusted[i] = normalizePrefix(p)
	}
	v4Bits, v6Bits := cfg.IPv4Prefix, cfg.IPv6Prefix
	if v4Bits == 0 {
		v4Bits = DefaultIPv4Prefix
	}
	if v6Bits == 0 {
		v6Bits = DefaultIPv6Prefix
	}
	if err := checkPrefixBits(v4Bits, v6Bits); err != nil {
		return nil, fmt.Errorf("keyfunc: %s: %w", name, err)
	}
	p := &proxy{trusted: trusted, header: header, v4Bits: v4Bits, v6Bits: v6Bits}
	return p.key, nil
}

// parseTrusted parses a CIDR prefix or a single address.
func parseTrusted(s string) (netip.Prefix, error) {
	if strings.IndexByte(s, '/') >= 0 {
		return netip.ParsePrefix(s)
	}
	addr, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	addr = addr.WithZone("")
	return netip.PrefixFrom(addr, addr.BitLen()), nil
}

// normalizePrefix masks p and turns an IPv4-mapped prefix into the IPv4
// prefix it covers, since addresses are unmapped before they are checked.
func normalizePrefix(p netip.Prefix) netip.Prefix {
	p = p.Masked()
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// proxy is the state of a Func returned by ClientIP.
type proxy struct {
	trusted        []netip.Prefix
	header         string // canonical header name
	v4Bits, v6Bits int
}

func (p *proxy) key(r Request) (string, error) {
	peer, ok := parseHost(r.RemoteAddr())
	if !ok {
		return "", errBadRemoteAddr
	}
	client := peer
	if p.isTrusted(peer) {
		switch p.header {
		case headerXFF:
			client = p.walk(r.Values(headerXFF), peer, false)
		case headerForwarded:
			client = p.walk(r.Values(headerForwarded), peer, true)
		case headerRealIP:
			// Looked up in canonical form, which spares net/http a copy.
			if vs := r.Values("X-Real-Ip"); len(vs) == 1 {
				if addr, ok := parseHost(trimOWS(vs[0])); ok {
					client = addr
				}
			}
		}
	}
	return ipKey(r, client, p.v4Bits, p.v6Bits), nil
}

// isTrusted reports whether addr is in one of the trusted prefixes.
func (p *proxy) isTrusted(addr netip.Addr) bool {
	for _, t := range p.trusted {
		if t.Contains(addr) {
			return true
		}
	}
	return false
}

// walk returns the client address named by a forwarding header whose lines
// are given in the order received, starting from peer, the trusted proxy
// that sent the request. It walks the comma-separated entries from right to
// left without building the list, skipping empty entries, and stops at the
// first untrusted address (the client), at a malformed entry or after
// MaxProxyHops entries (both returning the last trusted hop reached).
//
// The entries are split on commas without regard to quoted strings. A quoted
// string holding a comma can only come from the left of what the trusted
// proxies appended, and the fragments it is cut into are malformed elements,
// which stop the walk.
func (p *proxy) walk(lines []string, peer netip.Addr, forwarded bool) netip.Addr {
	client := peer
	n := 0
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for {
			if n == MaxProxyHops {
				return client
			}
			n++
			entry, rest := line, ""
			comma := strings.LastIndexByte(line, ',')
			if comma >= 0 {
				entry, rest = line[comma+1:], line[:comma]
			}
			if entry = trimOWS(entry); entry != "" {
				var addr netip.Addr
				var ok bool
				if forwarded {
					addr, ok = forwardedFor(entry)
				} else {
					addr, ok = parseHost(entry)
				}
				if !ok {
					return client
				}
				if !p.isTrusted(addr) {
					return addr
				}
				client = addr
			}
			if comma < 0 {
				break
			}
			line = rest
		}
	}
	return client
}

// forwardedFor parses one element of a Forwarded header (RFC 7239, section
// 4), such as `for="[2001:db8::1]:4711";proto=https;by=203.0.113.43`, and
// returns the address of its for= parameter. It reports false if the element
// is malformed, has no for= parameter or more than one, or if the node is not
// an IP address (an obfuscated identifier or "unknown").
func forwardedFor(elem string) (netip.Addr, bool) {
	var node string
	found := false
	s := elem
	for {
		s = trimOWS(s)
		if s == "" {
			break
		}
		if s[0] == ';' { // empty pair
			s = s[1:]
			continue
		}
		i := 0
		for i < len(s) && isTchar(s[i]) {
			i++
		}
		if i == 0 || i == len(s) || s[i] != '=' {
			return netip.Addr{}, false
		}
		name := s[:i]
		s = s[i+1:]
		var value string
		quoted := s != "" && s[0] == '"'
		if quoted {
			end := quotedEnd(s)
			if end < 0 {
				return netip.Addr{}, false
			}
			value, s = s[1:end], s[end+1:]
		} else {
			j := 0
			for j < len(s) && isNodeChar(s[j]) {
				j++
			}
			value, s = s[:j], s[j:]
		}
		if s = trimOWS(s); s != "" && s[0] != ';' {
			return netip.Addr{}, false
		}
		if strings.EqualFold(name, "for") {
			if found || (quoted && strings.IndexByte(value, '\\') >= 0) {
				// A repeated for= is malformed; an address never needs
				// escaping, so refuse rather than unescape into a copy.
				return netip.Addr{}, false
			}
			node, found = value, true
		}
	}
	if !found {
		return netip.Addr{}, false
	}
	return parseNode(node)
}

// parseNode parses a Forwarded node: an address, optionally followed by a
// port, which may be obfuscated ("_abc"). IPv6 addresses belong in brackets
// but are accepted bare, as some proxies send them.
func parseNode(node string) (netip.Addr, bool) {
	host, port, bracketed, ok := splitHostPort(node)
	if !ok || (port != "" && !isPort(port) && !isObfuscated(port)) {
		return netip.Addr{}, false
	}
	return parseAddr(host, bracketed)
}

// isObfuscated reports whether s is an obfuscated identifier:
// "_" 1*(ALPHA / DIGIT / "." / "_" / "-").
func isObfuscated(s string) bool {
	if len(s) < 2 || s[0] != '_' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// quotedEnd returns the index of the quote that closes the quoted string at
// the start of s, honouring backslash escapes, or -1 if it is not closed.
func quotedEnd(s string) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

// isNodeChar reports whether c may appear in an unquoted Forwarded value.
// Besides token characters it allows ':', '[' and ']', which RFC 7239
// requires to be quoted but which some proxies send bare.
func isNodeChar(c byte) bool { return isTchar(c) || c == ':' || c == '[' || c == ']' }

// isTchar reports whether c is a token character (RFC 9110, section 5.6.2).
func isTchar(c byte) bool {
	if isAlnum(c) {
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// trimOWS trims spaces and horizontal tabs from both ends of s.
func trimOWS(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
