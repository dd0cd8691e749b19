package middleware_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// goroutineStacks returns the stack of every goroutine, by goroutine ID.
func goroutineStacks() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		if f := strings.Fields(g); len(f) > 1 && f[0] == "goroutine" {
			stacks[f[1]] = g
		}
	}
	return stacks
}

// sluiceCode are the packages whose goroutines a Limiter and its stores
// start: a goroutine whose stack, or the function that created it, is in
// one of them belongs to sluice.
var sluiceCode = []string{
	"github.com/sluicehq/sluice/middleware.",
	"github.com/sluicehq/sluice/internal/memstore.",
	"github.com/sluicehq/sluice/internal/redisstore.",
	"github.com/sluicehq/sluice/internal/redispipe.",
	"github.com/sluicehq/sluice/internal/slots.",
	"github.com/sluicehq/sluice/internal/fleetstore.",
}

// sluiceGoroutines returns the stacks of the goroutines running sluice
// code that are not in before.
func sluiceGoroutines(before map[string]string) []string {
	var got []string
	for id, s := range goroutineStacks() {
		if _, old := before[id]; old {
			continue
		}
		if slices.ContainsFunc(sluiceCode, func(pkg string) bool { return strings.Contains(s, pkg) }) {
			got = append(got, s)
		}
	}
	return got
}

// waitNoSluiceGoroutines fails t unless, within a few seconds, no goroutine
// of sluice's that was not in before is left.
func waitNoSluiceGoroutines(t *testing.T, before map[string]string, when string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := sluiceGoroutines(before)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d goroutines of sluice left:\n\n%s", when, len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond) // polling
	}
}

// hasGoroutine reports whether one of stacks runs fn.
func hasGoroutine(stacks []string, fn string) bool {
	return slices.ContainsFunc(stacks, func(s string) bool { return strings.Contains(s, fn) })
}

// held is a request that holdNext keeps in its handler.
type held struct{ entered, release chan struct{} }

type heldKey struct{}

// holdNext answers at once, except a request with a held in its context,
// which it keeps until release is closed.
var holdNext = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if h, ok := r.Context().Value(heldKey{}).(*held); ok {
		close(h.entered)
		<-h.release
	}
	w.WriteHeader(http.StatusOK)
})

// holdAndServe sends through h one request that stays in its handler, and
// while it does n concurrent requests from other clients. It returns once
// those n are answered; finish lets the first one end and waits for it.
func holdAndServe(t *testing.T, h http.Handler, n int) (finish func()) {
	t.Helper()
	hd := &held{entered: make(chan struct{}), release: make(chan struct{})}
	r := get("192.0.2.1:1")
	r = r.WithContext(context.WithValue(r.Context(), heldKey{}, hd))
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	select {
	case <-hd.entered:
	case <-done:
		t.Fatal("the held request did not reach its handler")
	case <-time.After(5 * time.Second):
		t.Fatal("the held request did not reach its handler within 5s")
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.ServeHTTP(httptest.NewRecorder(), get(fmt.Sprintf("192.0.2.%d:1", 10+i%200)))
		}()
	}
	wg.Wait()
	return func() {
		close(hd.release)
		<-done
	}
}

// TestCloseLeavesNoGoroutines: once Limiter.Close and the Close of the
// stores the caller made have returned, no goroutine the limiter or its
// stores started is left: not the in-memory stores' sweepers, not the
// Redis store's pipeline workers and probes, not the renewal of the leases
// of concurrency slots, the publishing of spare capacity nor the syncing
// of write-back counters, which do not start again for requests decided
// after Close. Close is idempotent.
//
// It does not run in parallel with other tests, so that the goroutines it
// sees are its own (those already running when it starts are ignored).
func TestCloseLeavesNoGoroutines(t *testing.T) {
	rules := func() []middleware.Rule {
		return []middleware.Rule{
			{Name: "rate", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(1000)}},
			{Name: "conc", Key: keyfunc.RemoteIP(), Concurrency: 100},
			// Elastic: the Limiter publishes its spare capacity to a
			// shared store.
			{Name: "elastic", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{{Requests: 1000, Window: time.Minute, Ceiling: 2000}}},
			// Write-back: a shared store's coordination layer syncs in
			// the background.
			{Name: "write-back", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(1000)}, Sync: middleware.SyncWriteBack},
		}
	}
	t.Run("memory", func(t *testing.T) {
		before := goroutineStacks()
		// The default store and FailLocal's default fallback: both the
		// limiter's to close.
		lim, err := middleware.NewRules(rules(), middleware.WithFailurePolicy(middleware.FailLocal))
		if err != nil {
			t.Fatal(err)
		}
		h := lim.Handler(holdNext)
		finish := holdAndServe(t, h, 32)
		running := sluiceGoroutines(before)
		if !hasGoroutine(running, "memstore.sweep") {
			t.Fatalf("no sweeper seen while the limiter is open:\n%s", strings.Join(running, "\n\n"))
		}
		if hasGoroutine(running, "renewLoop") {
			t.Errorf("slots of the in-memory store have no lease, but a renewal runs:\n%s", strings.Join(running, "\n\n"))
		}
		if err := lim.Close(); err != nil {
			t.Fatal(err)
		}
		finish()
		waitNoSluiceGoroutines(t, before, "after Limiter.Close")
		do(h, get("192.0.2.3:1")) // deciding after Close starts nothing
		if err := lim.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		waitNoSluiceGoroutines(t, before, "after a request decided after Close")
	})

	redisCase := func(t *testing.T, client redis.Scripter, prefix string) {
		before := goroutineStacks()
		store, err := middleware.NewRedisStore(client, middleware.RedisConfig{Prefix: prefix, StallThreshold: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		lim, err := middleware.NewRules(rules(), middleware.WithStore(store),
			middleware.WithFailurePolicy(middleware.FailLocal), middleware.WithConcurrencyLease(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		h := lim.Handler(holdNext)
		finish := holdAndServe(t, h, 32)
		running := sluiceGoroutines(before)
		for _, fn := range []string{"(*Limiter).renewLoop", "(*Limiter).startFleet", "fleetstore.(*Store).loop", "memstore.sweep"} {
			if !hasGoroutine(running, fn) {
				t.Fatalf("no %s seen while the limiter is open:\n%s", fn, strings.Join(running, "\n\n"))
			}
		}
		t.Logf("%d goroutines of sluice while open (pipeline workers: %v)", len(running), hasGoroutine(running, "redispipe."))
		if err := lim.Close(); err != nil {
			t.Fatal(err)
		}
		finish()
		// The store is still open: requests decided after the limiter's
		// Close take slots, whose leases are not renewed, and start no
		// publishing of spare capacity and no syncing of write-back
		// counters, on this limiter and on one closed before it had
		// elastic or write-back limits.
		fresh, err := middleware.NewRules(rules()[:1], middleware.WithStore(store))
		if err != nil {
			t.Fatal(err)
		}
		if err := fresh.Close(); err != nil {
			t.Fatal(err)
		}
		if err := fresh.SetRules(rules()); err != nil {
			t.Fatal(err)
		}
		for _, h := range []http.Handler{h, fresh.Handler(holdNext)} {
			finish = holdAndServe(t, h, 0)
			left := sluiceGoroutines(before)
			for _, fn := range []string{"renewLoop", "startFleet", "fleetstore."} {
				if hasGoroutine(left, fn) {
					t.Fatalf("%s started again after Close:\n%s", fn, strings.Join(left, "\n\n"))
				}
			}
			finish()
		}
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}
		if err := store.Close(); err != nil {
			t.Errorf("second store Close: %v", err)
		}
		waitNoSluiceGoroutines(t, before, "after Limiter.Close and RedisStore.Close")
	}
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		redisCase(t, srv.Client(t, &redis.Options{PoolSize: 64}), srv.Prefix(t))
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.Cluster(t)
		redisCase(t, cl.Client(t, &redis.ClusterOptions{PoolSize: 64}), cl.Prefix(t))
	})
}
