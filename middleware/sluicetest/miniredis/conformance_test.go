package sluiceminiredis_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/compattest"
	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redisstore"
	"github.com/sluicehq/sluice/internal/storetest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/sluicetest"
	sluiceminiredis "github.com/sluicehq/sluice/middleware/sluicetest/miniredis"
)

// newStore returns a Redis store on a miniredis of its own, through the
// hook that adds the struct library.
func newStore(t *testing.T) *redisstore.Store {
	t.Helper()
	_, c := sluiceminiredis.Run(t)
	s, err := redisstore.New(c, redisstore.Config{Timeout: 5 * time.Second, Pipeline: redispipe.Config{StallThreshold: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestConformance runs the store conformance suite on miniredis: every
// algorithm's decisions against the Go arithmetic, at fixed instants.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Store { return newStore(t) })
}

// TestRefund runs the suite of taking charges back (takeback.lua).
func TestRefund(t *testing.T) {
	t.Parallel()
	storetest.RunRefund(t, func(t *testing.T) storetest.Refunder { return newStore(t) })
}

// TestSettle runs the suite of settled usage (decide.lua's settle mode).
func TestSettle(t *testing.T) {
	t.Parallel()
	storetest.RunSettle(t, func(t *testing.T) storetest.Settler { return newStore(t) })
}

// TestCapabilities runs every capability of sluice on Redis once on
// miniredis (internal/compattest): bans, overrides, pauses, top clients,
// fleet modes, concurrency, elastic limits, regions, rules from Redis.
func TestCapabilities(t *testing.T) {
	t.Parallel()
	for _, c := range compattest.Capabilities {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			_, client := sluiceminiredis.Run(t)
			c.Run(t, compattest.Env{Client: client, Prefix: "sluice:"})
		})
	}
}

// TestPlainMiniredisRefused checks that a miniredis without the hook is
// refused when the store is made, with an error naming what it lacks.
func TestPlainMiniredisRefused(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	_, err := middleware.NewRedisStore(c, middleware.RedisConfig{})
	if err == nil || !strings.Contains(err.Error(), "struct library") || !strings.Contains(err.Error(), "miniredis") {
		t.Fatalf("NewRedisStore on a plain miniredis: %v; want an error naming the struct library", err)
	}
}

// TestServerClock is a user's test of a handler on the Redis store, on
// miniredis's clock (TIME): the third request in a minute is denied, and
// once miniredis's clock has moved a minute on, the client is let in.
func TestServerClock(t *testing.T) {
	t.Parallel()
	m, c := sluiceminiredis.Run(t)
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(start)
	lim, err := middleware.New(middleware.PerMinute(2).SlidingLog(), keyfunc.RemoteIP(),
		middleware.WithStore(sluiceminiredis.NewStore(t, c)), middleware.WithDenyCache(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	get := getter(lim)
	sluicetest.AssertAllowed(t, get(), 1)
	m.SetTime(start.Add(10 * time.Second))
	sluicetest.AssertAllowed(t, get(), 0)
	sluicetest.AssertDenied(t, get(), 50*time.Second)
	m.SetTime(start.Add(time.Minute))
	sluicetest.AssertAllowed(t, get(), 0)
}

// TestLimiterClock is the same test on a sluicetest.Clock: the Limiter
// passes the clock's instant to the scripts, so miniredis's own clock does
// not matter, and the deny cache follows the clock too.
func TestLimiterClock(t *testing.T) {
	t.Parallel()
	_, c := sluiceminiredis.Run(t)
	clock := sluicetest.NewClock(time.Time{})
	lim, err := middleware.New(middleware.PerMinute(2).SlidingLog(), keyfunc.RemoteIP(),
		middleware.WithStore(sluiceminiredis.NewStore(t, c)), clock.Option())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	get := getter(lim)
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	sluicetest.Spend(t, lim, req, 2)
	if n := sluicetest.Remaining(t, lim, req); n != 0 {
		t.Fatalf("Remaining after 2 of 2: %d", n)
	}
	sluicetest.AssertDenied(t, get(), time.Minute)
	clock.Advance(time.Minute)
	sluicetest.AssertAllowed(t, get(), 1)
	sluicetest.Reset(t, lim, req)
	if n := sluicetest.Remaining(t, lim, req); n != 2 {
		t.Fatalf("Remaining after Reset: %d", n)
	}
}

// getter returns a function that serves a GET of / from one client on an
// empty handler limited by lim, and returns the response.
func getter(lim *middleware.Limiter) func() *http.Response {
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	return func() *http.Response {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		return rec.Result()
	}
}

// TestGuarded checks that the scripts run here under the key guard when
// make test runs the module (SLUICE_KEYGUARD=1): miniredis runs the
// prelude like any other Lua.
func TestGuarded(t *testing.T) {
	t.Parallel()
	_, c := sluiceminiredis.Run(t)
	_, err := redis.NewScript(keyguard.Guard("return redis.call('GET', ARGV[1])")).Run(context.Background(), c, nil, "k").Result()
	if err == nil || !strings.Contains(err.Error(), `GET touches key "k"`) {
		t.Fatalf("a guarded script touching an undeclared key on miniredis: %v", err)
	}
}
