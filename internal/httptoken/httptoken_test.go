package httptoken

import (
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		s    string
		want bool
	}{
		{"X-API-Key", true},
		{"x_user.id", true},
		{"!#$%&'*+-.^_`|~09azAZ", true},
		{"", false},
		{"X API", false},
		{"X-Key:", false},
		{"Ключ", false},
		{"a\x00b", false},
		{"a\tb", false},
		{"(comment)", false},
		{`"quoted"`, false},
	} {
		if got := Valid(tt.s); got != tt.want {
			t.Errorf("Valid(%q) = %v, want %v", tt.s, got, tt.want)
		}
	}
	// Every byte: exactly the 77 tchars of RFC 9110.
	n := 0
	for c := 0; c < 256; c++ {
		if Valid(string(rune(c))) && c < 128 {
			n++
			if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) && !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
				t.Errorf("byte %q is valid", c)
			}
		}
		if c >= 128 && Valid(string([]byte{byte(c)})) {
			t.Errorf("byte %#x is valid", c)
		}
	}
	if n != 77 {
		t.Errorf("%d valid ASCII bytes, want 77", n)
	}
}
