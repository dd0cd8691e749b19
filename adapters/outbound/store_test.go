package outbound_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adapters/outbound"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/middleware"
)

// TestStoreDown: with a Limiter that fails closed, a request waits while
// its store does not answer, and goes once it answers again; one whose
// wait ends first fails unsent with the store's error.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	store, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	up := newUpstream(t, nil)
	lim := newLimiter(t, hostRule(middleware.PerSecond(100)), middleware.WithStore(store), middleware.WithFailurePolicy(middleware.FailClosed))
	patient := newClient(t, lim, outbound.Options{MaxWait: 5 * time.Second})
	hasty := newClient(t, lim, outbound.Options{MaxWait: 150 * time.Millisecond})
	if _, err := get(context.Background(), patient, up.URL, "before"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := make(chan time.Time, 1)
	time.AfterFunc(600*time.Millisecond, func() {
		resumed <- time.Now()
		_ = srv.Resume()
	})
	_, err = get(context.Background(), hasty, up.URL, "hasty")
	if !errors.Is(err, middleware.ErrStore) {
		t.Errorf("a request whose wait ends while the store is down: %v, want ErrStore", err)
	}
	if _, err := get(context.Background(), patient, up.URL, "patient"); err != nil {
		t.Fatalf("a request that can wait for the store: %v", err)
	}
	back := <-resumed
	got := up.got()
	if len(got) != 2 || got[1].tag != "patient" || got[1].at.Before(back) {
		t.Errorf("arrivals %v: want before, then patient after the store came back", tags(got))
	}
}
