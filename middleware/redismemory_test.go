package middleware_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// syncBuffer is a bytes.Buffer safe for concurrent writes, for a logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitLog waits up to 5 s for the log to hold every one of want.
func waitLog(t *testing.T, log *syncBuffer, want ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, all := log.String(), true
		for _, w := range want {
			all = all && strings.Contains(s, w)
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s the log does not say %q:\n%s", want, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fillRedis writes n values of size bytes under prefix.
func fillRedis(t *testing.T, c *redis.Client, prefix string, n, size int) {
	t.Helper()
	v := strings.Repeat("x", size)
	pipe := c.Pipeline()
	for i := range n {
		pipe.Set(context.Background(), prefix+strconv.Itoa(i), v, time.Hour)
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// memoryHealth returns the health of the one server of lim's store.
func memoryHealth(t *testing.T, lim *middleware.Limiter) middleware.ServerHealth {
	t.Helper()
	h := lim.Health()
	if len(h.Servers) != 1 {
		t.Fatalf("Health().Servers = %+v, want one server", h.Servers)
	}
	return h.Servers[0]
}

// TestRedisOutOfMemory fills a standalone Redis (maxmemory-policy
// noeviction) past its maxmemory, then sends it 2,000 requests a second:
// every request, which would write a counter, is answered by the failure
// policy (FailOpen, FailClosed, FailLocal in turn) at once, and held no
// longer than the bound; the server sends one OOM reply per request at
// most (no retry), and stays up; Health, the admin handler's /health and
// the log say that it is out of memory.
func TestRedisOutOfMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a real Redis and sends it load for a few seconds")
	}
	srv := redistest.Standalone(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	prefix := srv.Prefix(t)
	fillRedis(t, c, prefix+"filler:", 30, 100_000)
	used := redistest.InfoMemory(t, c)["used_memory"]
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-200_000, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	store, err := middleware.NewRedisStore(srv.Client(t, &redis.Options{PoolSize: 128}), middleware.RedisConfig{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, store)
	var log syncBuffer
	for _, tt := range []struct {
		policy  middleware.FailurePolicy
		outcome middleware.Outcome
	}{
		{middleware.FailOpen, middleware.OutcomeFailedOpen},
		{middleware.FailClosed, middleware.OutcomeError},
		{middleware.FailLocal, middleware.OutcomeFallback},
	} {
		lim := newLimiter(t, middleware.PerSecond(100), keyfunc.RemoteIP(), middleware.WithStore(store),
			middleware.WithFailurePolicy(tt.policy), middleware.WithObserver(middleware.NewLogObserver(slog.New(slog.NewTextHandler(&log, nil)))))
		before := redistest.ErrorStats(t, c)["OOM"]
		rlag := startRedisLag(t, srv.Addr())
		l := startLoad(t, lim, loadKey)
		time.Sleep(700 * time.Millisecond)
		outs := l.finish()
		rlag.Stop()
		oom := redistest.ErrorStats(t, c)["OOM"] - before
		s := summarize(outs, time.Time{}, time.Now(), nil)
		other := 0
		for _, o := range outs {
			if o.res.Outcome != tt.outcome {
				if other++; other == 1 {
					t.Errorf("policy %v: a request's outcome %v (%v), want %v", tt.policy, o.res.Outcome, o.err, tt.outcome)
				}
			}
		}
		t.Logf("policy %v: %d requests, %d with another outcome; %d OOM replies; %d held over %v beyond lag (the worst %v, lag up to %v; Redis answered PINGs within %v)",
			tt.policy, s.total, other, oom, s.held, heldTooLong, s.worst.took.Round(time.Millisecond), s.lag.Round(time.Millisecond), rlag.Worst().Round(time.Millisecond))
		if oom == 0 || oom > int64(s.total) {
			t.Errorf("policy %v: %d OOM replies to %d requests, want some and at most one each (no retry)", tt.policy, oom, s.total)
		}
		if s.held > strays(s.total) {
			busyGate(t, s.lag, rlag.Worst())("policy %v: %d of %d requests held over %v beyond lag (the worst %v with %v of lag)",
				tt.policy, s.held, s.total, heldTooLong, s.worst.took, s.worst.lag)
		}
		sh := memoryHealth(t, lim)
		if !sh.OutOfMemory {
			t.Errorf("policy %v: Health says %+v, want the server out of memory", tt.policy, sh)
		}
		if !sh.Up {
			// Out of memory is not down: only a machine too busy for the
			// server to answer in time makes it slow.
			busyGate(t, s.lag, rlag.Worst())("policy %v: Health says %+v, want the server up", tt.policy, sh)
		}
	}
	waitLog(t, &log, "sluice: store server memory", "refuses writes (OOM")

	lim := newLimiter(t, middleware.PerSecond(100), keyfunc.RemoteIP(), middleware.WithStore(store))
	if _, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1"))); err != nil {
		t.Fatal(err)
	}
	h := middleware.AdminHandler(lim, middleware.AdminConfig{Authorize: func(*http.Request) bool { return true }})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/health", nil))
	var body struct {
		Servers []struct {
			OutOfMemory bool `json:"out_of_memory"`
		} `json:"servers"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || len(body.Servers) != 1 || !body.Servers[0].OutOfMemory {
		t.Errorf("/health: %s (%v), want the server out of memory", rec.Body, err)
	}

	// Memory freed: decided by Redis again.
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if res, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2.2:1"))); err != nil || res.StoreErr != nil || res.Outcome != middleware.OutcomeAllowed {
		t.Errorf("with memory freed: %+v, %v; want decided by Redis", res, err)
	}
}

// TestRedisEviction runs a limiter on a Redis of 4 MB with
// maxmemory-policy allkeys-lru, as a Redis shared with a cache may be:
// the log warns at start, with the fix, whether the limiter is made
// before or after the store first reads the server's figures; under load,
// with a cache's writes filling the memory, the server evicts, and
// Health and the log say so; and a client that had used its limit, whose
// counter was evicted, starts afresh (what the warning is about).
func TestRedisEviction(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a real Redis under load for a few seconds")
	}
	srv := redistest.StandaloneWith(t, "--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru")
	c := srv.Client(t, nil)
	prefix := srv.Prefix(t)
	store, err := middleware.NewRedisStore(srv.Client(t, &redis.Options{PoolSize: 128}),
		middleware.RedisConfig{Prefix: prefix, MemoryCheck: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, store)
	var early, late syncBuffer
	logTo := func(b *syncBuffer) middleware.Option {
		return middleware.WithObserver(middleware.NewLogObserver(slog.New(slog.NewTextHandler(b, nil))))
	}
	var mu sync.Mutex
	var reports []middleware.HealthEvent
	hooks := &middleware.Hooks{OnStoreHealth: func(e middleware.HealthEvent) {
		if e.Memory != nil {
			mu.Lock()
			reports = append(reports, e)
			mu.Unlock()
		}
	}}
	lim := newLimiter(t, middleware.PerMinute(20), keyfunc.RemoteIP(), middleware.WithStore(store), logTo(&early), middleware.WithObserver(hooks))
	const warning = "maxmemory-policy allkeys-lru with maxmemory 4 MiB lets it evict rate-limit counters"
	waitLog(t, &early, "sluice: store server memory", warning, "set maxmemory-policy noeviction")
	// A limiter made after the first reading hears it at once.
	newLimiter(t, middleware.PerMinute(20), keyfunc.RemoteIP(), middleware.WithStore(store), logTo(&late))
	if !strings.Contains(late.String(), warning) {
		t.Errorf("a limiter made after the first reading was not warned: %q", late.String())
	}
	if sh := memoryHealth(t, lim); !sh.Memory.MayEvict() || sh.Memory.Policy != "allkeys-lru" || sh.Memory.MaxMemory != 4<<20 {
		t.Errorf("Health says %+v, want a server that may evict, allkeys-lru, 4 MiB", sh)
	}

	// A client that used its limit.
	probe := keyfunc.FromHTTP(get("192.0.2.200:1"))
	for i := range 21 {
		res, err := lim.Decide(probe)
		if err != nil || res.StoreErr != nil || res.Allowed != (i < 20) {
			t.Fatalf("probe request %d: %+v, %v", i+1, res, err)
		}
	}
	// Load, and a cache that fills the memory meanwhile.
	l := startLoad(t, lim, loadKey)
	for i := range 10 {
		fillRedis(t, c, prefix+"cache:"+strconv.Itoa(i)+":", 10, 100_000)
		time.Sleep(50 * time.Millisecond)
	}
	outs := l.finish()
	s := summarize(outs, time.Time{}, time.Now(), nil)
	waitLog(t, &early, "evicted", "keys since it was last asked")
	sh := memoryHealth(t, lim)
	t.Logf("%d requests under load, %d not decided by Redis; the server evicted %d keys", s.total, s.undecided, sh.Memory.Evicted)
	if sh.Memory.Evicted <= 0 {
		t.Errorf("Health says %+v, want keys evicted", sh)
	}
	mu.Lock()
	evicting := 0
	for _, e := range reports {
		if e.Memory.EvictedSince > 0 && errors.Is(e.Cause, middleware.ErrMayEvict) && e.Up {
			evicting++
		}
	}
	mu.Unlock()
	if evicting == 0 {
		t.Errorf("no StoreHealth report of evictions among %+v", reports)
	}
	// What the warning is about: the probe's counter may have been evicted
	// with the cache's pressure, its client then starting afresh.
	res, err := lim.Decide(probe)
	t.Logf("the probe client, denied before the cache filled the memory: allowed %v (%v)", res.Allowed, err)
}
