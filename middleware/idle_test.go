package middleware_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/schedlag"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// roundTrips is a go-redis hook that counts the round trips of a client
// (a command sent alone, or a pipeline) by what their first command is
// about: "spare" (the spare capacity of elastic limits, at
// <prefix>{capacity}), "admin" (the overrides' and bans' version and
// lists, at <prefix>{sluice-admin}...), "top" (the top-client summaries,
// at <prefix>{top:...}), "setup" (a new connection's handshake, a
// script's loading) or "counters" (anything else: decisions, fleet calls,
// slots, pings of a server taken as down).
type roundTrips struct {
	mu    sync.Mutex
	n     map[string]int
	names map[string]int // counters' round trips by first command and key
}

func (h *roundTrips) count(cmd redis.Cmder) {
	kind := "counters"
	args := cmd.Args()
	name, _ := args[0].(string)
	switch name {
	case "hello", "client", "auth", "select", "script":
		// A connection's handshake (go-redis dials another one when two
		// background calls overlap) and a script's loading.
		kind = "setup"
	}
	if (name == "evalsha" || name == "eval") && len(args) > 3 {
		switch key, _ := args[3].(string); {
		case strings.Contains(key, "{capacity}"):
			kind = "spare"
		case strings.Contains(key, "{sluice-admin}"):
			kind = "admin"
		case strings.Contains(key, "{top:"):
			kind = "top"
		}
	}
	h.mu.Lock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	h.n[kind]++
	if kind == "counters" {
		if h.names == nil {
			h.names = map[string]int{}
		}
		name := fmt.Sprint(args[0])
		if len(args) > 3 {
			name += " " + fmt.Sprint(args[3])
		}
		h.names[name]++
	}
	h.mu.Unlock()
}

func (h *roundTrips) snapshot() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.n)
}

// counterNames returns the counters' round trips so far by their first
// command and key.
func (h *roundTrips) counterNames() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.names)
}

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 {
			h.count(cmds[0])
		}
		return next(ctx, cmds)
	}
}

// TestIdleRoundTrips measures the round trips to Redis that an idle app
// server makes each second, with 1 and 16 servers on one Redis, after
// each server decided for no key and for 1,000 keys under rules of every
// kind that makes background calls: lease and write-back (the syncer), an
// elastic limit (spare capacity published every 250 ms), a concurrency
// limit (leases of slots held, renewed) and the overrides and bans the
// store keeps for the fleet (a version read every second). Per idle
// server and second, whatever it has seen: one round trip for the
// version, four for the spare capacity, none for counters (within half a
// round trip a second). docs/fleet.md and docs/operations.md give the
// figures.
func TestIdleRoundTrips(t *testing.T) {
	t.Parallel()
	for _, servers := range []int{1, 16} {
		t.Run(fmt.Sprintf("%d-servers", servers), func(t *testing.T) {
			t.Parallel()
			var none, seen map[string]float64
			var lagNone, lagSeen time.Duration
			done := make(chan struct{})
			go func() {
				defer close(done)
				none, lagNone = idleRoundTrips(t, servers, 0)
			}()
			seen, lagSeen = idleRoundTrips(t, servers, 1000)
			<-done
			// Fewer calls than the timers make is a timing goal: a process
			// that goes unscheduled for longer than a timer's period, or
			// whose calls take that long, skips ticks (3 of 4 spare
			// capacity publications a second beside a second make test).
			// More is a cost, whatever the machine.
			fewer := timingGate(t, max(lagNone, lagSeen))
			t.Logf("%d servers, round trips a second per idle server: %v after no key, %v after 1,000 keys each", servers, none, seen)
			// Per server and second: the version of the overrides and bans
			// once, the spare capacity 4 times; nothing for the counters.
			for kind, want := range map[string]float64{"admin": 1, "spare": 4, "counters": 0} {
				for _, got := range []float64{none[kind], seen[kind]} {
					switch {
					case got > want+0.5:
						t.Errorf("%s: %.2f round trips a second per idle server, want %.0f (%v after no key, %v after 1,000)", kind, got, want, none, seen)
					case got < want-0.5:
						fewer("%s: %.2f round trips a second per idle server, want %.0f (%v after no key, %v after 1,000)", kind, got, want, none, seen)
					}
				}
			}
			// The top-client summaries: none without clients, and after
			// them at most the last write of each of the 4 rules with
			// clients (published when they change, every 5 s).
			if none["top"] != 0 || seen["top"] > 4/idleMeasure.Seconds() {
				t.Errorf("top: %.2f and %.2f round trips a second per idle server, want 0 and at most %.0f", none["top"], seen["top"], 4/idleMeasure.Seconds())
			}
		})
	}
}

// idleMeasure is how long idleRoundTrips counts.
const idleMeasure = 2 * time.Second

// idleRoundTrips starts servers Limiters on one Redis, each with its own
// client, has each decide once for each of keys keys under every rule,
// lets the counters' windows end and their counts go, then counts the
// round trips of 2 s with no request, and returns them per server and
// second, by kind (see roundTrips), and the longest this process went
// unscheduled meanwhile.
func idleRoundTrips(t *testing.T, servers, keys int) (map[string]float64, time.Duration) {
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	ip := func(r keyfunc.Request) (string, error) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr())
		return host, nil
	}
	rules := []middleware.Rule{
		{Name: "exact", Key: ip, Limits: []middleware.Limit{middleware.PerSecond(1000)}},
		{Name: "lease", Key: ip, Limits: []middleware.Limit{middleware.PerSecond(1000)}, Sync: middleware.SyncLease},
		{Name: "write-back", Key: ip, Limits: []middleware.Limit{middleware.PerSecond(1000)}, Sync: middleware.SyncWriteBack},
		{Name: "elastic", Key: ip, Limits: []middleware.Limit{{Requests: 1000, Window: time.Second, Ceiling: 2000}}},
		{Name: "slots", Key: ip, Concurrency: 100},
	}
	counters := make([]*roundTrips, servers)
	lims := make([]*middleware.Limiter, servers)
	for i := range lims {
		// Hooks see the direct calls of a client that honours context
		// deadlines (see redispipe).
		c := srv.Client(t, &redis.Options{ContextTimeoutEnabled: true})
		counters[i] = &roundTrips{}
		c.AddHook(counters[i])
		store, err := middleware.NewRedisStore(c, middleware.RedisConfig{Prefix: prefix, StallThreshold: 2 * time.Second, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		lim, err := middleware.NewRules(rules, middleware.WithStore(store), middleware.WithCapacity(middleware.CapacityConfig{}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lim.Close() })
		lims[i] = lim
	}
	var wg sync.WaitGroup
	for _, lim := range lims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < keys; k++ {
				req := httptest.NewRequest("GET", "/", nil)
				req.RemoteAddr = "10.1." + strconv.Itoa(k>>8) + "." + strconv.Itoa(k&255) + ":1"
				res, err := lim.Decide(keyfunc.FromHTTP(req))
				if err != nil || !res.Allowed {
					t.Errorf("key %d: %+v, %v", k, res, err)
					return
				}
				res.Done()
			}
		}()
	}
	wg.Wait()
	// Windows of 1 s: two of them later, and a tick, nothing is owed.
	time.Sleep(2500 * time.Millisecond)
	total := func() map[string]int {
		sum := map[string]int{}
		for _, c := range counters {
			for k, n := range c.snapshot() {
				sum[k] += n
			}
		}
		return sum
	}
	admin := srv.Client(t, nil)
	use := redistest.ReadUsage(t, admin)
	before := total()
	namesBefore := make([]map[string]int, servers)
	for i, c := range counters {
		namesBefore[i] = c.counterNames()
	}
	const measure = idleMeasure
	lags := schedlag.Start(t)
	began := time.Now()
	time.Sleep(measure)
	lags.Stop()
	for i, c := range counters {
		for name, n := range c.counterNames() {
			if d := n - namesBefore[i][name]; d > 0 {
				t.Logf("server %d, %d keys: counters round trips %q: %d", i, keys, name, d)
			}
		}
	}
	out := map[string]float64{"admin": 0, "spare": 0, "counters": 0, "top": 0, "setup": 0}
	// Per second of what was counted: on a loaded machine the sleep ends
	// late (5 calls a second counted over 2 s that were longer).
	after, took := total(), time.Since(began)
	for k, n := range after {
		out[k] = float64(n-before[k]) / took.Seconds() / float64(servers)
	}
	u := redistest.ReadUsage(t, admin).Sub(use)
	t.Logf("%d servers, %d keys seen each: Redis ran %.0f commands and %.2f ms of CPU a second (its own timers included)",
		servers, keys, float64(u.Commands)/measure.Seconds(), float64(u.CPU.Microseconds())/1000/measure.Seconds())
	return out, lags.Max()
}
