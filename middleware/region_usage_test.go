package middleware

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/internal/testclock"
)

// TestRegionUsage settles usage of a scope: global rule in one region past
// its limit: the settle is counted in the region's own count whatever it
// holds, synced to the peers like any count, which then deny until the
// window ends; a regional usage limit and a global_strict one settle in
// their own stores, and what a request did not use goes back.
func TestRegionUsage(t *testing.T) {
	t.Parallel()
	sim := regiontest.New(t, regiontest.Names, regiontest.ScaledDelays(20))
	t0 := time.UnixMilli(1_800_000_000_000) // on a window boundary
	us, eu := regiontest.USEast1, regiontest.EUWest1
	for _, scope := range []Scope{ScopeGlobal, ScopeGlobalStrict, ScopeRegion} {
		t.Run(scope.String(), func(t *testing.T) {
			clock := testclock.New(t0)
			rule := Rule{Name: "llm", Key: fixedKey, Scope: scope, SyncInterval: map[Scope]time.Duration{ScopeGlobal: 50 * time.Millisecond}[scope],
				Usage: &Usage{Unit: "tokens", Limits: []Limit{PerMinute(100).FixedWindow()}, Estimate: 10, Max: 200}}
			lims, stores := threeRegions(t, sim, clock, []Rule{rule}, NopObserver{})
			use := func(region string, units int) bool {
				t.Helper()
				res := decideAt(t, lims[region])
				if res.StoreErr != nil {
					t.Fatal(res.StoreErr)
				}
				if res.Allowed {
					if err := res.Settle(units); err != nil {
						t.Fatal(err)
					}
					res.Finish(200)
				}
				return res.Allowed
			}
			if !use(us, 150) { // 10, then 140 more: 50 past the limit
				t.Fatal("first request denied")
			}
			if use(us, 1) {
				t.Error("admitted in debt in the same region")
			}
			clock.Add(60 * time.Millisecond)
			syncAll(t, stores)
			// Another region: the global and strict budgets are spent
			// there too; a regional one is whole.
			if got, want := use(eu, 5), scope == ScopeRegion; got != want {
				t.Errorf("in another region: admitted %v, want %v", got, want)
			}
			// A new window: whole again everywhere (fixed window).
			clock.Set(t0.Add(time.Minute))
			syncAll(t, stores)
			for _, r := range []string{us, eu} {
				if !use(r, 2) { // 10 at admission, 8 given back
					t.Errorf("%s: denied in a new window", r)
				}
			}
			st, err := lims[us].Peek(t.Context(), "llm", "client")
			if err != nil || len(st) != 1 {
				t.Fatal(st, err)
			}
			want := 100 - 2 // this region's own request
			if scope != ScopeRegion {
				want = 100 - 4 // both regions' (synced for global)
				if scope == ScopeGlobal {
					clock.Add(60 * time.Millisecond)
					syncAll(t, stores)
					st, _ = lims[us].Peek(t.Context(), "llm", "client")
				}
			}
			if st[0].Remaining != want {
				t.Errorf("remaining %d after two requests that used 2 each, want %d", st[0].Remaining, want)
			}
		})
	}
}
