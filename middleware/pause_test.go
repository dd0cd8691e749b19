package middleware_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// TestPause follows a pause with a fake clock, on the memory store (one
// Limiter's own) and on Redis (two Limiters, as two app servers, sharing
// it): requests of the paused key are denied, charged nothing, until the
// pause ends; other keys are not; a shorter pause does not cut a longer
// one short.
func TestPause(t *testing.T) {
	t.Parallel()
	rules := []middleware.Rule{{Name: "partner", Key: keyfunc.Header("X-Tenant"), Limits: []middleware.Limit{middleware.PerMinute(100)}}}
	req := func(tenant string) keyfunc.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Tenant", tenant)
		return keyfunc.FromHTTP(r)
	}
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			clk := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			opts := []middleware.Option{middleware.WithClock(clk.Now), middleware.WithPauses()}
			if store == "redis" {
				opts = append(opts, middleware.WithStore(redisStoreFor(t)))
			}
			newLim := func() *middleware.Limiter {
				lim, err := middleware.NewRules(rules, opts...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = lim.Close() })
				return lim
			}
			a, b := newLim(), newLim()
			if !a.PausesEnabled() {
				t.Fatal("PausesEnabled is false on a limiter made WithPauses")
			}
			check := func(lim *middleware.Limiter, tenant string, allowed bool, retryAfter time.Duration, remaining int) {
				t.Helper()
				res, err := lim.Decide(req(tenant))
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed != allowed || res.Paused == allowed || res.RetryAfter != retryAfter || res.Remaining != remaining {
					t.Fatalf("tenant %s: allowed %v paused %v retry after %v remaining %d; want allowed %v, retry after %v, remaining %d",
						tenant, res.Allowed, res.Paused, res.RetryAfter, res.Remaining, allowed, retryAfter, remaining)
				}
				if res.Key() != keyOf(t, tenant) {
					t.Fatalf("Key() = %q, want %q", res.Key(), keyOf(t, tenant))
				}
			}
			check(a, "acme", true, 0, 99)
			until, err := a.Pause(context.Background(), req("acme"), 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if want := clk.Now().Add(30 * time.Second); !until.Equal(want) {
				t.Fatalf("Pause ends at %v, want %v", until, want)
			}
			check(a, "acme", false, 30*time.Second, 0)
			check(a, "globex", true, 0, 99) // another key goes on
			if store == "redis" {
				check(b, "acme", false, 30*time.Second, 0) // the fleet's pause
			} else {
				check(b, "acme", true, 0, 99) // a process of its own
			}
			clk.Add(10 * time.Second)
			if u, err := a.Pause(context.Background(), req("acme"), 5*time.Second); err != nil || !u.Equal(until) {
				t.Fatalf("a shorter pause: %v, %v; want the longer one's end %v", u, err, until)
			}
			check(a, "acme", false, 20*time.Second, 0)
			clk.Add(20 * time.Second)
			// Denied requests were charged nothing: one request so far.
			check(a, "acme", true, 0, 98)
			if store == "redis" {
				check(b, "acme", true, 0, 97)
			}
		})
	}
}

func keyOf(t *testing.T, tenant string) string {
	t.Helper()
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Tenant", tenant)
	k, err := keyfunc.Header("X-Tenant")(keyfunc.FromHTTP(r))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestPauseErrors: Pause refuses a limiter made without WithPauses, a
// pause under a millisecond and a request without a key, and a request
// no rule applies to pauses nothing.
func TestPauseErrors(t *testing.T) {
	t.Parallel()
	rules := []middleware.Rule{{Name: "api", Path: "/api/*", Key: keyfunc.Header("X-Key"), Limits: []middleware.Limit{middleware.PerMinute(10)}}}
	plain, err := middleware.NewRules(rules)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })
	r := httptest.NewRequest("GET", "/api/x", nil)
	r.Header.Set("X-Key", "k")
	if _, err := plain.Pause(context.Background(), keyfunc.FromHTTP(r), time.Second); !errors.Is(err, middleware.ErrNoPauses) {
		t.Errorf("Pause without WithPauses: %v, want ErrNoPauses", err)
	}
	if plain.PausesEnabled() {
		t.Error("PausesEnabled is true without WithPauses")
	}
	lim, err := middleware.NewRules(rules, middleware.WithPauses())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	if _, err := lim.Pause(context.Background(), keyfunc.FromHTTP(r), time.Microsecond); err == nil {
		t.Error("a pause of 1µs was accepted")
	}
	if _, err := lim.Pause(context.Background(), keyfunc.FromHTTP(httptest.NewRequest("GET", "/api/x", nil)), time.Second); !errors.Is(err, keyfunc.ErrNoKey) {
		t.Errorf("Pause of a request without a key: %v, want ErrNoKey", err)
	}
	if u, err := lim.Pause(context.Background(), keyfunc.FromHTTP(httptest.NewRequest("GET", "/other", nil)), time.Second); err != nil || !u.IsZero() {
		t.Errorf("Pause of a request no rule applies to: %v, %v; want the zero time", u, err)
	}
}

// TestKeys: the rules and keys a request would be charged under, each
// once, without charging it; not those of shadow rules or rules with only
// a concurrency limit.
func TestKeys(t *testing.T) {
	t.Parallel()
	lim, err := middleware.NewRules([]middleware.Rule{
		{Name: "two", Key: keyfunc.Header("X-Tenant"), Limits: []middleware.Limit{middleware.PerSecond(10), middleware.PerHour(100)}},
		{Name: "shadow", Key: keyfunc.Global(), Limits: []middleware.Limit{middleware.PerSecond(1)}, Shadow: true},
		{Name: "slots", Key: keyfunc.Global(), Concurrency: 2},
		{Name: "api", Path: "/api/*", Key: keyfunc.Method(), Limits: []middleware.Limit{middleware.PerMinute(5)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	r := httptest.NewRequest("GET", "/api/x", nil)
	r.Header.Set("X-Tenant", "acme")
	keys, err := lim.Keys(keyfunc.FromHTTP(r))
	if err != nil {
		t.Fatal(err)
	}
	want := []middleware.RuleKey{{Rule: "two", Key: keyOf(t, "acme")}, {Rule: "api", Key: "m:GET"}}
	if len(keys) != len(want) || keys[0] != want[0] || keys[1] != want[1] {
		t.Errorf("Keys = %v, want %v", keys, want)
	}
	if st, _ := lim.Peek(context.Background(), "two", keyOf(t, "acme")); st[0].Remaining != 10 {
		t.Errorf("Keys charged the request: %d left of 10", st[0].Remaining)
	}
	if _, err := lim.Keys(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil))); !errors.Is(err, keyfunc.ErrNoKey) {
		t.Errorf("Keys of a request without the header: %v, want ErrNoKey", err)
	}
}
