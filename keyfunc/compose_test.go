package keyfunc

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// constKey returns a Func that always returns key.
func constKey(key string) Func {
	return func(Request) (string, error) { return key, nil }
}

// failing returns a Func that always fails with err and counts its calls.
func failing(err error, calls *int) Func {
	return func(Request) (string, error) {
		*calls++
		return "", err
	}
}

func TestFirst(t *testing.T) {
	t.Parallel()
	hybrid := First(User(userFromContext), RemoteIP())
	tests := []struct {
		name string
		r    *testRequest
		want string
	}{
		{"authenticated", withUser(newRequest("192.0.2.1:1"), "42"), "user:42"},
		{"anonymous", newRequest("192.0.2.1:1"), "ip:192.0.2.1"},
		{"empty user", withUser(newRequest("192.0.2.1:1"), ""), "ip:192.0.2.1"},
	}
	for _, tt := range tests {
		if got, err := hybrid(tt.r); err != nil || got != tt.want {
			t.Errorf("%s: key = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}

	// An API key, then the user, then the address.
	chain := First(APIKey("X-API-Key", nil), User(userFromContext), RemoteIP())
	r := withUser(newRequest("192.0.2.1:1", "X-API-Key", "abc"), "42")
	if got, _ := chain(r); got != "key:"+wantHash("abc") {
		t.Errorf("API key first: key = %q", got)
	}
}

func TestFirstStopsOnOtherErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("session store down")
	var calls int
	keyOf := First(failing(fmt.Errorf("wrapped: %w", ErrNoKey), &calls), failing(boom, &calls), failing(nil, &calls), RemoteIP())
	got, err := keyOf(newRequest("192.0.2.1:1"))
	if !errors.Is(err, boom) || got != "" {
		t.Errorf("key = %q, %v; want the error %v", got, err, boom)
	}
	if errors.Is(err, ErrNoKey) {
		t.Errorf("error %v wraps ErrNoKey; First must not fall through on it", err)
	}
	if calls != 2 {
		t.Errorf("%d functions called, want 2 (none after the failing one)", calls)
	}
}

func TestFirstAllNoKey(t *testing.T) {
	t.Parallel()
	keyOf := First(Header("X-Tenant"), User(userFromContext))
	got, err := keyOf(newRequest("192.0.2.1:1"))
	if !errors.Is(err, ErrNoKey) || got != "" {
		t.Fatalf("key = %q, %v; want an error wrapping ErrNoKey", got, err)
	}
	// The last function's error is returned.
	if _, want := User(userFromContext)(newRequest("")); err.Error() != want.Error() {
		t.Errorf("error = %v, want %v", err, want)
	}
}

func TestJoin(t *testing.T) {
	t.Parallel()
	r := newRequest("192.0.2.1:1")
	r.method, r.route = "POST", "/login"
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}
	var many []Func
	for _, k := range keys {
		many = append(many, constKey(k))
	}
	long := strings.Repeat("x", 300)
	tests := []struct {
		name  string
		keyOf Func
		want  string
	}{
		{"one", Join(RemoteIP()), "ip:192.0.2.1"},
		{"ip and route", Join(RemoteIP(), Route()), "ip:192.0.2.1|route:/login"},
		{"three", Join(Method(), Route(), RemoteIP()), "m:POST|route:/login|ip:192.0.2.1"},
		{"more keys than the stack holds", Join(many...), strings.Join(keys, "|")},
		{"long keys", Join(constKey(long), constKey(long)), long + "|" + long},
		{"escaped parts", Join(constKey("a|b"), constKey("c%")), "a%7Cb|c%25"},
	}
	for _, tt := range tests {
		if got, err := tt.keyOf(r); err != nil || got != tt.want {
			t.Errorf("%s: key = %.80q, %v; want %.80q", tt.name, got, err, tt.want)
		}
	}
}

func TestJoinError(t *testing.T) {
	t.Parallel()
	var calls int
	keyOf := Join(RemoteIP(), User(userFromContext), failing(nil, &calls))
	got, err := keyOf(newRequest("192.0.2.1:1"))
	if !errors.Is(err, ErrNoKey) || got != "" {
		t.Errorf("key = %q, %v; want the User error", got, err)
	}
	if calls != 0 {
		t.Errorf("%d functions called after the failing one, want 0", calls)
	}
}

// TestJoinNoForgery checks that a value containing the separator cannot
// make one combination of keys equal to another.
func TestJoinNoForgery(t *testing.T) {
	t.Parallel()
	keyOf := Join(User(userFromContext), RemoteIP())
	// Alice from 192.0.2.1, and a user who picked the ID
	// "alice|ip:192.0.2.1" from somewhere else.
	victim, err1 := keyOf(withUser(newRequest("192.0.2.1:1"), "alice"))
	forger, err2 := keyOf(withUser(newRequest("198.51.100.7:1"), "alice|ip:192.0.2.1"))
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if victim == forger || strings.HasPrefix(forger, victim) {
		t.Errorf("forged key %q collides with %q", forger, victim)
	}
	if strings.Count(forger, "|") != 1 {
		t.Errorf("key %q has %d separators, want 1", forger, strings.Count(forger, "|"))
	}

	// The same holds for functions that do not escape their own values.
	a, _ := Join(constKey("x|y"), constKey("z"))(newRequest(""))
	b, _ := Join(constKey("x"), constKey("y|z"))(newRequest(""))
	c, _ := Join(constKey("x%7Cy"), constKey("z"))(newRequest(""))
	if a == b || a == c || b == c {
		t.Errorf("Join keys collide: %q, %q, %q", a, b, c)
	}
}

func TestComposePanics(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		fn   func()
		want string
	}{
		{"First()", func() { First() }, "keyfunc: First expects at least one function"},
		{"Join()", func() { Join() }, "keyfunc: Join expects at least one function"},
		{"First(nil)", func() { First(nil) }, "keyfunc: First: function 0 is nil"},
		{"Join(ip, nil)", func() { Join(RemoteIP(), nil) }, "keyfunc: Join: function 1 is nil"},
	}
	for _, tt := range tests {
		func() {
			defer func() {
				if msg, _ := recover().(string); msg != tt.want {
					t.Errorf("%s panicked with %q, want %q", tt.name, msg, tt.want)
				}
			}()
			tt.fn()
		}()
	}
}

func TestComposeCopiesFuncs(t *testing.T) {
	t.Parallel()
	fns := []Func{constKey("a"), constKey("b")}
	first, join := First(fns...), Join(fns...)
	fns[0], fns[1] = constKey("x"), constKey("y")
	if got, _ := first(newRequest("")); got != "a" {
		t.Errorf("First after changing its argument: key = %q, want a", got)
	}
	if got, _ := join(newRequest("")); got != "a|b" {
		t.Errorf("Join after changing its argument: key = %q, want a|b", got)
	}
}

func TestComposeAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun is disturbed by concurrent tests.
	r := newRequest("192.0.2.1:1")
	r.route = "/login"
	hybrid := First(User(userFromContext), RemoteIP())
	if n := testing.AllocsPerRun(100, func() { _, _ = hybrid(r) }); n > 1 {
		t.Errorf("First(User, RemoteIP) for an anonymous request allocates %v times, want at most 1", n)
	}
	// RemoteIP and Route each allocate their key, Join one more.
	join := Join(RemoteIP(), Route())
	if n := testing.AllocsPerRun(100, func() { _, _ = join(r) }); n > 3 {
		t.Errorf("Join(RemoteIP, Route) allocates %v times, want at most 3", n)
	}
}
