package compare

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// redisConcurrency is the number of goroutines of BenchmarkRedis, whatever
// GOMAXPROCS is.
const redisConcurrency = 64

// redisOptions are the client options of every Redis benchmark and test:
// go-redis defaults (so ContextTimeoutEnabled is off) but for the pool,
// sized above the 64 goroutines.
func redisOptions() *redis.Options { return &redis.Options{PoolSize: 128} }

// BenchmarkRedis measures Redis decisions per second and their latency
// from 64 goroutines, for each limiter with a Redis store, beside a
// pipelined INCR + PEXPIRE (no MULTI) measured in the same run on the same
// server:
//
//	go test -run '^$' -bench BenchmarkRedis$ -benchtime 2s -count 3
//
// One redis-server 7 of its own on loopback (persistence off), started by
// internal/redistest and stopped at the end; one go-redis v9 client with
// default options but PoolSize 128, shared by the limiters. "hot" sends
// every decision to one key; "keys-100k" cycles through 100,000 keys, each
// of which got one decision from the limiter before the timer starts. The
// limit, 10^9 a minute, is never reached, so every decision writes.
//
// Each limiter is driven through the call its middleware makes: sluice's
// Store.Take (what Limiter.Decide calls, with the key keyfunc.RemoteIP
// makes), ulule's Limiter.Get, httprate's RateLimiter.OnLimit over
// httprate-redis, throttled's GCRARateLimiterCtx.RateLimitCtx over
// goredisstore.v9, and redis_rate's Limiter.Allow. sluice is shown with its
// store's default Timeout (100ms) and without a timeout, like the others.
//
// Metrics: decisions/s (admitted decisions over wall time), p50-µs and
// p99-µs (latency of one call), server-cpu-µs (the CPU time, user and
// system, that redis-server spent per decision, from INFO cpu: what bounds
// throughput when the server is the bottleneck), %-of-baseline (decisions/s
// over the baseline's in the same process), and %-errors when any call
// failed or was denied; the errors are logged.
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Standalone(b)
	c := srv.Client(b, redisOptions())
	benchRedis(b, c, redisConcurrency, []string{"hot", "keys-100k"}, redisEntries(b, c, false))
}

// BenchmarkRedisPaired measures sluice's share of the baseline as
// BenchmarkRedis does (64 goroutines, default go-redis options but
// PoolSize 128, sluice's default Timeout), but in alternating slices: each
// of its 10 slices makes b.N/10 decisions with the baseline and as many
// with sluice, in turns (the baseline first in even slices), so that both
// see the same moments of a machine whose speed drifts within seconds:
//
//	go test -run '^$' -bench BenchmarkRedisPaired -benchtime 4s -count 3
//
// Metrics: %-of-baseline (sluice's decisions/s over the baseline's, over
// all slices), slice-%-min and slice-%-max (the lowest and highest share
// of a single slice), each one's decisions/s and p99-µs, and
// sluice-scripts/decision (script runs on the server per decision, from
// INFO commandstats: how many decisions share a run). "keys-100k" cycles
// through all 100,000 keys across the slices, each of which got one
// decision from each before timing. "cold" gives every decision a client
// that neither has seen (a crawler, a launch: every key new, as right
// after FLUSHALL).
func BenchmarkRedisPaired(b *testing.B) {
	srv := redistest.Standalone(b)
	c := srv.Client(b, redisOptions())
	entries := []redisEntry{{"incr-pexpire", incrPExpire(c)}, {redisSluice.name, redisSluice.new(b, c, benchRule)}}
	many := make([]string, distinctClients)
	for i := range many {
		many[i] = ipv4(i)
	}
	for _, e := range entries {
		if _, errs, first := runDecisions(redisConcurrency, len(many), e.impl, many); errs > 0 {
			b.Fatalf("%s: populating %d keys: %d errors, first: %v", e.name, len(many), errs, first)
		}
	}
	// cold hands out client addresses that neither has seen: from after
	// the 100,000 populated ones on, for the "cold" case.
	cold := distinctClients
	coldKeys := func(n int) []string {
		ks := make([]string, n)
		for i := range ks {
			ks[i] = ipv4(cold)
			cold++
		}
		return ks
	}
	for _, set := range []string{"hot", "keys-100k", "cold"} {
		keys := []string{hotIP}
		if set == "keys-100k" {
			keys = many
		}
		b.Run(set, func(b *testing.B) {
			const parts = 10
			per := max(b.N/parts, 1)
			var (
				took   [2]time.Duration
				made   [2]int64
				srvCPU [2]float64 // redis-server's CPU time, s
				ownCPU [2]float64 // this process's CPU time, s
				runs   [2]float64 // script runs on the server
				lat    [2][]time.Duration
				lo, hi = math.Inf(1), 0.0
				off    int
			)
			b.ResetTimer()
			for sl := range parts {
				// Each slice goes on through the keys where the last one
				// stopped.
				ks := append(append(make([]string, 0, len(keys)), keys[off:]...), keys[:off]...)
				off = (off + per) % len(keys)
				var rate [2]float64
				for j := range 2 {
					k := (j + sl) % 2
					if set == "cold" {
						b.StopTimer()
						ks = coldKeys(per)
						b.StartTimer()
					}
					cpu0, own0, runs0 := serverCPU(b, c), selfCPU(b), scriptRuns(b, c)
					start := time.Now()
					l, errs, first := runDecisions(redisConcurrency, per, entries[k].impl, ks)
					d := time.Since(start)
					srvCPU[k] += serverCPU(b, c) - cpu0
					ownCPU[k] += selfCPU(b) - own0
					runs[k] += scriptRuns(b, c) - runs0
					if errs > 0 {
						b.Fatalf("%s: %d of %d decisions failed, first: %v", entries[k].name, errs, per, first)
					}
					took[k] += d
					made[k] += int64(per)
					lat[k] = append(lat[k], l...)
					rate[k] = float64(per) / d.Seconds()
				}
				share := 100 * rate[1] / rate[0]
				lo, hi = min(lo, share), max(hi, share)
			}
			b.StopTimer()
			var total [2]float64
			for k, e := range entries {
				total[k] = float64(made[k]) / took[k].Seconds()
				slices.Sort(lat[k])
				b.ReportMetric(total[k], e.name+"-decisions/s")
				b.ReportMetric(float64(lat[k][len(lat[k])*99/100])/float64(time.Microsecond), e.name+"-p99-µs")
				b.ReportMetric(srvCPU[k]/float64(made[k])*1e6, e.name+"-server-cpu-µs")
				b.ReportMetric(ownCPU[k]/float64(made[k])*1e6, e.name+"-client-cpu-µs")
			}
			b.ReportMetric(runs[1]/float64(made[1]), entries[1].name+"-scripts/decision")
			b.ReportMetric(100*total[1]/total[0], "%-of-baseline")
			b.ReportMetric(lo, "slice-%-min")
			b.ReportMetric(hi, "slice-%-max")
		})
	}
}

// BenchmarkRedisSerial measures the latency of one decision at a time on
// one hot key, for each limiter of BenchmarkRedis, beside EVALSHA of the
// script "return 1" (the floor of any script-based limiter) and the
// pipelined INCR + PEXPIRE, in the same run on a redis-server of its own:
//
//	go test -run '^$' -bench BenchmarkRedisSerial -benchtime 2s -count 3
//
// The conditions and metrics of the "hot/<name>" cases are those of
// BenchmarkRedis, with one goroutine. A loopback round trip on a virtual
// machine takes longer when its cores are idle between calls than when
// something keeps them busy, and that changes within a run; so the
// "hot/interleaved" case makes, in each of its b.N rounds, one call of every
// baseline and limiter, in an order drawn anew each round (a call's
// latency also depends on the call before it), and reports each one's p50
// and p99 ("<name>-p50-µs"): the figures to compare with one another.
func BenchmarkRedisSerial(b *testing.B) {
	srv := redistest.Standalone(b)
	c := srv.Client(b, redisOptions())
	entries := redisEntries(b, c, true)
	benchRedis(b, c, 1, []string{"hot"}, entries)
	b.Run("hot/interleaved", func(b *testing.B) { interleaved(b, entries, hotIP) })
}

// interleaved makes b.N rounds of one decision per entry, all for key, and
// reports each entry's latency percentiles.
func interleaved(b *testing.B, entries []redisEntry, key string) {
	ctx := context.Background()
	decide := make([]decideFunc, len(entries))
	silent := make([]int64, len(entries))
	for k, e := range entries {
		decide[k] = e.impl.worker()
		if e.impl.silentErrors != nil {
			silent[k] = e.impl.silentErrors()
		}
	}
	lat := make([][]time.Duration, len(entries))
	for k := range lat {
		lat[k] = make([]time.Duration, 0, b.N)
	}
	errs := make([]int, len(entries))
	// Each round calls the entries in a new random order: a call is
	// slower after some calls than after others (after the quick
	// "return 1", by 10 µs and more on a VM), and a fixed order would
	// always give an entry the same predecessor.
	order := make([]int, len(entries))
	for k := range order {
		order[k] = k
	}
	rng := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rng.Shuffle(len(order), func(a, c int) { order[a], order[c] = order[c], order[a] })
		for _, k := range order {
			t := time.Now()
			err := decide[k](ctx, key)
			lat[k] = append(lat[k], time.Since(t))
			if err != nil {
				if errs[k] == 0 {
					b.Logf("%s: %v", entries[k].name, err)
				}
				errs[k]++
			}
		}
	}
	b.StopTimer()
	for k, e := range entries {
		if e.impl.silentErrors != nil {
			errs[k] += int(e.impl.silentErrors() - silent[k])
		}
		if errs[k] > 0 {
			b.Errorf("%s: %d of %d decisions failed or were denied", e.name, errs[k], b.N)
		}
		l := lat[k]
		slices.Sort(l)
		b.ReportMetric(float64(l[(len(l)-1)/2])/float64(time.Microsecond), e.name+"-p50-µs")
		b.ReportMetric(float64(l[(len(l)-1)*99/100])/float64(time.Microsecond), e.name+"-p99-µs")
	}
}

type redisEntry struct {
	name string
	impl redisImpl
}

// redisEntries returns the baseline(s), then every limiter of redisLimiters.
func redisEntries(b *testing.B, c *redis.Client, evalsha bool) []redisEntry {
	entries := []redisEntry{{"incr-pexpire", incrPExpire(c)}}
	if evalsha {
		entries = append(entries, redisEntry{"evalsha-return1", evalshaReturn1(b, c)},
			redisEntry{"evalsha-time-hget-hset", evalshaTimeHGetHSet(b, c)})
	}
	for _, l := range redisLimiters {
		entries = append(entries, redisEntry{l.name, l.new(b, c, benchRule)})
	}
	return entries
}

// evalshaReturn1 runs EVALSHA of the script "return 1", loaded first.
func evalshaReturn1(tb testing.TB, c *redis.Client) redisImpl {
	sha, err := c.ScriptLoad(context.Background(), "return 1").Result()
	if err != nil {
		tb.Fatal(err)
	}
	return redisImpl{worker: func() decideFunc {
		return func(ctx context.Context, _ string) error {
			v, err := c.EvalSha(ctx, sha, nil).Int64()
			if err == nil && v != 1 {
				err = fmt.Errorf("EVALSHA return 1 = %d", v)
			}
			return err
		}
	}}
}

// evalshaTimeHGetHSet runs EVALSHA of a script that does only what every
// sluice decision on Redis must: read the server's clock (TIME), read a
// counter (HGET) and write it back (HSET, 32 bytes), answering with a
// 72-byte string as sluice's script does. It is the floor of a decision
// on Redis's clock with a counter in a hash field, beside "return 1".
func evalshaTimeHGetHSet(tb testing.TB, c *redis.Client) redisImpl {
	const src = `local t = redis.call('TIME')
local v = redis.call('HGET', KEYS[1], 'f')
redis.call('HSET', KEYS[1], 'f', string.rep('x', 32))
return string.rep('y', 72)`
	sha, err := c.ScriptLoad(context.Background(), src).Result()
	if err != nil {
		tb.Fatal(err)
	}
	keys := []string{"floor:{time-hget-hset}"}
	return redisImpl{worker: func() decideFunc {
		return func(ctx context.Context, _ string) error {
			v, err := c.EvalSha(ctx, sha, keys).Text()
			if err == nil && len(v) != 72 {
				err = fmt.Errorf("EVALSHA of the floor script returned %d bytes", len(v))
			}
			return err
		}
	}}
}

// benchRedis runs one sub-benchmark per key set and entry, with conc
// goroutines. The first entry is the baseline of %-of-baseline.
func benchRedis(b *testing.B, c *redis.Client, conc int, keySets []string, entries []redisEntry) {
	many := make([]string, distinctClients)
	for i := range many {
		many[i] = ipv4(i)
	}
	populated := map[string]bool{} // sub-benchmarks run one at a time
	for _, set := range keySets {
		keys := []string{hotIP}
		if set == "keys-100k" {
			keys = many
		}
		var baseline float64
		for i, e := range entries {
			b.Run(set+"/"+e.name, func(b *testing.B) {
				if len(keys) > 1 && !populated[e.name] {
					populated[e.name] = true
					_, errs, first := runDecisions(redisConcurrency, len(keys), e.impl, keys)
					if errs > 0 {
						b.Fatalf("populating %d keys: %d errors, first: %v", len(keys), errs, first)
					}
				}
				rate := measure(b, c, conc, e.impl, keys)
				if i == 0 {
					baseline = rate
				} else if baseline > 0 {
					b.ReportMetric(100*rate/baseline, "%-of-baseline")
				}
			})
		}
	}
}

// measure makes b.N decisions from conc goroutines, cycling through keys,
// reports the metrics described at BenchmarkRedis and returns the admitted
// decisions per second. c is a client of the server the decisions go to.
func measure(b *testing.B, c *redis.Client, conc int, impl redisImpl, keys []string) float64 {
	silent := func() int64 {
		if impl.silentErrors == nil {
			return 0
		}
		return impl.silentErrors()
	}
	silent0 := silent()
	cpu0, own0 := serverCPU(b, c), selfCPU(b)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	lat, errs, first := runDecisions(conc, b.N, impl, keys)
	elapsed := time.Since(start)
	b.StopTimer()
	errs += silent() - silent0
	b.ReportMetric((serverCPU(b, c)-cpu0)/float64(b.N)*1e6, "server-cpu-µs")
	b.ReportMetric((selfCPU(b)-own0)/float64(b.N)*1e6, "client-cpu-µs")

	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Microsecond)
	}
	rate := float64(int64(b.N)-errs) / elapsed.Seconds()
	b.ReportMetric(rate, "decisions/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	if errs > 0 {
		b.ReportMetric(100*float64(errs)/float64(b.N), "%-errors")
		b.Logf("%d of %d decisions failed or were denied; first returned error: %v", errs, b.N, first)
	}
	return rate
}

// runDecisions makes n decisions, the i-th for keys[i%len(keys)], from conc
// goroutines, each with a worker of its own. It returns the latency of
// every call, the number of calls that returned an error, and the first
// such error.
func runDecisions(conc, n int, impl redisImpl, keys []string) (lat []time.Duration, errs int64, first error) {
	var (
		next    atomic.Int64
		nerr    atomic.Int64
		mu      sync.Mutex
		wg      sync.WaitGroup
		ctx     = context.Background()
		firstMu sync.Once
	)
	lat = make([]time.Duration, 0, n)
	for g := 0; g < conc; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			decide := impl.worker()
			mine := make([]time.Duration, 0, n/conc+1)
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					break
				}
				t := time.Now()
				err := decide(ctx, keys[i%len(keys)])
				mine = append(mine, time.Since(t))
				if err != nil {
					nerr.Add(1)
					firstMu.Do(func() { first = err })
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return lat, nerr.Load(), first
}

// processCPU returns the CPU time that this process has used (all its
// threads, user and system, from getrusage).
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// selfCPU returns processCPU in seconds.
func selfCPU(tb testing.TB) float64 { return processCPU(tb).Seconds() }

// scriptRuns returns how many scripts the server of c has run (INFO
// commandstats: the calls of EVALSHA and EVAL).
func scriptRuns(tb testing.TB, c *redis.Client) float64 {
	tb.Helper()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var total float64
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, _ := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if k != "cmdstat_evalsha" && k != "cmdstat_eval" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
		n, err := strconv.ParseFloat(calls, 64)
		if err != nil {
			tb.Fatalf("INFO commandstats: %s: %v", k, err)
		}
		total += n
	}
	return total
}

// serverCPU returns the CPU time, user and system, in seconds, that the
// server of c has used (INFO cpu: used_cpu_user + used_cpu_sys).
func serverCPU(tb testing.TB, c *redis.Client) float64 {
	tb.Helper()
	s, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var total float64
	found := 0
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, _ := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatalf("INFO cpu: %s: %v", k, err)
			}
			total += f
			found++
		}
	}
	if found != 2 {
		tb.Fatalf("INFO cpu has no used_cpu_user and used_cpu_sys: %q", s)
	}
	return total
}
