package compare

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// dataMemory is used_memory less the memory of client connections
// (mem_clients_normal), whose buffers come and go with the traffic.
func dataMemory(t *testing.T, c *redis.Client) int64 {
	m := redistest.InfoMemory(t, c)
	used, ok := m["used_memory"]
	if !ok {
		t.Fatal("INFO memory has no used_memory")
	}
	return used - m["mem_clients_normal"]
}

func dbSize(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	n, err := c.DBSize(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// warmUp opens the client's connections and loads the limiter's scripts
// with one decision for each of 256 clients of its own (198.51.100.0/24),
// from 64 goroutines, so that neither counts in what is measured next.
func warmUp(t *testing.T, impl redisImpl) {
	t.Helper()
	warm := make([]string, 256)
	for i := range warm {
		warm[i] = "198.51.100." + strconv.Itoa(i)
	}
	if _, errs, first := runDecisions(redisConcurrency, len(warm), impl, warm); errs > 0 {
		t.Fatalf("warm-up: %d errors, first: %v", errs, first)
	}
}

// memRule is the rule of TestRedisMemoryPerKey: 10 requests an hour. One
// request leaves redis_rate's key in Redis for period/rate = 6 minutes,
// longer than the fill takes; with 10^9 a minute it would expire after 1 s.
var memRule = rule{10, time.Hour}

// TestRedisMemoryPerKey measures the Redis memory per client of sluice,
// ulule and redis_rate, with one rule (10 requests an hour) and one
// decision (an admission) for each of 1,000,000 client addresses:
//
//	SLUICE_COMPARE=1 go test -run TestRedisMemoryPerKey -v -timeout 20m
//
// Each limiter gets a redis-server 7 of its own (internal/redistest,
// persistence off) and a go-redis v9 client with default options but
// PoolSize 128. The decisions come from 64 goroutines through the same calls
// as in BenchmarkRedis; sluice's store has no timeout of its own (Timeout
// -1), so that a busy machine cannot turn decisions into timeouts and leave
// the count short. The figure is the growth of used_memory, less
// mem_clients_normal (connection buffers), from after a warm-up (which
// opens the connections and loads the scripts) to after the fill, divided by
// 1,000,000. ulule and redis_rate keep one Redis key per client, so DBSIZE
// must have grown by 1,000,000; sluice keeps its counters as fields of at
// most 262,144 bucket hashes, so DBSIZE says nothing about it. For every
// limiter, every 1000th client is checked to be counted once (sluice and
// ulule: a read of the counter; redis_rate: its key exists).
func TestRedisMemoryPerKey(t *testing.T) {
	requireCompare(t)
	keys := make([]string, memKeys)
	for i := range keys {
		keys[i] = ipv4(i)
	}
	for _, l := range []redisLimiter{redisSluiceNoTimeout, redisUlule, redisRedisRate} {
		t.Run(l.name, func(t *testing.T) {
			srv := redistest.Standalone(t)
			c := srv.Client(t, redisOptions())
			impl := l.new(t, c, memRule)
			warmUp(t, impl)
			keys0, mem0 := dbSize(t, c), dataMemory(t, c)

			start := time.Now()
			if _, errs, first := runDecisions(redisConcurrency, len(keys), impl, keys); errs > 0 {
				t.Fatalf("%d errors, first: %v", errs, first)
			}
			took := time.Since(start)
			keys1, mem1 := dbSize(t, c), dataMemory(t, c)
			if l.name != redisSluiceNoTimeout.name && keys1-keys0 != memKeys {
				t.Fatalf("DBSIZE grew by %d, want %d", keys1-keys0, memKeys)
			}
			ctx := context.Background()
			for i := 0; i < len(keys); i += 1000 {
				if ok, err := impl.counted(ctx, keys[i]); err != nil || !ok {
					t.Fatalf("client %s not counted: %v", keys[i], err)
				}
			}
			t.Logf("%s: %.0f bytes per client (used_memory less clients %+.1f MB for %d clients, DBSIZE %+d; filled in %s)",
				l.name, float64(mem1-mem0)/memKeys, float64(mem1-mem0)/1e6, memKeys, keys1-keys0, took.Round(time.Millisecond))
		})
	}
}

// TestRedisExpiry checks that sluice's Redis counters leave Redis within 2
// windows of their last use, and that their memory goes with them:
//
//	SLUICE_COMPARE=1 go test -run TestRedisExpiry -v
//
// On a redis-server of its own, with a 1 s window and a store without a
// timeout, 64 goroutines make one decision for each of 100,000 client
// addresses; then DBSIZE and used_memory (less client buffers) are polled
// every 100ms for at most 20 s. The store keeps its counters as fields of
// bucket hashes, and each write extends its bucket's TTL to 2 windows after
// the start of the counter's current window, so at most 2 s after the
// bucket's last write; Redis then removes expired keys with its active
// expiry cycle (10 times a second by default) or on access. The test fails
// if any key is left more than 2 windows + 1 s after the last decision.
func TestRedisExpiry(t *testing.T) {
	requireCompare(t)
	const (
		n = distinctClients
		w = time.Second
	)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = ipv4(i)
	}
	srv := redistest.Standalone(t)
	c := srv.Client(t, redisOptions())
	impl := redisSluiceNoTimeout.new(t, c, rule{bigLimit, w})
	warmUp(t, impl)
	// The warm-up key expires too; wait for it so that the baseline is empty.
	for deadline := time.Now().Add(5 * time.Second); dbSize(t, c) > 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	mem0 := dataMemory(t, c)

	start := time.Now()
	if _, errs, first := runDecisions(redisConcurrency, n, impl, keys); errs > 0 {
		t.Fatalf("%d errors, first: %v", errs, first)
	}
	end := time.Now()
	peakKeys, peakMem := dbSize(t, c), dataMemory(t, c)
	t.Logf("filled %d keys in %s: DBSIZE %d, used_memory less clients %+.1f MB",
		n, end.Sub(start).Round(time.Millisecond), peakKeys, float64(peakMem-mem0)/1e6)

	var gone time.Duration
	for deadline := end.Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		k := dbSize(t, c)
		since := time.Since(end)
		t.Logf("%6s after the last decision: DBSIZE %6d, used_memory less clients %+.2f MB",
			since.Round(10*time.Millisecond), k, float64(dataMemory(t, c)-mem0)/1e6)
		if k == 0 {
			gone = since
			break
		}
	}
	if gone == 0 {
		t.Fatalf("keys left 20 s after the last decision: %d", dbSize(t, c))
	}
	t.Logf("all %d keys gone %s after the last decision (window %s)", n, gone.Round(10*time.Millisecond), w)
	if gone > 2*w+time.Second {
		t.Errorf("keys gone %s after the last decision, want within 2 windows (+1 s for Redis's expiry cycle)", gone)
	}
}
