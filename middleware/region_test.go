package middleware

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/internal/testclock"
)

// regionEvents counts the RegionEvents an observer sees, by kind.
type regionEvents struct {
	NopObserver
	mu sync.Mutex
	n  map[RegionEventKind]int
}

func (o *regionEvents) Region(e RegionEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[RegionEventKind]int{}
	}
	o.n[e.Kind]++
}

func (o *regionEvents) count(k RegionEventKind) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[k]
}

// threeRegions returns a limiter and its store per region of the
// simulation, on the fake clock, with global_strict rules decided in
// us-east-1.
func threeRegions(t *testing.T, sim *regiontest.Sim, clock *testclock.Clock, rules []Rule, obs Observer) (map[string]*Limiter, map[string]*RegionStore) {
	t.Helper()
	lims, stores := map[string]*Limiter{}, map[string]*RegionStore{}
	prefix := strings.NewReplacer("/", "_").Replace(t.Name()) + ":"
	for _, r := range sim.Names {
		s, err := NewRegionStore(RegionConfig{
			Region: r, Redis: sim.Local(t, r), Peers: sim.Peers(t, r), Home: regiontest.USEast1,
			Prefix: prefix, Now: clock.Now, Manual: true, RedisConfig: RedisConfig{Prefix: prefix, Timeout: 5 * time.Second, StallThreshold: 2 * time.Second},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		lim, err := NewRules(rules, WithStore(s), WithClock(clock.Now), WithDenyCache(0), WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lim.Close() })
		lims[r], stores[r] = lim, s
	}
	return lims, stores
}

func admitN(t *testing.T, lim *Limiter, n int) int {
	t.Helper()
	ok := 0
	for i := 0; i < n; i++ {
		res := decideAt(t, lim)
		if res.StoreErr != nil {
			t.Fatalf("store error: %v", res.StoreErr)
		}
		if res.Allowed {
			ok++
		}
	}
	return ok
}

func syncAll(t *testing.T, stores map[string]*RegionStore) {
	t.Helper()
	for _, s := range stores {
		if err := s.Sync(context.Background(), time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRegionStoreScopes(t *testing.T) {
	t.Parallel()
	sim := regiontest.New(t, regiontest.Names, regiontest.ScaledDelays(20))
	t0 := time.UnixMilli(1_800_000_000_000) // on a window boundary
	us, eu, ap := regiontest.USEast1, regiontest.EUWest1, regiontest.APSoutheast1

	t.Run("global", func(t *testing.T) {
		clock := testclock.New(t0)
		obs := &regionEvents{}
		lims, stores := threeRegions(t, sim, clock, []Rule{{Name: "g", Key: fixedKey, Limits: []Limit{PerSecond(30).FixedWindow()}, Scope: ScopeGlobal, SyncInterval: 50 * time.Millisecond}}, obs)
		// Synced between bursts: the regions together admit the limit.
		got := admitN(t, lims[us], 20)
		clock.Add(60 * time.Millisecond)
		syncAll(t, stores)
		got += admitN(t, lims[eu], 20)
		clock.Add(60 * time.Millisecond)
		syncAll(t, stores)
		got += admitN(t, lims[ap], 20)
		if got != 30 {
			t.Errorf("synced between bursts: %d admitted, want the limit, 30", got)
		}
		if obs.count(RegionSynced) == 0 {
			t.Error("no RegionSynced event")
		}
		// Next window, no sync between bursts: each region decides from
		// its own count only, at most (N-1) L over the limit.
		clock.Set(t0.Add(time.Second))
		got = admitN(t, lims[us], 20) + admitN(t, lims[eu], 20) + admitN(t, lims[ap], 20)
		if got != 60 {
			t.Errorf("unsynced bursts: %d admitted, want 60 (each region's 20)", got)
		}
	})

	t.Run("region", func(t *testing.T) {
		clock := testclock.New(t0)
		lims, stores := threeRegions(t, sim, clock, []Rule{{Name: "r", Key: fixedKey, Limits: []Limit{PerSecond(30)}}}, NopObserver{})
		got := 0
		for _, r := range sim.Names {
			got += admitN(t, lims[r], 40)
			syncAll(t, stores)
		}
		if got != 90 {
			t.Errorf("per-region counters: %d admitted, want N x L = 90", got)
		}
	})

	t.Run("global_strict", func(t *testing.T) {
		clock := testclock.New(t0)
		// 30 a minute, not a second: Redis expires a bucket in real time
		// once it would be full again, from the instant decided at, and
		// the clock stands still here while a loaded machine took more
		// than a second for the 60 decisions (49 admitted of 30).
		lims, _ := threeRegions(t, sim, clock, []Rule{{Name: "s", Key: fixedKey, Limits: []Limit{PerMinute(30).TokenBucket(30)}, Scope: ScopeGlobalStrict}}, NopObserver{})
		got := admitN(t, lims[ap], 20) + admitN(t, lims[eu], 20) + admitN(t, lims[us], 20)
		if got != 30 {
			t.Errorf("global_strict: %d admitted, want exactly 30", got)
		}
	})

	t.Run("regional and global limits together", func(t *testing.T) {
		clock := testclock.New(t0)
		lims, stores := threeRegions(t, sim, clock, []Rule{
			{Name: "per-region", Key: fixedKey, Limits: []Limit{PerSecond(15).FixedWindow()}},
			{Name: "global", Key: fixedKey, Limits: []Limit{PerSecond(30).FixedWindow()}, Scope: ScopeGlobal},
		}, NopObserver{})
		got := map[string]int{}
		for _, r := range []string{us, eu, ap} {
			got[r] = admitN(t, lims[r], 20)
			clock.Add(DefaultRegionSyncInterval)
			syncAll(t, stores)
		}
		if got[us] != 15 || got[eu] != 15 || got[ap] != 0 {
			t.Errorf("admitted %v, want 15 in us and eu (their own budget), 0 in ap (global budget spent)", got)
		}
	})
}

func TestRegionConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rule Rule
		want string
	}{
		{Rule{Name: "tb", Key: fixedKey, Limits: []Limit{PerSecond(5).TokenBucket(5)}, Scope: ScopeGlobal}, `sluice: rule "tb": scope: global: limits[0] is a token_bucket`},
		{Rule{Name: "cal", Key: fixedKey, Limits: []Limit{{Requests: 5, Algorithm: FixedWindow, Period: CalendarDay}}, Scope: ScopeGlobal}, `sluice: rule "cal": scope: global: limits[0] has a calendar period`},
		{Rule{Name: "wb", Key: fixedKey, Limits: []Limit{PerSecond(5)}, Scope: ScopeGlobal, Sync: SyncWriteBack}, `sluice: rule "wb": scope: global: sync: write_back does not apply`},
		{Rule{Name: "c", Key: fixedKey, Concurrency: 2, Scope: ScopeGlobal}, `sluice: rule "c": scope: global: the rule has no rate limit`},
		{Rule{Name: "i", Key: fixedKey, Limits: []Limit{PerSecond(5)}, Scope: ScopeGlobalStrict, SyncInterval: time.Second}, `sluice: rule "i": sync_interval applies only to`},
	} {
		_, err := NewRules([]Rule{tc.rule})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.rule.Name, err, tc.want)
		}
	}
	if _, err := NewRegionStore(RegionConfig{Region: "a"}); err == nil {
		t.Error("NewRegionStore without Redis: no error")
	}
}
