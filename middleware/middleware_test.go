package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// t0 is 30 s into a minute.
var t0 = time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC)

// newClock returns a fake clock frozen at t.
func newClock(t time.Time) *testclock.Clock { return testclock.New(t) }

func newLimiter(t *testing.T, l middleware.Limit, key keyfunc.Func, opts ...middleware.Option) *middleware.Limiter {
	t.Helper()
	lim, err := middleware.New(l, key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return lim
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })

func do(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func get(remote string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	return r
}

// rateHeaders returns the rate-limit fields of h in a stable form.
func rateHeaders(h http.Header) map[string]string {
	m := map[string]string{}
	for _, k := range []string{headers.Limit, headers.Remaining, headers.Reset, headers.RetryAfter, headers.RateLimit, headers.RateLimitPolicy} {
		if v := h.Values(k); len(v) > 0 {
			m[k] = strings.Join(v, "\n")
		}
	}
	return m
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	key := keyfunc.RemoteIP()
	tests := []struct {
		name string
		l    middleware.Limit
		key  keyfunc.Func
		opts []middleware.Option
		want string
	}{
		{"zero requests", middleware.PerMinute(0), key, nil, `sluice: rule "default": limit 0/1m0s: requests must be > 0`},
		{"negative window", middleware.Limit{Requests: 1, Window: -time.Second}, key, nil, `sluice: rule "default": limit 1/-1s: window must be > 0`},
		{"sub-millisecond window", middleware.Limit{Requests: 1, Window: time.Microsecond}, key, nil, `sluice: rule "default": limit 1/1µs: window must be a whole number of milliseconds`},
		{"nil key", middleware.PerMinute(1), nil, nil, `sluice: rule "default": key function is nil`},
		{"nil store", middleware.PerMinute(1), key, []middleware.Option{middleware.WithStore(nil)}, "sluice: WithStore: store is nil"},
		{"nil deny handler", middleware.PerMinute(1), key, []middleware.Option{middleware.WithDenyHandler(nil)}, "sluice: WithDenyHandler: handler is nil"},
		{"nil error handler", middleware.PerMinute(1), key, []middleware.Option{middleware.WithErrorHandler(nil)}, "sluice: WithErrorHandler: handler is nil"},
		{"nil clock", middleware.PerMinute(1), key, []middleware.Option{middleware.WithClock(nil)}, "sluice: WithClock: clock is nil"},
		{"bad style", middleware.PerMinute(1), key, []middleware.Option{middleware.WithHeaderStyle(9)}, "sluice: WithHeaderStyle: unknown style 9"},
		{"bad policy", middleware.PerMinute(1), key, []middleware.Option{middleware.WithFailurePolicy(7)}, "sluice: WithFailurePolicy: unknown policy 7"},
		{"nil option", middleware.PerMinute(1), key, []middleware.Option{nil}, "sluice: nil Option"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lim, err := middleware.New(tt.l, tt.key, tt.opts...)
			if err == nil {
				lim.Close()
				t.Fatalf("New succeeded, want error %q", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("New error = %q, want %q", err, tt.want)
			}
		})
	}
}

// TestHandlerBurst checks exact statuses, headers and body at fixed instants.
func TestHandlerBurst(t *testing.T) {
	t.Parallel()
	clock := newClock(t0)
	h := newLimiter(t, middleware.PerMinute(3), keyfunc.RemoteIP(), middleware.WithClock(clock.Now)).Handler(ok)
	policy := `"default";q=3;w=60`
	want := []struct {
		code    int
		headers map[string]string
	}{
		// The window starts at the first request. X-RateLimit-Reset: whole
		// again at the end of the next window (119.999 s). t: the next
		// unit, when enough of this window's count has decayed in the
		// next one: c*(59999-y) <= (3-r-1)*60000, 60 s + y.
		{200, map[string]string{headers.Limit: "3", headers.Remaining: "2", headers.Reset: "120", headers.RateLimit: `"default";r=2;t=120`, headers.RateLimitPolicy: policy}},
		{200, map[string]string{headers.Limit: "3", headers.Remaining: "1", headers.Reset: "120", headers.RateLimit: `"default";r=1;t=90`, headers.RateLimitPolicy: policy}},
		{200, map[string]string{headers.Limit: "3", headers.Remaining: "0", headers.Reset: "120", headers.RateLimit: `"default";r=0;t=80`, headers.RateLimitPolicy: policy}},
		// Next window, 19.999 s in: 3*(59999-19999) + 60000 <= 180000;
		// t is the same wait, for one unit.
		{429, map[string]string{headers.Limit: "3", headers.Remaining: "0", headers.Reset: "120", headers.RetryAfter: "80", headers.RateLimit: `"default";r=0;t=80`, headers.RateLimitPolicy: policy}},
	}
	for i, w := range want {
		rec := do(h, get("192.0.2.1:1234"))
		if rec.Code != w.code {
			t.Fatalf("request %d: status %d, want %d", i, rec.Code, w.code)
		}
		if got := rateHeaders(rec.Header()); !equalMaps(got, w.headers) {
			t.Errorf("request %d: headers %v, want %v", i, got, w.headers)
		}
	}
	rec := do(h, get("192.0.2.1:1234"))
	if got, want := rec.Body.String(), `{"error":"rate limit exceeded","policy":"default","limit":3,"window_seconds":60,"retry_after_seconds":80}`+"\n"; got != want {
		t.Errorf("429 body = %s, want %s", got, want)
	}
	if got := rec.Header().Get("Content-Type"); got != middleware.ContentTypeJSON {
		t.Errorf("Content-Type = %q", got)
	}
	// Another client is unaffected.
	if rec := do(h, get("192.0.2.2:1234")); rec.Code != 200 {
		t.Errorf("other client: status %d", rec.Code)
	}
	// At Retry-After the client gets one request.
	clock.Add(80 * time.Second)
	if rec := do(h, get("192.0.2.1:1234")); rec.Code != 200 {
		t.Errorf("after Retry-After: status %d", rec.Code)
	}
	if rec := do(h, get("192.0.2.1:1234")); rec.Code != 429 {
		t.Errorf("second request after Retry-After: status %d, want 429", rec.Code)
	}
}

func TestSpoofedForwardedForDoesNotChangeKey(t *testing.T) {
	t.Parallel()
	clock := newClock(t0)
	h := newLimiter(t, middleware.PerMinute(2), keyfunc.RemoteIP(), middleware.WithClock(clock.Now)).Handler(ok)
	for i, want := range []int{200, 200, 429, 429} {
		r := get("198.51.100.7:5555")
		r.Header.Set("X-Forwarded-For", "10.0.0."+string(rune('1'+i)))
		r.Header.Set("X-Real-IP", "10.9.9."+string(rune('1'+i)))
		if rec := do(h, r); rec.Code != want {
			t.Errorf("request %d: status %d, want %d", i, rec.Code, want)
		}
	}
}

func TestHeaderStyles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		style headers.Style
		want  []string
	}{
		{headers.Both, []string{headers.Limit, headers.Remaining, headers.Reset, headers.RateLimit, headers.RateLimitPolicy}},
		{headers.Legacy, []string{headers.Limit, headers.Remaining, headers.Reset}},
		{headers.Draft, []string{headers.RateLimit, headers.RateLimitPolicy}},
		{headers.None, nil},
	}
	for _, tt := range tests {
		t.Run(tt.style.String(), func(t *testing.T) {
			t.Parallel()
			h := newLimiter(t, middleware.PerMinute(1), keyfunc.RemoteIP(), middleware.WithHeaderStyle(tt.style), middleware.WithClock(newClock(t0).Now)).Handler(ok)
			got := rateHeaders(do(h, get("192.0.2.1:1")).Header())
			if len(got) != len(tt.want) {
				t.Fatalf("allowed: headers %v, want names %v", got, tt.want)
			}
			for _, k := range tt.want {
				if _, ok := got[k]; !ok {
					t.Errorf("allowed: %s missing from %v", k, got)
				}
			}
			denied := rateHeaders(do(h, get("192.0.2.1:1")).Header())
			// With a limit of 1, the counted request must leave the
			// sliding window entirely: the last ms of the next window.
			if denied[headers.RetryAfter] != "120" || len(denied) != len(tt.want)+1 {
				t.Errorf("denied: headers %v, want %v plus Retry-After 120", denied, tt.want)
			}
		})
	}
}

func TestNoKey(t *testing.T) {
	t.Parallel()
	key := keyfunc.APIKey("X-API-Key", nil)
	h := newLimiter(t, middleware.PerMinute(1), key).Handler(ok)
	rec := do(h, get("192.0.2.1:1"))
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("missing API key: status %d, want 400", rec.Code)
	}
	if got := rec.Body.String(); !strings.Contains(got, "no rate-limit key") {
		t.Errorf("body %q", got)
	}
	if len(rateHeaders(rec.Header())) != 0 {
		t.Errorf("headers sent for undecided request: %v", rec.Header())
	}
	// NoKeyAllow lets it through unlimited.
	h = newLimiter(t, middleware.PerMinute(1), key, middleware.WithNoKeyPolicy(middleware.NoKeyAllow)).Handler(ok)
	for i := 0; i < 3; i++ {
		if rec := do(h, get("192.0.2.1:1")); rec.Code != 200 {
			t.Fatalf("NoKeyAllow request %d: status %d", i, rec.Code)
		}
	}
}

func TestSkip(t *testing.T) {
	t.Parallel()
	lim := newLimiter(t, middleware.PerMinute(1), keyfunc.RemoteIP(),
		middleware.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }))
	h := lim.Handler(ok)
	for i := 0; i < 3; i++ {
		rec := do(h, httptest.NewRequest("GET", "/healthz", nil))
		if rec.Code != 200 || len(rateHeaders(rec.Header())) != 0 {
			t.Fatalf("skipped request %d: status %d headers %v", i, rec.Code, rec.Header())
		}
	}
	if do(h, httptest.NewRequest("GET", "/", nil)).Code != 200 || do(h, httptest.NewRequest("GET", "/", nil)).Code != 429 {
		t.Error("skip leaked into other paths")
	}
}

func TestDenyHandler(t *testing.T) {
	t.Parallel()
	var got middleware.Result
	deny := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = middleware.ResultFromContext(r.Context())
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	h := newLimiter(t, middleware.PerSecond(1), keyfunc.RemoteIP(), middleware.WithDenyHandler(deny), middleware.WithClock(newClock(t0).Now)).Handler(ok)
	do(h, get("192.0.2.1:1"))
	rec := do(h, get("192.0.2.1:1"))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want the deny handler's 503", rec.Code)
	}
	if got.Allowed || got.Policy != "default" || got.Limit != middleware.PerSecond(1) || got.RetryAfter != 1999*time.Millisecond {
		t.Errorf("ResultFromContext = %+v", got)
	}
	if rec.Header().Get(headers.RetryAfter) != "2" {
		t.Errorf("Retry-After not set before the deny handler: %v", rec.Header())
	}
}

// failingStore fails every call, like a store whose server is down.
type failingStore struct{ calls atomic.Int64 }

var errDown = errors.New("connection refused")

func (s *failingStore) Take(context.Context, time.Time, []middleware.Charge, []middleware.Decision) (bool, error) {
	s.calls.Add(1)
	return false, errDown
}

func TestFailurePolicies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		opts     []middleware.Option
		want     []int
		wantHdrs bool
	}{
		{"fail open by default", nil, []int{200, 200, 200}, false},
		{"fail closed", []middleware.Option{middleware.WithFailurePolicy(middleware.FailClosed)}, []int{503, 503, 503}, false},
		{"fail local", []middleware.Option{middleware.WithFailurePolicy(middleware.FailLocal)}, []int{200, 200, 429}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var hooked []error
			var mu sync.Mutex
			store := &failingStore{}
			opts := append([]middleware.Option{
				middleware.WithStore(store),
				middleware.WithClock(newClock(t0).Now),
				middleware.WithObserver(&middleware.Hooks{OnStoreFailed: func(_ keyfunc.Request, err error) {
					mu.Lock()
					hooked = append(hooked, err)
					mu.Unlock()
				}}),
			}, tt.opts...)
			h := newLimiter(t, middleware.PerMinute(2), keyfunc.RemoteIP(), opts...).Handler(ok)
			for i, want := range tt.want {
				rec := do(h, get("192.0.2.1:1"))
				if rec.Code != want {
					t.Fatalf("request %d: status %d, want %d", i, rec.Code, want)
				}
				if got := len(rateHeaders(rec.Header())) > 0; got != tt.wantHdrs {
					t.Errorf("request %d: headers %v, want rate-limit headers %v", i, rec.Header(), tt.wantHdrs)
				}
				if want == 503 && !strings.Contains(rec.Body.String(), "rate limiter unavailable") {
					t.Errorf("503 body %q", rec.Body.String())
				}
			}
			if store.calls.Load() != int64(len(tt.want)) || len(hooked) != len(tt.want) {
				t.Errorf("store called %d times, hook %d times; want %d", store.calls.Load(), len(hooked), len(tt.want))
			}
			for _, err := range hooked {
				if !errors.Is(err, middleware.ErrStore) || !errors.Is(err, errDown) {
					t.Errorf("hooked error %v does not wrap ErrStore and the cause", err)
				}
			}
		})
	}
}

// TestConcurrentExact hammers one key from many goroutines at a frozen
// instant: exactly the limit passes.
func TestConcurrentExact(t *testing.T) {
	t.Parallel()
	const limit, workers, each = 100, 32, 20
	h := newLimiter(t, middleware.PerMinute(limit), keyfunc.RemoteIP(), middleware.WithClock(newClock(t0).Now)).Handler(ok)
	var passed atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				if do(h, get("192.0.2.1:1")).Code == 200 {
					passed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if passed.Load() != limit {
		t.Errorf("%d requests passed, want exactly %d", passed.Load(), limit)
	}
}

func TestMultipleLimits(t *testing.T) {
	t.Parallel()
	clock := newClock(t0)
	lim, err := middleware.NewRules([]middleware.Rule{{
		Name: "api", Key: keyfunc.RemoteIP(),
		Limits: []middleware.Limit{middleware.PerSecond(2), middleware.PerMinute(3)},
	}}, middleware.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	h := lim.Handler(ok)
	rec := do(h, get("192.0.2.1:1"))
	if got, want := rec.Header().Get(headers.RateLimitPolicy), `"api-1s";q=2;w=1, "api-1m";q=3;w=60`; got != want {
		t.Errorf("RateLimit-Policy = %s, want %s", got, want)
	}
	// Binding: per-second has 1 left, per-minute 2.
	if got, want := rec.Header().Get(headers.RateLimit), `"api-1s";r=1;t=2`; got != want {
		t.Errorf("RateLimit = %s, want %s", got, want)
	}
	do(h, get("192.0.2.1:1"))
	// Third request in the same second: the per-second limit denies; it
	// admits again when 2*(999-y) + 1000 <= 2000 in the next second,
	// y = 499 ms: 1.499 s.
	rec = do(h, get("192.0.2.1:1"))
	if rec.Code != 429 || rec.Header().Get(headers.RateLimit) != `"api-1s";r=0;t=2` || rec.Header().Get(headers.RetryAfter) != "2" {
		t.Fatalf("third request in one second: %d %v", rec.Code, rateHeaders(rec.Header()))
	}
	// 1.5 s later both admit; the minute counter had 2 (the denied request
	// was not charged) and now has 3. Both have 0 left: the header names
	// the one that takes longer to reset. Its next unit: 58.5 s, then
	// 3*(59999-y) <= 2*60000 in the next minute, y = 19.999 s.
	clock.Add(1500 * time.Millisecond)
	if rec := do(h, get("192.0.2.1:1")); rec.Code != 200 || rec.Header().Get(headers.RateLimit) != `"api-1m";r=0;t=79` {
		t.Fatalf("after 1.5 s: %d %v", rec.Code, rateHeaders(rec.Header()))
	}
	// Another second: the per-second limit would admit, the minute limit
	// denies until 19.999 s into the next minute (57.5 s + 19.999 s); t,
	// for one unit, says the same.
	clock.Add(time.Second)
	rec = do(h, get("192.0.2.1:1"))
	if rec.Code != 429 || rec.Header().Get(headers.RateLimit) != `"api-1m";r=0;t=78` || rec.Header().Get(headers.RetryAfter) != "78" {
		t.Fatalf("minute limit: %d %v", rec.Code, rateHeaders(rec.Header()))
	}
}

// TestDecideAllocs checks the decision on an existing key allocates
// nothing beyond the key itself.
func TestDecideAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	lim := newLimiter(t, middleware.PerSecond(1<<30), keyfunc.RemoteIP(), middleware.WithClock(newClock(t0).Now))
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
		t.Errorf("Decide: %v allocs, want 0 (the key string is carved from a shared chunk)", allocs)
	}
	static := newLimiter(t, middleware.PerSecond(1<<30), func(keyfunc.Request) (string, error) { return "k", nil })
	if allocs := testing.AllocsPerRun(200, func() { _, _ = static.Decide(r) }); allocs != 0 {
		t.Errorf("Decide with a constant key: %v allocs, want 0", allocs)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestRulePathError: a bad Path is refused with the rule's name and what
// is wrong (internal/pathmatch tests the patterns).
func TestRulePathError(t *testing.T) {
	t.Parallel()
	_, err := middleware.NewRules([]middleware.Rule{{Name: "r", Path: "/api/", Key: keyfunc.Global(), Limits: []middleware.Limit{middleware.PerMinute(1)}}})
	if want := `sluice: rule "r": path "/api/" has an empty segment: requests are matched by their cleaned path, without doubled or trailing slashes`; err == nil || err.Error() != want {
		t.Errorf("NewRules error = %v, want %s", err, want)
	}
}

// TestHandlerAllocs holds the allocation goal of the speed issue: behind
// the limiter, with a fresh httptest.NewRecorder per request as users
// benchmark it, a request costs at most 3 allocations more than the bare
// handler. Those 3 are the recorder's: a group for the header map the
// rate-limit fields go into, and two more for the copy of a non-empty
// header that it takes at WriteHeader.
func TestHandlerAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	lim := newLimiter(t, middleware.PerSecond(1<<30), keyfunc.RemoteIP(), middleware.WithClock(newClock(t0).Now))
	bareHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	limited := lim.Handler(bareHandler)
	r := get("192.0.2.1:1")
	count := func(h http.Handler) float64 {
		h.ServeHTTP(httptest.NewRecorder(), r)
		return testing.AllocsPerRun(1000, func() { h.ServeHTTP(httptest.NewRecorder(), r) })
	}
	base, got := count(bareHandler), count(limited)
	if got-base > 3 {
		t.Errorf("limited handler: %v allocs, bare %v: %v more, want at most 3", got, base, got-base)
	}
}
