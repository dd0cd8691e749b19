// Package pathmatch matches request paths against the path patterns of
// rules ("/api/*", "/users/{id}/posts"), for package middleware, which
// matches them, and package config, which checks them where a rules file
// gives them. docs/rules.md gives the patterns' syntax.
package pathmatch

import (
	"fmt"
	"path"
	"strings"
)

// Matcher matches cleaned paths against a pattern split into segments.
type Matcher struct {
	// All reports that the pattern matches every path.
	All      bool
	segs     []string // "" stands for any one segment
	wildcard bool     // the pattern ends in /*
}

// Compile returns the matcher of the path pattern p, or an error that
// says what is wrong with p.
func Compile(p string) (Matcher, error) {
	if p == "" || p == "/*" || p == "*" {
		return Matcher{All: true}, nil
	}
	if !strings.HasPrefix(p, "/") {
		return Matcher{}, fmt.Errorf("%q must start with /", p)
	}
	var m Matcher
	rest := p[1:]
	if strings.HasSuffix(rest, "/*") || rest == "*" {
		m.wildcard = true
		rest = strings.TrimSuffix(strings.TrimSuffix(rest, "*"), "/")
	}
	if rest == "" {
		return m, nil
	}
	for s := range strings.SplitSeq(rest, "/") {
		switch {
		case s == "*" || len(s) > 2 && s[0] == '{' && s[len(s)-1] == '}' && !strings.ContainsAny(s[1:len(s)-1], "{}*"):
			m.segs = append(m.segs, "")
		case s == "":
			return Matcher{}, fmt.Errorf("%q has an empty segment: requests are matched by their cleaned path, without doubled or trailing slashes", p)
		case s == "." || s == "..":
			return Matcher{}, fmt.Errorf("%q has a %q segment: requests are matched by their cleaned path, without dot segments", p, s)
		case strings.ContainsAny(s, "*{}"):
			return Matcher{}, fmt.Errorf("%q: bad segment %q: * and {name} stand for whole segments", p, s)
		default:
			m.segs = append(m.segs, s)
		}
	}
	return m, nil
}

// Match reports whether the cleaned path p matches the pattern.
func (m *Matcher) Match(p string) bool {
	if m.All {
		return true
	}
	rest := strings.TrimPrefix(p, "/")
	for _, want := range m.segs {
		if rest == "" {
			return false
		}
		seg, tail, _ := strings.Cut(rest, "/")
		if want != "" && seg != want {
			return false
		}
		rest = tail
	}
	return rest == "" || m.wildcard
}

// Clean returns p as the rules see it: rooted, without dot segments,
// doubled or trailing slashes. It allocates only when p is not clean.
func Clean(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] == '/' && !strings.Contains(p, "//") && !strings.Contains(p, "/.") && (len(p) == 1 || p[len(p)-1] != '/') {
		return p
	}
	if p[0] != '/' {
		p = "/" + p
	}
	return path.Clean(p)
}
