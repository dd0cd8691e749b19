package middleware_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// TestRedisConcurrencyExact: 4 limiters (app servers, each its own Redis
// client) × 32 goroutines on one key, on standalone Redis and on Cluster:
// never more than N in the handlers at once, and N reached. The limiters
// fail closed, with a long store timeout: a request the store failed to
// decide on a loaded machine would otherwise pass without a slot (fail
// open, the default), which says nothing of the slots' exactness.
func TestRedisConcurrencyExact(t *testing.T) {
	t.Parallel()
	for _, topo := range []string{"standalone", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			t.Parallel()
			const n, servers, goroutines, rounds = 5, 4, 32, 4
			var in, peak, served, failed atomic.Int64
			handler := func() {
				c := in.Add(1)
				for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
				}
				// A request that takes a while: longer than a round trip to
				// a loaded Redis, so that the N holders of slots are in
				// their handlers at once (a slot is also held during the
				// round trips that take and give it back).
				time.Sleep(20 * time.Millisecond)
				in.Add(-1)
				served.Add(1)
			}
			var wg sync.WaitGroup
			// One prefix: the app servers share the counters.
			var prefix string
			if topo == "cluster" {
				prefix = redistest.SharedCluster(t).Prefix(t)
			} else {
				prefix = redistest.Shared(t).Prefix(t)
			}
			for range servers {
				var store middleware.Store
				var err error
				if topo == "cluster" {
					cl := redistest.SharedCluster(t)
					store, err = middleware.NewRedisStore(cl.Client(t, nil), middleware.RedisConfig{Prefix: prefix, Timeout: 5 * time.Second, StallThreshold: 2 * time.Second})
				} else {
					srv := redistest.Shared(t)
					store, err = middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: prefix, Timeout: 5 * time.Second, StallThreshold: 2 * time.Second})
				}
				if err != nil {
					t.Fatal(err)
				}
				closeStore(t, store)
				lim, err := middleware.NewRules([]middleware.Rule{{Name: "slow", Key: keyfunc.Global(), Concurrency: n}},
					middleware.WithStore(store), middleware.WithFailurePolicy(middleware.FailClosed))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { lim.Close() })
				for range goroutines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range rounds {
							res, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1")))
							if err != nil {
								if failed.Add(1) == 1 {
									t.Errorf("a decision failed: %v", err)
								}
								continue
							}
							if res.Allowed {
								handler()
								res.Done()
							}
						}
					}()
				}
			}
			wg.Wait()
			t.Logf("%s: %d served, at most %d in flight", topo, served.Load(), peak.Load())
			if p := peak.Load(); p != n {
				t.Errorf("at most %d in flight, want exactly %d", p, n)
			}
		})
	}
}

// TestRedisConcurrencyLeases: the slots of an app server that stops (its
// limiter closed without the requests ending) come back when their lease
// ends, and a running request's lease is renewed so that it keeps its
// slot past the first lease.
func TestRedisConcurrencyLeases(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	store, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), StallThreshold: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, store)
	const lease = 3 * time.Second
	clock := newClock(t0)
	newLim := func() *middleware.Limiter {
		lim, err := middleware.NewRules([]middleware.Rule{{Name: "slow", Key: keyfunc.RemoteIP(), Concurrency: 2}},
			middleware.WithStore(store), middleware.WithClock(clock.Now), middleware.WithConcurrencyLease(lease))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lim.Close() })
		return lim
	}
	decide := func(lim *middleware.Limiter) middleware.Result {
		t.Helper()
		res, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2.7:1")))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	// App server A takes both slots, then dies: no release, no renewal.
	a, b := newLim(), newLim()
	decide(a)
	decide(a)
	a.Close()
	if res := decide(b); res.Allowed || !res.Concurrency || res.InFlight != 2 {
		t.Fatalf("B while A's leases run: %+v; want denied, 2 in flight", res)
	}
	clock.Add(lease - time.Millisecond)
	if res := decide(b); res.Allowed {
		t.Fatal("B a ms before the leases end: allowed")
	}
	clock.Add(time.Millisecond)
	res1 := decide(b)
	if !res1.Allowed {
		t.Fatalf("B once A's leases ended: %+v; want its slots back", res1)
	}

	// B's request runs past its first lease: B renews it (every lease/3
	// of real time), so at the end of the first lease it still holds it.
	start := clock.Now()
	clock.Add(lease / 2)
	time.Sleep(lease/3 + 500*time.Millisecond) // at least one renewal at start+lease/2
	clock.Add(lease/2 + time.Second)           // past the first lease
	c := newLim()
	r2 := decide(c)
	r3 := decide(c)
	if !r2.Allowed || r3.Allowed {
		t.Fatalf("at %v after the request began: second %v, third %v; want the renewed slot still held (one free)", clock.Now().Sub(start), r2.Allowed, r3.Allowed)
	}
	res1.Done()
	r2.Done()
	if r4 := decide(c); !r4.Allowed {
		t.Fatal("after Done: no slot free")
	} else {
		r4.Done()
	}
}
