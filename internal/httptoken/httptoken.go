// Package httptoken tells HTTP tokens (RFC 9110, section 5.6.2), which is
// what a header field's name must be, for the packages that check the
// header names a rule or a rules file configures.
package httptoken

// Valid reports whether s is a non-empty HTTP token: letters, digits and
// !#$%&'*+-.^_`|~ only.
func Valid(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tchar[s[i]] {
			return false
		}
	}
	return true
}

// tchar marks the bytes a token may hold.
var tchar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()
