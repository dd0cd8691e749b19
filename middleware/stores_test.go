package middleware_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// denyingStore denies every request, for a minute.
type denyingStore struct{}

func (denyingStore) Take(_ context.Context, _ time.Time, charges []middleware.Charge, out []middleware.Decision) (bool, error) {
	for i := range out {
		out[i] = middleware.Decision{RetryAfter: time.Minute, ResetAfter: time.Minute, NextAfter: time.Minute}
	}
	return false, nil
}

// traitsStore is store with the given traits.
type traitsStore struct {
	middleware.Store
	traits middleware.StoreTraits
}

func (s traitsStore) StoreTraits() middleware.StoreTraits { return s.traits }

// events counts what an Observer is told.
type events struct {
	middleware.NopObserver
	calls, hits atomic.Int64
	mu          sync.Mutex
	breaker     []bool
}

func (e *events) StoreCalled(time.Duration, error) { e.calls.Add(1) }
func (e *events) DenyCacheHit(string)              { e.hits.Add(1) }
func (e *events) BreakerChanged(open bool) {
	e.mu.Lock()
	e.breaker = append(e.breaker, open)
	e.mu.Unlock()
}

// TestStoreTraits: what a store says of itself (StoreTraits), not its
// type, decides whether the Limiter puts a circuit breaker and a deny
// cache in front of it.
func TestStoreTraits(t *testing.T) {
	t.Parallel()
	local, fast := middleware.StoreTraits{Local: true}, middleware.StoreTraits{FailsFast: true}
	tests := []struct {
		name        string
		store       middleware.Store
		opts        []middleware.Option
		wantCalls   int64
		wantHits    int64
		wantBreaker int // times it opened
	}{
		{"failing, no traits: breaker", &failingStore{}, nil, middleware.DefaultBreakerFailures, 0, 1},
		{"failing, traits zero: breaker", traitsStore{&failingStore{}, middleware.StoreTraits{}}, nil, middleware.DefaultBreakerFailures, 0, 1},
		{"failing, fails fast: no breaker", traitsStore{&failingStore{}, fast}, nil, 10, 0, 0},
		{"failing, fails fast, WithBreaker", traitsStore{&failingStore{}, fast}, []middleware.Option{middleware.WithBreaker(2, time.Hour)}, 2, 0, 1},
		{"denying, no traits: deny cache", denyingStore{}, nil, 1, 9, 0},
		{"denying, local: no deny cache", traitsStore{denyingStore{}, local}, nil, 10, 0, 0},
		{"denying, local, WithDenyCache", traitsStore{denyingStore{}, local}, []middleware.Option{middleware.WithDenyCache(100)}, 1, 9, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var ev events
			lim := newLimiter(t, middleware.PerMinute(5), keyfunc.RemoteIP(), append(tt.opts,
				middleware.WithStore(tt.store), middleware.WithClock(newClock(t0).Now), middleware.WithObserver(&ev))...)
			for range 10 {
				if _, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1"))); err != nil {
					t.Fatal(err)
				}
			}
			ev.mu.Lock()
			opened := len(ev.breaker)
			ev.mu.Unlock()
			if ev.calls.Load() != tt.wantCalls || ev.hits.Load() != tt.wantHits || opened != tt.wantBreaker {
				t.Errorf("store called %d times, deny cache hits %d, breaker opened %d times; want %d, %d, %d",
					ev.calls.Load(), ev.hits.Load(), opened, tt.wantCalls, tt.wantHits, tt.wantBreaker)
			}
		})
	}
}

// tracedStore wraps a RedisStore, as users wrap stores to trace them.
type tracedStore struct {
	*middleware.RedisStore
	takes atomic.Int64
}

func (s *tracedStore) Take(ctx context.Context, now time.Time, charges []middleware.Charge, out []middleware.Decision) (bool, error) {
	s.takes.Add(1)
	return s.RedisStore.Take(ctx, now, charges, out)
}

// TestStoreEventsReachObservers: a Redis store's events (here, its batch
// sizes) reach the Observers of the Limiters built on it, through the
// ObservableStore interface (so through a store that wraps it, too) and
// only until Limiter.Close; and an Observer added to the store directly
// hears them until it is removed.
func TestStoreEventsReachObservers(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	// A Timeout of 5 s: what is tested is where the events go, not the
	// store's bound (a first decision took more than 100 ms on a loaded
	// machine and failed open).
	rs, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), StallThreshold: 2 * time.Second, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	store := &tracedStore{RedisStore: rs}
	var s middleware.Store = store
	for name, ok := range map[string]bool{
		"SlotStore":       is[middleware.SlotStore](s),
		"Returner":        is[middleware.Returner](s),
		"Resetter":        is[middleware.Resetter](s),
		"TraitsReporter":  is[middleware.TraitsReporter](s),
		"ObservableStore": is[middleware.ObservableStore](s),
	} {
		if !ok {
			t.Errorf("a store that embeds *RedisStore is not a %s", name)
		}
	}

	var viaLimiter, direct atomic.Int64
	lim, err := middleware.New(middleware.PerMinute(100), keyfunc.RemoteIP(), middleware.WithStore(s),
		middleware.WithObserver(&middleware.Hooks{OnStoreBatch: func(n int) { viaLimiter.Add(int64(n)) }}))
	if err != nil {
		t.Fatal(err)
	}
	remove := rs.AddObserver(&middleware.Hooks{OnStoreBatch: func(n int) { direct.Add(int64(n)) }})
	decide := func() {
		t.Helper()
		res, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1")))
		if err != nil || res.Outcome != middleware.OutcomeAllowed {
			t.Fatalf("Decide = %v, %v; want allowed", res.Outcome, err)
		}
	}
	for range 3 {
		decide()
	}
	if got := viaLimiter.Load(); got != 3 || direct.Load() != 3 || store.takes.Load() != 3 {
		t.Fatalf("3 decisions: %d in batches seen by the limiter's observer, %d by the store's, %d takes; want 3, 3, 3", got, direct.Load(), store.takes.Load())
	}
	// The Redis store needs no breaker and gets a deny cache, wrapped or
	// not.
	if tr := s.(middleware.TraitsReporter).StoreTraits(); tr != (middleware.StoreTraits{FailsFast: true}) {
		t.Errorf("StoreTraits = %+v, want FailsFast only", tr)
	}

	if err := lim.Close(); err != nil {
		t.Fatal(err)
	}
	decide() // the store is the caller's: open after Limiter.Close
	if got := viaLimiter.Load(); got != 3 {
		t.Errorf("the limiter's observer heard the store after Limiter.Close: %d decisions", got)
	}
	if got := direct.Load(); got != 4 {
		t.Errorf("the store's own observer heard %d decisions, want 4", got)
	}
	remove()
	remove() // idempotent
	decide()
	if got := direct.Load(); got != 4 {
		t.Errorf("a removed observer heard the store: %d decisions", got)
	}
}

func is[T any](v any) bool {
	_, ok := v.(T)
	return ok
}

// TestObservedDecideAllocs: telling an Observer about a decision costs no
// allocation: Decide with one allocates nothing, as without.
func TestObservedDecideAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	var n atomic.Int64
	lim := newLimiter(t, middleware.PerSecond(1<<30), keyfunc.RemoteIP(), middleware.WithClock(newClock(t0).Now),
		middleware.WithObserver(&middleware.Hooks{OnDecided: func(_ keyfunc.Request, res *middleware.Result) {
			if res.Allowed {
				n.Add(1)
			}
		}}),
		middleware.WithObserver(middleware.NopObserver{}))
	r := keyfunc.FromHTTP(get("192.0.2.1:1"))
	if _, err := lim.Decide(r); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := lim.Decide(r); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Decide with observers: %v allocs, want 0", allocs)
	}
	if n.Load() < 200 {
		t.Errorf("the observer saw %d decisions, want at least 200", n.Load())
	}
}

// TestCloseConcurrent: Close may be called from several goroutines at
// once, and again later; each call returns nil once the first has closed
// the limiter's own stores (the race detector checks the rest).
func TestCloseConcurrent(t *testing.T) {
	t.Parallel()
	lim, err := middleware.New(middleware.PerMinute(10), keyfunc.RemoteIP(), middleware.WithFailurePolicy(middleware.FailLocal))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = lim.Close()
		}()
	}
	wg.Wait()
	for i, err := range append(errs, lim.Close()) {
		if err != nil {
			t.Errorf("Close %d: %v", i, err)
		}
	}
	if _, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1"))); err != nil {
		t.Errorf("Decide after Close: %v (the in-memory stores still count)", err)
	}
}

// TestWrappedRedisStoreKeepsFleetMode: a store that embeds *RedisStore
// keeps the coordination layer of write-back mode, which counts in memory
// and syncs to Redis (its flush at Close reaches the observers), instead
// of silently deciding every request exactly.
func TestWrappedRedisStoreKeepsFleetMode(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	rs, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), StallThreshold: 2 * time.Second, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	store := &tracedStore{RedisStore: rs}
	var synced atomic.Int64
	lim, err := middleware.NewRules([]middleware.Rule{{Name: "wb", Key: keyfunc.RemoteIP(),
		Limits: []middleware.Limit{middleware.PerMinute(100)}, Sync: middleware.SyncWriteBack}},
		middleware.WithStore(store), middleware.WithObserver(&middleware.Hooks{OnSynced: func(middleware.SyncEvent) { synced.Add(1) }}))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if res, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1"))); err != nil || !res.Allowed {
			t.Fatalf("Decide = %+v, %v", res, err)
		}
	}
	if err := lim.Close(); err != nil {
		t.Fatal(err)
	}
	if synced.Load() == 0 {
		t.Errorf("no sync event through a store that embeds *RedisStore (%d Take calls): write-back mode was not used", store.takes.Load())
	}
}
