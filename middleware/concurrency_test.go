package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// gate is a handler that holds every request until release is closed,
// and counts how many it holds at once.
type gate struct {
	in, peak atomic.Int64
	entered  chan struct{}
	release  chan struct{}
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 1024), release: make(chan struct{})}
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := g.in.Add(1)
	defer g.in.Add(-1)
	for {
		p := g.peak.Load()
		if n <= p || g.peak.CompareAndSwap(p, n) {
			break
		}
	}
	g.entered <- struct{}{}
	select {
	case <-g.release:
	case <-r.Context().Done():
	}
}

func concurrencyLimiter(t *testing.T, n int, opts ...middleware.Option) *middleware.Limiter {
	t.Helper()
	lim, err := middleware.NewRules([]middleware.Rule{{Name: "slow", Key: keyfunc.RemoteIP(), Concurrency: n}}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return lim
}

// TestConcurrencyExact: many goroutines on one key, at most N in the
// handler at once, the rest denied with 429 and Retry-After 1; once the
// handlers return, the slots are free again.
func TestConcurrencyExact(t *testing.T) {
	t.Parallel()
	const n, clients = 3, 64
	lim := concurrencyLimiter(t, n)
	g := newGate()
	h := lim.Handler(g)
	var wg sync.WaitGroup
	var denied atomic.Int64
	codes := make(chan *httptest.ResponseRecorder, clients)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := do(h, get("192.0.2.1:1"))
			if rec.Code != http.StatusOK {
				denied.Add(1)
				codes <- rec
			}
		}()
	}
	for range n {
		<-g.entered
	}
	// Everyone else is turned away while the three are held.
	for denied.Load() < clients-n {
		time.Sleep(time.Millisecond)
	}
	close(g.release)
	wg.Wait()
	close(codes)
	if p := g.peak.Load(); p != n {
		t.Errorf("at most %d in flight, want %d", p, n)
	}
	for rec := range codes {
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" {
			t.Fatalf("denied: %d, Retry-After %q; want 429, 1", rec.Code, rec.Header().Get("Retry-After"))
		}
		if want := `{"error":"too many requests in flight","policy":"slow","limit":3,"retry_after_seconds":1}` + "\n"; rec.Body.String() != want {
			t.Fatalf("body %q, want %q", rec.Body.String(), want)
		}
		if rec.Header().Get("X-RateLimit-Limit") != "" {
			t.Fatalf("rate-limit headers on a concurrency denial: %v", rec.Header())
		}
	}
	// All slots came back: n more fit at once.
	g2 := newGate()
	h2 := lim.Handler(g2)
	var wg2 sync.WaitGroup
	for range n {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			if rec := do(h2, get("192.0.2.1:1")); rec.Code != 200 {
				t.Errorf("after release: %d", rec.Code)
			}
		}()
	}
	for range n {
		<-g2.entered
	}
	close(g2.release)
	wg2.Wait()
}

// TestConcurrencySlotsComeBack: a slot is given back when the handler
// panics and when the client goes away, and never twice.
func TestConcurrencySlotsComeBack(t *testing.T) {
	t.Parallel()
	lim := concurrencyLimiter(t, 1)
	// A panic.
	panicky := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	func() {
		defer func() { _ = recover() }()
		do(panicky, get("192.0.2.1:1"))
	}()
	if rec := do(lim.Handler(ok), get("192.0.2.1:1")); rec.Code != 200 {
		t.Fatalf("after a panic: %d, want the slot back", rec.Code)
	}
	// A client that goes away: the handler sees the context end.
	g := newGate()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { done <- do(lim.Handler(g), get("192.0.2.1:1").WithContext(ctx)).Code }()
	<-g.entered
	if rec := do(lim.Handler(ok), get("192.0.2.1:1")); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second while one is in flight: %d, want 429", rec.Code)
	}
	cancel()
	<-done
	if rec := do(lim.Handler(ok), get("192.0.2.1:1")); rec.Code != 200 {
		t.Fatalf("after the client went away: %d, want the slot back", rec.Code)
	}
	// Done on a copy, twice: one slot given back, not two.
	res, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1")))
	if err != nil || !res.Allowed {
		t.Fatal(res, err)
	}
	cp := res
	res.Done()
	cp.Done()
	r1, _ := lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1")))
	r2, _ := lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1")))
	if !r1.Allowed || r2.Allowed {
		t.Errorf("after a double Done: %v, %v; want one slot free, not two", r1.Allowed, r2.Allowed)
	}
	r1.Done()
	r2.Done()
}

// TestConcurrencyOptions: a 503 status, shadow mode, and a rule that has
// both rate limits and a concurrency limit, whose concurrency denial is
// charged to no rate limit.
func TestConcurrencyOptions(t *testing.T) {
	t.Parallel()
	lim, err := middleware.NewRules([]middleware.Rule{
		{Name: "busy", Path: "/busy", Key: keyfunc.RemoteIP(), Concurrency: 1, ConcurrencyStatus: 503},
		{Name: "trial", Path: "/trial", Key: keyfunc.RemoteIP(), Concurrency: 1, Shadow: true},
		{Name: "both", Path: "/both", Key: keyfunc.RemoteIP(), Concurrency: 1, Limits: []middleware.Limit{middleware.PerMinute(5)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	hold := func(path string) func() {
		res, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", path, nil)))
		if err != nil || !res.Allowed {
			t.Fatalf("%s: %+v %v", path, res, err)
		}
		return res.Done
	}
	release := hold("/busy")
	rec := do(lim.Handler(ok), httptest.NewRequest("GET", "/busy", nil))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" {
		t.Errorf("/busy: %d, Retry-After %q; want 503, 1", rec.Code, rec.Header().Get("Retry-After"))
	}
	release()

	release = hold("/trial")
	res, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/trial", nil)))
	if err != nil || !res.Allowed || !res.Shadowed {
		t.Errorf("/trial over its shadow concurrency limit: %+v %v; want allowed and shadowed", res, err)
	}
	res.Done()
	release()

	release = hold("/both")
	for range 3 {
		if rec := do(lim.Handler(ok), httptest.NewRequest("GET", "/both", nil)); rec.Code != 429 {
			t.Fatalf("/both while held: %d", rec.Code)
		}
	}
	release()
	// Two requests counted (the held one and this), not five.
	rec = do(lim.Handler(ok), httptest.NewRequest("GET", "/both", nil))
	if rec.Code != 200 || rec.Header().Get("X-RateLimit-Remaining") != "3" {
		t.Errorf("/both after: %d, remaining %q; want 200, 3 (concurrency denials charge nothing)", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
}

// TestConcurrencyNeedsSlots: a store that cannot hold slots is refused at
// construction with a clear error.
func TestConcurrencyNeedsSlots(t *testing.T) {
	t.Parallel()
	_, err := middleware.NewRules([]middleware.Rule{{Name: "slow", Key: keyfunc.RemoteIP(), Concurrency: 2}},
		middleware.WithStore(&failingStore{}))
	if err == nil || !strings.Contains(err.Error(), `rule "slow": concurrency needs a store that can hold slots`) {
		t.Errorf("err = %v", err)
	}
	for _, r := range []middleware.Rule{
		{Name: "neg", Key: keyfunc.RemoteIP(), Concurrency: -1},
		{Name: "status", Key: keyfunc.RemoteIP(), Concurrency: 1, ConcurrencyStatus: 500},
	} {
		if _, err := middleware.NewRules([]middleware.Rule{r}); err == nil {
			t.Errorf("rule %+v accepted", r)
		}
	}
}
