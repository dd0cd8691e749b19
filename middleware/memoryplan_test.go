package middleware_test

import (
	"context"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// TestRedisMemoryPlan measures what the Redis store keeps per client, for
// each thing a rule or the fleet may keep, as docs/redis.md ("Memory")
// tells to plan maxmemory by:
//
//	SLUICE_MEMORY=1 go test -run TestRedisMemoryPlan -v ./middleware/
//
// Each case gets a redis-server of its own and a Limiter on a store with
// the default prefix; 64 goroutines make each of n clients (50,000, or
// SLUICE_MEMORY_KEYS) do what the case keeps something for; the figure is
// the growth of used_memory less the connections' buffers
// (mem_clients_normal), divided by n. Clients share the 262,144 bucket
// hashes as they would in production: fewer clients cost more each (a
// bucket's own overhead is shared by fewer of them).
func TestRedisMemoryPlan(t *testing.T) {
	if os.Getenv("SLUICE_MEMORY") == "" {
		t.Skip("set SLUICE_MEMORY=1 to measure (a minute or two)")
	}
	n := 50_000
	if v := os.Getenv("SLUICE_MEMORY_KEYS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatal(err)
		}
	}
	key := keyfunc.RemoteIP()
	ban := middleware.PerHour(1)
	ban.Ban = time.Hour
	for _, tc := range []struct {
		name string
		rule middleware.Rule
		// requests per client, and what to do for each beyond them.
		requests int
		each     func(ctx context.Context, lim *middleware.Limiter, r keyfunc.Request, addr string) error
		// now measures at once: a lease's slices go back once its counter
		// is idle for two intervals.
		now bool
	}{
		{name: "a rule of one limit (sliding window)", rule: middleware.Rule{Limits: []middleware.Limit{middleware.PerHour(100)}}, requests: 1},
		{name: "a rule of two limits", rule: middleware.Rule{Limits: []middleware.Limit{middleware.PerMinute(10), middleware.PerHour(100)}}, requests: 1},
		// A long interval, so that the first clients' slices are still held
		// (not given back for being idle) when the last ones are made.
		{name: "a rule in lease mode, a slice held", rule: middleware.Rule{Limits: []middleware.Limit{middleware.PerHour(100)}, Sync: middleware.SyncLease, SyncInterval: 10 * time.Second}, requests: 3, now: true},
		{name: "a rule in write_back mode", rule: middleware.Rule{Limits: []middleware.Limit{middleware.PerHour(100)}, Sync: middleware.SyncWriteBack}, requests: 3},
		{name: "a ban (and its counter)", rule: middleware.Rule{Limits: []middleware.Limit{ban}}, requests: 2},
		{name: "a pause", rule: middleware.Rule{Limits: []middleware.Limit{middleware.PerHour(100)}}, each: func(ctx context.Context, lim *middleware.Limiter, r keyfunc.Request, _ string) error {
			_, err := lim.Pause(ctx, r, time.Hour)
			return err
		}},
		{name: "an override", rule: middleware.Rule{Limits: []middleware.Limit{middleware.PerHour(100)}}, each: func(ctx context.Context, lim *middleware.Limiter, _ keyfunc.Request, addr string) error {
			return lim.SetOverride(ctx, middleware.Override{Rule: "r", Key: "ip:" + addr, Limits: []middleware.Limit{middleware.PerHour(10)}})
		}},
		{name: "a concurrency slot held", rule: middleware.Rule{Concurrency: 10}, requests: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Standalone(t)
			c := srv.Client(t, &redis.Options{PoolSize: 128})
			store, err := middleware.NewRedisStore(c, middleware.RedisConfig{Timeout: -1, StallThreshold: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			closeStore(t, store)
			rule := tc.rule
			rule.Name, rule.Key = "r", key
			var granted atomic.Int64
			hooks := &middleware.Hooks{OnSynced: func(e middleware.SyncEvent) {
				if e.Kind == middleware.SyncLeaseGranted {
					granted.Add(1)
				}
			}}
			lim, err := middleware.NewRules([]middleware.Rule{rule}, middleware.WithStore(store), middleware.WithPauses(),
				middleware.WithMaxOverrides(2*n), middleware.WithTopClients(middleware.TopConfig{Off: true}), middleware.WithObserver(hooks))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			ctx := context.Background()
			addr := func(prefix string, i int) string {
				return prefix + "." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
			}
			var held sync.Mutex
			var results []middleware.Result
			fill := func(prefix string, clients int) {
				var next atomic.Int64
				var wg sync.WaitGroup
				var failed atomic.Value
				for range 64 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							i := int(next.Add(1) - 1)
							if i >= clients {
								return
							}
							a := addr(prefix, i)
							r := httptest.NewRequest("GET", "/", nil)
							r.RemoteAddr = a + ":1"
							req := keyfunc.FromHTTP(r)
							for range tc.requests {
								res, err := lim.Decide(req)
								if err == nil {
									err = res.StoreErr
								}
								if err != nil {
									failed.Store(err)
									return
								}
								if rule.Concurrency > 0 {
									held.Lock()
									results = append(results, res) // held until the figure is read
									held.Unlock()
								}
							}
							if tc.each != nil {
								if err := tc.each(ctx, lim, req, a); err != nil {
									failed.Store(err)
									return
								}
							}
						}
					}()
				}
				wg.Wait()
				if f := failed.Load(); f != nil {
					t.Fatal(f)
				}
			}
			fill("10", 256) // warm-up: connections, scripts, the admin keys
			time.Sleep(300 * time.Millisecond)
			mem0 := memoryOfData(t, c)
			fill("11", n)
			if !tc.now {
				time.Sleep(300 * time.Millisecond) // write-back's counts pushed
			}
			mem1 := memoryOfData(t, c)
			t.Logf("%s: %.1f bytes per client (%+.2f MB for %d clients; %d keys; %d leases granted)", tc.name, float64(mem1-mem0)/float64(n), float64(mem1-mem0)/1e6, n, c.DBSize(ctx).Val(), granted.Load())
			for i := range results {
				results[i].Done()
			}
		})
	}
}

// memoryOfData is used_memory less the memory of client connections
// (mem_clients_normal), whose buffers come and go with the traffic.
func memoryOfData(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	f := redistest.InfoMemory(t, c)
	return f["used_memory"] - f["mem_clients_normal"]
}
