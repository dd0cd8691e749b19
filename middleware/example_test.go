package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// The limiter needs a limit and says what it counts by; everything else has
// a safe default (in-memory store, both header styles, fail open).
func ExampleNew() {
	lim, err := middleware.New(middleware.PerMinute(2), keyfunc.RemoteIP(),
		middleware.WithClock(func() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	for i := 0; i < 3; i++ {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code == http.StatusTooManyRequests {
			fmt.Println(rec.Code, "Retry-After:", rec.Header().Get("Retry-After"))
			continue
		}
		fmt.Println(rec.Code, "X-RateLimit-Remaining:", rec.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 X-RateLimit-Remaining: 1
	// 200 X-RateLimit-Remaining: 0
	// 429 Retry-After: 90
}

// A hybrid key counts authenticated users by their ID and everyone else by
// IP address, with a stricter limit per route for logins.
func Example_hybridKey() {
	type userKey struct{}
	user := func(ctx context.Context) (string, bool) {
		id, ok := ctx.Value(userKey{}).(string)
		return id, ok
	}
	lim, err := middleware.NewRules([]middleware.Rule{
		{
			Name:   "api",
			Path:   "/api/*",
			Key:    keyfunc.First(keyfunc.User(user), keyfunc.RemoteIP()),
			Limits: []middleware.Limit{middleware.PerMinute(100), middleware.PerHour(1000)},
		},
		{
			Name:    "login",
			Path:    "/api/login",
			Methods: []string{http.MethodPost},
			Key:     keyfunc.Join(keyfunc.RemoteIP(), keyfunc.Route()),
			Limits:  []middleware.Limit{{Requests: 5, Window: 5 * time.Minute}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()

	rec := httptest.NewRecorder()
	lim.Handler(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest("POST", "/api/login", nil))
	fmt.Println(rec.Header().Get("RateLimit-Policy"))
	// Output:
	// "api-1m";q=100;w=60, "api-1h";q=1000;w=3600, "login";q=5;w=300
}

// Store errors are absorbed (fail open) by default; FailClosed answers 503
// and FailLocal counts in memory until the store is back.
func ExampleWithFailurePolicy() {
	lim, err := middleware.New(middleware.PerSecond(10), keyfunc.RemoteIP(),
		middleware.WithFailurePolicy(middleware.FailClosed),
		middleware.WithObserver(&middleware.Hooks{OnStoreFailed: func(r keyfunc.Request, err error) {
			log.Printf("rate limiter store failed: %v", err)
		}}))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	fmt.Println("ok")
	// Output: ok
}

// Counters in Redis are shared by every app server that uses the same
// Redis; the decision is one atomic script call on the server's clock.
func ExampleNewRedisStore() {
	client := redis.NewClient(&redis.Options{
		Addr:                  "localhost:6379",
		ContextTimeoutEnabled: true, // lets the store's timeout end a hung call at once
	})
	defer client.Close()
	store, err := middleware.NewRedisStore(client, middleware.RedisConfig{Prefix: "myapp:ratelimit:"})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // the store is the caller's: closed after the limiter
	lim, err := middleware.New(middleware.PerMinute(100), keyfunc.RemoteIP(), middleware.WithStore(store))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	http.Handle("/", lim.Handler(http.NotFoundHandler()))
}

// Hooks observes a few events with plain functions; metrics modules and
// NewLogObserver are Observers too, given the same way.
func ExampleHooks() {
	var denied int
	lim, err := middleware.New(middleware.PerMinute(1), keyfunc.RemoteIP(),
		middleware.WithClock(func() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }),
		middleware.WithObserver(&middleware.Hooks{
			OnDecided: func(r keyfunc.Request, res *middleware.Result) {
				fmt.Println(res.Outcome, res.Rule)
				if res.Outcome == middleware.OutcomeDenied {
					denied++
				}
			},
			OnStoreFailed: func(r keyfunc.Request, err error) { log.Print(err) },
		}))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	h := lim.Handler(http.NotFoundHandler())
	for range 2 {
		r := httptest.NewRequest("GET", "/", nil)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	fmt.Println("denied:", denied)
	// Output:
	// allowed default
	// denied default
	// denied: 1
}

// downStore is a store whose server is down.
type downStore struct{}

func (downStore) Take(context.Context, time.Time, []middleware.Charge, []middleware.Decision) (bool, error) {
	return false, errors.New("connection refused")
}

// NewLogObserver logs what an operator needs to see: here a store that is
// down, the circuit breaker opening, and a request let through.
func ExampleNewLogObserver() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // a fixed output for the example
			}
			return a
		},
	}))
	lim, err := middleware.New(middleware.PerMinute(100), keyfunc.RemoteIP(),
		middleware.WithStore(downStore{}), middleware.WithBreaker(1, time.Minute),
		middleware.WithObserver(middleware.NewLogObserver(logger)))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	lim.Handler(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	// Output:
	// level=WARN msg="sluice: circuit breaker open: the store is not called until it recovers"
	// level=WARN msg="sluice: store call failed" error="sluice: store failed: connection refused" not_logged=0
	// level=WARN msg="sluice: store failed, request let through unlimited" rule=default error="sluice: store failed: connection refused" not_logged=0
}

// Whoever makes a store closes it, after the limiters that use it; a
// limiter closes only what it made itself. Limiters on one store share
// its counters.
func ExampleNewMemoryStore() {
	store, err := middleware.NewMemoryStore(middleware.MemoryConfig{MaxKeys: 100_000})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	for _, name := range []string{"api", "admin"} {
		lim, err := middleware.New(middleware.PerMinute(100), keyfunc.RemoteIP(), middleware.WithStore(store))
		if err != nil {
			log.Fatal(err)
		}
		defer lim.Close()
		res, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/"+name, nil)))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(name, res.Remaining)
	}
	// Output:
	// api 99
	// admin 98
}

// A store's own events reach an Observer added to it directly, for code
// that uses the store without a Limiter (a Limiter adds its Observers to
// its store itself).
func ExampleRedisStore_AddObserver() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	store, err := middleware.NewRedisStore(client, middleware.RedisConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	remove := store.AddObserver(&middleware.Hooks{OnStoreHealth: func(e middleware.HealthEvent) {
		log.Printf("redis %s up=%v: %v", e.Server, e.Up, e.Cause)
	}})
	defer remove()
}

// countingStore counts the decisions of the store it wraps. Embedding
// *middleware.MemoryStore forwards the interfaces a Limiter looks for
// (SlotStore, TraitsReporter and the others), so the Limiter uses the
// wrapper as it would the MemoryStore itself.
type countingStore struct {
	*middleware.MemoryStore
	takes int
}

func (s *countingStore) Take(ctx context.Context, now time.Time, charges []middleware.Charge, out []middleware.Decision) (bool, error) {
	s.takes++
	return s.MemoryStore.Take(ctx, now, charges, out)
}

// A store that wraps another keeps the Limiter's behaviour when it forwards
// the optional interfaces: here the in-memory store's traits, so that no
// deny cache answers for it and every request reaches it.
func Example_wrappedStore() {
	mem, err := middleware.NewMemoryStore(middleware.MemoryConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer mem.Close()
	store := &countingStore{MemoryStore: mem}
	lim, err := middleware.New(middleware.PerMinute(2), keyfunc.RemoteIP(), middleware.WithStore(store),
		middleware.WithClock(func() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	for range 4 {
		if _, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil))); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(store.takes, store.StoreTraits().Local)
	// Output: 4 true
}
