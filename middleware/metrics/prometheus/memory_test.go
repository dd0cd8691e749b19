package sluiceprom_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/middleware"
	sluiceprom "github.com/sluicehq/sluice/middleware/metrics/prometheus"
)

// redisLimiter returns a watched limiter on a Redis store of srv whose
// memory figures are read every 50 ms, once they have been read.
func redisLimiter(t *testing.T, m *sluiceprom.Metrics, srv *redistest.Server) *middleware.Limiter {
	t.Helper()
	store, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), MemoryCheck: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	lim, err := middleware.NewRules(rules(), middleware.WithStore(store), middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	m.Watch(lim)
	serve(lim.Handler(ok), "/api/a", "alice")
	waitHealth(t, func(h middleware.ServerHealth) bool { return !h.Memory.CheckedAt.IsZero() }, lim)
	return lim
}

// waitHealth waits up to 5 s for lim's one server to be as ok wants.
func waitHealth(t *testing.T, ok func(middleware.ServerHealth) bool, lim *middleware.Limiter) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if h := lim.Health(); len(h.Servers) == 1 && ok(h.Servers[0]) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s, Health says %+v", lim.Health().Servers)
		}
	}
}

// TestStoreServerMemory: a Redis server that may evict, then evicts, then
// refuses writes, as the watched limiter's Health says, is what the
// memory series say.
func TestStoreServerMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.StandaloneWith(t, "--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru")
	m, reg := newMetrics(t)
	lim := redisLimiter(t, m, srv)
	server := `{server="` + srv.Addr() + `"}`
	checkSeries(t, series(t, reg), map[string]float64{
		sluiceprom.StoreServerMayEvict + server:    1,
		sluiceprom.StoreServerOutOfMemory + server: 0,
		sluiceprom.StoreServerEvictedKeys + server: 0,
	})

	c := srv.Client(t, nil)
	ctx := context.Background()
	v := strings.Repeat("x", 100_000)
	for i := range 60 {
		if err := c.Set(ctx, srv.Prefix(t)+strconv.Itoa(i), v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitHealth(t, func(h middleware.ServerHealth) bool { return h.Memory.Evicted > 0 }, lim)
	if n := series(t, reg)[sluiceprom.StoreServerEvictedKeys+server]; n <= 0 {
		t.Errorf("%s = %v, want the server's evictions", sluiceprom.StoreServerEvictedKeys, n)
	}

	// noeviction, and full: writes are refused.
	// Well below what the data takes (the connections' buffers come and
	// go with the traffic).
	if err := c.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	serve(lim.Handler(ok), "/api/a", "bob")
	waitHealth(t, func(h middleware.ServerHealth) bool { return h.OutOfMemory && !h.Memory.MayEvict() }, lim)
	checkSeries(t, series(t, reg), map[string]float64{
		sluiceprom.StoreServerMayEvict + server:    0,
		sluiceprom.StoreServerOutOfMemory + server: 1,
	})
	// Memory reports are not reachability: the server never went down.
	if v, listed := series(t, reg)[sluiceprom.StoreServerUp+server]; listed {
		t.Errorf("%s%s = %v: a server that never went down is listed", sluiceprom.StoreServerUp, server, v)
	}
}
