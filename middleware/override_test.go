package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

func apiRules(overage float64) []middleware.Rule {
	return []middleware.Rule{
		{Name: "api", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(2)}, Overage: overage},
		{Name: "login", Path: "/login", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(5)}, Count: middleware.Count{Status: []middleware.Status{401}}},
	}
}

// quota returns the X-RateLimit-Limit a request from addr gets.
func quota(h http.Handler, addr string) string {
	return doFrom(h, addr, "/x").Header().Get("X-RateLimit-Limit")
}

// TestOverride sets, reads and removes an override on one limiter, checks
// that bad input changes nothing, that it ends when it says, that it
// survives SetRules, and that memory is bounded.
func TestOverride(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			clk := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			var reported atomic.Int64
			reported.Store(-1)
			opts := []middleware.Option{middleware.WithClock(clk.Now), middleware.WithMaxOverrides(2),
				middleware.WithObserver(&middleware.Hooks{OnClientState: func(overrides, _ int) { reported.Store(int64(overrides)) }})}
			if store == "redis" {
				opts = append(opts, middleware.WithStore(redisStoreFor(t)))
			}
			lim, err := middleware.NewRules(apiRules(0), opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = lim.Close() })
			h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			ctx := context.Background()
			const a, b = "192.0.2.1:1", "192.0.2.2:1"
			if q := quota(h, a); q != "2" {
				t.Fatalf("before: quota %s", q)
			}
			o := middleware.Override{Rule: "api", Key: "ip:192.0.2.1", Limits: []middleware.Limit{middleware.PerMinute(100)}, Until: clk.Now().Add(time.Hour)}
			if err := lim.SetOverride(ctx, o); err != nil {
				t.Fatal(err)
			}
			if q, qb := quota(h, a), quota(h, b); q != "100" || qb != "2" {
				t.Fatalf("overridden: quota %s (other client %s), want 100 (2)", q, qb)
			}
			if n := reported.Load(); n != 1 {
				t.Fatalf("observers told of %d overrides, want 1", n)
			}
			if got, ok := lim.Override("api", "ip:192.0.2.1"); !ok || got.Limits[0].Requests != 100 || !got.Until.Equal(o.Until) {
				t.Fatalf("Override = %+v, %v", got, ok)
			}
			if st, err := lim.Peek(ctx, "api", "ip:192.0.2.1"); err != nil || len(st) != 1 || st[0].Limit.Requests != 100 || st[0].Remaining != 98 {
				t.Fatalf("Peek of the overridden client = %+v, %v; want the override's 100, 98 left", st, err)
			}
			// Bad input is refused and changes nothing.
			for _, bad := range []struct {
				o    middleware.Override
				want string
			}{
				{middleware.Override{Rule: "nope", Key: "ip:192.0.2.1", Limits: []middleware.Limit{middleware.PerMinute(1)}}, "unknown rule"},
				{middleware.Override{Rule: "api", Key: "ip:192.0.2.1", Limits: []middleware.Limit{{Requests: 0, Window: time.Minute}}}, "requests must be > 0"},
				{middleware.Override{Rule: "api", Key: "ip:192.0.2.1"}, "no limits"},
				{middleware.Override{Rule: "api", Key: "", Limits: []middleware.Limit{middleware.PerMinute(1)}}, "empty key"},
				{middleware.Override{Rule: "api", Key: "ip:192.0.2.1", Limits: []middleware.Limit{middleware.PerMinute(1), middleware.PerMinute(3)}}, "two limits with window 1m"},
				{middleware.Override{Rule: "login", Key: "ip:192.0.2.1", Limits: []middleware.Limit{middleware.PerMinute(3).SlidingLog()}}, "counting by outcome needs"},
				{middleware.Override{Rule: "api", Key: "ip:192.0.2.1", Limits: []middleware.Limit{middleware.PerMinute(1)}, Until: clk.Now().Add(-time.Second)}, "already past"},
			} {
				err := lim.SetOverride(ctx, bad.o)
				if err == nil || !strings.Contains(err.Error(), bad.want) || !strings.HasPrefix(err.Error(), "sluice: ") {
					t.Errorf("SetOverride(%+v) = %v, want an error with %q", bad.o, err, bad.want)
				}
			}
			if q := quota(h, a); q != "100" || len(lim.Overrides()) != 1 {
				t.Fatalf("after bad input: quota %s, %d overrides", q, len(lim.Overrides()))
			}
			// A reload keeps it, compiled against the new rule.
			if err := lim.SetRules(apiRules(0.5)); err != nil {
				t.Fatal(err)
			}
			rr := doFrom(h, a, "/x")
			if rr.Header().Get("X-RateLimit-Limit") != "100" {
				t.Fatalf("after SetRules: quota %s", rr.Header().Get("X-RateLimit-Limit"))
			}
			// Bounded: a third override is refused.
			if err := lim.SetOverride(ctx, middleware.Override{Rule: "api", Key: "k2", Limits: []middleware.Limit{middleware.PerMinute(1)}}); err != nil {
				t.Fatal(err)
			}
			if err := lim.SetOverride(ctx, middleware.Override{Rule: "api", Key: "k3", Limits: []middleware.Limit{middleware.PerMinute(1)}}); !errors.Is(err, middleware.ErrTooManyOverrides) {
				t.Fatalf("third override: %v, want ErrTooManyOverrides", err)
			}
			// It ends when it says.
			clk.Add(time.Hour)
			if q := quota(h, a); q != "2" {
				t.Fatalf("after the override ended: quota %s", q)
			}
			if ok, err := lim.RemoveOverride(ctx, "api", "k2"); !ok || err != nil {
				t.Fatalf("RemoveOverride = %v, %v", ok, err)
			}
			if n := len(lim.Overrides()); n != 0 {
				t.Fatalf("%d overrides left", n)
			}
		})
	}
}

// TestOverrideFleet sets an override on one of three limiters sharing a
// Redis: the other two apply it within the sync interval, and its removal
// likewise; a limiter made afterwards loads it at once.
func TestOverrideFleet(t *testing.T) {
	t.Parallel()
	store := redisStoreFor(t)
	var hs [3]http.Handler
	var lims [3]*middleware.Limiter
	for i := range lims {
		lim, err := middleware.NewRules(apiRules(0), middleware.WithStore(store), middleware.WithClientSync(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lim.Close() })
		lims[i], hs[i] = lim, lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	}
	const a = "192.0.2.5:1"
	waitQuota := func(i int, want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for quota(hs[i], a) != want {
			if time.Now().After(deadline) {
				t.Fatalf("limiter %d: quota %s after 5 s, want %s", i, quota(hs[i], a), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	o := middleware.Override{Rule: "api", Key: "ip:192.0.2.5", Limits: []middleware.Limit{middleware.PerMinute(50)}}
	if err := lims[0].SetOverride(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if q := quota(hs[0], a); q != "50" {
		t.Fatalf("limiter 0: quota %s at once, want 50", q)
	}
	start := time.Now()
	waitQuota(1, "50")
	waitQuota(2, "50")
	t.Logf("applied fleet-wide in %v", time.Since(start))
	late, err := middleware.NewRules(apiRules(0), middleware.WithStore(store))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = late.Close() })
	deadline := time.Now().Add(5 * time.Second)
	for len(late.Overrides()) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("a new limiter did not load the fleet's override")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if ok, err := lims[1].RemoveOverride(context.Background(), "api", "ip:192.0.2.5"); !ok || err != nil {
		t.Fatalf("RemoveOverride = %v, %v", ok, err)
	}
	waitQuota(0, "2")
	waitQuota(2, "2")
}
