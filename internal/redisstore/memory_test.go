package redisstore

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/window"
)

// TestMemoryPerCounter measures the Redis memory of one counter of each
// algorithm, and of sliding logs holding 10, 100 and 1000 entries:
//
//	SLUICE_MEMORY=1 go test -run TestMemoryPerCounter -v -timeout 30m ./internal/redisstore/
//
// With SLUICE_MEMORY_KEYS=1000000 and -run
// 'TestMemoryPerCounter/^(sliding_window|fixed_window|token_bucket|leaky_bucket|sliding_log/1)$',
// the single-entry counters are measured as BENCHMARKS.md measures the
// sliding window's, a million clients sharing the 262,144 buckets.
//
// Each case gets a redis-server of its own (internal/redistest,
// persistence off) and a store with the default key prefix, without a
// timeout or stall threshold. After a warm-up that
// opens the connections and loads the script (256 clients of its own),
// 64 goroutines make, for each of n client keys (100,000 by default, or
// SLUICE_MEMORY_KEYS; a tenth and a hundredth of it for the logs of 100 and
// 1000 entries), as many requests as the counter is to hold entries, at
// instants 1 ms apart, under a limit of one hour that they fill exactly.
// The figure is the growth of used_memory, less mem_clients_normal
// (connection buffers), divided by n: it includes each counter's share of
// its bucket (the keys are spread over up to 262,144 bucket hashes, whose
// number is reported). Every 100th client is checked to be counted in
// full.
func TestMemoryPerCounter(t *testing.T) {
	if os.Getenv("SLUICE_MEMORY") == "" {
		t.Skip("set SLUICE_MEMORY=1 to measure (a few minutes)")
	}
	n := 100_000
	if v := os.Getenv("SLUICE_MEMORY_KEYS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatal(err)
		}
	}
	h := time.Hour
	for _, tc := range []struct {
		name    string
		limit   window.Limit
		keys    int
		entries int
	}{
		{"sliding_window", swl(10, h), n, 1},
		{"fixed_window", fxl(10, h), n, 1},
		{"fixed_window/calendar_day", call(10, window.CalendarDay, newYork), n, 1},
		{"token_bucket", tbl(10, h, 0), n, 1},
		{"leaky_bucket", lkl(10, h, 0, 0), n, 1},
		{"sliding_log/1", sll(10, h), n, 1},
		{"sliding_log/10", sll(10, h), n, 10},
		{"sliding_log/100", sll(100, h), n / 10, 100},
		{"sliding_log/1000", sll(1000, h), n / 100, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Standalone(t)
			c := srv.Client(t, &redis.Options{PoolSize: 128})
			// No timeout, and a stall threshold generous enough for a
			// loaded machine: the fill must not lose a decision.
			// The default prefix, as in production: the server is this
			// test's own.
			s, err := New(c, Config{Timeout: -1, Pipeline: redispipe.Config{StallThreshold: 10 * time.Second}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			fill := func(prefix string, keys, entries int) {
				t.Helper()
				var next atomic.Int64
				var wg sync.WaitGroup
				var failed atomic.Value
				for g := 0; g < 64; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ch, out := make([]window.Charge, 1), make([]window.Decision, 1)
						for {
							i := int(next.Add(1) - 1)
							if i >= keys {
								return
							}
							ch[0] = window.Charge{Key: prefix + strconv.Itoa(i), Name: "r", Limit: tc.limit, Cost: 1}
							for j := 0; j < entries; j++ {
								ok, err := s.Take(ctx, base.Add(time.Duration(j)*time.Millisecond), ch, out)
								if err != nil || !ok {
									failed.Store(strconv.Itoa(i) + ": " + strconv.FormatBool(ok) + " " + errString(err))
									return
								}
							}
						}
					}()
				}
				wg.Wait()
				if f := failed.Load(); f != nil {
					t.Fatalf("client %s", f)
				}
			}
			fill("warm:", 256, 1)
			mem0, keys0 := dataMemory(t, c), c.DBSize(ctx).Val()
			start := time.Now()
			fill("ip:", tc.keys, tc.entries)
			took := time.Since(start)
			mem1, keys1 := dataMemory(t, c), c.DBSize(ctx).Val()
			for i := 0; i < tc.keys; i += 100 {
				ch := window.Charge{Key: "ip:" + strconv.Itoa(i), Name: "r", Limit: tc.limit}
				if _, d := take(t, s, base.Add(time.Duration(tc.entries)*time.Millisecond), ch); d.Remaining != tc.limit.Capacity()-tc.entries {
					t.Fatalf("client %d: %d remaining, want %d", i, d.Remaining, tc.limit.Capacity()-tc.entries)
				}
			}
			sample := string(s.appendKey(nil, "ip:0"))
			enc := c.ObjectEncoding(ctx, sample).Val()
			usage := c.MemoryUsage(ctx, sample).Val()
			fields := c.HLen(ctx, sample).Val()
			t.Logf("%s: %.1f bytes per counter (used_memory less clients %+.2f MB for %d counters of %d entries in %d buckets; "+
				"a sample bucket holds %d counters in %d bytes as a %s; filled in %s)",
				tc.name, float64(mem1-mem0)/float64(tc.keys), float64(mem1-mem0)/1e6, tc.keys, tc.entries, keys1-keys0,
				fields, usage, enc, took.Round(time.Millisecond))
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// dataMemory is used_memory less the memory of client connections
// (mem_clients_normal), whose buffers come and go with the traffic.
func dataMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	fields := redistest.InfoMemory(t, c)
	used, ok := fields["used_memory"]
	if !ok {
		t.Fatal("INFO memory has no used_memory")
	}
	return used - fields["mem_clients_normal"]
}
