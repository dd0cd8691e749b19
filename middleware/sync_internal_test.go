package middleware

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
)

// withManualSync makes the coordination layer's syncer run only when the
// test calls syncNow.
func withManualSync() Option { return func(c *config) { c.syncManual = true } }

// syncNow runs one tick of the limiter's syncer at now.
func (l *Limiter) syncNow(t testing.TB, now time.Time) {
	t.Helper()
	fs := l.syncs.store.Load()
	if fs == nil {
		t.Fatal("no coordination layer")
	}
	fs.Sync(context.Background(), now, false)
}

// abandon drops the limiter as a process that dies would: nothing
// unsynced is pushed.
func (l *Limiter) abandon() {
	if fs := l.syncs.store.Load(); fs != nil {
		fs.Abandon()
	}
}

var fixedKey keyfunc.Func = func(keyfunc.Request) (string, error) { return "client", nil }

// syncEvents counts the SyncEvents an observer sees, by kind.
type syncEvents struct {
	NopObserver
	mu    sync.Mutex
	units map[SyncEventKind]int64
	n     map[SyncEventKind]int
}

func (o *syncEvents) Synced(e SyncEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.units == nil {
		o.units, o.n = map[SyncEventKind]int64{}, map[SyncEventKind]int{}
	}
	o.units[e.Kind] += e.Units
	o.n[e.Kind]++
}

// fleetOf returns n limiters, each with its own client (separate app
// servers), on the store at prefix, with rules and the fake clock.
func fleetOf(t *testing.T, n int, client func() redis.Scripter, prefix string, clock *testclock.Clock, rules []Rule, opts ...Option) []*Limiter {
	t.Helper()
	var out []*Limiter
	for i := 0; i < n; i++ {
		store, err := NewRedisStore(client(), RedisConfig{Prefix: prefix, Timeout: 5 * time.Second, StallThreshold: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		lim, err := NewRules(rules, append([]Option{WithStore(store), WithClock(clock.Now), withManualSync(), WithDenyCache(0)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lim.Close() })
		out = append(out, lim)
	}
	return out
}

func decideAt(t *testing.T, lim *Limiter) Result {
	t.Helper()
	res, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil)))
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestSyncConfigErrors(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	store, err := NewRedisStore(srv.Client(t, nil), RedisConfig{Prefix: srv.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rule  Rule
		store bool
		want  string
	}{
		{Rule{Name: "q", Key: fixedKey, Limits: []Limit{PerSecond(2).LeakyBucket(5, 0)}, Sync: SyncLease}, true, `sluice: rule "q": sync: lease: limits[0] is a leaky_bucket`},
		{Rule{Name: "log", Key: fixedKey, Limits: []Limit{PerMinute(5).SlidingLog()}, Sync: SyncWriteBack}, true, `sluice: rule "log": sync: write_back: limits[0] is a sliding_log`},
		{Rule{Name: "c", Key: fixedKey, Concurrency: 3, Sync: SyncLease}, true, `sluice: rule "c": sync: lease: the rule has only a concurrency limit`},
		{Rule{Name: "l", Key: fixedKey, Limits: []Limit{PerMinute(5)}, Lease: 10}, true, `sluice: rule "l": lease applies only to sync: lease`},
		{Rule{Name: "m", Key: fixedKey, Limits: []Limit{PerMinute(5)}, Sync: SyncLease, MaxUnsynced: 3}, true, `sluice: rule "m": max_unsynced applies only to sync: write_back`},
		{Rule{Name: "i", Key: fixedKey, Limits: []Limit{PerMinute(5)}, Sync: SyncWriteBack, SyncInterval: 1500 * time.Microsecond}, true, `sluice: rule "i": sync_interval 1.5ms must be a whole number of milliseconds`},
		{Rule{Name: "n", Key: fixedKey, Limits: []Limit{PerMinute(5)}, Sync: SyncLease, Lease: -1}, true, `sluice: rule "n": lease -1 must be between 1 and 2^30`},
	} {
		opts := []Option{}
		if tc.store {
			opts = append(opts, WithStore(store))
		}
		_, err := NewRules([]Rule{tc.rule}, opts...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("rule %q: error %v, want it to start with %s", tc.rule.Name, err, tc.want)
		}
	}
	// With the in-memory store, one process counts alone: every mode
	// decides exactly.
	mem, err := NewRules([]Rule{{Name: "mem", Key: fixedKey, Limits: []Limit{PerMinute(5)}, Sync: SyncLease}})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	n := 0
	for decideAt(t, mem).Allowed {
		n++
	}
	if n != 5 || mem.syncs.store.Load() != nil {
		t.Errorf("in memory: %d admitted of 5, layer %v", n, mem.syncs.store.Load())
	}
	for _, s := range []string{"exact", "lease", "write_back"} {
		m, err := ParseSyncMode(s)
		if err != nil || m.String() != s {
			t.Errorf("ParseSyncMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseSyncMode("writeback"); err == nil {
		t.Error("ParseSyncMode accepted writeback")
	}
}

// TestSyncModes runs four limiters (separate app servers) in each mode on
// one key, with a rule in exact mode beside it, on standalone Redis and
// on a Cluster, and checks the bound of each mode per window, what
// Remaining and Retry-After say, and the observer events.
func TestSyncModes(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	cl := redistest.Cluster(t)
	backends := []struct {
		name   string
		prefix string
		client func() redis.Scripter
	}{
		{"standalone", srv.Prefix(t), func() redis.Scripter { return srv.Client(t, nil) }},
		{"cluster", cl.Prefix(t), func() redis.Scripter { return cl.Client(t, nil) }},
	}
	for _, be := range backends {
		for _, mode := range []SyncMode{SyncLease, SyncWriteBack} {
			t.Run(be.name+"/"+mode.String(), func(t *testing.T) {
				clock := testclock.New(time.UnixMilli(1_800_000_000_000))
				const limit, maxUnsynced, servers = 50, 2, 4
				rules := []Rule{
					{Name: "fleet-" + mode.String(), Key: fixedKey, Limits: []Limit{{Requests: limit, Window: 10 * time.Second}}, Sync: mode,
						Lease: map[SyncMode]int{SyncLease: 5}[mode], MaxUnsynced: map[SyncMode]int{SyncWriteBack: maxUnsynced}[mode]},
				}
				obs := &syncEvents{}
				lims := fleetOf(t, servers, be.client, be.prefix+mode.String(), clock, rules, WithObserver(obs))
				admitted, denied := 0, 0
				// 300 requests over one window of 10 s, a tick every 100 ms.
				for i := 0; i < 300; i++ {
					clock.Add(10_000 * time.Millisecond / 300)
					if i%3 == 0 {
						for _, l := range lims {
							l.syncNow(t, clock.Now())
						}
					}
					res := decideAt(t, lims[i%servers])
					if res.Allowed {
						admitted++
						if res.Remaining < 0 || res.Remaining > limit {
							t.Fatalf("remaining %d", res.Remaining)
						}
						continue
					}
					denied++
					if res.RetryAfter <= 0 || res.RetryAfter > 10*time.Second {
						t.Fatalf("denied with Retry-After %s", res.RetryAfter)
					}
				}
				bound := limit
				if mode == SyncWriteBack {
					// servers × max_unsynced, plus one interval of requests
					// (3 here).
					bound += servers*maxUnsynced + 3
				}
				if admitted > bound || admitted < limit-servers*5 {
					t.Errorf("%d admitted in one window of %d, want between %d and %d", admitted, limit, limit-servers*5, bound)
				}
				obs.mu.Lock()
				defer obs.mu.Unlock()
				if mode == SyncLease && (obs.units[SyncLeaseGranted] < int64(limit) || obs.n[SyncLeaseGranted] == 0) {
					t.Errorf("lease events: %v", obs.units)
				}
				if mode == SyncWriteBack && (obs.units[SyncUnsynced] != int64(admitted) || obs.n[SyncFlushed] == 0) {
					t.Errorf("write-back events: %v, %d admitted", obs.units, admitted)
				}
				if st := lims[0].Stats(); st.SyncKeys != 1 {
					t.Errorf("Stats: %d keys in the coordination layer, want 1", st.SyncKeys)
				}
				t.Logf("%d admitted, %d denied, events %v", admitted, denied, obs.units)
			})
		}
	}
}

// TestSyncModeChange moves a rule from write-back to exact and to lease
// without resetting its client: the count carries over.
func TestSyncModeChange(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	clock := testclock.New(time.UnixMilli(1_800_000_000_000))
	prefix := srv.Prefix(t)
	rule := Rule{Name: "r", Key: fixedKey, Limits: []Limit{PerMinute(10)}, Sync: SyncWriteBack, MaxUnsynced: 1}
	lim := fleetOf(t, 1, func() redis.Scripter { return srv.Client(t, nil) }, prefix, clock, []Rule{rule})[0]
	for i := 0; i < 4; i++ {
		decideAt(t, lim)
	}
	rule.Sync, rule.MaxUnsynced = SyncExact, 0
	if err := lim.SetRules([]Rule{rule}); err != nil {
		t.Fatal(err)
	}
	if res := decideAt(t, lim); !res.Allowed || res.Remaining != 5 {
		t.Fatalf("exact after write-back: allowed %v remaining %d, want true 5", res.Allowed, res.Remaining)
	}
	rule.Sync, rule.Lease = SyncLease, 2
	if err := lim.SetRules([]Rule{rule}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for decideAt(t, lim).Allowed {
		n++
	}
	if n != 5 {
		t.Fatalf("lease after exact: %d admitted, want the 5 left", n)
	}
}

// TestSyncRedisRestart stops Redis in the middle: write-back keeps deciding
// locally and pushes the outage's counts once Redis is back; a lease is
// spent until it ends, then the failure policy applies.
func TestSyncRedisRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	clock := testclock.New(time.UnixMilli(1_800_000_000_000))
	prefix := srv.Prefix(t)
	client := func() redis.Scripter { return srv.Client(t, nil) }
	flushes := &flushErrs{}
	wb := fleetOf(t, 1, client, prefix, clock, []Rule{{Name: "wb", Key: fixedKey, Limits: []Limit{PerMinute(1000)}, Sync: SyncWriteBack, MaxUnsynced: 1000}}, WithObserver(flushes))[0]
	ls := fleetOf(t, 1, client, prefix, clock, []Rule{{Name: "ls", Key: fixedKey, Limits: []Limit{PerMinute(1000)}, Sync: SyncLease, Lease: 10}})[0]
	exact := fleetOf(t, 1, client, prefix, clock, []Rule{{Name: "wb", Key: fixedKey, Limits: []Limit{PerMinute(1000)}}})[0]
	for i := 0; i < 3; i++ {
		decideAt(t, wb)
	}
	// Enough requests for the slices to grow to the lease (10).
	for i := 0; i < 25; i++ {
		decideAt(t, ls)
	}
	for deadline := time.Now().Add(5 * time.Second); ls.syncs.store.Load().Busy(); {
		if time.Now().After(deadline) {
			t.Fatal("a lease call is still on its way")
		}
		time.Sleep(time.Millisecond) // the refill of the slice, asked in the background
	}
	srv.Kill()
	for i := 0; i < 20; i++ {
		if res := decideAt(t, wb); !res.Allowed || res.Outcome != OutcomeAllowed {
			t.Fatalf("write-back with Redis down: request %d: %+v", i, res)
		}
	}
	wb.syncNow(t, clock.Now()) // fails: the counts stay unsynced
	// The slice held is spent locally; then the failure policy applies.
	local := 0
	for local < 20 {
		res := decideAt(t, ls)
		if res.Outcome != OutcomeAllowed {
			if res.Outcome != OutcomeFailedOpen || res.StoreErr == nil {
				t.Fatalf("lease spent with Redis down: %+v", res)
			}
			break
		}
		local++
	}
	if local == 0 || local >= 20 {
		t.Fatalf("%d requests decided locally with Redis down, want what was left of a slice of at most 10", local)
	}
	clock.Add(DefaultSyncInterval)
	if res := decideAt(t, ls); res.Outcome != OutcomeFailedOpen || res.StoreErr == nil {
		t.Fatalf("lease ended with Redis down: outcome %s, err %v; want failed_open", res.Outcome, res.StoreErr)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// The server came back empty (killed, never saved): the fleet count
	// catches up with the 23 counted and never pushed, 20 of them while
	// it was down.
	deadline := time.Now().Add(10 * time.Second)
	for {
		wb.syncNow(t, clock.Now())
		if flushes.last() == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no flush succeeded after the restart: %v", flushes.last())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The exact limiter's own store finds the server back at its next
	// probe (a decision before that fails open, charging nothing).
	res := decideAt(t, exact)
	for res.StoreErr != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the exact limiter's store still fails after the restart: %v", res.StoreErr)
		}
		time.Sleep(10 * time.Millisecond)
		res = decideAt(t, exact)
	}
	if res.Remaining != 1000-23-1 {
		t.Fatalf("exact count after the restart: remaining %d, want %d", res.Remaining, 1000-24)
	}
}

// flushErrs keeps the error of the last SyncFlushed event.
type flushErrs struct {
	NopObserver
	mu  sync.Mutex
	err error
	n   int
}

func (o *flushErrs) Synced(e SyncEvent) {
	if e.Kind == SyncFlushed {
		o.mu.Lock()
		o.err, o.n = e.Err, o.n+1
		o.mu.Unlock()
	}
}

func (o *flushErrs) last() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == 0 {
		return fmt.Errorf("no flush yet")
	}
	return o.err
}

// TestSyncKilledServer drops an app server without a flush: the fleet
// loses at most its unsynced counts, max_unsynced.
func TestSyncKilledServer(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	clock := testclock.New(time.UnixMilli(1_800_000_000_000))
	prefix := srv.Prefix(t)
	client := func() redis.Scripter { return srv.Client(t, nil) }
	const maxUnsynced = 5
	for _, hits := range []int{3, 5, 23, 29} {
		t.Run(fmt.Sprint(hits), func(t *testing.T) {
			name := fmt.Sprint("k", hits)
			dying := fleetOf(t, 1, client, prefix, clock, []Rule{{Name: name, Key: fixedKey, Limits: []Limit{PerMinute(1000)}, Sync: SyncWriteBack, MaxUnsynced: maxUnsynced}})[0]
			exact := fleetOf(t, 1, client, prefix, clock, []Rule{{Name: name, Key: fixedKey, Limits: []Limit{PerMinute(1000)}}})[0]
			for i := 0; i < hits; i++ {
				decideAt(t, dying)
			}
			dying.abandon()
			res := decideAt(t, exact)
			counted := 1000 - 1 - res.Remaining
			if lost := hits - counted; lost < 0 || lost >= maxUnsynced {
				t.Fatalf("%d admitted, %d counted in Redis: %d lost, want fewer than max_unsynced %d", hits, counted, lost, maxUnsynced)
			}
		})
	}
}

// TestSyncCommandsPerDecision counts, from INFO commandstats, the Redis
// commands per decision of 4 app servers on one key, at 1,000 and at 250
// requests a second each, in each mode with the default settings: every
// command Redis ran (those that scripts ran included) must be at most
// 1/20 of exact mode's at the same rate, and so must the scripts run. It
// logs Redis's own CPU time per decision beside them (INFO cpu).
func TestSyncCommandsPerDecision(t *testing.T) {
	t.Parallel()
	for _, rate := range []int{1000, 250} {
		t.Run(fmt.Sprint(rate, "-per-second"), func(t *testing.T) {
			t.Parallel()
			exact := redisPerDecision(t, SyncExact, 4, rate, time.Second)
			if exact.scripts < 0.99 {
				t.Fatalf("exact mode: %.4f scripts per decision, want about 1", exact.scripts)
			}
			t.Logf("%d a second per server, exact: %s", rate, exact)
			for _, mode := range []SyncMode{SyncLease, SyncWriteBack} {
				got := redisPerDecision(t, mode, 4, rate, 4*time.Second)
				t.Logf("%d a second per server, %s: %s (1/%.0f of exact mode's commands)", rate, mode, got, exact.commands/got.commands)
				if got.commands > exact.commands/20 || got.scripts > exact.scripts/20 {
					t.Errorf("%s: %.4f commands and %.4f scripts per decision, want at most 1/20 of exact mode's %.4f and %.4f",
						mode, got.commands, got.scripts, exact.commands, exact.scripts)
				}
			}
		})
	}
}

// perDecision is what Redis did per decision.
type perDecision struct {
	scripts, commands float64
	cpu               time.Duration
}

func (p perDecision) String() string {
	return fmt.Sprintf("%.4f scripts, %.4f commands, %.2f µs of Redis CPU per decision", p.scripts, p.commands, float64(p.cpu)/float64(time.Microsecond))
}

// redisPerDecision plays servers app servers at rate requests a second
// each on one key for d of fake time, running each one's syncer every
// 100 ms, on a redis-server of its own, and returns what Redis did per
// decision (INFO commandstats and cpu).
func redisPerDecision(t *testing.T, mode SyncMode, servers, rate int, d time.Duration) perDecision {
	srv := redistest.Standalone(t)
	clock := testclock.New(time.UnixMilli(1_800_000_000_000))
	rule := Rule{Name: "hot", Key: fixedKey, Limits: []Limit{PerMinute(10_000_000)}, Sync: mode}
	lims := fleetOf(t, servers, func() redis.Scripter { return srv.Client(t, nil) }, srv.Prefix(t), clock, []Rule{rule})
	admin := srv.Client(t, nil)
	before := redistest.ReadUsage(t, admin)
	step := time.Second / time.Duration(rate*servers)
	n := int(d / step)
	var sinceSync time.Duration
	for i := 0; i < n; i++ {
		clock.Add(step)
		if sinceSync += step; sinceSync >= DefaultSyncInterval && mode != SyncExact {
			sinceSync = 0
			for _, l := range lims {
				l.syncNow(t, clock.Now())
			}
		}
		if res := decideAt(t, lims[i%servers]); !res.Allowed {
			t.Fatalf("request %d denied", i)
		}
	}
	u := redistest.ReadUsage(t, admin).Sub(before)
	return perDecision{float64(u.Scripts) / float64(n), float64(u.Commands) / float64(n), u.CPU / time.Duration(n)}
}
