package rulename

import (
	"regexp"
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile("^" + Pattern + "$")
	for _, tt := range []struct {
		name string
		want bool
	}{
		{"api", true},
		{"api-v1.users_2", true},
		{"A", true},
		{strings.Repeat("x", 64), true},
		{strings.Repeat("x", 65), false},
		{"", false},
		{"api key", false},
		{"api/v1", false},
		{"api:1", false},
		{"{tag}", false},
		{"é", false},
		{"api\n", false},
	} {
		if got := Valid(tt.name); got != tt.want {
			t.Errorf("Valid(%q) = %v, want %v", tt.name, got, tt.want)
		}
		if got := re.MatchString(tt.name); got != tt.want {
			t.Errorf("Pattern on %q: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// FuzzValid checks Valid against Pattern as a regular expression.
func FuzzValid(f *testing.F) {
	re := regexp.MustCompile("^" + Pattern + "$")
	for _, s := range []string{"api", "", "a b", strings.Repeat("y", 64), "x\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if Valid(s) != re.MatchString(s) {
			t.Errorf("Valid(%q) = %v, the pattern says %v", s, Valid(s), re.MatchString(s))
		}
	})
}
