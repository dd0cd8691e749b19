// Package keytext writes client addresses as keys name them, for package
// keyfunc (RemoteIP, ClientIP and the others) and for package config
// (the remote_address values of descriptor files), so that both write the
// same text for the same client.
package keytext

import "net/netip"

// CanonicalIP returns the prefix a client address is counted under: addr
// with its zone stripped, unmapped to IPv4 if it is an IPv4-mapped IPv6
// address, and masked to v4Bits or v6Bits according to its family. It
// returns the zero Prefix if addr is invalid or the prefix length for its
// family is out of range.
func CanonicalIP(addr netip.Addr, v4Bits, v6Bits int) netip.Prefix {
	if !addr.IsValid() {
		return netip.Prefix{}
	}
	addr = addr.Unmap().WithZone("")
	bits := v6Bits
	if addr.Is4() {
		bits = v4Bits
	}
	p, err := addr.Prefix(bits)
	if err != nil {
		return netip.Prefix{}
	}
	return p
}

// AppendIP appends the text form of CanonicalIP(addr, v4Bits, v6Bits) to
// dst and returns the extended buffer: the bare address if the prefix
// covers a single address ("192.0.2.1", "2001:db8::1"), otherwise the
// masked prefix in CIDR notation ("2001:db8:1:2::/64"). It appends nothing
// if CanonicalIP returns the zero Prefix.
func AppendIP(dst []byte, addr netip.Addr, v4Bits, v6Bits int) []byte {
	p := CanonicalIP(addr, v4Bits, v6Bits)
	switch {
	case !p.IsValid():
		return dst
	case p.IsSingleIP():
		return p.Addr().AppendTo(dst)
	default:
		return p.AppendTo(dst)
	}
}
