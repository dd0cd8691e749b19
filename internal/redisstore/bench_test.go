package redisstore

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redispipe"
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
	// No store timeout, and a stall threshold that a busy machine does not
	// reach: a benchmark on a busy machine measures throughput, and a
	// stall shows in p99 rather than as a failure.
	s, err := New(c, Config{Prefix: prefix, Timeout: -1, Pipeline: redispipe.Config{StallThreshold: 5 * time.Second}})
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
			defer scriptCPU(b, c)()
			measure(b, conc, func(i int, ch []window.Charge, out []window.Decision) error {
				ch[0] = window.Charge{Key: "ip:203.0.113.7", Name: "per-ip", Limit: big, Cost: 1}
				_, err := s.Take(ctx, time.Time{}, ch, out)
				return err
			})
		})
		b.Run("store/keys-100k/"+name, func(b *testing.B) {
			populated(b)
			defer scriptCPU(b, c)()
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

// scriptCPU reads the server's CPU time in scripts (INFO commandstats,
// EVALSHA and EVAL) now, and returns a function that reports, as the
// metric server-µs/op, the time in scripts since per operation of the
// benchmark (each one decision; a script run may decide several): what a
// decision costs Redis's single thread, without the noise of the network
// and the client.
func scriptCPU(b *testing.B, c *redis.Client) func() {
	calls0, usec0 := scriptStats(b, c)
	return func() {
		calls, usec := scriptStats(b, c)
		if calls > calls0 {
			b.ReportMetric(float64(usec-usec0)/float64(b.N), "server-µs/op")
		}
	}
}

// scriptStats returns the calls of EVALSHA and EVAL and the µs they took.
func scriptStats(b *testing.B, c *redis.Client) (calls, usec int64) {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		_, rest, _ := strings.Cut(line, ":")
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				calls += n
			case "usec":
				usec += n
			}
		}
	}
	return calls, usec
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
// deadlines (ContextTimeoutEnabled), and with one that does not, whose
// direct calls go through a clone that gives up at the stall threshold.
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

// BenchmarkAlgorithms measures decisions per second, latency and the
// server's time per decision (server-µs/op, the script's time in Redis's
// single thread) of each algorithm, from 16 goroutines over 10,000 keys,
// with limits that no benchmark reaches so that every decision writes, on
// Redis's clock; and sliding logs held at 10, 100 and 1000 entries:
//
//	go test -run '^$' -bench BenchmarkAlgorithms -benchtime 2s ./internal/redisstore/
func BenchmarkAlgorithms(b *testing.B) {
	srv := redistest.Standalone(b)
	c := srv.Client(b, &redis.Options{PoolSize: 128})
	// No timeout, and a stall threshold that a busy machine does not
	// reach: a stall shows in p99 rather than as a failure.
	s, err := New(c, Config{Prefix: srv.Prefix(b), Timeout: -1, Pipeline: redispipe.Config{StallThreshold: 5 * time.Second}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const keys = 10_000
	names := make([]string, keys)
	for i := range names {
		names[i] = "ip:10.0." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&255)
	}
	nyc, err := time.LoadLocation("America/New_York")
	if err != nil {
		b.Fatal(err)
	}
	big, m := 1<<30, time.Minute
	for _, tc := range []struct {
		name  string
		limit window.Limit
	}{
		{"sliding_window", window.Limit{Requests: big, Window: m}},
		{"fixed_window", window.Limit{Requests: big, Window: m, Algorithm: window.FixedWindow}},
		{"fixed_window/calendar_day", window.Limit{Requests: big, Algorithm: window.FixedWindow, Period: window.CalendarDay, Location: nyc}},
		// Buckets that refill (drain) slowly, so that a counter is never
		// full (empty) again between its decisions, as a sliding window's
		// never expires; and that hold more than any benchmark charges.
		{"token_bucket", window.Limit{Requests: 10, Window: m, Algorithm: window.TokenBucket, Burst: big}},
		{"leaky_bucket", window.Limit{Requests: 10, Window: m, Algorithm: window.LeakyBucket, Burst: big}},
		// At 16 goroutines, each key gets a few requests a second: the
		// log holds a handful of entries.
		{"sliding_log", window.Limit{Requests: 1000, Window: time.Second, Algorithm: window.SlidingLog}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			defer scriptCPU(b, c)()
			measure(b, 16, func(i int, ch []window.Charge, out []window.Decision) error {
				ch[0] = window.Charge{Key: names[i%keys], Name: tc.name, Limit: tc.limit, Cost: 1}
				_, err := s.Take(ctx, time.Time{}, ch, out)
				return err
			})
		})
	}
	// Logs held full at n entries, one per ms: each decision at the next
	// ms admits one entry as the oldest leaves.
	for _, n := range []int{10, 100, 1000} {
		b.Run("sliding_log/full-"+strconv.Itoa(n), func(b *testing.B) {
			l := window.Limit{Requests: n, Window: time.Duration(n) * time.Millisecond, Algorithm: window.SlidingLog}
			const logKeys = 100
			var clock [logKeys]atomic.Int64
			base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			runConcurrent(b, 16, logKeys*n, func(i int, ch []window.Charge, out []window.Decision) error {
				k := i % logKeys
				ch[0] = window.Charge{Key: names[k], Name: l.String(), Limit: l, Cost: 1}
				_, err := s.Take(ctx, base.Add(time.Duration(clock[k].Add(1))*time.Millisecond), ch, out)
				return err
			})
			defer scriptCPU(b, c)()
			measure(b, 16, func(i int, ch []window.Charge, out []window.Decision) error {
				k := i % logKeys
				ch[0] = window.Charge{Key: names[k], Name: l.String(), Limit: l, Cost: 1}
				_, err := s.Take(ctx, base.Add(time.Duration(clock[k].Add(1))*time.Millisecond), ch, out)
				return err
			})
		})
	}
}

// BenchmarkScript measures what a decision of each algorithm costs the
// server alone: the script's time in Redis's single thread per decision
// (server-µs/op), with the scripts sent 100 to a pipeline from one
// connection over 10,000 keys (100,000 / n for logs held full at n
// entries), so that the client and the network weigh as little as
// possible on the server; per-run-1 runs the script once per decision,
// per-run-16 decides 16 requests (of different clients) per run, as the
// Pipeliner merges the decisions of a batch. Limits are never reached, so
// every decision writes; the logs are held full at 1, 10, 100 and 1000
// entries; sliding_window/cold decides each time for a counter that does
// not exist yet (a new client), after 100,000 others:
//
//	go test -run '^$' -bench BenchmarkScript -count 5 ./internal/redisstore/
func BenchmarkScript(b *testing.B) {
	srv := redistest.Standalone(b)
	c := srv.Client(b, nil)
	s := &Store{prefix: srv.Prefix(b)}
	ctx := context.Background()
	if err := script.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	nyc, err := time.LoadLocation("America/New_York")
	if err != nil {
		b.Fatal(err)
	}
	const keys = 10_000
	big, m := 1<<30, time.Minute
	type tc struct {
		name  string
		limit window.Limit
		full  int  // entries a log is held at, 0 for Redis's clock
		cold  bool // every decision for a counter that does not exist yet
	}
	cases := []tc{
		{"sliding_window", window.Limit{Requests: big, Window: m}, 0, false},
		{"sliding_window/cold", window.Limit{Requests: big, Window: m}, 0, true},
		{"fixed_window", window.Limit{Requests: big, Window: m, Algorithm: window.FixedWindow}, 0, false},
		{"fixed_window/calendar_day", window.Limit{Requests: big, Algorithm: window.FixedWindow, Period: window.CalendarDay, Location: nyc}, 0, false},
		// Buckets that refill (drain) slowly, as in BenchmarkAlgorithms.
		{"token_bucket", window.Limit{Requests: 10, Window: m, Algorithm: window.TokenBucket, Burst: big}, 0, false},
		{"leaky_bucket", window.Limit{Requests: 10, Window: m, Algorithm: window.LeakyBucket, Burst: big}, 0, false},
	}
	for _, n := range []int{1, 10, 100, 1000} {
		cases = append(cases, tc{"sliding_log/full-" + strconv.Itoa(n), window.Limit{Requests: n, Window: time.Duration(n) * time.Millisecond, Algorithm: window.SlidingLog}, n, false})
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			keys0 := keys
			if tc.cold {
				keys0 = 100_000
			}
			if tc.full > 1 {
				keys0 = 100_000 / tc.full // a million entries to fill at most
			}
			ks, fs := make([]string, keys0), make([][]byte, keys0)
			for i := range ks {
				ch := window.Charge{Key: "ip:" + strconv.Itoa(i), Name: tc.name, Limit: tc.limit}
				ks[i], fs[i] = string(s.appendKey(nil, ch.Key)), appendField(nil, &ch)
			}
			base := window.Millis(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			clock := make([]int64, keys0)
			// fresh names the counters of a cold case, one per decision:
			// clients that were never seen, in buckets of which about a
			// third exist, as after 100,000 clients on the 262,144 buckets.
			fresh := 0
			// send sends n decisions from the from-th on, per to a script
			// run (as the Pipeliner merges the calls of a batch), 100 runs
			// to a pipeline.
			warm := false
			send := func(from, n, per int) {
				p := c.Pipeline()
				for i := from; i < from+n; {
					var keys []string
					var head []byte
					var rest []any
					for j := 0; j < per && i < from+n; j, i = j+1, i+1 {
						k := i % keys0
						nowMs := int64(-1)
						if tc.full > 0 {
							clock[k]++
							nowMs = base + clock[k]
						}
						ch := window.Charge{Limit: tc.limit, Cost: 1}
						key, field := ks[k], fs[k]
						if tc.cold && warm {
							fresh++
							nc := window.Charge{Key: "new:" + strconv.Itoa(fresh), Name: tc.name, Limit: tc.limit}
							key, field = string(s.appendKey(nil, nc.Key)), appendField(nil, &nc)
						}
						keys = append(keys, key)
						head = redispipe.AppendHeader(head, 1, 1)
						rest = append(rest, string(appendCharge(appendRequest(nil, nowMs, true), field, &ch, -1)))
					}
					args := []any{len(rest), string(head)}
					script.EvalSha(ctx, p, keys, append(args, rest...)...)
				}
				if _, err := p.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
			// Logs start full; every other counter exists.
			for i := 0; i < keys0*max(tc.full, 1); i += 100 {
				send(i, 100, 1)
			}
			warm = true
			for _, per := range []int{1, 16} {
				b.Run("per-run-"+strconv.Itoa(per), func(b *testing.B) {
					defer scriptCPU(b, c)()
					for i := 0; i < b.N; i += 100 * per {
						send(i, min(100*per, b.N-i), per)
					}
				})
			}
		})
	}
}
