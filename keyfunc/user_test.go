package keyfunc

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestUser(t *testing.T) {
	t.Parallel()
	keyOf := User(userFromContext)
	id64 := strings.Repeat("u", 64)
	id65 := strings.Repeat("u", 65)
	tests := []struct{ id, want string }{
		{"42", "user:42"},
		{"alice@example.com", "user:alice@example.com"},
		{"a|ip:192.0.2.1", "user:a%7Cip:192.0.2.1"},
		{"50%", "user:50%25"},
		{"line\nbreak", "user:line%0Abreak"},
		{id64, "user:" + id64},
		{id65, "user#" + wantHash(id65)},
		{strings.Repeat("|", 65), "user#" + wantHash(strings.Repeat("|", 65))},
		{strings.Repeat("|", 64), "user:" + strings.Repeat("%7C", 64)},
	}
	for _, tt := range tests {
		got, err := keyOf(withUser(newRequest(""), tt.id))
		if err != nil || got != tt.want {
			t.Errorf("User(%q) = %q, %v; want %q", tt.id, got, err, tt.want)
		}
	}
}

func TestUserNotAuthenticated(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		from func(context.Context) (string, bool)
	}{
		{"false", func(context.Context) (string, bool) { return "42", false }},
		{"empty", func(context.Context) (string, bool) { return "", true }},
		{"nothing in context", userFromContext},
	}
	for _, tt := range tests {
		got, err := User(tt.from)(newRequest(""))
		if !errors.Is(err, ErrNoKey) || got != "" {
			t.Errorf("%s: key = %q, %v; want an error wrapping ErrNoKey", tt.name, got, err)
		}
	}
}

func TestUserNilPanics(t *testing.T) {
	t.Parallel()
	defer func() {
		if msg, _ := recover().(string); !strings.HasPrefix(msg, "keyfunc: ") {
			t.Errorf("User(nil) panicked with %q, want a keyfunc: message", msg)
		}
	}()
	User(nil)
}

func TestUserAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun is disturbed by concurrent tests.
	keyOf := User(userFromContext)
	// An ID that fits the stack buffer once escaped, or is hashed.
	for _, id := range []string{"42", "a|b", strings.Repeat("u", 64), strings.Repeat("u", 65)} {
		r := withUser(newRequest(""), id)
		if n := testing.AllocsPerRun(100, func() { _, _ = keyOf(r) }); n > 1 {
			t.Errorf("User(%d-byte ID) allocates %v times, want at most 1", len(id), n)
		}
	}
}
