package middleware_test

import (
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// restartWindow is the fixed window of TestEmptyRestart's limits.
const restartWindow = 10 * time.Second

// A mode of TestEmptyRestart: a rule, and the most a client may be
// admitted after the restart in the window the restart falls in
// (docs/redis.md, "A Redis restarted empty"): the limit again, plus what
// the mode may add to a counter that starts afresh.
type restartMode struct {
	name  string
	rule  middleware.Rule
	after int
}

const (
	restartLimit    = 20
	restartLease    = 8
	restartUnsynced = 4
	// restartBefore is what each probe client counts before the restart.
	restartBefore = 10
)

func restartModes() []restartMode {
	fixed := []middleware.Limit{middleware.Limit{Requests: restartLimit, Window: restartWindow}.FixedWindow()}
	return []restartMode{
		{"exact", middleware.Rule{Limits: fixed}, restartLimit},
		// The rest of each server's slice, spent in memory (it was
		// counted in the counter lost): up to 2 servers × lease.
		{"lease", middleware.Rule{Limits: fixed, Sync: middleware.SyncLease, Lease: restartLease}, restartLimit + 2*restartLease},
		// fleet.OverBound on the new counter: 2 servers × max_unsynced,
		// and what the probe was admitted in a sync interval (added in
		// the test).
		{"write_back", middleware.Rule{Limits: fixed, Sync: middleware.SyncWriteBack, MaxUnsynced: restartUnsynced}, restartLimit + 2*restartUnsynced},
	}
}

// TestEmptyRestart restarts a standalone Redis empty (persistence off)
// while two app servers decide 2,000 requests a second of other clients in
// exact, lease and write-back modes. In one window (fixed, 10 s), probe
// clients, ten per mode, each count 10 of their 20 through both servers;
// Redis is killed and started again at once; then each sends 40 more,
// through both servers in turn. What each probe gets after the restart is
// its limit again, and no more than its mode adds (restartMode.after, and
// for write-back what the probe was admitted in a sync interval): the
// over-admission is what its counter held (10), as docs/redis.md states,
// plus, in the fleet modes, what they add to a counter that starts afresh.
// Requests that find Redis down fail closed (FailClosed), so that what is
// admitted is what the modes admit. It measures how soon the fleet modes
// are back after the restart: the first lease granted and the first push
// that succeeded on each app server, and the first request decided by
// Redis. The app servers' clock (WithClock, which the store and the fleet
// modes decide by) runs with real time from 100 ms into a window, so that
// the test need not wait for one to start.
func TestEmptyRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a real Redis under load")
	}
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	modes := restartModes()
	var rules []middleware.Rule
	for _, m := range modes {
		r := m.rule
		r.Name, r.Path, r.Key = m.name, "/"+m.name, keyfunc.RemoteIP()
		rules = append(rules, r)
	}
	type syncSeen struct {
		mu              sync.Mutex
		since           time.Time
		granted, pushed time.Time // the first after since
	}
	now := time.Now()
	offset := now.Truncate(restartWindow).Add(restartWindow + 100*time.Millisecond).Sub(now)
	clock := func() time.Time { return time.Now().Add(offset) }
	var lims [2]*middleware.Limiter
	var seen [2]*syncSeen
	for i := range lims {
		store, err := middleware.NewRedisStore(srv.Client(t, &redis.Options{PoolSize: 128}), middleware.RedisConfig{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		closeStore(t, store)
		s := &syncSeen{}
		seen[i] = s
		hooks := &middleware.Hooks{OnSynced: func(e middleware.SyncEvent) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.since.IsZero() {
				return
			}
			switch now := time.Now(); {
			case e.Kind == middleware.SyncLeaseGranted && e.Units > 0 && s.granted.IsZero():
				s.granted = now
			case e.Kind == middleware.SyncFlushed && e.Err == nil && e.Calls > 0 && s.pushed.IsZero():
				s.pushed = now
			}
		}}
		lims[i] = newLimiterRules(t, rules, middleware.WithStore(store), middleware.WithFailurePolicy(middleware.FailClosed), middleware.WithObserver(hooks), middleware.WithClock(clock))
	}
	request := func(m int, addr string) keyfunc.Request {
		r := httptest.NewRequest("GET", "/"+modes[m].name, nil)
		r.RemoteAddr = addr + ":1"
		return keyfunc.FromHTTP(r)
	}
	var mu sync.Mutex
	n := 0
	l := startLoadFunc(t, loadRate, loadGoroutines, func() (*middleware.Limiter, keyfunc.Request, int) {
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		m, j := i%len(modes), (i/len(modes))%100
		return lims[i/len(modes)%2], request(m, "10.1."+strconv.Itoa(m)+"."+strconv.Itoa(j)), m<<8 | j
	})
	rlag := startRedisLag(t, srv.Addr())

	const probes = 10
	probe := func(m, j int) string { return "10.2." + strconv.Itoa(m) + "." + strconv.Itoa(j) }
	// probeRun is what a probe was admitted in a run of requests: how
	// many, how many in the sync interval (100 ms) that admitted most,
	// and how many of its requests failed.
	type probeRun struct{ admitted, inInterval, failed int }
	// charge has each probe send k requests, one at a time, through both
	// servers in turn, all probes at once.
	charge := func(k int) [][]probeRun {
		got := make([][]probeRun, len(modes))
		var wg sync.WaitGroup
		for m := range modes {
			got[m] = make([]probeRun, probes)
			for j := range probes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var at []time.Time
					run := &got[m][j]
					for i := range k {
						res, err := lims[i%2].Decide(request(m, probe(m, j)))
						switch {
						case err != nil || res.StoreErr != nil:
							run.failed++
						case res.Allowed:
							run.admitted++
							at = append(at, time.Now())
						}
					}
					for a := range at {
						b := a
						for b < len(at) && at[b].Sub(at[a]) < 100*time.Millisecond {
							b++
						}
						run.inInterval = max(run.inInterval, b-a)
					}
				}()
			}
		}
		wg.Wait()
		return got
	}
	time.Sleep(200 * time.Millisecond) // the load runs
	win := clock().Truncate(restartWindow)
	before := charge(restartBefore)
	killed := time.Now()
	if err := srv.Restart(); err != nil {
		l.finish()
		t.Fatal(err)
	}
	back := time.Now() // it answers PING
	for _, s := range seen {
		s.mu.Lock()
		s.since = back
		s.mu.Unlock()
	}
	// Decided by Redis again: the first probe request that is.
	var decided time.Time
	for deadline := back.Add(5 * time.Second); decided.IsZero() && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if res, err := lims[0].Decide(request(0, "10.3.0.1")); err == nil && res.StoreErr == nil {
			decided = time.Now()
		}
	}
	after := charge(2 * restartLimit)
	ended := clock()
	time.Sleep(500 * time.Millisecond) // the fleet's first pushes after the restart
	outs := l.finish()
	rlag.Stop()

	inWindow := ended.Before(win.Add(restartWindow))
	timing := busyGate(t, summarize(outs, killed, time.Now(), nil).lag, rlag.Worst())
	for m, mode := range modes {
		most, over := 0, 0
		for j := range probes {
			b, a := before[m][j], after[m][j]
			most, over = max(most, a.admitted), max(over, b.admitted+a.admitted-restartLimit)
			bound := mode.after
			if m == 2 {
				// fleet.OverBound's "what it admits in one sync interval",
				// for this probe.
				bound += a.inInterval
			}
			if inWindow && a.admitted > bound {
				t.Errorf("%s: probe %d admitted %d times after the restart in its window, want at most %d (the limit %d, and what the mode adds)",
					mode.name, j, a.admitted, bound, restartLimit)
			}
			if inWindow && a.admitted < restartLimit-b.admitted {
				// What the window had left before the restart, at least:
				// unless requests failed closed on a machine too busy.
				report := t.Errorf
				if a.failed+b.failed > 0 {
					report = timing
				}
				report("%s: probe %d admitted %d times after the restart, less than what its window had left (%d; %d requests failed)",
					mode.name, j, a.admitted, restartLimit-b.admitted, a.failed+b.failed)
			}
		}
		t.Logf("%s (%d per %v): probes were admitted %d before the restart, then up to %d times of %d in the same window: over the limit by up to %d (stated: at most %d after)",
			mode.name, restartLimit, restartWindow, restartBefore, most, 2*restartLimit, over, mode.after)
	}
	if !inWindow {
		timing("the probes ended %v after their window, which the restart (%v) made too long for the test", ended.Sub(win.Add(restartWindow)), back.Sub(killed))
	}
	t.Logf("Redis down %v; decided by Redis again %v after it answered PING", back.Sub(killed).Round(time.Millisecond), decided.Sub(back).Round(time.Millisecond))
	if decided.IsZero() || decided.Sub(back) > 500*time.Millisecond {
		timing("decided by Redis again %v after the restart, want within 500 ms", decided.Sub(back))
	}
	for i, s := range seen {
		s.mu.Lock()
		t.Logf("app server %d: first lease granted %v after Redis was back, first push %v after", i, s.granted.Sub(back).Round(time.Millisecond), s.pushed.Sub(back).Round(time.Millisecond))
		if s.granted.IsZero() || s.pushed.IsZero() {
			t.Errorf("app server %d: no lease granted (%v) or no push that succeeded (%v) after the restart", i, s.granted, s.pushed)
		}
		s.mu.Unlock()
	}
}

// newLimiterRules returns a Limiter of rules, closed when the test ends.
func newLimiterRules(t *testing.T, rules []middleware.Rule, opts ...middleware.Option) *middleware.Limiter {
	t.Helper()
	lim, err := middleware.NewRules(rules, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	return lim
}
