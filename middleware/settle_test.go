package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// statusHandler answers the status its path names ("/401"), or panics for
// "/panic".
var statusHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/panic" {
		panic("handler failed")
	}
	code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
	w.WriteHeader(code)
})

// serve sends one request for path through h and returns the status,
// 0 if the handler panicked through h.
func serve(h http.Handler, path string) (status int) {
	defer func() {
		if recover() != nil {
			status = 0
		}
	}()
	rr := httptest.NewRecorder()
	req := httptest.NewRequest("POST", path, nil)
	req.RemoteAddr = "192.0.2.1:1234"
	h.ServeHTTP(rr, req)
	return rr.Code
}

func countingLimiter(t *testing.T, count middleware.Count, store middleware.Store, opts ...middleware.Option) *middleware.Limiter {
	t.Helper()
	if store != nil {
		opts = append(opts, middleware.WithStore(store))
	}
	lim, err := middleware.NewRules([]middleware.Rule{{
		Name: "login", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(3)}, Count: count,
	}}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	return lim
}

func redisStoreFor(t *testing.T) middleware.Store {
	srv := redistest.Shared(t)
	s, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), Timeout: 5 * time.Second, StallThreshold: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestCountByStatus sends requests in turn and checks which are counted:
// only the statuses the rule counts use up its 3 a minute.
func TestCountByStatus(t *testing.T) {
	t.Parallel()
	failures := middleware.Count{Status: []middleware.Status{401, 403}}
	errors5xx := middleware.Count{Status: []middleware.Status{middleware.Status5xx}}
	notOK := middleware.Count{StatusNot: []middleware.Status{middleware.Status2xx, 304}}
	cases := []struct {
		name  string
		count middleware.Count
		paths []string
		want  []int // 0: the handler panicked
	}{
		{"successes free", failures, []string{"/200", "/200", "/200", "/200", "/302", "/401", "/200"}, []int{200, 200, 200, 200, 302, 401, 200}},
		{"failures counted", failures, []string{"/401", "/200", "/403", "/401", "/200", "/401"}, []int{401, 200, 403, 401, 429, 429}},
		{"classes", errors5xx, []string{"/500", "/404", "/503", "/200", "/502", "/200"}, []int{500, 404, 503, 200, 502, 429}},
		{"status_not", notOK, []string{"/204", "/304", "/404", "/201", "/500", "/418", "/200"}, []int{204, 304, 404, 201, 500, 418, 429}},
		{"panic counts as 500", errors5xx, []string{"/panic", "/200", "/panic", "/panic", "/200"}, []int{0, 200, 0, 0, 429}},
		{"panic is no failed login", failures, []string{"/panic", "/panic", "/panic", "/panic", "/200"}, []int{0, 0, 0, 0, 200}},
	}
	for _, store := range []string{"memory", "redis"} {
		for _, c := range cases {
			t.Run(store+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				var s middleware.Store
				if store == "redis" {
					s = redisStoreFor(t)
				}
				clk := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
				h := countingLimiter(t, c.count, s, middleware.WithClock(clk.Now)).Handler(statusHandler)
				for i, p := range c.paths {
					clk.Add(time.Second)
					if got := serve(h, p); got != c.want[i] {
						t.Fatalf("request %d (%s): status %d, want %d", i, p, got, c.want[i])
					}
				}
			})
		}
	}
}

// TestCountConcurrencyBound runs 4 limiters, each with a store of its own
// (on Redis, its own go-redis client), 32 goroutines each, all of whose
// requests fail, against one key with a limit of 3: however they
// interleave, at most 3 reach the handler, since each is charged before
// the handler runs. Then successful requests in flight hold their share
// until they answer, and give it back.
func TestCountConcurrencyBound(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			var prefix string
			var srv *redistest.Server
			var shared middleware.Store
			mem, err := middleware.NewMemoryStore(middleware.MemoryConfig{})
			shared = mem
			if err != nil {
				t.Fatal(err)
			}
			if store == "redis" {
				srv = redistest.Shared(t)
				prefix = srv.Prefix(t)
			}
			var reached, inHandler, maxIn atomic.Int64
			release := make(chan struct{})
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reached.Add(1)
				n := inHandler.Add(1)
				for m := maxIn.Load(); n > m && !maxIn.CompareAndSwap(m, n); m = maxIn.Load() {
				}
				<-release
				inHandler.Add(-1)
				code, _ := strconv.Atoi(r.Header.Get("X-Status"))
				w.WriteHeader(code)
			})
			var handlers [4]http.Handler
			for i := range handlers {
				s := shared
				if srv != nil {
					rs, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: prefix, Timeout: 5 * time.Second, StallThreshold: 2 * time.Second})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = rs.Close() })
					s = rs
				}
				handlers[i] = countingLimiter(t, middleware.Count{Status: []middleware.Status{401}}, s).Handler(handler)
			}
			burst := func(status string) (codes map[int]int) {
				codes = map[int]int{}
				var mu sync.Mutex
				var wg sync.WaitGroup
				for i := range 4 * 32 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rr := httptest.NewRecorder()
						req := httptest.NewRequest("POST", "/login", nil)
						req.RemoteAddr = "192.0.2.7:1"
						req.Header.Set("X-Status", status)
						handlers[i%4].ServeHTTP(rr, req)
						mu.Lock()
						codes[rr.Code]++
						mu.Unlock()
					}()
				}
				// Let every request be decided, then let the handlers answer.
				deadline := time.Now().Add(10 * time.Second)
				for {
					mu.Lock()
					n := codes[429]
					mu.Unlock()
					if n+int(inHandler.Load()) == 4*32 || time.Now().After(deadline) {
						break
					}
					time.Sleep(time.Millisecond)
				}
				close(release)
				wg.Wait()
				release = make(chan struct{})
				return codes
			}
			// Successes first: at most 3 in flight at once, all given back.
			codes := burst("200")
			if maxIn.Load() > 3 || codes[200] < 1 || codes[200]+codes[429] != 128 {
				t.Fatalf("successes: %d in the handler at once, statuses %v; want at most 3 at once", maxIn.Load(), codes)
			}
			// Given back: the failures that follow have the whole limit.
			reached.Store(0)
			maxIn.Store(0)
			codes = burst("401")
			if reached.Load() != 3 || codes[401] != 3 || codes[429] != 125 {
				t.Fatalf("failures: %d reached the handler, statuses %v; want exactly 3", reached.Load(), codes)
			}
			// And they stay counted.
			rr := httptest.NewRecorder()
			req := httptest.NewRequest("POST", "/login", nil)
			req.RemoteAddr = "192.0.2.7:1"
			handlers[0].ServeHTTP(rr, req)
			if rr.Code != 429 {
				t.Fatalf("after 3 failures: %d, want 429", rr.Code)
			}
		})
	}
}

// TestCountFailLocal: while Redis is down, the local fallback decides, and
// uncounted responses are given back to it.
func TestCountFailLocal(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	store, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), StallThreshold: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	srv.Kill()
	clk := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	h := countingLimiter(t, middleware.Count{Status: []middleware.Status{401}}, store,
		middleware.WithClock(clk.Now), middleware.WithFailurePolicy(middleware.FailLocal)).Handler(statusHandler)
	for i, c := range []struct {
		path string
		want int
	}{{"/200", 200}, {"/200", 200}, {"/200", 200}, {"/200", 200}, {"/401", 401}, {"/401", 401}, {"/401", 401}, {"/200", 429}} {
		if got := serve(h, c.path); got != c.want {
			t.Fatalf("request %d (%s) with Redis down: %d, want %d", i, c.path, got, c.want)
		}
	}
}
