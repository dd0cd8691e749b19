package middleware_test

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// TestRedisDown stops, then hangs, a real redis-server under a running
// limiter and checks each failure policy: requests are answered by the
// policy, promptly, and the limiter recovers when Redis is back.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	type step struct {
		code    int
		limited bool // rate-limit headers expected
	}
	tests := []struct {
		policy middleware.FailurePolicy
		down   []step // while Redis is stopped: 4 requests
		paused step   // then while it hangs
	}{
		{middleware.FailOpen, []step{{200, false}, {200, false}, {200, false}, {200, false}}, step{200, false}},
		{middleware.FailClosed, []step{{503, false}, {503, false}, {503, false}, {503, false}}, step{503, false}},
		// The local fallback counts on its own from zero: 3 pass, then 429.
		{middleware.FailLocal, []step{{200, true}, {200, true}, {200, true}, {429, true}}, step{429, true}},
	}
	for _, tt := range tests {
		t.Run(tt.policy.String(), func(t *testing.T) {
			t.Parallel()
			srv := redistest.Standalone(t)
			client := srv.Client(t, &redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1})
			store, err := middleware.NewRedisStore(client, middleware.RedisConfig{Prefix: srv.Prefix(t), Timeout: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			clock := newClock(t0)
			var mu sync.Mutex
			var storeErrs []error
			var breaker []bool
			lim := newLimiter(t, middleware.PerMinute(3), keyfunc.RemoteIP(),
				middleware.WithStore(store), middleware.WithClock(clock.Now),
				middleware.WithFailurePolicy(tt.policy),
				middleware.WithBreaker(3, time.Second),
				middleware.WithOnError(func(_ keyfunc.Request, err error) {
					mu.Lock()
					storeErrs = append(storeErrs, err)
					mu.Unlock()
				}),
				middleware.WithOnBreakerChange(func(open bool) { breaker = append(breaker, open) }))
			h := lim.Handler(ok)
			request := func(name string, want step) {
				t.Helper()
				start := time.Now()
				rec := do(h, get("192.0.2.1:1"))
				took := time.Since(start)
				t.Logf("%s: %v", name, took)
				if took > 5*time.Second {
					t.Fatalf("%s: took %v: the request waited for Redis", name, took)
				}
				if rec.Code != want.code {
					t.Fatalf("%s: status %d, want %d (body %q)", name, rec.Code, want.code, rec.Body)
				}
				if got := rec.Header().Get(headers.Limit) != ""; got != want.limited {
					t.Fatalf("%s: rate-limit headers %v, want %v", name, rec.Header(), want.limited)
				}
			}

			// Redis up: counted in Redis.
			request("up 1", step{200, true})
			request("up 2", step{200, true})

			srv.Stop()
			for i, want := range tt.down {
				request("down "+string(rune('1'+i)), want)
			}
			// Three failures opened the breaker: the fourth request was
			// answered without trying Redis.
			mu.Lock()
			n := len(storeErrs)
			for _, err := range storeErrs {
				if !errors.Is(err, middleware.ErrStore) || !strings.Contains(err.Error(), "redisstore") {
					t.Errorf("hook got %v, want a wrapped redisstore error", err)
				}
			}
			mu.Unlock()
			if n != 3 || len(breaker) != 1 || !breaker[0] {
				t.Errorf("%d store errors reported and breaker changes %v; want 3 and [true]", n, breaker)
			}

			// Hung server: the store's timeout answers, not Redis.
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			if err := srv.Pause(); err != nil {
				t.Fatal(err)
			}
			clock.Add(time.Second) // the breaker lets one probe through
			request("paused", tt.paused)
			if err := srv.Resume(); err != nil {
				t.Fatal(err)
			}

			// Back: the next probe closes the breaker and Redis decides
			// again (the restarted server kept no counts).
			clock.Add(time.Second)
			rec := do(h, get("192.0.2.1:1"))
			if rec.Code != 200 || rec.Header().Get(headers.Remaining) != "2" {
				t.Fatalf("after recovery: status %d, headers %v", rec.Code, rateHeaders(rec.Header()))
			}
			if len(breaker) != 2 || breaker[1] {
				t.Errorf("breaker changes %v, want [true false]", breaker)
			}
		})
	}
}

// TestRedisSharedBudget runs two limiters, as two app servers would, whose
// own clocks differ by minutes, against one Redis: the store's clock (Redis
// TIME) makes them share one budget.
func TestRedisSharedBudget(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	var handlers []http.Handler
	for range 2 {
		store, err := middleware.NewRedisStore(srv.Client(t, &redis.Options{ContextTimeoutEnabled: true}),
			middleware.RedisConfig{Prefix: prefix, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		handlers = append(handlers, newLimiter(t, middleware.PerHour(10), keyfunc.RemoteIP(), middleware.WithStore(store)).Handler(ok))
	}
	passed := 0
	for i := 0; i < 12; i++ {
		if do(handlers[i%2], get("192.0.2.1:1")).Code == 200 {
			passed++
		}
	}
	if passed != 10 {
		t.Errorf("%d of 12 requests passed through two app servers, want 10", passed)
	}
}
