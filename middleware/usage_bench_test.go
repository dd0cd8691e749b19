package middleware

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// BenchmarkUsage measures what a settle costs: one request decided and
// finished, on the memory store and on Redis in each sync mode, with 8
// goroutines per core each on a key of its own, for
//
//   - requests: a rule of requests only, the reference;
//   - estimate: a rule with a usage limit too, whose requests use just
//     their estimate (nothing to settle);
//   - settle: the same, each request using 5 more than its estimate, which
//     Finish settles.
//
// On Redis it reports the scripts (and all commands) Redis ran per
// request: a settle is one more script run in exact mode (batched with the
// decisions of other requests), part of a slice already leased in lease
// mode, and nothing of its own in write-back mode, whose settles ride on
// the pushes of the counter.
//
//	go test -run '^$' -bench BenchmarkUsage -benchtime 20000x -count 3 ./middleware/
func BenchmarkUsage(b *testing.B) {
	srv := redistest.Standalone(b)
	for _, mode := range []string{"memory", "exact", "lease", "write_back"} {
		for _, kind := range []string{"requests", "estimate", "settle"} {
			b.Run(mode+"/"+kind, func(b *testing.B) {
				rule := Rule{Name: "bench", Key: addrKey, Limits: []Limit{PerMinute(1_000_000_000)}}
				if kind != "requests" {
					rule.Usage = &Usage{Unit: "tokens", Limits: []Limit{PerMinute(1_000_000_000)}, Estimate: 10, Max: 1000}
				}
				var opts []Option
				var client *redis.Client
				if mode != "memory" {
					client = srv.Client(b, &redis.Options{PoolSize: 128})
					store, err := NewRedisStore(client, RedisConfig{Prefix: srv.Prefix(b), StallThreshold: -1, Timeout: 2 * time.Second})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { store.Close() })
					opts = append(opts, WithStore(store))
					rule.Sync, _ = ParseSyncMode(mode)
				}
				lim, err := NewRules([]Rule{rule}, opts...)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { lim.Close() })
				used := 10
				if kind == "settle" {
					used = 15
				}
				var before redistest.Usage
				if client != nil {
					before = redistest.ReadUsage(b, client)
				}
				var keys atomic.Int64
				b.ReportAllocs()
				b.SetParallelism(8)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					r := benchRequest{"k" + strconv.FormatInt(keys.Add(1), 10)}
					for pb.Next() {
						res, err := lim.Decide(r)
						if err != nil || !res.Allowed {
							b.Error(fmt.Errorf("not admitted: %+v %v", res, err))
							return
						}
						if kind != "requests" {
							if err := res.Settle(used); err != nil {
								b.Error(err)
								return
							}
						}
						res.Finish(200)
					}
				})
				b.StopTimer()
				if client != nil {
					if fs := lim.syncs.store.Load(); fs != nil {
						fs.Sync(b.Context(), time.Time{}, true) // what is unsynced or leased
					}
					u := redistest.ReadUsage(b, client).Sub(before)
					b.ReportMetric(float64(u.Scripts)/float64(b.N), "scripts/op")
					b.ReportMetric(float64(u.Commands)/float64(b.N), "cmds/op")
				}
			})
		}
	}
}
