package pathmatch

import "testing"

func TestCompile(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"":                  "",
		"/*":                "",
		"/api/login":        "",
		"/api/*":            "",
		"/users/{id}/posts": "",
		"/users/*/posts":    "",
		"api":               `"api" must start with /`,
		"/api/":             `"/api/" has an empty segment: requests are matched by their cleaned path, without doubled or trailing slashes`,
		"/a/../b":           `"/a/../b" has a ".." segment: requests are matched by their cleaned path, without dot segments`,
		"/a/{x{y}}":         `"/a/{x{y}}": bad segment "{x{y}}": * and {name} stand for whole segments`,
		"/api*":             `"/api*": bad segment "api*": * and {name} stand for whole segments`,
	}
	for p, want := range tests {
		got := ""
		if _, err := Compile(p); err != nil {
			got = err.Error()
		}
		if got != want {
			t.Errorf("Compile(%q) = %q, want %q", p, got, want)
		}
	}
}

func TestMatch(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		pattern, path string
		want          bool
	}{
		{"", "/anything", true},
		{"/api/*", "/api", true},
		{"/api/*", "/api/users/7", true},
		{"/api/*", "/apis", false},
		{"/users/{id}/posts", "/users/7/posts", true},
		{"/users/{id}/posts", "/users/7/posts/1", false},
		{"/users/*/posts", "/users//posts", false},
		{"/api/login", "/api/login", true},
		{"/api/login", "/api", false},
	} {
		m, err := Compile(tt.pattern)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Match(Clean(tt.path)); got != tt.want {
			t.Errorf("%q matches %q: %v, want %v", tt.pattern, tt.path, got, tt.want)
		}
	}
	for p, want := range map[string]string{"": "/", "api": "/api", "/a//b/": "/a/b", "/a/./b/../c": "/a/c", "/clean": "/clean"} {
		if got := Clean(p); got != want {
			t.Errorf("Clean(%q) = %q, want %q", p, got, want)
		}
	}
}
