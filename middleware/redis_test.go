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
	"github.com/sluicehq/sluice/internal/schedlag"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// TestRedisDown stops, then hangs, a real redis-server under a running
// limiter and checks each failure policy: requests are answered by the
// policy, promptly, the store reports the server down with the cause, and
// the limiter decides with Redis again soon after it is back.
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
			// Default go-redis options: the store, not the client's
			// retries, decides how long a request waits.
			client := srv.Client(t, nil)
			var mu sync.Mutex
			var storeErrs []error
			var health []middleware.HealthEvent
			store, err := middleware.NewRedisStore(client, middleware.RedisConfig{Prefix: srv.Prefix(t)})
			if err != nil {
				t.Fatal(err)
			}
			closeStore(t, store)
			clock := newClock(t0)
			lim := newLimiter(t, middleware.PerMinute(3), keyfunc.RemoteIP(),
				middleware.WithStore(store), middleware.WithClock(clock.Now),
				middleware.WithFailurePolicy(tt.policy),
				// The store's health events reach the limiter's
				// observers.
				middleware.WithObserver(&middleware.Hooks{
					OnStoreFailed: func(_ keyfunc.Request, err error) {
						mu.Lock()
						storeErrs = append(storeErrs, err)
						mu.Unlock()
					},
					OnStoreHealth: func(e middleware.HealthEvent) {
						mu.Lock()
						health = append(health, e)
						mu.Unlock()
					},
				}))
			h := lim.Handler(ok)
			lags := schedlag.Start(t)
			request := func(name string, want step) {
				t.Helper()
				start := time.Now()
				rec := do(h, get("192.0.2.1:1"))
				took, lag := time.Since(start), lags.Worst(start, time.Now())
				t.Logf("%s: %v (scheduling lag %v)", name, took, lag)
				if took > time.Second+lag {
					t.Fatalf("%s: took %v with %v of scheduling lag: the request waited for Redis", name, took, lag)
				}
				if rec.Code != want.code {
					t.Fatalf("%s: status %d, want %d (body %q)", name, rec.Code, want.code, rec.Body)
				}
				if got := rec.Header().Get(headers.Limit) != ""; got != want.limited {
					t.Fatalf("%s: rate-limit headers %v, want %v", name, rec.Header(), want.limited)
				}
			}
			// backInRedis waits until Redis decides again: the store
			// probes a server that was down within a few hundred ms.
			backInRedis := func(wantRemaining string) {
				t.Helper()
				deadline := time.Now().Add(2 * time.Second)
				for {
					rec := do(h, get("192.0.2.1:1"))
					mu.Lock()
					up := len(health) == 0 || health[len(health)-1].Up
					mu.Unlock()
					if up && rec.Code == 200 && rec.Header().Get(headers.Remaining) == wantRemaining {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("Redis did not decide again: status %d, headers %v", rec.Code, rateHeaders(rec.Header()))
					}
					time.Sleep(10 * time.Millisecond)
				}
			}

			// Redis up: counted in Redis. Then a fresh window, whatever
			// the first decisions, which open the store's connections,
			// left to the policy (on a loaded machine they may take longer
			// than the store's timeout); and the events so far are past.
			untilRedisDecides(t, func() (middleware.Result, error) {
				return lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1")))
			}, nil)
			clock.Add(2 * time.Minute)
			mu.Lock()
			storeErrs, health = nil, nil
			mu.Unlock()

			srv.Kill()
			for i, want := range tt.down {
				request("down "+string(rune('1'+i)), want)
			}
			// The store reports the server down from its own goroutine:
			// wait for the report rather than expect it before the
			// requests return.
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				mu.Lock()
				n := len(health)
				mu.Unlock()
				if n > 0 {
					break
				}
			}
			mu.Lock()
			if len(storeErrs) != len(tt.down) {
				t.Errorf("%d store errors reported for %d requests, want one each", len(storeErrs), len(tt.down))
			}
			for _, err := range storeErrs {
				if !errors.Is(err, middleware.ErrStore) || !strings.Contains(err.Error(), "redisstore") {
					t.Errorf("hook got %v, want a wrapped redisstore error", err)
				}
			}
			if len(health) == 0 || health[0].Up || health[0].Cause == nil || health[0].Server != srv.Addr() {
				t.Errorf("health events %+v, want %s down with a cause", health, srv.Addr())
			}
			mu.Unlock()

			// Back (the restarted server kept no counts), then hung: the
			// store stops waiting long before its timeout.
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			backInRedis("2")
			if err := srv.Pause(); err != nil {
				t.Fatal(err)
			}
			request("paused", tt.paused)
			request("paused again", tt.paused)
			if err := srv.Resume(); err != nil {
				t.Fatal(err)
			}
			clock.Add(2 * time.Minute) // a fresh window, whatever FailLocal counted
			backInRedis("2")
			mu.Lock()
			defer mu.Unlock()
			if last := health[len(health)-1]; !last.Up || last.Cause != nil {
				t.Errorf("last health event %+v, want up", last)
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
			middleware.RedisConfig{Prefix: prefix, Timeout: time.Second, StallThreshold: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		closeStore(t, store)
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
