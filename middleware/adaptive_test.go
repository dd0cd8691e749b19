package middleware_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// reqTo returns a request for path from a fixed client.
func reqTo(path string) keyfunc.Request {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.RemoteAddr = "192.0.2.1:1"
	return keyfunc.FromHTTP(r)
}

// capacityRecorder records the capacity events and sheds it is told of.
type capacityRecorder struct {
	middleware.NopObserver
	mu      sync.Mutex
	limits  map[string]int
	shed    map[middleware.Priority]int
	elastic map[string]int
}

func newCapacityRecorder() *capacityRecorder {
	return &capacityRecorder{limits: map[string]int{}, shed: map[middleware.Priority]int{}, elastic: map[string]int{}}
}

func (c *capacityRecorder) CapacityChanged(e middleware.CapacityEvent) {
	c.mu.Lock()
	c.limits[e.Rule] = e.Limit
	c.mu.Unlock()
}

func (c *capacityRecorder) Shed(_ string, p middleware.Priority) {
	c.mu.Lock()
	c.shed[p]++
	c.mu.Unlock()
}

func (c *capacityRecorder) ElasticChanged(e middleware.ElasticEvent) {
	c.mu.Lock()
	c.elastic[e.Policy] = e.Effective
	c.mu.Unlock()
}

// runBatches drives a closed loop on lim for d: as many requests as the
// rule admits start together and end together after latency(n), n being
// how many were admitted. It returns the adaptive limit at the end.
func runBatches(t *testing.T, lim *middleware.Limiter, clk *testclock.Clock, d time.Duration, latency func(n int) time.Duration) int {
	t.Helper()
	end := clk.Now().Add(d)
	for clk.Now().Before(end) {
		var held []middleware.Result
		for range 64 {
			res, err := lim.Decide(reqTo("/api"))
			if err != nil {
				t.Fatal(err)
			}
			if !res.Allowed {
				if !res.Shed || !res.Concurrency {
					t.Fatalf("denied, but not shed: %+v", res)
				}
				break
			}
			held = append(held, res)
		}
		if len(held) == 0 {
			t.Fatal("nothing admitted")
		}
		clk.Add(latency(len(held)))
		for i := range held {
			held[i].Done()
		}
	}
	return lim.Capacity().Rules["api"].Limit
}

// TestAdaptiveConcurrencyFollowsLatency: the limit of a rule with
// AdaptiveConcurrency settles above the service's 8 slots, falls when the
// service halves (latency doubles at the old limit), and recovers.
func TestAdaptiveConcurrencyFollowsLatency(t *testing.T) {
	t.Parallel()
	clk := newClock(t0)
	obs := newCapacityRecorder()
	lim, err := middleware.NewRules([]middleware.Rule{{
		Name: "api", Path: "/api",
		AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 2, Max: 60},
	}}, middleware.WithClock(clk.Now), middleware.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	slots := func(n int) func(int) time.Duration {
		return func(c int) time.Duration {
			if c <= n {
				return 20 * time.Millisecond
			}
			return 20 * time.Millisecond * time.Duration(c) / time.Duration(n)
		}
	}
	l8 := runBatches(t, lim, clk, 10*time.Second, slots(8))
	if l8 < 9 || l8 > 24 {
		t.Fatalf("8 slots: limit %d, want 9..24", l8)
	}
	l4 := runBatches(t, lim, clk, 5*time.Second, slots(4))
	if l4 >= l8 || l4 > 12 {
		t.Fatalf("4 slots: limit %d, want below %d and at most 12", l4, l8)
	}
	back := runBatches(t, lim, clk, 5*time.Second, slots(8))
	if back <= l4 {
		t.Fatalf("8 slots again: limit %d, want above %d", back, l4)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.limits["api"] != back {
		t.Errorf("observer saw limit %d, Capacity says %d", obs.limits["api"], back)
	}
	if obs.shed[middleware.PriorityNormal] == 0 {
		t.Error("observer saw no normal request shed")
	}
}

// TestAdaptiveConcurrencyResponse: a shed request gets 503 (or the
// rule's status) with Retry-After and no rate-limit fields, through
// Handler.
func TestAdaptiveConcurrencyResponse(t *testing.T) {
	t.Parallel()
	for _, status := range []int{0, http.StatusTooManyRequests} {
		lim, err := middleware.NewRules([]middleware.Rule{{
			Name: "api", AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 1, Max: 1, Status: status},
		}}, middleware.WithClock(newClock(t0).Now))
		if err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		entered := make(chan struct{})
		h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release
		}))
		done := make(chan struct{})
		go func() {
			defer close(done)
			do(h, get("192.0.2.1:1"))
		}()
		<-entered
		rec := do(h, get("192.0.2.2:1"))
		want := status
		if want == 0 {
			want = http.StatusServiceUnavailable
		}
		if rec.Code != want || rec.Header().Get("Retry-After") != "1" || rec.Header().Get("RateLimit") != "" {
			t.Errorf("status option %d: got %d %v", status, rec.Code, rec.Header())
		}
		if !strings.Contains(rec.Body.String(), `"policy":"api"`) {
			t.Errorf("body %s", rec.Body)
		}
		close(release)
		<-done
		// The place came back with Done.
		if rec := do(h2(lim), get("192.0.2.2:1")); rec.Code != http.StatusOK {
			t.Errorf("after the first request ended: %d", rec.Code)
		}
		lim.Close()
	}
}

func h2(lim *middleware.Limiter) http.Handler { return lim.Handler(ok) }

// TestShedByPriority: with a fixed limit of 8 and a hard limit of 16,
// sheddable requests stop at 4 in flight, normal ones at 8, high ones at
// 12 and critical ones at 16; after a critical one is refused, no request
// of lower priority is admitted for the hold, even with nothing in flight.
func TestShedByPriority(t *testing.T) {
	t.Parallel()
	clk := newClock(t0)
	obs := newCapacityRecorder()
	lim, err := middleware.NewRules([]middleware.Rule{
		{Name: "api", AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 8, Max: 16}},
		{Name: "batch", Path: "/batch", Priority: middleware.PrioritySheddable},
	}, middleware.WithClock(clk.Now), middleware.WithObserver(obs), middleware.WithPriority(func(r keyfunc.Request) middleware.Priority {
		switch r.Header("X-Priority") {
		case "critical":
			return middleware.PriorityCritical
		case "high":
			return middleware.PriorityHigh
		}
		return middleware.PriorityUnset
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	req := func(path, prio string) keyfunc.Request {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("X-Priority", prio)
		return keyfunc.FromHTTP(r)
	}
	var held []middleware.Result
	admit := func(path, prio string) bool {
		res, err := lim.Decide(req(path, prio))
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			held = append(held, res)
		}
		return res.Allowed
	}
	steps := []struct {
		path, prio string
		want       bool
		priority   middleware.Priority
	}{
		{"/batch", "", true, middleware.PrioritySheddable},
		{"/batch", "", true, middleware.PrioritySheddable},
		{"/batch", "", true, middleware.PrioritySheddable},
		{"/batch", "", true, middleware.PrioritySheddable}, // 4 in flight
		{"/batch", "", false, middleware.PrioritySheddable},
		{"/api", "", true, middleware.PriorityNormal},
		{"/api", "", true, middleware.PriorityNormal},
		{"/api", "", true, middleware.PriorityNormal},
		{"/api", "", true, middleware.PriorityNormal}, // 8
		{"/api", "", false, middleware.PriorityNormal},
		{"/batch", "high", true, middleware.PriorityHigh}, // WithPriority wins over the rule
		{"/api", "high", true, middleware.PriorityHigh},
		{"/api", "high", true, middleware.PriorityHigh},
		{"/api", "high", true, middleware.PriorityHigh}, // 12
		{"/api", "high", false, middleware.PriorityHigh},
		{"/api", "critical", true, middleware.PriorityCritical},
		{"/api", "critical", true, middleware.PriorityCritical},
		{"/api", "critical", true, middleware.PriorityCritical},
		{"/api", "critical", true, middleware.PriorityCritical}, // 16, the hard limit
		{"/api", "critical", false, middleware.PriorityCritical},
	}
	for i, st := range steps {
		res, err := lim.Decide(req(st.path, st.prio))
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed != st.want || res.Priority != st.priority {
			t.Fatalf("step %d (%s %s): allowed %v priority %v, want %v %v", i, st.path, st.prio, res.Allowed, res.Priority, st.want, st.priority)
		}
		if res.Allowed {
			held = append(held, res)
		}
	}
	for i := range held {
		held[i].Done()
	}
	held = held[:0]
	clk.Add(10 * time.Millisecond)
	// Nothing in flight, but a critical request was refused just now.
	for _, prio := range []string{"", "high"} {
		if admit("/api", prio) {
			t.Errorf("priority %q admitted within the hold after a critical refusal", prio)
		}
	}
	if !admit("/api", "critical") {
		t.Error("critical refused with nothing in flight")
	}
	clk.Add(time.Second)
	if !admit("/batch", "") {
		t.Error("sheddable refused after the hold")
	}
	for i := range held {
		held[i].Done()
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.shed[middleware.PrioritySheddable] != 1 || obs.shed[middleware.PriorityCritical] != 1 {
		t.Errorf("shed counts %v", obs.shed)
	}
}

func TestAdaptiveConcurrencyValidates(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rule middleware.Rule
		want string
	}{
		{middleware.Rule{Name: "a", AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 0, Max: 4}}, `sluice: rule "a": adaptive concurrency: min 0 and max 4: want 1 <= min <= max`},
		{middleware.Rule{Name: "a", AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 5, Max: 4}}, `sluice: rule "a": adaptive concurrency: min 5 and max 4: want 1 <= min <= max`},
		{middleware.Rule{Name: "a", AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 1, Max: 4, Status: 500}}, `sluice: rule "a": adaptive concurrency: status 500: want 503 or 429`},
		{middleware.Rule{Name: "a", Priority: 9}, `sluice: rule "a": priority 9 is unknown`},
		{middleware.Rule{Name: "a", Deny: true, Key: keyfunc.RemoteIP(), Priority: middleware.PriorityHigh}, `sluice: rule "a": a Deny rule has no limits, LimitsFunc, concurrency or priority`},
		{middleware.Rule{Name: "a", Limits: []middleware.Limit{middleware.PerSecond(1)}, Priority: middleware.PriorityHigh}, `sluice: rule "a": key function is nil`},
	} {
		_, err := middleware.NewRules([]middleware.Rule{tc.rule})
		if err == nil || err.Error() != tc.want {
			t.Errorf("%+v: error %v, want %q", tc.rule, err, tc.want)
		}
	}
}

func TestParsePriority(t *testing.T) {
	t.Parallel()
	for _, p := range []middleware.Priority{middleware.PrioritySheddable, middleware.PriorityNormal, middleware.PriorityHigh, middleware.PriorityCritical} {
		got, err := middleware.ParsePriority(p.String())
		if err != nil || got != p {
			t.Errorf("ParsePriority(%q) = %v, %v", p.String(), got, err)
		}
	}
	if _, err := middleware.ParsePriority("urgent"); err == nil {
		t.Error("ParsePriority(urgent): no error")
	}
}

// TestAdaptiveConcurrencyShadow: a shadow adaptive rule, or any in shadow
// mode, reports the requests it would have shed and refuses none.
func TestAdaptiveConcurrencyShadow(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		rule middleware.Rule
		opts []middleware.Option
	}{
		"shadow rule": {middleware.Rule{Name: "api", Shadow: true, AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 1, Max: 1}}, nil},
		"shadow mode": {middleware.Rule{Name: "api", AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 1, Max: 1}}, []middleware.Option{middleware.WithShadowMode()}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lim, err := middleware.NewRules([]middleware.Rule{tc.rule}, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			first, err := lim.Decide(reqTo("/a"))
			if err != nil || !first.Allowed || first.Shadowed {
				t.Fatalf("first: %+v %v", first, err)
			}
			second, err := lim.Decide(reqTo("/a"))
			if err != nil || !second.Allowed || !second.Shadowed || second.ShadowPolicy != "api" || second.Outcome != middleware.OutcomeShadowDenied {
				t.Fatalf("second: %+v %v", second, err)
			}
			if got := lim.Capacity().Rules["api"].InFlight; got != 2 {
				t.Errorf("in flight %d, want 2", got)
			}
			first.Done()
			second.Done()
			if got := lim.Capacity().Rules["api"].InFlight; got != 0 {
				t.Errorf("in flight %d after Done, want 0", got)
			}
		})
	}
}

// TestAdaptiveConcurrencyManyRules: a request under six adaptive rules
// takes a place under each and gives every one back.
func TestAdaptiveConcurrencyManyRules(t *testing.T) {
	t.Parallel()
	var rules []middleware.Rule
	for i := range 6 {
		rules = append(rules, middleware.Rule{Name: "a" + string(rune('0'+i)), AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 1, Max: 1}})
	}
	lim, err := middleware.NewRules(rules)
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	for range 3 {
		res, err := lim.Decide(reqTo("/"))
		if err != nil || !res.Allowed {
			t.Fatalf("%+v %v", res, err)
		}
		for name, c := range lim.Capacity().Rules {
			if c.InFlight != 1 {
				t.Fatalf("%s: %d in flight, want 1", name, c.InFlight)
			}
		}
		res.Done()
		for name, c := range lim.Capacity().Rules {
			if c.InFlight != 0 {
				t.Fatalf("%s: %d in flight after Done, want 0", name, c.InFlight)
			}
		}
	}
}

// TestLogObserverShed: shedding is logged at Warn, once a second per rule.
func TestLogObserverShed(t *testing.T) {
	t.Parallel()
	var buf strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	lim, err := middleware.NewRules([]middleware.Rule{{Name: "api", AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 1, Max: 1}}},
		middleware.WithObserver(middleware.NewLogObserver(log)))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	held, _ := lim.Decide(reqTo("/"))
	for range 3 {
		if res, _ := lim.Decide(reqTo("/")); res.Allowed {
			t.Fatal("admitted over the limit")
		}
	}
	held.Done()
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(buf.String(), "sluice: shedding load"); n != 1 || !strings.Contains(buf.String(), "level=WARN") || !strings.Contains(buf.String(), "priority=normal") {
		t.Errorf("logged %d times:\n%s", n, buf.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
