package middleware_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// flakyStore fails while down is set and otherwise admits everything.
type flakyStore struct {
	down  atomic.Bool
	calls atomic.Int64
}

func (s *flakyStore) Take(_ context.Context, _ time.Time, charges []middleware.Charge, out []middleware.Decision) (bool, error) {
	s.calls.Add(1)
	if s.down.Load() {
		return false, errDown
	}
	for i := range out {
		out[i] = middleware.Decision{Allowed: true, Remaining: charges[i].Limit.Requests - 1}
	}
	return true, nil
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	clock := newClock(t0)
	store := &flakyStore{}
	store.down.Store(true)
	var changes []bool
	lim := newLimiter(t, middleware.PerSecond(100), keyfunc.RemoteIP(),
		middleware.WithStore(store), middleware.WithClock(clock.Now),
		middleware.WithBreaker(3, time.Second),
		middleware.WithObserver(&middleware.Hooks{OnBreakerChanged: func(open bool) { changes = append(changes, open) }}))
	h := lim.Handler(ok)
	step := func(name string, wantCalls int64, wantCode int, wantErr error) {
		t.Helper()
		res, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1")))
		if err != nil || !res.Allowed || !errors.Is(res.StoreErr, wantErr) {
			t.Fatalf("%s: Decide = %+v, %v; want allowed with error %v", name, res, err, wantErr)
		}
		if got := store.calls.Load(); got != wantCalls {
			t.Fatalf("%s: store called %d times, want %d", name, got, wantCalls)
		}
		if rec := do(h, get("192.0.2.1:1")); rec.Code != wantCode {
			t.Fatalf("%s: status %d", name, rec.Code)
		}
	}
	// Three failures in a row open the breaker (the handler call in each
	// step counts too).
	step("first failure", 1, 200, errDown)
	if got := store.calls.Load(); got != 2 {
		t.Fatalf("store called %d times, want 2", got)
	}
	_, _ = lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1"))) // third failure
	step("open", 3, 200, middleware.ErrBreakerOpen)
	if len(changes) != 1 || !changes[0] {
		t.Fatalf("breaker changes %v, want [true]", changes)
	}
	// After the cooldown one request probes; it fails and reopens.
	clock.Add(time.Second)
	step("failed probe", 4, 200, errDown)
	step("reopened", 4, 200, middleware.ErrBreakerOpen)
	// The store recovers: the next probe closes the breaker.
	store.down.Store(false)
	clock.Add(time.Second)
	res, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1")))
	if err != nil || res.StoreErr != nil || !res.Applied || store.calls.Load() != 5 {
		t.Fatalf("probe after recovery: %+v, %v, %d calls", res, err, store.calls.Load())
	}
	if len(changes) != 2 || changes[1] {
		t.Fatalf("breaker changes %v, want [true false]", changes)
	}
}

func TestBreakerFailClosedAnswersAtOnce(t *testing.T) {
	t.Parallel()
	store := &flakyStore{}
	store.down.Store(true)
	lim := newLimiter(t, middleware.PerSecond(100), keyfunc.RemoteIP(), middleware.WithStore(store),
		middleware.WithFailurePolicy(middleware.FailClosed), middleware.WithBreaker(2, time.Hour))
	h := lim.Handler(ok)
	for i := 0; i < 10; i++ {
		if rec := do(h, get("192.0.2.1:1")); rec.Code != 503 {
			t.Fatalf("request %d: status %d, want 503", i, rec.Code)
		}
	}
	if got := store.calls.Load(); got != 2 {
		t.Errorf("store called %d times, want 2 (then the breaker opened)", got)
	}
}

func TestWithBreakerValidates(t *testing.T) {
	t.Parallel()
	_, err := middleware.New(middleware.PerSecond(1), keyfunc.RemoteIP(), middleware.WithBreaker(3, 0))
	if err == nil || err.Error() != "sluice: WithBreaker: want failures >= 0 and cooldown > 0, got 3 and 0s" {
		t.Errorf("err = %v", err)
	}
}
