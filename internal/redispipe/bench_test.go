package redispipe

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// benchKeys is the number of distinct counters the benchmarks touch.
const benchKeys = 10_000

// runner makes one decision for key.
type runner func(ctx context.Context, key string) error

// BenchmarkDecisions compares ways of running one script per decision
// from 1 and 64 goroutines, on a standalone server and on a three-master
// Cluster, each with a go-redis client with default options but PoolSize
// 128, and reports decisions per second, latency percentiles and calls
// per round trip:
//
//	go test -run '^$' -bench BenchmarkDecisions -benchtime 3s ./internal/redispipe/
//
// On a machine shared with other work, TestCompare gives steadier figures
// by interleaving the variants.
//
// The variants: Script.Run on the client (no pipelining); Script.Run on
// go-redis's experimental AutoPipeline (blocking face, default options);
// this package with 1, 2 and 4 batches in flight per destination; the
// script's batch twin (NewBatchScript), one EVALSHA deciding the calls of
// a batch for one slot;
// and this package with its default, adaptive stall threshold. The others
// have stall detection off, so that a machine short of CPU, which makes
// live servers look hung, does not blur the comparison: the last variant
// shows what that costs.
func BenchmarkDecisions(b *testing.B) {
	for _, topo := range []string{"standalone", "cluster"} {
		b.Run(topo, func(b *testing.B) {
			rt := &rtCounter{}
			client, keys, _ := benchTopology(b, topo, rt)
			ap, err := autoPipeline(client)
			if err != nil {
				b.Fatal(err)
			}
			variants := []struct {
				name string
				make func(b *testing.B) runner
			}{
				{"script.Run", func(*testing.B) runner {
					return func(ctx context.Context, key string) error {
						return decide.Run(ctx, client, []string{key}, decideArgs...).Err()
					}
				}},
				{"AutoPipeline", func(*testing.B) runner {
					return func(ctx context.Context, key string) error {
						return decide.Run(ctx, ap, []string{key}, decideArgs...).Err()
					}
				}},
				{"redispipe/inflight=1", pipelined(client, Config{MaxInFlight: 1, StallThreshold: -1}, nil)},
				{"redispipe/inflight=2", pipelined(client, Config{MaxInFlight: 2, StallThreshold: -1}, nil)},
				{"redispipe/inflight=4", pipelined(client, Config{MaxInFlight: 4, StallThreshold: -1}, nil)},
				{"batchscript/inflight=2", func(b *testing.B) runner {
					p := newPipeliner(b, client, Config{MaxInFlight: 2, StallThreshold: -1})
					return func(ctx context.Context, key string) error {
						_, err := p.Run(ctx, batchDecide, []string{key}, decideArgs...)
						return err
					}
				}},
				{"redispipe/inflight=1/stall=adaptive", pipelined(client, Config{MaxInFlight: 1}, nil)},
			}
			for _, g := range []int{1, 64} {
				for _, v := range variants {
					b.Run(fmt.Sprintf("g=%d/%s", g, v.name), func(b *testing.B) {
						drive(b, g, keys, v.make(b), rt)
					})
				}
			}
		})
	}
}

// autoPipeline returns go-redis's blocking AutoPipeline of client.
func autoPipeline(client redis.UniversalClient) (*redis.AutoPipeliner, error) {
	switch c := client.(type) {
	case *redis.Client:
		return c.AutoPipeline()
	case *redis.ClusterClient:
		return c.AutoPipeline()
	}
	return nil, fmt.Errorf("no AutoPipeline for %T", client)
}

// pipelined returns a maker of runners through a Pipeliner with cfg, closed
// when the benchmark ends, that reports its state changes as a metric.
func pipelined(client redis.UniversalClient, cfg Config, send func(*dest, context.Context, []*call) bool) func(b *testing.B) runner {
	return func(b *testing.B) runner {
		var downs atomic.Int64
		cfg.OnStateChange = func(_ string, up bool, _ error) {
			if !up {
				downs.Add(1)
			}
		}
		p, err := New(client, cfg)
		if err != nil {
			b.Fatal(err)
		}
		p.send = send
		b.Cleanup(func() {
			_ = p.Close()
			if n := downs.Load(); n > 0 {
				b.Logf("%d false stalls", n)
			}
		})
		return func(ctx context.Context, key string) error {
			_, err := p.Run(ctx, decide, []string{key}, decideArgs...)
			return err
		}
	}
}

// drive makes b.N decisions from g goroutines, each with a 100 ms time
// limit as the store sets, and reports successful decisions/s, p50 and p99
// latency in µs (of every call, failed or not), commands per round trip,
// and errors if any.
func drive(b *testing.B, g int, keys []string, run runner, rt *rtCounter) {
	ctx := context.Background()
	// Warm up: scripts cached, connections open, counters created. A busy
	// machine may make a call fail: try again for a while.
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 200; i++ {
		if err := run(ctx, keys[i]); err != nil {
			if time.Now().After(deadline) {
				b.Fatal(err)
			}
			i--
			time.Sleep(time.Millisecond)
		}
	}
	var next atomic.Int64
	lat := make([][]time.Duration, g)
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	rt.reset()
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < g; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, b.N/g+1)
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					break
				}
				cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				t0 := time.Now()
				err := run(cctx, keys[i%benchKeys])
				mine = append(mine, time.Since(t0))
				cancel()
				if err != nil {
					if failed.Add(1) == 1 {
						firstErr.Store(err)
					}
				}
			}
			lat[w] = mine
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
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
	// Only decisions that succeeded count: failing fast is no decision.
	b.ReportMetric(float64(int64(b.N)-failed.Load())/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(pct(0.5), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	if trips := rt.trips.Load(); trips > 0 {
		b.ReportMetric(float64(rt.cmds.Load())/float64(trips), "cmds/rt")
	}
	if n := failed.Load(); n > 0 {
		b.ReportMetric(float64(n), "errors")
		b.Logf("%d of %d decisions failed, first: %v", n, b.N, firstErr.Load())
	}
}

// rtCounter is a go-redis hook that counts round trips (a command or a
// pipeline) and the commands they carried.
type rtCounter struct{ trips, cmds atomic.Int64 }

func (h *rtCounter) reset() { h.trips.Store(0); h.cmds.Store(0) }

func (h *rtCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *rtCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.trips.Add(1)
		h.cmds.Add(1)
		return next(ctx, cmd)
	}
}

func (h *rtCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.trips.Add(1)
		h.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// benchTopology starts the servers of topo ("standalone" or a three-master
// "cluster") and returns a client of them (default options but PoolSize
// 128) whose node connections carry rt, benchKeys keys under a prefix of
// the test's, one per slot tag, and a plain client of each server, for
// INFO.
func benchTopology(tb testing.TB, topo string, rt *rtCounter) (client redis.UniversalClient, keys []string, servers []*redis.Client) {
	tb.Helper()
	var prefix string
	if topo == "standalone" {
		srv := redistest.Standalone(tb)
		prefix = srv.Prefix(tb)
		c := srv.Client(tb, &redis.Options{PoolSize: 128})
		c.AddHook(rt)
		client = c
		servers = append(servers, srv.Client(tb, nil))
	} else {
		cl := redistest.Cluster(tb)
		prefix = cl.Prefix(tb)
		for _, n := range cl.Nodes() {
			servers = append(servers, n.Client(tb, nil))
		}
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), PoolSize: 128})
		tb.Cleanup(func() { _ = cc.Close() })
		cc.OnNewNode(func(c *redis.Client) { c.AddHook(rt) })
		client = cc
	}
	return client, benchKeyNames(prefix), servers
}

// benchKeyNames returns benchKeys keys under prefix, one per slot tag.
func benchKeyNames(prefix string) []string {
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = prefix + "{" + strconv.Itoa(i) + "}:per-ip:60000"
	}
	return keys
}
