package fleetstore

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redisstore"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/window"
)

// scriptCalls returns how many scripts clients ran on c's server: EVALSHA
// and EVAL in INFO commandstats. (Not the commands that scripts run,
// which commandstats counts too.)
func scriptCalls(t testing.TB, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		for _, name := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), name); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				v, err := strconv.ParseInt(calls, 10, 64)
				if err != nil {
					t.Fatalf("commandstats line %q: %v", line, err)
				}
				n += v
			}
		}
	}
	return n
}

// countLeases counts the lease calls made through a Backend.
type countLeases struct {
	Backend
	n *atomic.Int64
}

func (c countLeases) Fleet(ctx context.Context, deadline time.Time, call *fleet.Call) (fleet.Reply, error) {
	if call.Lease {
		c.n.Add(1)
	}
	return c.Backend.Fleet(ctx, deadline, call)
}

// TestLeaseCallsShareScriptRuns has 4 app servers (each its own client)
// with 64 requests in flight each decide twice in a row for each of many
// keys: the first decision of a key is decided exactly (a cold counter),
// the second (nearly always) is a lease call, and the calls made at the
// same moment must
// share script runs, as exact decisions do (one EVALSHA for the calls of
// one batch). It counts the scripts run (INFO commandstats) against the
// calls made: at most one run per 4 calls, where calls that each ran
// alone would make one run per call. A key is busy for its second
// decision only if the first was within two sync intervals (200 ms)
// before it: the decisions are made at explicit instants, their own,
// and the lease calls are counted against the keys whose two decisions
// were that close (on a loaded machine some are not).
func TestLeaseCallsShareScriptRuns(t *testing.T) {
	srv := redistest.Standalone(t)
	admin := srv.Client(t, nil)
	prefix := srv.Prefix(t)
	l := window.Limit{Algorithm: window.SlidingWindow, Requests: 1_000_000_000, Window: time.Minute}
	var leases atomic.Int64
	var layers []*Store
	for i := 0; i < 4; i++ {
		c := srv.Client(t, &redis.Options{PoolSize: 128})
		// Idle servers get direct calls, as with the pipeline's defaults;
		// a stall threshold of 2 s, since a loaded machine running the
		// race detector can take tens of ms to answer.
		rs, err := redisstore.New(c, redisstore.Config{Prefix: prefix, Timeout: 5 * time.Second, Pipeline: redispipe.Config{StallThreshold: 2 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		fs, err := New(Config{Backend: countLeases{rs, &leases}, Exact: rs, ID: redisstore.FleetID, Manual: true, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		fs.SetRules(map[string]Settings{"r": {Mode: fleet.Lease}})
		layers = append(layers, fs)
	}
	const n = 20_000
	within := 2 * DefaultSyncInterval
	before := scriptCalls(t, admin)
	var next, busy atomic.Int64
	var wg sync.WaitGroup
	for s := range layers {
		for g := 0; g < 64; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := make([]window.Decision, 1)
				for {
					i := next.Add(1) - 1
					if i >= n {
						return
					}
					c := []window.Charge{{Key: "k" + strconv.FormatInt(i, 10), Name: "r", Limit: l, Cost: 1}}
					var first time.Time
					for j := range 2 {
						// Whole milliseconds, as the layer keeps them.
						at := time.UnixMilli(time.Now().UnixMilli())
						if j == 0 {
							first = at
						} else if at.Sub(first) <= within {
							busy.Add(1)
						}
						ok, err := layers[s].Take(context.Background(), at, c, out)
						if err != nil || !ok {
							t.Errorf("key %d: allowed %v, %v", i, ok, err)
							return
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	runs := scriptCalls(t, admin) - before
	calls, near := leases.Load(), busy.Load()
	t.Logf("%d decisions, %d lease calls, %d script runs: %.3f runs per call; %d keys decided twice within %v", 2*n, calls, runs, float64(runs)/float64(2*n), near, within)
	// A key's second decision leases if the first was within two
	// intervals, unless another key took its slot in the memory of recent
	// uses between its two decisions (see uses): then it too is decided
	// exactly.
	if calls > near || calls < near*95/100 {
		t.Fatalf("%d lease calls for %d keys decided twice within %v, want about one each", calls, near, within)
	}
	if near < n/2 {
		t.Logf("only %d of %d keys were decided twice within %v: the machine is busy", near, n, within)
	}
	if runs < 1 || 4*runs > 2*n {
		t.Errorf("%d script runs for %d exact decisions and %d lease calls, want between 1 and one per 4 calls", runs, 2*n-calls, calls)
	}
}
