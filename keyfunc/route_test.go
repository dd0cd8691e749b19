package keyfunc

import (
	"strings"
	"testing"
)

func TestMethod(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("M", 33)
	tests := []struct{ method, want string }{
		{"GET", "m:GET"},
		{"", "m:GET"},
		{"HEAD", "m:HEAD"},
		{"POST", "m:POST"},
		{"PUT", "m:PUT"},
		{"PATCH", "m:PATCH"},
		{"DELETE", "m:DELETE"},
		{"CONNECT", "m:CONNECT"},
		{"OPTIONS", "m:OPTIONS"},
		{"TRACE", "m:TRACE"},
		{"PURGE", "m:PURGE"},
		{"get", "m:get"},
		{"A|B", "m:A%7CB"},
		{strings.Repeat("M", 32), "m:" + strings.Repeat("M", 32)},
		{long, "m#" + wantHash(long)},
	}
	keyOf := Method()
	for _, tt := range tests {
		r := newRequest("")
		r.method = tt.method
		if got, err := keyOf(r); err != nil || got != tt.want {
			t.Errorf("Method(%q) = %q, %v; want %q", tt.method, got, err, tt.want)
		}
	}
}

func TestRoute(t *testing.T) {
	t.Parallel()
	long := "/" + strings.Repeat("p", 128)
	tests := []struct{ route, path, want string }{
		{"GET /users/{id}", "/users/42", "route:GET /users/{id}"},
		{"/a|b", "/a|b", "route:/a%7Cb"},
		{"", "/users/42", "path:/users/42"},
		{"", "/a|b%", "path:/a%7Cb%25"},
		{"", "/" + strings.Repeat("p", 127), "path:/" + strings.Repeat("p", 127)},
		{"", long, "path#" + wantHash(long)},
		{"", "", "path:"},
	}
	keyOf := Route()
	for _, tt := range tests {
		r := newRequest("")
		r.route, r.path = tt.route, tt.path
		if got, err := keyOf(r); err != nil || got != tt.want {
			t.Errorf("Route(route %q, path %.20q) = %q, %v; want %q", tt.route, tt.path, got, err, tt.want)
		}
	}
}

func TestGlobal(t *testing.T) {
	t.Parallel()
	keyOf := Global()
	for _, remote := range []string{"192.0.2.1:1", "[2001:db8::1]:1", "@"} {
		if got, err := keyOf(newRequest(remote)); err != nil || got != "global" {
			t.Errorf("Global() from %q = %q, %v; want \"global\"", remote, got, err)
		}
	}
}

func TestMethodAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun is disturbed by concurrent tests.
	keyOf := Method()
	r := newRequest("")
	r.method = "POST"
	if n := testing.AllocsPerRun(100, func() { _, _ = keyOf(r) }); n != 0 {
		t.Errorf("Method(POST) allocates %v times, want 0", n)
	}
}
