package middleware_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redisstore"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/schedlag"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// The outage tests drive a limiter as a new user would run one: in
// process, 64 goroutines sending 2,000 requests a second over 300 client
// keys (20 per 10 s each, so that both 200s and 429s occur), with go-redis
// clients created with default options but PoolSize 128, while real
// redis-server processes are killed, hung and restarted. They assert on
// counts of requests (held up, decided without Redis), not on wall-clock
// figures that a loaded machine could miss: a request is held up when it
// took more than the bound the store states (its Timeout, 100 ms by
// default, plus 25 ms) beyond the longest this process went unscheduled
// while it ran (package schedlag), since other test binaries share the
// machine's cores. No request may be held up by a store failure, whatever
// its phase (the kill, the outage, the restart). BENCHMARKS.md has the figures measured on a quiet
// one. They run one at a time, not in parallel with
// each other or with the package's parallel tests: each is a load of its
// own, and a machine too busy to answer in tens of milliseconds is one
// whose servers the store rightly takes as stalled.
const (
	loadGoroutines = 64
	loadRate       = 2000 // requests a second, all goroutines together
	loadKeys       = 300
	// heldTooLong is the bound RedisConfig.Timeout states, at its
	// default: Timeout plus 25 ms (docs/redis.md).
	heldTooLong = redisstore.DefaultTimeout + 25*time.Millisecond
)

// outcome is what became of one request of the load.
type outcome struct {
	at      time.Time     // when it was sent
	took    time.Duration // how long Decide took
	key     int           // which client
	decided bool          // by Redis (not by the failure policy)
	err     error         // Decide's error, or the store error it absorbed
	// lag is the longest this process went unscheduled while the request
	// ran (package schedlag): on a machine that busy, a request is held
	// only if it took longer than heldTooLong plus lag.
	lag time.Duration
	// overrun is how long past its deadline the store may have waited
	// for a verification's verdict (redispipe.OverrunAllowance, the
	// runtime's scheduling latency, which lag, a timer's lateness, does
	// not show), read as the request ended.
	overrun time.Duration
	// res is Decide's result, req the request.
	res middleware.Result
	req keyfunc.Request
}

// load sends requests to lim until stop is closed, paced at loadRate, and
// returns every outcome. keyOf names client i.
type load struct {
	mu       sync.Mutex
	outcomes []outcome
	stop     chan struct{}
	done     sync.WaitGroup
	lags     *schedlag.Log
}

func startLoad(t *testing.T, lim *middleware.Limiter, keyOf func(i int) string) *load {
	t.Helper()
	return startLoadAt(t, lim, keyOf, loadRate, loadGoroutines)
}

// startLoadAt is startLoad at rate requests a second from goroutines
// goroutines, each on a ticker of its own: a goroutine held by a request
// misses the ticks that pass meanwhile, as a client that waits for its
// answer does.
func startLoadAt(t *testing.T, lim *middleware.Limiter, keyOf func(i int) string, rate, goroutines int) *load {
	t.Helper()
	var next atomic.Int64
	return startLoadFunc(t, rate, goroutines, func() (*middleware.Limiter, keyfunc.Request, int) {
		i := int(next.Add(1)) % loadKeys
		return lim, keyfunc.FromHTTP(get(keyOf(i) + ":1")), i
	})
}

// startLoadFunc is startLoadAt for requests that next makes: each is
// decided by the limiter next returns, and its outcome is that of client
// key.
func startLoadFunc(t *testing.T, rate, goroutines int, next func() (lim *middleware.Limiter, r keyfunc.Request, key int)) *load {
	t.Helper()
	l := &load{stop: make(chan struct{}), lags: schedlag.Start(t)}
	interval := time.Second * time.Duration(goroutines) / time.Duration(rate)
	for g := range goroutines {
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			// Stagger the goroutines over one interval.
			time.Sleep(interval * time.Duration(g) / time.Duration(goroutines))
			for n := 0; n < 60*rate/goroutines; n++ { // at most a minute
				select {
				case <-l.stop:
					return
				case <-tick.C:
				}
				lim, r, i := next()
				start := time.Now()
				res, err := lim.Decide(r)
				end := time.Now()
				o := outcome{at: start, took: end.Sub(start), key: i, decided: err == nil && res.Applied && res.StoreErr == nil,
					overrun: redispipe.OverrunAllowance(end)}
				if err == nil {
					err = res.StoreErr
				}
				o.err, o.res, o.req = err, res, r
				l.mu.Lock()
				l.outcomes = append(l.outcomes, o)
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// finish stops the load and returns what happened.
func (l *load) finish() []outcome {
	close(l.stop)
	l.done.Wait()
	l.lags.Stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.outcomes {
		o := &l.outcomes[i]
		o.lag = l.lags.Worst(o.at, o.at.Add(o.took))
	}
	return l.outcomes
}

// loadKey returns the address of client i among 300.
func loadKey(i int) string {
	if i < 250 {
		return "198.51.100." + strconv.Itoa(i)
	}
	return "203.0.113." + strconv.Itoa(i-250)
}

// summary counts outcomes in [from, to): held counts those that took more
// than heldTooLong beyond their lag and the store's overrun allowance
// (outcome.overrun), and lag is the longest lag of any.
type summary struct {
	total, undecided, held int
	lag                    time.Duration
	// worst is the outcome that took longest beyond its lag.
	worst outcome
}

func summarize(os []outcome, from, to time.Time, keep func(outcome) bool) summary {
	var s summary
	for _, o := range os {
		if o.at.Before(from) || !o.at.Before(to) || keep != nil && !keep(o) {
			continue
		}
		s.total++
		if !o.decided {
			s.undecided++
		}
		if o.took > heldTooLong+o.lag+o.overrun {
			s.held++
		}
		if o.took-o.lag-o.overrun > s.worst.took-s.worst.lag-s.worst.overrun {
			s.worst = o
		}
		s.lag = max(s.lag, o.lag)
	}
	return s
}

// firstDecidedAfter returns how long after t the load's requests were
// decided by Redis again for good: the time from t to the first request
// after which every later one (of those keep selects) was decided.
func firstDecidedAfter(os []outcome, t time.Time, keep func(outcome) bool) (time.Duration, bool) {
	var lastUndecided time.Time
	seen := false
	for _, o := range os {
		if o.at.Before(t) || keep != nil && !keep(o) {
			continue
		}
		seen = true
		if !o.decided && o.at.After(lastUndecided) {
			lastUndecided = o.at
		}
	}
	if !seen {
		return 0, false
	}
	if lastUndecided.IsZero() {
		return 0, true
	}
	return lastUndecided.Sub(t), true
}

// chargeProbe sends n requests from a client outside the load and returns
// what the last one had remaining.
func chargeProbe(t *testing.T, lim *middleware.Limiter, addr string, n int) int {
	t.Helper()
	var res middleware.Result
	var err error
	for range n {
		if res, err = lim.Decide(keyfunc.FromHTTP(get(addr + ":1"))); err != nil || res.StoreErr != nil || !res.Applied {
			t.Fatalf("probe client: %+v, %v", res, err)
		}
	}
	return res.Remaining
}

// failoverUnderLoad charges 5 of 20 to the client probe, outside the
// load, and waits until victim's replica has that count; then, under the
// load, kills victim and waits for wait to see a replica promoted. It
// returns what the load saw, ending 2 s after the promotion, the instant
// of the kill and that of the promotion.
func failoverUnderLoad(t *testing.T, lim *middleware.Limiter, probe string, victim *redistest.Server,
	wait func(context.Context, *redistest.Server) (*redistest.Server, time.Duration, error)) (os []outcome, killed, promoted time.Time) {
	t.Helper()
	ctx := context.Background()
	if rem := chargeProbe(t, lim, probe, 5); rem != 15 {
		t.Fatalf("probe client has %d remaining after 5 of 20", rem)
	}
	if err := victim.WaitReplicated(ctx); err != nil {
		t.Fatal(err)
	}
	l := startLoad(t, lim, loadKey)
	time.Sleep(time.Second)
	killed = time.Now()
	victim.Kill()
	_, took, err := wait(ctx, victim)
	if err != nil {
		l.finish()
		t.Fatal(err)
	}
	promoted = killed.Add(took)
	time.Sleep(2 * time.Second)
	return l.finish(), killed, promoted
}

func newOutageLimiter(t *testing.T, store middleware.Store) *middleware.Limiter {
	return newLimiter(t, middleware.Limit{Requests: 20, Window: 10 * time.Second}, keyfunc.RemoteIP(), middleware.WithStore(store))
}

// TestOutageStandalone kills a standalone Redis under load, restarts it on
// the same port, and counts: requests held up more than heldTooLong from the
// kill on (none, unless this process or a redis-server of the test's own
// was late past grayBusyLag: busyGate), requests undecided after Redis accepts connections
// again (at most 500 ms worth), and, at startup, requests let through
// undecided while 64 goroutines open the first connections (none).
func TestOutageStandalone(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a real Redis under load for several seconds")
	}
	srv := redistest.Standalone(t)
	store, err := middleware.NewRedisStore(srv.Client(t, &redis.Options{PoolSize: 128}), middleware.RedisConfig{Prefix: srv.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, store)
	lim := newOutageLimiter(t, store)
	// A server of the test's own, pinged: how late a redis-server answers
	// on this machine meanwhile (busyGate).
	serverLag := startRedisLag(t, redistest.Standalone(t).Addr())
	start := time.Now()
	l := startLoad(t, lim, loadKey)
	time.Sleep(time.Second)
	killed := time.Now()
	srv.Kill()
	time.Sleep(time.Second)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now() // Restart returns once the server answers PING
	time.Sleep(1500 * time.Millisecond)
	os := l.finish()

	startup := summarize(os, start, start.Add(500*time.Millisecond), nil)
	down := summarize(os, killed, back, nil)
	recovery, ok := firstDecidedAfter(os, back, nil)
	t.Logf("startup: %d requests, %d undecided; down: %d requests, %d held over %v (plus up to %v of scheduling lag); decided again %v after Redis accepted connections",
		startup.total, startup.undecided, down.total, down.held, heldTooLong, down.lag, recovery)
	if startup.undecided != 0 {
		t.Errorf("%d requests undecided at startup, want 0", startup.undecided)
	}
	if held := summarize(os, killed, time.Now(), nil); held.held > 0 {
		busyGate(t, held.lag, serverLag.WorstIn(killed, time.Now()))("%d requests held more than %v from the kill on, want none", held.held, heldTooLong)
	}
	// Within 500 ms: at most 500 ms worth of requests undecided after the
	// server accepted connections again.
	after := summarize(os, back, time.Now(), nil)
	if !ok || after.undecided > loadRate/2 {
		t.Errorf("%d requests undecided after Redis accepted connections (decided again after %v), want at most %d (500ms)",
			after.undecided, recovery, loadRate/2)
	}
}

// TestOutageHung hangs a standalone Redis (SIGSTOP) under load: no request
// waits more than the store's bound (heldTooLong), and decisions come
// back when it resumes.
func TestOutageHung(t *testing.T) {
	if testing.Short() {
		t.Skip("hangs a real Redis under load for several seconds")
	}
	srv := redistest.Standalone(t)
	store, err := middleware.NewRedisStore(srv.Client(t, &redis.Options{PoolSize: 128}), middleware.RedisConfig{Prefix: srv.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, store)
	lim := newOutageLimiter(t, store)
	serverLag := startRedisLag(t, redistest.Standalone(t).Addr()) // busyGate
	l := startLoad(t, lim, loadKey)
	time.Sleep(time.Second)
	hung := time.Now()
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	time.Sleep(1500 * time.Millisecond)
	os := l.finish()
	down := summarize(os, hung, back, nil)
	after := summarize(os, back.Add(500*time.Millisecond), time.Now(), nil)
	t.Logf("hung: %d requests, %d held over %v (plus up to %v of scheduling lag); after: %d requests, %d undecided",
		down.total, down.held, heldTooLong, down.lag, after.total, after.undecided)
	if held := summarize(os, hung, time.Now(), nil); held.held > 0 {
		w := held.worst
		busyGate(t, held.lag, serverLag.WorstIn(hung, time.Now()))("%d requests held more than %v from the hang on, want none (the worst took %v with %v of lag, sent %v after the hang, decided %v, %v)",
			held.held, heldTooLong, w.took, w.lag, w.at.Sub(hung), w.decided, w.err)
	}
	if after.undecided != 0 {
		t.Errorf("%d requests undecided from 500ms after Redis resumed, want 0", after.undecided)
	}
}

// bucketSlot returns the Cluster slot of the counters of client address
// addr under keyfunc.RemoteIP: the store keeps them in the bucket tagged
// with 3 base64url characters of SHA-256("ip:" + addr).
func bucketSlot(addr string) int {
	sum := sha256.Sum256([]byte("ip:" + addr))
	return redistest.KeySlot("{" + base64.RawURLEncoding.EncodeToString(sum[:3])[:3] + "}")
}

// TestOutageCluster kills one master of a Cluster of 3 masters and 3
// replicas under load: requests for keys on the healthy masters are all
// decided by Redis throughout, and those of the killed master's keys are
// decided again within a second of its replica's promotion.
func TestOutageCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a Cluster master under load for several seconds")
	}
	cl := redistest.ClusterWithReplicas(t)
	ctx := context.Background()
	store, err := middleware.NewRedisStore(cl.Client(t, &redis.ClusterOptions{PoolSize: 128}), middleware.RedisConfig{Prefix: cl.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, store)
	lim := newOutageLimiter(t, store)
	// The master of each client's counters.
	masters := map[int]string{}
	for i := range loadKeys {
		m, err := cl.MasterForSlot(ctx, bucketSlot(loadKey(i)))
		if err != nil {
			t.Fatal(err)
		}
		masters[i] = m.Addr()
	}
	victim, err := cl.MasterForSlot(ctx, bucketSlot(loadKey(0)))
	if err != nil {
		t.Fatal(err)
	}
	onVictim := func(o outcome) bool { return masters[o.key] == victim.Addr() }
	healthy := func(o outcome) bool { return !onVictim(o) }
	// A client outside the load whose counters the victim holds: its count
	// is replicated before the kill, so the failover must not lose it.
	probe := ""
	for i := 0; probe == ""; i++ {
		addr := "192.0.2." + strconv.Itoa(i)
		if m, err := cl.MasterForSlot(ctx, bucketSlot(addr)); err == nil && m == victim {
			probe = addr
		}
	}
	os, killed, promoted := failoverUnderLoad(t, lim, probe, victim, cl.WaitFailover)
	took := promoted.Sub(killed)

	h := summarize(os, killed, time.Now(), healthy)
	v := summarize(os, promoted.Add(time.Second), time.Now(), onVictim)
	recovery, _ := firstDecidedAfter(os, promoted, onVictim)
	t.Logf("failover took %v; healthy masters: %d requests, %d undecided, %d held over %v (plus up to %v of scheduling lag); killed master's keys decided again %v after the promotion (%d undecided from 1 s after it)",
		took, h.total, h.undecided, h.held, heldTooLong, h.lag, recovery, v.undecided)
	if h.undecided != 0 {
		t.Errorf("%d of %d requests for keys on healthy masters were not decided by Redis, want 0", h.undecided, h.total)
	}
	if v.total == 0 || v.undecided != 0 {
		t.Errorf("%d of %d requests for the killed master's keys undecided from 1 s after the promotion, want 0", v.undecided, v.total)
	}
	if rem := chargeProbe(t, lim, probe, 1); rem != 14 {
		t.Errorf("after the failover the probe client has %d remaining after its 6th request, want 14: a replicated count was lost", rem)
	}
}

// TestOutageSentinel kills the master of a Sentinel setup (1 master, 1
// replica, 3 sentinels) under load, with a FailoverClient of go-redis's
// default options (PoolSize too): no request is held more than heldTooLong, and
// the last undecided request comes within 500 ms of the promotion.
func TestOutageSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("fails a Sentinel master over under load for several seconds")
	}
	s := redistest.Sentinel(t)
	ctx := context.Background()
	store, err := middleware.NewRedisStore(s.Client(t, &redis.FailoverOptions{}), middleware.RedisConfig{Prefix: s.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, store)
	lim := newOutageLimiter(t, store)
	serverLag := startRedisLag(t, redistest.Standalone(t).Addr()) // busyGate
	master, err := s.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	os, killed, promoted := failoverUnderLoad(t, lim, "192.0.2.1", master, s.WaitFailover)
	took := promoted.Sub(killed)
	down := summarize(os, killed, promoted, nil)
	after := summarize(os, promoted.Add(500*time.Millisecond), time.Now(), nil)
	recovery, _ := firstDecidedAfter(os, promoted, nil)
	t.Logf("failover took %v; %d requests during it, %d held over %v (plus up to %v of scheduling lag); decided again %v after the promotion (%d undecided from 500ms after it)",
		took, down.total, down.held, heldTooLong, down.lag, recovery, after.undecided)
	if after.total == 0 || after.undecided != 0 {
		t.Errorf("%d of %d requests undecided from 500ms after the promotion, want 0", after.undecided, after.total)
	}
	if held := summarize(os, killed, time.Now(), nil); held.held > 0 {
		busyGate(t, held.lag, serverLag.WorstIn(killed, time.Now()))("%d requests held more than %v from the kill on, want none", held.held, heldTooLong)
	}
	if recovery > 500*time.Millisecond {
		t.Errorf("the last undecided request came %v after the promotion, want at most 500ms", recovery)
	}
	if rem := chargeProbe(t, lim, "192.0.2.1", 1); rem != 14 {
		t.Errorf("after the failover the probe client has %d remaining after its 6th request, want 14: a replicated count was lost", rem)
	}
}

// untilRedisDecides makes decisions with decide until Redis decides one
// (the store answered in time) and ready, if not nil, holds, for at most
// 3 s beyond this process's scheduling lag. A store's first decisions open
// its connections and load its script: on a loaded machine they may take
// longer than the store's timeout, and go to the failure policy, as any
// decision that late does.
func untilRedisDecides(t *testing.T, decide func() (middleware.Result, error), ready func() bool) {
	t.Helper()
	lags := schedlag.Start(t)
	defer lags.Stop()
	for began := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		res, err := decide()
		if err == nil && res.StoreErr == nil && res.Applied && (ready == nil || ready()) {
			return
		}
		if lag := lags.Max(); time.Since(began) > 3*time.Second+lag {
			t.Fatalf("with Redis up, not decided by Redis within %v (scheduling lag up to %v): %+v, %v", time.Since(began), lag, res, err)
		}
	}
}

// TestRecommendedClientOptions checks what docs/redis.md says of
// ContextTimeoutEnabled: with it, go-redis ends a read from a hung server
// at the decision's deadline and frees the connection; without it, the
// read goes on until ReadTimeout (3 s by default).
func TestRecommendedClientOptions(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		opts      *redis.Options
		wantFreed bool
	}{
		{"recommended", &redis.Options{ContextTimeoutEnabled: true}, true},
		{"default", &redis.Options{}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Standalone(t)
			client := srv.Client(t, tt.opts)
			store, err := middleware.NewRedisStore(client, middleware.RedisConfig{Prefix: srv.Prefix(t)})
			if err != nil {
				t.Fatal(err)
			}
			closeStore(t, store)
			lim := newOutageLimiter(t, store)
			r := keyfunc.FromHTTP(get("192.0.2.1:1"))
			untilRedisDecides(t, func() (middleware.Result, error) { return lim.Decide(r) }, nil)
			if err := srv.Pause(); err != nil {
				t.Fatal(err)
			}
			defer srv.Resume()
			// Requests at once, so that some leave in a batch on a pooled
			// connection (the first goes directly, through a clone of the
			// client that gives up at the stall threshold).
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					start := time.Now()
					res, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2." + strconv.Itoa(i+1) + ":1")))
					if err != nil || res.StoreErr == nil {
						t.Errorf("with Redis hung: %+v, %v; want a store error under FailOpen", res, err)
					}
					if took := time.Since(start); took > time.Second {
						t.Errorf("the request waited %v", took)
					}
				}()
			}
			wg.Wait()
			// The store's deadline (100 ms), and those of the probes, have
			// passed well before 1 s; ReadTimeout (3 s) has not.
			time.Sleep(time.Second)
			st := client.PoolStats()
			held := st.TotalConns - st.IdleConns
			t.Logf("%s: 1 s into the hang, %d connections held (pool %+v)", tt.name, held, *st)
			if got := held == 0; got != tt.wantFreed {
				t.Errorf("connections freed at the deadline: %v (%d held), want %v", got, held, tt.wantFreed)
			}
		})
	}
}
