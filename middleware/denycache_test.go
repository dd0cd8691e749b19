package middleware_test

import (
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// TestDenyCacheShieldsRedis floods one key at about 10,000 requests a
// second for a second, on the server's clock, and counts the scripts the
// server ran: the admitted requests, and about one more per Retry-After,
// instead of one per request.
func TestDenyCacheShieldsRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for a second of real time")
	}
	t.Parallel()
	const (
		limit      = 10
		goroutines = 10
		perG       = 1000 // at 1 ms intervals: 10,000 requests a second
	)
	srv := redistest.Standalone(t) // its own server: its command counts are this test's
	admin := srv.Client(t, nil)
	run := func(t *testing.T, opts ...middleware.Option) (calls, admitted int, took time.Duration) {
		// MaxBatch 1: one script run per decision, so that the server's
		// count of scripts counts the decisions that reached it (batches
		// of several decisions run as one script).
		store, err := middleware.NewRedisStore(srv.Client(t, &redis.Options{PoolSize: 128}), middleware.RedisConfig{Prefix: srv.Prefix(t), StallThreshold: 2 * time.Second, MaxBatch: 1})
		if err != nil {
			t.Fatal(err)
		}
		closeStore(t, store)
		lim := newLimiter(t, middleware.PerSecond(limit), keyfunc.RemoteIP(), append(opts, middleware.WithStore(store))...)
		before := redistest.ScriptCalls(t, admin)
		began := time.Now()
		var ok atomic.Int64
		var wg sync.WaitGroup
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(time.Millisecond)
				defer tick.Stop()
				r := keyfunc.FromHTTP(get("192.0.2.1:1"))
				for range perG {
					<-tick.C
					res, err := lim.Decide(r)
					if err != nil {
						t.Error(err)
						return
					}
					if res.Allowed {
						ok.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		return redistest.ScriptCalls(t, admin) - before, int(ok.Load()), time.Since(began)
	}
	calls, admitted, took := run(t)
	t.Logf("deny cache: %d requests, %d admitted, %d scripts run", goroutines*perG, admitted, calls)
	// Each admission is one call; each denial the store makes is cached
	// until the next unit comes free (1/limit of a second here), so a
	// refresh costs about one call per unit, plus the requests that reach
	// the store together at the instant an entry expires.
	if bound := admitted + 2*goroutines*(admitted+1); calls > bound {
		t.Errorf("%d scripts for %d admitted, want at most %d", calls, admitted, bound)
	}
	// About a second on a quiet machine; a loaded one drops the tickers'
	// ticks while the goroutines decide, and the run lasts longer (34
	// admitted in 3.4 s beside a second make test).
	if seconds := int(math.Ceil(took.Seconds())); admitted < limit || admitted > 3*limit*seconds {
		t.Errorf("%d admitted in %v at %d/s", admitted, took, limit)
	}
	without, _, _ := run(t, middleware.WithDenyCache(0))
	t.Logf("no deny cache: %d scripts run", without)
	// A request that timed out may have its script run after the count.
	if without < goroutines*perG*9/10 {
		t.Errorf("without the cache %d scripts ran for %d requests: the count is not measuring them", without, goroutines*perG)
	}
}

// TestDenyCacheDecisions checks what a denial from the cache tells the
// client: the same status and fields the store gave, aged by the time that
// passed, and the store asked again once the Retry-After has passed.
func TestDenyCacheDecisions(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	admin := srv.Client(t, nil)
	store, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), StallThreshold: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, store)
	clock := newClock(t0)
	h := newLimiter(t, middleware.PerMinute(2), keyfunc.RemoteIP(), middleware.WithStore(store), middleware.WithClock(clock.Now)).Handler(ok)
	for range 2 {
		if rec := do(h, get("192.0.2.1:1")); rec.Code != http.StatusOK {
			t.Fatalf("status %d", rec.Code)
		}
	}
	first := do(h, get("192.0.2.1:1")) // denied by Redis: 89.999 s
	before := redistest.ScriptCalls(t, admin)
	clock.Add(10 * time.Second)
	second := do(h, get("192.0.2.1:1")) // denied by the cache
	if after := redistest.ScriptCalls(t, admin); after != before {
		// Other tests share the server; only this test's key matters, so
		// check the answer rather than fail on a shared count.
		t.Logf("%d scripts ran meanwhile on the shared server", after-before)
	}
	if first.Code != 429 || second.Code != 429 {
		t.Fatalf("statuses %d, %d; want 429 twice", first.Code, second.Code)
	}
	if got := first.Header().Get("Retry-After"); got != "90" {
		t.Errorf("Retry-After from Redis %q, want 90", got)
	}
	if got := second.Header().Get("Retry-After"); got != "80" {
		t.Errorf("Retry-After from the cache 10 s later %q, want 80", got)
	}
	if got := second.Header().Get("RateLimit"); got != `"default";r=0;t=80` {
		t.Errorf("RateLimit from the cache %q", got)
	}
	// At Retry-After the cache no longer denies, and Redis admits.
	clock.Add(79999 * time.Millisecond)
	if rec := do(h, get("192.0.2.1:1")); rec.Code != http.StatusOK {
		t.Errorf("at Retry-After: status %d, want 200", rec.Code)
	}
}

// closeStore closes a store that has a Close method when the test ends.
func closeStore(t *testing.T, s middleware.Store) {
	if c, ok := s.(interface{ Close() error }); ok {
		t.Cleanup(func() { c.Close() })
	}
}

// TestFallbackStartsInformed: under FailLocal, a client Redis was denying
// when the outage began stays denied until its Retry-After, instead of
// getting a fresh allowance from the local fallback, which takes over for
// it only then.
func TestFallbackStartsInformed(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	store, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, store)
	clock := newClock(t0)
	h := newLimiter(t, middleware.PerMinute(2), keyfunc.RemoteIP(), middleware.WithStore(store),
		middleware.WithClock(clock.Now), middleware.WithFailurePolicy(middleware.FailLocal)).Handler(ok)
	codes := func(n int) []int {
		var c []int
		for range n {
			c = append(c, do(h, get("192.0.2.1:1")).Code)
		}
		return c
	}
	if got := codes(3); !slices.Equal(got, []int{200, 200, 429}) { // the 429 from Redis: 89.999 s
		t.Fatalf("with Redis up: %v", got)
	}
	srv.Kill()
	clock.Add(30 * time.Second)
	if got := codes(2); !slices.Equal(got, []int{429, 429}) {
		t.Errorf("Redis down, 30 s later: %v, want still denied", got)
	}
	// Past the Retry-After Redis gave, the fallback decides: it counts on
	// its own, from zero.
	clock.Add(60 * time.Second)
	if got := codes(3); !slices.Equal(got, []int{200, 200, 429}) {
		t.Errorf("Redis down, past the Retry-After: %v, want the fallback's own 2 then 429", got)
	}
}
