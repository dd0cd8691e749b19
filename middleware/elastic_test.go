package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// elasticRules: a client limited to 10 per second with a ceiling of 50 on
// /api, and other traffic on /other that only the capacity signal sees.
func elasticRules() []middleware.Rule {
	return []middleware.Rule{
		{Name: "client", Path: "/api", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{{Requests: 10, Window: time.Second, Ceiling: 50}}},
		{Name: "other", Path: "/other", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerSecond(1_000_000)}},
	}
}

// elasticLimiter returns a limiter of elasticRules on the fake clock clk.
func elasticLimiter(t *testing.T, clk *testclock.Clock, opts ...middleware.Option) *middleware.Limiter {
	t.Helper()
	opts = append([]middleware.Option{
		middleware.WithClock(clk.Now),
		middleware.WithCapacity(middleware.CapacityConfig{Min: 4, Initial: 8, CoolOff: 2 * time.Second, Rise: 3 * time.Second}),
	}, opts...)
	lim, err := middleware.NewRules(elasticRules(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return lim
}

// warm feeds the limiter's signal 30 requests of 10ms, so that it knows
// the service's minimum latency.
func warm(t *testing.T, lim *middleware.Limiter, clk *testclock.Clock) {
	t.Helper()
	for range 30 {
		res, err := lim.Decide(reqTo("/other"))
		if err != nil || !res.Allowed {
			t.Fatalf("warm: %+v %v", res, err)
		}
		clk.Add(10 * time.Millisecond)
		res.Done()
	}
}

// client sends 60 requests over one second, each taking 10ms, and returns
// how many were admitted and how many of those on the elastic headroom.
func client(t *testing.T, lim *middleware.Limiter, clk *testclock.Clock) (admitted, elastic int) {
	t.Helper()
	for range 60 {
		res, err := lim.Decide(reqTo("/api"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted++
			if res.Elastic {
				elastic++
			}
		}
		clk.Add(10 * time.Millisecond)
		res.Done()
		clk.Add(time.Second/60 - 10*time.Millisecond)
	}
	return admitted, elastic
}

// TestElasticFollowsSpare: a client limited to 10/s with a ceiling of
// 50/s, sending 60/s, gets about 50 while the service is idle, its 10 as
// soon as other traffic saturates the service, and about 50 again once
// that traffic stops and the cool-off and rise have passed.
func TestElasticFollowsSpare(t *testing.T) {
	t.Parallel()
	clk := newClock(t0)
	obs := newCapacityRecorder()
	lim := elasticLimiter(t, clk, middleware.WithObserver(obs))
	warm(t, lim, clk)

	if got, el := client(t, lim, clk); got < 45 || got > 50 || el != got-10 {
		t.Fatalf("idle: %d admitted, %d on the headroom; want 45..50, all but 10", got, el)
	}
	if st := lim.Capacity(); st.Factor != 1 || st.Spare < 0.5 {
		t.Fatalf("idle: %+v", st)
	}
	// Other traffic saturates the service: 40 requests in flight, where
	// the signal's limit is about 8.
	var others []middleware.Result
	for range 40 {
		res, err := lim.Decide(reqTo("/other"))
		if err != nil || !res.Allowed {
			t.Fatal(res, err)
		}
		others = append(others, res)
	}
	got, el := client(t, lim, clk)
	if got < 8 || got > 16 {
		t.Fatalf("saturated, first second: %d admitted (%d on the headroom), want about 10", got, el)
	}
	if got, el := client(t, lim, clk); got < 9 || got > 11 || el != 0 {
		t.Fatalf("saturated, second second: %d admitted (%d on the headroom), want 10, none on the headroom", got, el)
	}
	if st := lim.Capacity(); st.Factor != 0 || st.Spare != 0 {
		t.Fatalf("saturated: %+v", st)
	}
	obs.mu.Lock()
	if e := obs.elastic["client"]; e != 10 {
		t.Errorf("saturated: observer saw effective limit %d, want 10", e)
	}
	obs.mu.Unlock()
	for i := range others {
		others[i].Done()
	}
	// Cool-off (2s) and rise (3s); the client keeps its 10 meanwhile.
	for s := range 5 {
		if got, _ := client(t, lim, clk); got < 9 {
			t.Fatalf("recovering, second %d: %d admitted, want at least 10", s, got)
		}
	}
	if got, _ := client(t, lim, clk); got < 45 {
		t.Fatalf("after the traffic stopped: %d admitted, want about 50", got)
	}
	obs.mu.Lock()
	if e := obs.elastic["client"]; e != 50 {
		t.Errorf("recovered: observer saw effective limit %d, want 50", e)
	}
	obs.mu.Unlock()
}

// TestElasticHeaders: RateLimit-Policy and X-RateLimit-Limit advertise
// the limit in force; Remaining counts the limit's own quota, then the
// headroom's.
func TestElasticHeaders(t *testing.T) {
	t.Parallel()
	clk := newClock(t0)
	lim := elasticLimiter(t, clk)
	warm(t, lim, clk)
	h := lim.Handler(ok)
	send := func() http.Header {
		r := httptest.NewRequest(http.MethodGet, "/api", nil)
		r.RemoteAddr = "192.0.2.1:1"
		rec := do(h, r)
		return rec.Header()
	}
	first := send()
	if got := first.Get(headers.RateLimitPolicy); got != `"client";q=50;w=1` {
		t.Errorf("idle: RateLimit-Policy %q", got)
	}
	if got := first.Get(headers.RateLimit); !strings.HasPrefix(got, `"client";r=9;`) {
		t.Errorf("idle: RateLimit %q", got)
	}
	if got := first.Get(headers.Limit); got != "50" {
		t.Errorf("idle: X-RateLimit-Limit %q", got)
	}
	for range 9 {
		send()
	}
	eleventh := send() // the first on the headroom: 40 - 1 left
	if got := eleventh.Get(headers.Remaining); got != "39" {
		t.Errorf("on the headroom: X-RateLimit-Remaining %q, want 39", got)
	}
}

func TestElasticValidates(t *testing.T) {
	t.Parallel()
	key := keyfunc.RemoteIP()
	for _, tc := range []struct {
		rule middleware.Rule
		want string
	}{
		{middleware.Rule{Name: "a", Key: key, Limits: []middleware.Limit{{Requests: 10, Window: time.Second, Ceiling: 10}}}, `sluice: rule "a": limit 10/1s: ceiling 10 must be above the limit's 10 requests`},
		{middleware.Rule{Name: "a", Key: key, Limits: []middleware.Limit{middleware.PerSecond(10).TokenBucket(20)}}, ""},
		{middleware.Rule{Name: "a", Key: key, Limits: []middleware.Limit{{Requests: 10, Window: time.Second, Ceiling: 20, Algorithm: middleware.TokenBucket}}}, `sluice: rule "a": limit 10/1s token_bucket: a ceiling needs a sliding window, a fixed window or a sliding log`},
		{middleware.Rule{Name: "a", Key: key, Overage: 0.1, Limits: []middleware.Limit{{Requests: 10, Window: time.Second, Ceiling: 20}}}, `sluice: rule "a": limit 10/1s: a limit with a ceiling has no overage`},
	} {
		lim, err := middleware.NewRules([]middleware.Rule{tc.rule})
		if tc.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", tc.rule, err)
			} else {
				lim.Close()
			}
			continue
		}
		if err == nil || err.Error() != tc.want {
			t.Errorf("%+v: error %v, want %q", tc.rule, err, tc.want)
		}
	}
}

// TestElasticFleet: two app servers share a real Redis. Load on one
// lowers the spare capacity it publishes, and the other's clients are
// pulled back to their limits.
func TestElasticFleet(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := srv.Prefix(t)
	clk := newClock(t0)
	newServer := func(name string) *middleware.Limiter {
		s, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: prefix, StallThreshold: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		closeStore(t, s)
		return elasticLimiter(t, clk, middleware.WithStore(s), middleware.WithCapacity(middleware.CapacityConfig{
			Min: 4, Initial: 8, CoolOff: 2 * time.Second, Rise: 3 * time.Second,
			Server: name, FleetEvery: time.Hour, FleetTTL: 2 * time.Hour, // published by hand below
		}))
	}
	a, b := newServer("a"), newServer("b")
	warm(t, a, clk)
	warm(t, b, clk)
	ctx := context.Background()
	publish := func() {
		t.Helper()
		for _, l := range []*middleware.Limiter{a, b} {
			if err := middleware.PublishSpare(l, ctx, clk.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish()
	if st := b.Capacity(); st.FleetServers != 2 || st.FleetSpare < 0.5 {
		t.Fatalf("both idle: b sees %+v", st)
	}
	if got, _ := client(t, b, clk); got < 45 {
		t.Fatalf("both idle: b's client got %d, want about 50", got)
	}
	// a is saturated; b is not.
	var held []middleware.Result
	for range 40 {
		res, err := a.Decide(reqTo("/other"))
		if err != nil || !res.Allowed {
			t.Fatal(res, err)
		}
		held = append(held, res)
	}
	clk.Add(200 * time.Millisecond) // a's signal closes a window
	publish()
	if st := b.Capacity(); st.FleetSpare != 0 || st.Signal.Spare < 0.5 || st.Factor != 0 {
		t.Fatalf("a saturated: b sees %+v", st)
	}
	if got, el := client(t, b, clk); got < 9 || got > 11 || el != 0 {
		t.Fatalf("a saturated: b's client got %d (%d on the headroom), want its 10", got, el)
	}
	// a's entry expires when it stops publishing.
	for i := range held {
		held[i].Done()
	}
	clk.Add(3 * time.Hour)
	if err := middleware.PublishSpare(b, ctx, clk.Now()); err != nil {
		t.Fatal(err)
	}
	if st := b.Capacity(); st.FleetServers != 1 {
		t.Fatalf("a gone: b sees %d servers", st.FleetServers)
	}
}

// TestElasticCombined: an elastic limit beside a fixed one of the same
// rule stops at the fixed one; limits from a LimitsFunc may be elastic.
func TestElasticCombined(t *testing.T) {
	t.Parallel()
	for name, rule := range map[string]middleware.Rule{
		"beside a fixed limit": {Name: "r", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{
			{Requests: 3, Window: time.Second, Ceiling: 6}, middleware.PerMinute(4)}},
		"from a LimitsFunc": {Name: "r", Key: keyfunc.RemoteIP(), LimitsFunc: func(keyfunc.Request, string) []middleware.Limit {
			return []middleware.Limit{{Requests: 2, Window: time.Second, Ceiling: 5}}
		}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clk := newClock(t0)
			lim, err := middleware.NewRules([]middleware.Rule{rule}, middleware.WithClock(clk.Now))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			want := map[string]int{"beside a fixed limit": 4, "from a LimitsFunc": 5}[name]
			got := 0
			for range 10 {
				res, err := lim.Decide(reqTo("/"))
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed {
					got++
				}
				res.Done()
			}
			if got != want {
				t.Errorf("%d admitted, want %d", got, want)
			}
		})
	}
}
