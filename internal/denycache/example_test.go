package denycache_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/denycache"
	"github.com/sluicehq/sluice/internal/window"
)

// A Limiter asks the cache first, and the store only on a miss; it records
// the store's denials with the instant it gave the store. Here the store is
// the reference arithmetic, window.Take, over one counter.
func Example() {
	cache := denycache.New(denycache.Config{})
	states := make([]window.State, 1)
	charges := []window.Charge{{
		Key:   "ip:192.0.2.1",
		Name:  "api",
		Limit: window.Limit{Requests: 2, Window: time.Second},
		Cost:  1,
	}}
	out := make([]window.Decision, len(charges))
	start := time.Date(2009, 11, 10, 23, 0, 0, 0, time.UTC)

	for i := range 6 {
		now := start.Add(time.Duration(i) * 300 * time.Millisecond)
		if idx, d, ok := cache.Lookup(now, charges); ok {
			// Charges other than idx were not decided: the denial is
			// built from d alone.
			fmt.Printf("%v: denied by the cache (charge %d), retry in %v\n", now.Sub(start), idx, d.RetryAfter)
			continue
		}
		if window.Take(states, window.Millis(now), charges, out) {
			fmt.Printf("%v: admitted by the store\n", now.Sub(start))
			continue
		}
		cache.Record(now, charges, out)
		fmt.Printf("%v: denied by the store, retry in %v\n", now.Sub(start), out[0].RetryAfter)
	}
	// Output:
	// 0s: admitted by the store
	// 300ms: admitted by the store
	// 600ms: denied by the store, retry in 899ms
	// 900ms: denied by the cache (charge 0), retry in 599ms
	// 1.2s: denied by the cache (charge 0), retry in 299ms
	// 1.5s: admitted by the store
}
