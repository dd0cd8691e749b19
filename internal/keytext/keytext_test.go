package keytext

import (
	"net/netip"
	"testing"
)

func TestAppendIP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr   netip.Addr
		v4, v6 int
		want   string
	}{
		{netip.MustParseAddr("192.0.2.1"), 32, 64, "x192.0.2.1"},
		{netip.MustParseAddr("192.0.2.1"), 8, 64, "x192.0.0.0/8"},
		{netip.MustParseAddr("2001:db8::1"), 32, 128, "x2001:db8::1"},
		{netip.MustParseAddr("2001:db8::1"), 32, 64, "x2001:db8::/64"},
		{netip.Addr{}, 32, 64, "x"},
		{netip.MustParseAddr("::ffff:192.0.2.1"), 32, 64, "x192.0.2.1"},
		{netip.MustParseAddr("fe80::1%eth0"), 32, 128, "xfe80::1"},
		{netip.MustParseAddr("192.0.2.1"), 33, 64, "x"},
	}
	for _, tt := range tests {
		if got := string(AppendIP([]byte("x"), tt.addr, tt.v4, tt.v6)); got != tt.want {
			t.Errorf("AppendIP(%v, %d, %d) = %q, want %q", tt.addr, tt.v4, tt.v6, got, tt.want)
		}
	}
}
