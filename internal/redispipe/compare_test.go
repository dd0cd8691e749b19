package redispipe

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestCompare prints a table comparing the ways of running one script per
// decision that BenchmarkDecisions measures, but interleaved: each round
// runs every variant for a second, in turn, and the table shows the median
// of the rounds, so that load from other processes that comes and goes
// weighs on every variant alike. It runs only when REDISPIPE_COMPARE is
// set, to the number of rounds:
//
//	REDISPIPE_COMPARE=5 go test -run TestCompare -v ./internal/redispipe/
func TestCompare(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("REDISPIPE_COMPARE"))
	if rounds <= 0 {
		t.Skip("set REDISPIPE_COMPARE to the number of rounds")
	}
	const window = time.Second
	type result struct {
		rate, p50, p99 []float64
		perRT, cpu     []float64
		errors         int64
	}
	var table strings.Builder
	fmt.Fprintf(&table, "\n| topology | goroutines | variant | decisions/s | p50 µs | p99 µs | calls/round trip | server CPU µs/decision | errors |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, topo := range []string{"standalone", "cluster"} {
		rt := &rtCounter{}
		client, keys, servers := benchTopology(t, topo, rt)
		ap, err := autoPipeline(client)
		if err != nil {
			t.Fatal(err)
		}
		pipe := func(cfg Config, send func(*dest, context.Context, []*call) bool) runner {
			p := newPipeliner(t, client, cfg)
			p.send = send
			return func(ctx context.Context, key string) error {
				_, err := p.Run(ctx, decide, []string{key}, decideArgs...)
				return err
			}
		}
		// The same decisions by the batch twin of the script: the calls
		// of a batch to one server (one slot, on a Cluster) run as one.
		batchPipe := func(cfg Config) runner {
			p := newPipeliner(t, client, cfg)
			return func(ctx context.Context, key string) error {
				_, err := p.Run(ctx, batchDecide, []string{key}, decideArgs...)
				return err
			}
		}
		variants := []struct {
			name string
			run  runner
		}{
			{"script.Run", func(ctx context.Context, key string) error {
				return decide.Run(ctx, client, []string{key}, decideArgs...).Err()
			}},
			{"go-redis AutoPipeline", func(ctx context.Context, key string) error {
				return decide.Run(ctx, ap, []string{key}, decideArgs...).Err()
			}},
			{"redispipe, 1 in flight", pipe(Config{MaxInFlight: 1, StallThreshold: -1}, nil)},
			{"redispipe, 2 in flight", pipe(Config{MaxInFlight: 2, StallThreshold: -1}, nil)},
			{"redispipe, 4 in flight", pipe(Config{MaxInFlight: 4, StallThreshold: -1}, nil)},
			{"batch script, 2 in flight", batchPipe(Config{StallThreshold: -1})},
			{"redispipe defaults (adaptive stall)", pipe(Config{}, nil)},
		}
		for _, g := range []int{1, 64} {
			results := make([]result, len(variants))
			for r := 0; r < rounds; r++ {
				for i := range variants {
					// Rotate the order so that no variant always follows
					// the same one.
					v := (i + r) % len(variants)
					cpu0 := serverCPU(t, servers)
					rate, p50, p99, perRT, errs := measure(variants[v].run, g, window, keys, rt)
					cpu := serverCPU(t, servers) - cpu0
					res := &results[v]
					res.cpu = append(res.cpu, cpu.Seconds()*1e6/(rate*window.Seconds()))
					res.rate = append(res.rate, rate)
					res.p50 = append(res.p50, p50)
					res.p99 = append(res.p99, p99)
					res.perRT = append(res.perRT, perRT)
					res.errors += errs
				}
			}
			for i, v := range variants {
				res := results[i]
				fmt.Fprintf(&table, "| %s | %d | %s | %.0f | %.0f | %.0f | %.1f | %.1f | %d |\n",
					topo, g, v.name, median(res.rate), median(res.p50), median(res.p99), median(res.perRT), median(res.cpu), res.errors)
			}
		}
	}
	t.Log(table.String())
}

// measure runs decisions from g goroutines for d and returns successful
// decisions per second, p50 and p99 latency in µs, commands per round trip
// and the number of errors.
func measure(run runner, g int, d time.Duration, keys []string, rt *rtCounter) (rate, p50, p99, perRT float64, errs int64) {
	ctx := context.Background()
	for i := 0; i < 100; i++ { // warm up
		_ = run(ctx, keys[i])
	}
	var next, failed, ok atomic.Int64
	lat := make([][]time.Duration, g)
	var wg sync.WaitGroup
	rt.reset()
	stop := time.Now().Add(d)
	start := time.Now()
	for w := 0; w < g; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(stop) {
				i := next.Add(1)
				cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				t0 := time.Now()
				err := run(cctx, keys[int(i)%len(keys)])
				mine = append(mine, time.Since(t0))
				cancel()
				if err != nil {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
			}
			lat[w] = mine
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(float64(len(all)-1)*p)].Nanoseconds()) / 1e3
	}
	if trips := rt.trips.Load(); trips > 0 {
		perRT = float64(rt.cmds.Load()) / float64(trips)
	}
	return float64(ok.Load()) / elapsed.Seconds(), pct(0.5), pct(0.99), perRT, failed.Load()
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// serverCPU returns the CPU time the servers have used, from INFO cpu.
func serverCPU(t testing.TB, servers []*redis.Client) time.Duration {
	t.Helper()
	var total float64
	for _, c := range servers {
		info, err := c.Info(context.Background(), "cpu").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			for _, field := range []string{"used_cpu_sys:", "used_cpu_user:"} {
				if v, ok := strings.CutPrefix(line, field); ok {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil {
						t.Fatal(err)
					}
					total += f
				}
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}

// TestCompareMaxBatch is TestCompare for the batch bound, with more
// callers than it, on a standalone server:
//
//	REDISPIPE_COMPARE=5 go test -run TestCompareMaxBatch -v ./internal/redispipe/
func TestCompareMaxBatch(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("REDISPIPE_COMPARE"))
	if rounds <= 0 {
		t.Skip("set REDISPIPE_COMPARE to the number of rounds")
	}
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	rt := &rtCounter{}
	c := srv.Client(t, &redis.Options{PoolSize: 128})
	c.AddHook(rt)
	keys := benchKeyNames(prefix)
	sizes := []int{16, 32, 64, 128, 256}
	var table strings.Builder
	fmt.Fprintf(&table, "\n| goroutines | MaxBatch | decisions/s | p50 µs | p99 µs | calls/round trip |\n|---|---|---|---|---|---|\n")
	for _, g := range []int{64, 256} {
		runs := make([]runner, len(sizes))
		for i, mb := range sizes {
			p := newPipeliner(t, c, Config{MaxBatch: mb, StallThreshold: -1})
			runs[i] = func(ctx context.Context, key string) error {
				_, err := p.Run(ctx, decide, []string{key}, decideArgs...)
				return err
			}
		}
		rate := make([][]float64, len(sizes))
		p50 := make([][]float64, len(sizes))
		p99 := make([][]float64, len(sizes))
		perRT := make([][]float64, len(sizes))
		for r := 0; r < rounds; r++ {
			for i := range sizes {
				v := (i + r) % len(sizes)
				a, b, c, d, _ := measure(runs[v], g, time.Second, keys, rt)
				rate[v], p50[v], p99[v], perRT[v] = append(rate[v], a), append(p50[v], b), append(p99[v], c), append(perRT[v], d)
			}
		}
		for i, mb := range sizes {
			fmt.Fprintf(&table, "| %d | %d | %.0f | %.0f | %.0f | %.1f |\n", g, mb, median(rate[i]), median(p50[i]), median(p99[i]), median(perRT[i]))
		}
	}
	t.Log(table.String())
}
