package redisstore

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/window"
)

// benchKeys is the number of distinct keys of the "keys-100k" benchmarks.
const benchKeys = 100_000

// BenchmarkTake measures decisions per second and latency percentiles of
// the store against a redis-server of its own on loopback, at concurrency
// 1, 16 and 64, for one hot key and for 100,000 distinct keys, beside a
// baseline of a pipelined INCR + PEXPIRE on the same server:
//
//	go test -run '^$' -bench BenchmarkTake -benchtime 2s -count 3 ./internal/redisstore/
func BenchmarkTake(b *testing.B) {
	srv := redistest.Standalone(b)
	c := srv.Client(b, &redis.Options{PoolSize: 128})
	prefix := srv.Prefix(b)
	// No store timeout: a benchmark on a busy machine measures throughput,
	// and a stall shows in p99 rather than as a failure.
	s, err := New(c, Config{Prefix: prefix, Timeout: -1})
	if err != nil {
		b.Fatal(err)
	}
	// A limit no benchmark reaches, so every decision writes.
	big := window.Limit{Requests: 1 << 30, Window: time.Minute}
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = "ip:10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
	}
	incrKeys := make([]string, benchKeys)
	for i, k := range keys {
		incrKeys[i] = prefix + "incr:" + k
	}
	ctx := context.Background()

	// Create the 100,000 counters first, so the benchmarks update existing
	// ones as a steady state would.
	var populate sync.Once
	populated := func(b *testing.B) {
		populate.Do(func() {
			runConcurrent(b, 64, benchKeys, func(i int, ch []window.Charge, out []window.Decision) error {
				ch[0] = window.Charge{Key: keys[i], Name: "per-ip", Limit: big, Cost: 1}
				_, err := s.Take(ctx, time.Time{}, ch, out)
				return err
			})
		})
	}

	for _, conc := range []int{1, 16, 64} {
		name := "c=" + strconv.Itoa(conc)
		b.Run("store/hot/"+name, func(b *testing.B) {
			measure(b, conc, func(i int, ch []window.Charge, out []window.Decision) error {
				ch[0] = window.Charge{Key: "ip:203.0.113.7", Name: "per-ip", Limit: big, Cost: 1}
				_, err := s.Take(ctx, time.Time{}, ch, out)
				return err
			})
		})
		b.Run("store/keys-100k/"+name, func(b *testing.B) {
			populated(b)
			measure(b, conc, func(i int, ch []window.Charge, out []window.Decision) error {
				ch[0] = window.Charge{Key: keys[i%benchKeys], Name: "per-ip", Limit: big, Cost: 1}
				_, err := s.Take(ctx, time.Time{}, ch, out)
				return err
			})
		})
		b.Run("baseline-incr/hot/"+name, func(b *testing.B) {
			hot := prefix + "incr:hot"
			measure(b, conc, func(i int, _ []window.Charge, _ []window.Decision) error {
				return incr(ctx, c, hot)
			})
		})
		b.Run("baseline-incr/keys-100k/"+name, func(b *testing.B) {
			measure(b, conc, func(i int, _ []window.Charge, _ []window.Decision) error {
				return incr(ctx, c, incrKeys[i%benchKeys])
			})
		})
	}
}

// incr is the baseline: the cheapest fixed-window counter, one pipelined
// INCR and PEXPIRE.
func incr(ctx context.Context, c *redis.Client, key string) error {
	pipe := c.Pipeline()
	pipe.Incr(ctx, key)
	pipe.PExpire(ctx, key, time.Minute)
	_, err := pipe.Exec(ctx)
	return err
}

// measure runs op b.N times from conc goroutines and reports throughput
// and latency percentiles.
func measure(b *testing.B, conc int, op func(i int, ch []window.Charge, out []window.Decision) error) {
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	lat := runConcurrent(b, conc, b.N, op)
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Microsecond)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// runConcurrent runs op n times, with i from 0 to n-1, from conc
// goroutines, and returns the latency of each call.
func runConcurrent(b *testing.B, conc, n int, op func(i int, ch []window.Charge, out []window.Decision) error) []time.Duration {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		all  = make([]time.Duration, 0, n)
	)
	for g := 0; g < conc; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch, out := make([]window.Charge, 1), make([]window.Decision, 1)
			lat := make([]time.Duration, 0, n/conc+1)
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					break
				}
				t := time.Now()
				if err := op(i, ch, out); err != nil {
					b.Error(err)
					break
				}
				lat = append(lat, time.Since(t))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(all) == 0 {
		b.Fatal("no operation completed")
	}
	return all
}

// BenchmarkTakeTimeout is the price of the default 100 ms store timeout, one
// decision at a time on one hot key: with a client that honours context
// deadlines (ContextTimeoutEnabled), and with one that does not, where Take
// waits for the script on a goroutine of its own.
//
//	go test -run '^$' -bench BenchmarkTakeTimeout -benchmem -count 5 ./internal/redisstore/
func BenchmarkTakeTimeout(b *testing.B) {
	srv := redistest.Standalone(b)
	prefix := srv.Prefix(b)
	big := window.Limit{Requests: 1 << 30, Window: time.Minute}
	for _, tc := range []struct {
		name    string
		opts    *redis.Options
		timeout time.Duration
	}{
		{"no-timeout", nil, -1},
		{"context-timeout", &redis.Options{ContextTimeoutEnabled: true}, 0},
		{"detached", nil, 0},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := New(srv.Client(b, tc.opts), Config{Prefix: prefix, Timeout: tc.timeout})
			if err != nil {
				b.Fatal(err)
			}
			ch := []window.Charge{{Key: "ip:203.0.113.7", Name: "per-ip", Limit: big, Cost: 1}}
			out := make([]window.Decision, 1)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Take(ctx, time.Time{}, ch, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
