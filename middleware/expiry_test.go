package middleware_test

import (
	"context"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// keysWithoutExpiry are the keys the Redis store writes without an expiry,
// by what follows the prefix: the fleet's overrides (which may be set
// without an end, and must not go with an eviction), their ends, and the
// version app servers poll for changes to the overrides and bans: a few
// small keys whatever the number of clients (an override is a field of
// the first), which a volatile-* maxmemory-policy never evicts. Every
// other key has an expiry.
var keysWithoutExpiry = []string{"{sluice-admin}overrides", "{sluice-admin}overrides:ends", "{sluice-admin}version"}

// TestEveryKeyExpires uses every capability that writes to Redis (the five
// algorithms, lease and write-back, bans and their index, overrides,
// pauses, concurrency slots, usage settled after the response, top
// clients, spare capacity) and then lists the keys under the store's
// prefix: every one has an expiry, but keysWithoutExpiry, which docs/redis.md
// ("Memory") names. What the maxmemory-policy may evict follows from it.
func TestEveryKeyExpires(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	store, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: prefix, Timeout: 5 * time.Second, StallThreshold: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, store)
	ban := middleware.PerMinute(1)
	ban.Ban = time.Hour
	key := keyfunc.RemoteIP()
	rules := []middleware.Rule{
		{Name: "sliding", Path: "/a", Key: key, Limits: []middleware.Limit{middleware.PerMinute(100)}},
		{Name: "fixed", Path: "/a", Key: key, Limits: []middleware.Limit{middleware.PerMinute(100).FixedWindow()}},
		{Name: "token", Path: "/a", Key: key, Limits: []middleware.Limit{middleware.PerMinute(100).TokenBucket(10)}},
		{Name: "log", Path: "/a", Key: key, Limits: []middleware.Limit{middleware.PerMinute(100).SlidingLog()}},
		{Name: "leaky", Path: "/a", Key: key, Limits: []middleware.Limit{middleware.PerMinute(100).LeakyBucket(5, time.Second)}},
		{Name: "lease", Path: "/a", Key: key, Limits: []middleware.Limit{middleware.PerMinute(100)}, Sync: middleware.SyncLease},
		{Name: "write-back", Path: "/a", Key: key, Limits: []middleware.Limit{middleware.PerMinute(100)}, Sync: middleware.SyncWriteBack},
		{Name: "elastic", Path: "/a", Key: key, Limits: []middleware.Limit{{Requests: 100, Window: time.Minute, Ceiling: 200}}},
		{Name: "slots", Path: "/a", Key: key, Concurrency: 10},
		{Name: "usage", Path: "/a", Key: key, Usage: &middleware.Usage{Unit: "tokens", Limits: []middleware.Limit{middleware.PerMinute(1000)}, Estimate: 1}},
		{Name: "ban", Path: "/ban", Key: key, Limits: []middleware.Limit{ban}},
	}
	lim, err := middleware.NewRules(rules, middleware.WithStore(store), middleware.WithPauses(),
		middleware.WithCapacity(middleware.CapacityConfig{}), middleware.WithTopClients(middleware.TopConfig{Server: "app-1", Publish: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	ctx := context.Background()
	req := func(path string) keyfunc.Request {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = "192.0.2.1:1"
		return keyfunc.FromHTTP(r)
	}
	for range 5 { // lease and write-back count in memory from the second
		res, err := lim.Decide(req("/a"))
		if err != nil || !res.Allowed {
			t.Fatalf("%+v, %v", res, err)
		}
		if err := res.Settle(3); err != nil {
			t.Fatal(err)
		}
		res.Finish(200)
	}
	// A request in flight holds a concurrency slot; the counts of lease
	// and write-back, top clients and spare capacity are pushed within a
	// few of their intervals.
	held, err := lim.Decide(req("/a"))
	if err != nil || !held.Allowed {
		t.Fatalf("%+v, %v", held, err)
	}
	defer held.Done()
	for range 2 { // the second starts the ban
		if _, err := lim.Decide(req("/ban")); err != nil {
			t.Fatal(err)
		}
	}
	if err := lim.SetOverride(ctx, middleware.Override{Rule: "sliding", Key: "ip:192.0.2.2", Limits: []middleware.Limit{middleware.PerMinute(5)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Pause(ctx, req("/a"), time.Minute); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // see held

	c := srv.Client(t, nil)
	var keys []string
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	var without []string
	kinds := map[string]bool{}
	for _, k := range keys {
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(k, prefix)
		kinds[kind(name)] = true
		if ttl < 0 {
			without = append(without, name)
		}
	}
	t.Logf("%d keys, of the kinds %v; without an expiry: %v", len(keys), sortedKeys(kinds), without)
	for _, want := range []string{"bucket", "ban", "pause", "slots", "top", "capacity", "admin"} {
		if !kinds[want] {
			t.Errorf("no key of kind %q among %v: the test did not reach it", want, keys)
		}
	}
	for _, k := range without {
		if !slices.Contains(keysWithoutExpiry, k) {
			t.Errorf("%s has no expiry; only %v may have none", k, keysWithoutExpiry)
		}
	}
}

// kind names what a key under the store's prefix is, by its shape.
func kind(name string) string {
	switch {
	case strings.HasPrefix(name, "{sluice-admin}"):
		return "admin"
	case strings.HasPrefix(name, "{top:"):
		return "top"
	case strings.HasPrefix(name, "{capacity}"):
		return "capacity"
	case strings.Contains(name, "}ban:"):
		return "ban"
	case strings.Contains(name, "}pause:"):
		return "pause"
	case strings.Contains(name, "}s:"):
		return "slots"
	case strings.HasSuffix(name, "}"):
		return "bucket"
	}
	return name
}

func sortedKeys(m map[string]bool) []string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}
