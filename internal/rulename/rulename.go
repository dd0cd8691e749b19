// Package rulename holds the one pattern that names in rules follow: the
// names of rules (Rule.Name, a rules file's name fields) and of plans,
// which appear in response headers and in store keys. Package middleware
// and package config both check names with it.
package rulename

// Pattern is the pattern a name must match, as error messages quote it.
const Pattern = "[A-Za-z0-9_.-]{1,64}"

// Valid reports whether s matches Pattern: 1 to 64 bytes of ASCII letters,
// digits, '_', '.' and '-'.
func Valid(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '.', c == '-':
		default:
			return false
		}
	}
	return true
}
