package middleware_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/schedlag"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// heldAtStart is how much longer a request of a fresh client may take on
// a healthy Redis than the same request of a fresh plain go-redis client
// (see plainFirstRequests), beyond this process's scheduling lag: the
// stall threshold of a new destination (redispipe.MaxStallThreshold),
// which no batch of a healthy server comes near, and the wait of the
// pipeline's holds at start (a batch past its stall threshold waits for a
// verification; the pool's warm-up used to hold connections in WAITs of
// 20 ms, which took the server 35 ms each, two or more in a row for each
// connection of a small pool). A request that takes longer was held by
// one of them, not by its round trips.
const heldAtStart = redispipe.MaxStallThreshold

// TestFreshClientDecides checks that a healthy Redis decides every request
// of a fresh go-redis client from the first, whatever the size of its
// pool: 1, 2 or 4 connections, or go-redis's default. Each case makes
// three fresh clients (default Options but PoolSize), each with a store
// and a limiter at their defaults, and sends each client's first requests
// through the middleware, one after the other (six from one address at a
// limit of five: five 200s, then a 429) or all at once (sixteen from one
// address: five admitted, eleven denied). It fails on any request not
// decided by Redis (failed open, a store error, a response without the
// rate-limit fields, a request not counted) and on any request held at
// start: one that took longer than heldAtStart beyond twice this
// process's scheduling lag while it ran (package schedlag: a request
// crosses goroutines twice, to a lane and back) and beyond the slowest
// of the same requests of a fresh plain go-redis client made just before
// (plainFirstRequests), which tells what a new client's dials, handshakes
// and first script run cost on this machine at that moment (the race
// detector makes them several milliseconds). A redis-server that
// the machine does not schedule for a few milliseconds holds a request in
// a way that lag does not show, so one such request in a case is only
// logged (strays); on a machine so busy that this process went
// unscheduled for more than grayBusyLag, the goals are only logged
// (timingGate).
func TestFreshClientDecides(t *testing.T) {
	srv := redistest.Standalone(t)
	lags := schedlag.Start(t)
	modes := []struct {
		name       string
		n          int
		concurrent bool
	}{{"sequential", 6, false}, {"concurrent", 16, true}}
	for _, pool := range []int{1, 2, 4, 0} {
		poolName := strconv.Itoa(pool)
		if pool == 0 {
			poolName = "default"
		}
		for _, m := range modes {
			n, concurrent := m.n, m.concurrent
			t.Run("pool="+poolName+"/"+m.name, func(t *testing.T) {
				prefix := srv.Prefix(t)
				var all []freshRequest
				for round := range 3 {
					plain := plainFirstRequests(t, srv.Addr(), pool, fmt.Sprintf("%s%d", prefix, round), n, concurrent)
					reqs := freshClientRequests(t, srv.Addr(), pool, fmt.Sprintf("%s%d:", prefix, round), n, concurrent)
					for i := range reqs {
						reqs[i].lag = lags.Worst(reqs[i].start, reqs[i].start.Add(reqs[i].took))
						reqs[i].plain = plain
					}
					checkFreshCounts(t, round, reqs, !concurrent)
					all = append(all, reqs...)
				}
				checkFreshTiming(t, all)
			})
		}
	}
}

// freshIndex is the key of a request's index in the context of
// freshClientRequests's requests.
type freshIndex struct{}

// freshRequest is what became of one request of a fresh client.
type freshRequest struct {
	start time.Time
	took  time.Duration
	lag   time.Duration
	// plain is the slowest of the same requests of a fresh plain client.
	plain    time.Duration
	status   int
	fields   bool // the response had the rate-limit fields
	outcome  middleware.Outcome
	storeErr error
}

// plainFirstRequests makes a fresh go-redis client of the server at addr
// with PoolSize pool and runs n calls of a script the server has not
// seen (named by tag) through it, as redis.Script.Run does (EVALSHA, then
// EVAL on NOSCRIPT), one after the other or all at once, and returns the
// longest any took.
func plainFirstRequests(t *testing.T, addr string, pool int, tag string, n int, concurrent bool) time.Duration {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr, PoolSize: pool})
	defer rc.Close()
	script := redis.NewScript("return 1 -- " + tag)
	took := make([]time.Duration, n)
	run := func(i int) {
		start := time.Now()
		if err := script.Run(context.Background(), rc, nil).Err(); err != nil {
			t.Errorf("a plain client's script: %v", err)
		}
		took[i] = time.Since(start)
	}
	forEach(n, concurrent, run)
	return slices.Max(took)
}

// forEach calls f with 0 to n-1, in turn or all at once.
func forEach(n int, concurrent bool, f func(i int)) {
	if !concurrent {
		for i := range n {
			f(i)
		}
		return
	}
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			f(i)
		}()
	}
	close(gate)
	wg.Wait()
}

// freshClientRequests makes a fresh client of the server at addr with
// PoolSize pool, a store (with prefix) and a limiter of five requests a
// minute over them, and sends n requests from one client address through
// the limiter's middleware, one after the other or all at once.
func freshClientRequests(t *testing.T, addr string, pool int, prefix string, n int, concurrent bool) []freshRequest {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr, PoolSize: pool})
	defer rc.Close()
	store, err := middleware.NewRedisStore(rc, middleware.RedisConfig{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	reqs := make([]freshRequest, n)
	var mu sync.Mutex // guards the outcomes in reqs
	lim, err := middleware.New(middleware.Limit{Requests: 5, Window: time.Minute}, keyfunc.RemoteIP(),
		middleware.WithStore(store),
		middleware.WithObserver(&middleware.Hooks{OnDecided: func(r keyfunc.Request, res *middleware.Result) {
			if i, ok := r.Context().Value(freshIndex{}).(int); ok {
				mu.Lock()
				reqs[i].outcome, reqs[i].storeErr = res.Outcome, res.StoreErr
				mu.Unlock()
			}
		}}))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	h := lim.Handler(ok)
	send := func(i int) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r = r.WithContext(context.WithValue(r.Context(), freshIndex{}, i))
		r.RemoteAddr = "192.0.2.1:1234"
		rec := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(rec, r)
		took := time.Since(start)
		mu.Lock()
		q := &reqs[i]
		q.start, q.took, q.status = start, took, rec.Code
		q.fields = rec.Header().Get(headers.Limit) != "" && rec.Header().Get(headers.RateLimit) != ""
		mu.Unlock()
	}
	forEach(n, concurrent, send)
	return reqs
}

// checkFreshCounts fails t unless every request of round reqs was decided
// by Redis and counted: five admitted and the others denied, in that
// order if inOrder (the requests went one after the other).
func checkFreshCounts(t *testing.T, round int, reqs []freshRequest, inOrder bool) {
	t.Helper()
	var lag time.Duration
	for _, q := range reqs {
		lag = max(lag, q.lag)
	}
	report := timingGate(t, lag)
	admitted := 0
	for i, q := range reqs {
		decided := q.storeErr == nil && q.fields && (q.outcome == middleware.OutcomeAllowed || q.outcome == middleware.OutcomeDenied)
		if !decided {
			report("round %d, request %d (%v, lag %v): not decided by Redis: status %d, outcome %v, rate-limit fields %v, store error %v",
				round, i+1, q.took.Round(time.Microsecond), q.lag, q.status, q.outcome, q.fields, q.storeErr)
		}
		if q.status == http.StatusOK {
			admitted++
		}
		want := http.StatusTooManyRequests
		if i < 5 {
			want = http.StatusOK
		}
		if inOrder && q.status != want {
			report("round %d, request %d: status %d, want %d", round, i+1, q.status, want)
		}
	}
	if admitted != 5 {
		report("round %d: %d of %d requests admitted at a limit of 5", round, admitted, len(reqs))
	}
}

// checkFreshTiming fails t if requests of reqs were held at start (see
// TestFreshClientDecides).
func checkFreshTiming(t *testing.T, reqs []freshRequest) {
	t.Helper()
	var lag, slowest, worst, plain time.Duration
	var held []freshRequest
	for _, q := range reqs {
		lag = max(lag, q.lag)
		plain = max(plain, q.plain)
		slowest = max(slowest, q.took)
		worst = max(worst, q.took-2*q.lag-q.plain)
		if q.took > heldAtStart+2*q.lag+q.plain {
			held = append(held, q)
		}
	}
	t.Logf("%d requests: the slowest took %v; %v at most beyond twice this process's scheduling lag (up to %v) and the slowest of a plain client's (up to %v)",
		len(reqs), slowest.Round(time.Microsecond), worst.Round(time.Microsecond), lag, plain.Round(time.Microsecond))
	if len(held) == 0 {
		return
	}
	report := timingGate(t, lag)
	if len(held) <= strays(len(reqs)) {
		report = t.Logf
	}
	q := held[0]
	report("%d of %d requests held longer than %v beyond twice this process's scheduling lag and a plain client's slowest, e.g. one of %v (lag %v, plain %v)",
		len(held), len(reqs), heldAtStart, q.took.Round(time.Microsecond), q.lag, q.plain.Round(time.Microsecond))
}
