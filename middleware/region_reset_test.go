package middleware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testclock"
)

// TestRegionStoreResetGlobalOnCluster: the admin handler's reset and
// Peek work on a global rule, through a RegionStore whose own Redis is a
// Redis Cluster; the reset reaches the peer region with the next sync.
func TestRegionStoreResetGlobalOnCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.Cluster(t)
	euSrv := redistest.Standalone(t)
	prefix := cluster.Prefix(t)
	usRedis, euRedis := cluster.Client(t, nil), euSrv.Client(t, nil)
	clock := testclock.New(time.UnixMilli(1_800_000_000_000))
	rules := []Rule{{Name: "g", Key: fixedKey, Limits: []Limit{PerMinute(5).FixedWindow()}, Scope: ScopeGlobal}}
	region := func(name string, own redis.UniversalClient, peer string, peerClient redis.UniversalClient) (*Limiter, *RegionStore) {
		s, err := NewRegionStore(RegionConfig{
			Region: name, Redis: own, Peers: map[string]redis.UniversalClient{peer: peerClient},
			Prefix: prefix + "rg:", Now: clock.Now, Manual: true, RedisConfig: RedisConfig{Prefix: prefix},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		lim, err := NewRules(rules, WithStore(s), WithClock(clock.Now), WithDenyCache(0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lim.Close() })
		return lim, s
	}
	usLim, usStore := region("us", usRedis, "eu", euRedis)
	euLim, euStore := region("eu", euRedis, "us", usRedis)
	sync := func() {
		t.Helper()
		clock.Add(DefaultRegionSyncInterval)
		for _, s := range []*RegionStore{usStore, euStore} {
			if err := s.Sync(context.Background(), time.Time{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	remaining := func(lim *Limiter) int {
		t.Helper()
		st, err := lim.Peek(context.Background(), "g", "client")
		if err != nil || len(st) != 1 {
			t.Fatalf("Peek: %v, %v", st, err)
		}
		return st[0].Remaining
	}

	got := admitN(t, usLim, 3)
	sync()
	got += admitN(t, euLim, 3)
	sync()
	if got != 5 || remaining(usLim) != 0 || remaining(euLim) != 0 {
		t.Fatalf("admitted %d, remaining us %d eu %d; want the limit, 5, and nothing left", got, remaining(usLim), remaining(euLim))
	}

	admin := AdminHandler(usLim, AdminConfig{Authorize: func(*http.Request) bool { return true }})
	w := httptest.NewRecorder()
	admin.ServeHTTP(w, httptest.NewRequest("POST", "/reset?rule=g&key=client", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("POST /reset: %d %s", w.Code, w.Body)
	}
	if r := remaining(usLim); r != 5 {
		t.Errorf("after the reset, us has %d left, want 5", r)
	}
	if r := remaining(euLim); r != 0 {
		t.Errorf("before the sync, eu has %d left, want 0 (the reset has not reached it)", r)
	}
	sync()
	if r := remaining(euLim); r != 5 {
		t.Errorf("after the sync, eu has %d left, want 5", r)
	}
	// The regions share the limit again from zero.
	got = admitN(t, euLim, 4)
	sync()
	got += admitN(t, usLim, 4)
	if got != 5 {
		t.Errorf("after the reset, %d admitted across regions, want 5", got)
	}
}

// TestRegionStoreRedisClock: without a clock (RegionConfig.Now, WithClock)
// a global rule is decided on the clock of the region's Redis, and its
// headers come from that clock's window.
func TestRegionStoreRedisClock(t *testing.T) {
	t.Parallel()
	srv, peer := redistest.Standalone(t), redistest.Standalone(t)
	prefix := srv.Prefix(t)
	s, err := NewRegionStore(RegionConfig{
		Region: "us", Redis: srv.Client(t, nil), Peers: map[string]redis.UniversalClient{"eu": peer.Client(t, nil)},
		Prefix: prefix + "rg:", Manual: true, RedisConfig: RedisConfig{Prefix: prefix},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	lim, err := NewRules([]Rule{{Name: "g", Key: fixedKey, Limits: []Limit{PerHour(3).FixedWindow()}, Scope: ScopeGlobal}}, WithStore(s), WithDenyCache(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	if got := admitN(t, lim, 4); got != 3 {
		t.Errorf("%d admitted, want 3", got)
	}
	st, err := lim.Peek(context.Background(), "g", "client")
	if err != nil || len(st) != 1 || st[0].Remaining != 0 || st[0].ResetAfter <= 0 || st[0].ResetAfter > time.Hour {
		t.Errorf("Peek: %+v, %v; want nothing left, a reset within the hour", st, err)
	}
}

// TestRegionStoreTakeAtRedisClock: without a clock, TakeAt returns the
// instant the Redis that decided read (TIME), not this server's: what
// Refund takes a charge back at, so that it finds the window the charge
// was counted in even when the app server's clock is off. The decision's
// reset then ends its window exactly, on a window's boundary.
func TestRegionStoreTakeAtRedisClock(t *testing.T) {
	t.Parallel()
	srv, peer := redistest.Standalone(t), redistest.Standalone(t)
	prefix := srv.Prefix(t)
	s, err := NewRegionStore(RegionConfig{
		Region: "us", Redis: srv.Client(t, nil), Peers: map[string]redis.UniversalClient{"eu": peer.Client(t, nil)},
		Prefix: prefix + "rg:", Manual: true, RedisConfig: RedisConfig{Prefix: prefix},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := NewRules([]Rule{{Name: "g", Key: fixedKey, Limits: []Limit{PerSecond(1000).FixedWindow()}, Scope: ScopeGlobal}}, WithStore(s)); err != nil {
		t.Fatal(err)
	}
	lim := PerSecond(1000).FixedWindow()
	for range 50 {
		cs := []Charge{{Key: "client", Name: "g", Limit: lim, Cost: 1}}
		out := make([]Decision, 1)
		ok, at, err := s.TakeAt(context.Background(), time.Time{}, cs, out)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if end := at.Add(out[0].ResetAfter).UnixMilli(); end%1000 != 0 {
			t.Fatalf("TakeAt at %d, reset %s: the window ends at %d, not on a second", at.UnixMilli(), out[0].ResetAfter, end)
		}
	}
}
