package middleware

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
)

// benchRequest is a keyfunc.Request whose RemoteAddr is the client's key.
type benchRequest struct{ addr string }

func (r benchRequest) Context() context.Context { return context.Background() }
func (r benchRequest) Method() string           { return "GET" }
func (r benchRequest) Path() string             { return "/" }
func (r benchRequest) Route() string            { return "" }
func (r benchRequest) RemoteAddr() string       { return r.addr }
func (r benchRequest) Header(string) string     { return "" }
func (r benchRequest) Values(string) []string   { return nil }

var addrKey keyfunc.Func = func(r keyfunc.Request) (string, error) { return r.RemoteAddr(), nil }

// fleetDecider makes one decision for a key on one app server.
type fleetDecider func(ctx context.Context, key string) error

// fleetServers returns n app servers of kind on srv: "incr-pexpire" (a
// pipelined INCR and PEXPIRE, the floor of a Redis counter), "memory" (a
// Limiter on the in-memory store, each server alone), "exact", "lease" or
// "write_back" (a Limiter on the Redis store, 10^9 a minute, never
// reached; "write_back/max_unsynced=N" sets MaxUnsynced, "lease/lease=N"
// sets Lease), each with its own go-redis client.
func fleetServers(b *testing.B, srv *redistest.Server, kind string, n int) []fleetDecider {
	out, _ := fleetLimiters(b, srv, kind, n)
	return out
}

// fleetLimiters is fleetServers that also returns the Limiters (none for
// "incr-pexpire").
func fleetLimiters(b *testing.B, srv *redistest.Server, kind string, n int) ([]fleetDecider, []*Limiter) {
	prefix := srv.Prefix(b)
	var out []fleetDecider
	var lims []*Limiter
	for i := 0; i < n; i++ {
		c := srv.Client(b, &redis.Options{PoolSize: 128})
		if kind == "incr-pexpire" {
			out = append(out, func(ctx context.Context, key string) error {
				pipe := c.Pipeline()
				incr := pipe.Incr(ctx, prefix+key)
				pipe.PExpire(ctx, prefix+key, time.Minute)
				if _, err := pipe.Exec(ctx); err != nil {
					return err
				}
				if incr.Val() < 1 {
					return fmt.Errorf("INCR = %d", incr.Val())
				}
				return nil
			})
			continue
		}
		rule := Rule{Name: "bench", Key: addrKey, Limits: []Limit{PerMinute(1_000_000_000)}}
		var opts []Option
		if kind != "memory" {
			// On a shared, loaded machine: servers taken as down only on
			// connection errors, and a generous timeout.
			store, err := NewRedisStore(c, RedisConfig{Prefix: prefix, StallThreshold: -1, Timeout: 2 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { store.Close() })
			opts = append(opts, WithStore(store))
			mode, unsynced, _ := strings.Cut(kind, "/max_unsynced=")
			mode, lease, _ := strings.Cut(mode, "/lease=")
			rule.Sync, _ = ParseSyncMode(mode)
			rule.MaxUnsynced, _ = strconv.Atoi(unsynced)
			rule.Lease, _ = strconv.Atoi(lease)
		}
		lim, err := NewRules([]Rule{rule}, opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { lim.Close() })
		lims = append(lims, lim)
		out = append(out, func(ctx context.Context, key string) error {
			res, err := lim.Decide(benchRequest{key})
			if err != nil {
				return err
			}
			if !res.Allowed || res.StoreErr != nil {
				return fmt.Errorf("not decided by the store: %+v", res)
			}
			return nil
		})
	}
	return out, lims
}

// flushFleet has each limiter's syncer push what is unsynced and give
// back what is leased, as Close does, all at once, and returns when they
// are done.
func flushFleet(lims []*Limiter) {
	var wg sync.WaitGroup
	for _, l := range lims {
		if fs := l.syncs.store.Load(); fs != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fs.Sync(context.Background(), time.Time{}, true)
			}()
		}
	}
	wg.Wait()
}

// clientCommands returns how many commands clients of kind (see
// fleetServers) sent srv, from INFO commandstats: INCR and PEXPIRE for
// "incr-pexpire", script calls (EVALSHA, EVAL) for the others.
// commandstats also counts the commands that scripts run (HGET, HSET,
// PEXPIRE), which clients did not send: counting PEXPIRE for a kind whose
// scripts call it would count a script's inner PEXPIRE as a command of its
// own.
func clientCommands(b *testing.B, c *redis.Client, kind string) int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		names := []string{"cmdstat_evalsha:", "cmdstat_eval:"}
		if kind == "incr-pexpire" {
			names = []string{"cmdstat_incr:", "cmdstat_pexpire:"}
		}
		for _, name := range names {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), name); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				v, _ := strconv.ParseInt(calls, 10, 64)
				n += v
			}
		}
	}
	return n
}

// runFleet makes n decisions, the i-th for keys[i%len(keys)], from conc
// goroutines per server, and returns every latency, the number of errors
// and the first.
func runFleet(servers []fleetDecider, conc, n int, keys []string) ([]time.Duration, int64, error) {
	var next atomic.Int64
	var nerr atomic.Int64
	var mu sync.Mutex
	var first error
	lat := make([]time.Duration, 0, n)
	var wg sync.WaitGroup
	for s, decide := range servers {
		for g := 0; g < conc; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mine := make([]time.Duration, 0, n/(conc*len(servers))+1)
				for {
					i := int(next.Add(1) - 1)
					if i >= n {
						break
					}
					t := time.Now()
					err := decide(context.Background(), keys[(i+s)%len(keys)])
					mine = append(mine, time.Since(t))
					if err != nil {
						nerr.Add(1)
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
					}
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return lat, nerr.Load(), first
}

func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Microsecond)
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// BenchmarkFleet measures the decisions per second of 4 app servers (each a
// Limiter with its own go-redis client) with 64 requests in flight each,
// on one hot key and on 100,000 keys, in each coordination mode, beside
// exact mode and a pipelined INCR + PEXPIRE measured in the same run, each
// on a redis-server of its own:
//
//	go test -run '^$' -bench BenchmarkFleet$ -benchtime 200000x ./middleware/
//
// On 100,000 keys every key got one decision per server, on average,
// before the timer starts. The timed part ends when every limiter's
// syncer has pushed what it has not (flushFleet), so that every decision's
// count is in Redis: the fleet modes' background work is timed too.
// Metrics: decisions/s, p50-µs and p99-µs of one decision, cmds/decision,
// the commands clients sent Redis per decision (INFO commandstats: INCR and
// PEXPIRE for incr-pexpire, EVALSHA and EVAL for the others; see
// clientCommands), what Redis did per decision (see reportRedis), and
// the app servers' CPU per decision (app-cpu-µs/decision: this process's,
// the benchmark's own goroutines included).
func BenchmarkFleet(b *testing.B) {
	many := make([]string, 100_000)
	for i := range many {
		many[i] = "10." + strconv.Itoa(i>>16) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
	}
	for _, set := range []string{"hot", "keys-100k"} {
		keys := []string{"10.0.0.1"}
		if set == "keys-100k" {
			keys = many
		}
		for _, kind := range []string{"memory", "incr-pexpire", "exact", "lease", "lease/lease=1000", "lease/lease=10000", "write_back", "write_back/max_unsynced=1000", "write_back/max_unsynced=10000"} {
			b.Run(set+"/"+kind, func(b *testing.B) {
				srv := redistest.Standalone(b)
				admin := srv.Client(b, nil)
				servers, lims := fleetLimiters(b, srv, kind, 4)
				if len(keys) > 1 {
					if _, n, err := runFleet(servers, 64, len(keys)*len(servers), keys); n > 0 {
						b.Logf("populating: %d errors, first: %v", n, err)
					}
					flushFleet(lims)
				}
				cmds := clientCommands(b, admin, kind)
				use := redistest.ReadUsage(b, admin)
				cpu := redistest.ProcessCPU(b)
				b.ResetTimer()
				start := time.Now()
				lat, nerr, err := runFleet(servers, 64, b.N, keys)
				// Every count in Redis before the clock stops: what the
				// fleet modes have not pushed yet is pushed now.
				flushFleet(lims)
				elapsed := time.Since(start)
				b.StopTimer()
				// The app servers' CPU (this process's), beside Redis's:
				// what bounds the decisions a machine makes whatever else
				// runs on it.
				b.ReportMetric(float64((redistest.ProcessCPU(b)-cpu).Microseconds())/float64(b.N), "app-cpu-µs/decision")
				if nerr > 0 {
					b.ReportMetric(100*float64(nerr)/float64(b.N), "%-errors")
					b.Logf("%d of %d decisions failed; first: %v", nerr, b.N, err)
				}
				b.ReportMetric(float64(int64(b.N)-nerr)/elapsed.Seconds(), "decisions/s")
				b.ReportMetric(float64(clientCommands(b, admin, kind)-cmds)/float64(b.N), "cmds/decision")
				reportRedis(b, redistest.ReadUsage(b, admin).Sub(use))
				reportLatency(b, lat)
			})
		}
	}
}

// reportRedis reports what Redis did per decision: every command it ran,
// those that scripts ran included (all-cmds/decision), and its own CPU
// time (redis-cpu-µs/decision), which bounds how many decisions one Redis
// can serve.
func reportRedis(b *testing.B, u redistest.Usage) {
	b.ReportMetric(float64(u.Commands)/float64(b.N), "all-cmds/decision")
	b.ReportMetric(float64(u.CPU.Microseconds())/float64(b.N), "redis-cpu-µs/decision")
}

// BenchmarkFleetSerial measures one decision at a time on one hot key, on
// one app server, in each mode, beside the in-memory store and exact mode:
//
//	go test -run '^$' -bench BenchmarkFleetSerial -benchtime 100000x ./middleware/
func BenchmarkFleetSerial(b *testing.B) {
	for _, kind := range []string{"memory", "incr-pexpire", "exact", "lease", "write_back"} {
		b.Run(kind, func(b *testing.B) {
			srv := redistest.Standalone(b)
			decide := fleetServers(b, srv, kind, 1)[0]
			ctx := context.Background()
			for i := 0; i < 1000; i++ { // warm up: scripts loaded, first lease
				if err := decide(ctx, "10.0.0.1"); err != nil {
					b.Fatal(err)
				}
			}
			lat := make([]time.Duration, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range lat {
				t := time.Now()
				if err := decide(ctx, "10.0.0.1"); err != nil {
					b.Fatal(err)
				}
				lat[i] = time.Since(t)
			}
			b.StopTimer()
			reportLatency(b, lat)
		})
	}
}
