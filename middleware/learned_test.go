package middleware_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/learn"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// learnLimiter returns a Limiter of one rule "up" of limits, with a fake
// clock, on store ("memory" or "redis"), and the outbound events it
// reports.
func learnLimiter(t *testing.T, store string, clk *testclock.Clock, rule middleware.Rule, opts ...middleware.Option) (*middleware.Limiter, *outboundEvents) {
	t.Helper()
	ev := &outboundEvents{}
	opts = append(opts, middleware.WithClock(clk.Now), middleware.WithObserver(&middleware.Hooks{OnOutbound: ev.add}))
	if store == "redis" {
		opts = append(opts, middleware.WithStore(redisStoreFor(t)))
	}
	if rule.Name == "" {
		rule.Name = "up"
	}
	if rule.Key == nil {
		rule.Key = keyfunc.Global()
	}
	lim, err := middleware.NewRules([]middleware.Rule{rule}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	return lim, ev
}

type outboundEvents struct {
	mu   sync.Mutex
	list []middleware.OutboundEvent
}

func (e *outboundEvents) add(ev middleware.OutboundEvent) {
	e.mu.Lock()
	e.list = append(e.list, ev)
	e.mu.Unlock()
}

func (e *outboundEvents) of(k middleware.OutboundKind) []middleware.OutboundEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []middleware.OutboundEvent
	for _, ev := range e.list {
		if ev.Kind == k {
			out = append(out, ev)
		}
	}
	return out
}

// limitInForce is the limit Peek reports for key under rule "up" (what
// decisions use).
func limitInForce(t *testing.T, lim *middleware.Limiter, key string) int {
	t.Helper()
	st, err := lim.Peek(context.Background(), "up", key)
	if err != nil || len(st) == 0 {
		t.Fatalf("Peek: %v, %v", st, err)
	}
	return st[0].Limit.Requests
}

var learnT0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// TestLearnQuota: an announced quota caps the budget less its margin,
// never above the limit in force, for as long as it is announced; a
// refusal within the guard of a quota that fell is not counted, one after
// it cuts the fraction 2% (the quota is known), once per episode; the
// events say so.
func TestLearnQuota(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			clk := testclock.New(learnT0)
			lim, ev := learnLimiter(t, store, clk, middleware.Rule{Limits: []middleware.Limit{middleware.PerSecond(100)}})
			ctx := context.Background()
			learned := func(e middleware.Evidence) middleware.Learned {
				t.Helper()
				e.Rule, e.Key = "up", "k"
				l, err := lim.Learn(ctx, e)
				if err != nil {
					t.Fatal(err)
				}
				return l
			}
			q := func(n int64) []middleware.Quota { return []middleware.Quota{{Units: n, Window: time.Second}} }

			if l := learned(middleware.Evidence{Quotas: q(1000)}); l.Limits[0].Requests != 100 || limitInForce(t, lim, "k") != 100 {
				t.Fatalf("a quota above the limit: %+v; want the limit, 100", l)
			}
			l := learned(middleware.Evidence{Quotas: q(50), Admitted: clk.Now()})
			if l.Limits[0].Requests != 49 || l.Margins[0] != 1 || l.Configured[0].Requests != 100 || limitInForce(t, lim, "k") != 49 {
				t.Fatalf("a quota of 50: %+v, in force %d; want 49 (a margin of 1)", l, limitInForce(t, lim, "k"))
			}
			if limitInForce(t, lim, "other") != 100 {
				t.Fatal("another key lowered too")
			}
			// Answers that took 2 to 21 ms: a spread of 17 ms (the 90th
			// percentile less the least) at 50 a second moves 1 unit.
			for i := range 20 {
				learned(middleware.Evidence{Quotas: q(50), Answered: time.Duration(2+i) * time.Millisecond})
			}
			if l := learned(middleware.Evidence{Quotas: q(50)}); l.Margins[0] != 2 || l.Limits[0].Requests != 48 || l.Spread != 17*time.Millisecond {
				t.Fatalf("with a spread of 17ms: %+v; want a margin of 2, 48", l)
			}
			// A refusal of a request admitted within two time units of
			// the quota's fall is the fall's own.
			clk.Add(1500 * time.Millisecond)
			if l := learned(middleware.Evidence{Quotas: q(50), Refused: true, Admitted: clk.Now().Add(-10 * time.Millisecond)}); l.Cut || l.Cuts != 0 {
				t.Fatalf("a refusal within the guard cut: %+v", l)
			}
			clk.Add(time.Second)
			l = learned(middleware.Evidence{Quotas: q(50), Refused: true, Admitted: clk.Now().Add(-10 * time.Millisecond)})
			if !l.Cut || l.Cuts != 1 || l.Limits[0].Requests != 47 || l.Fraction != 0.98 {
				t.Fatalf("a refusal past the guard: %+v; want a cut to 0.98, 47 (of 48)", l)
			}
			// Another refusal of the same episode: not counted.
			if l := learned(middleware.Evidence{Quotas: q(50), Refused: true, Admitted: clk.Now().Add(-5 * time.Millisecond)}); l.Cut || l.Cuts != 1 {
				t.Fatalf("a second refusal of one episode: %+v", l)
			}
			if cuts := ev.of(middleware.OutboundCut); len(cuts) != 1 || cuts[0].Units != 47 || cuts[0].Limit != 100 || cuts[0].Unit != "requests" || cuts[0].Rule != "up" {
				t.Errorf("OutboundCut events %+v, want one to 47 of 100", cuts)
			}
			var units []int
			for _, e := range ev.of(middleware.OutboundLearned) {
				units = append(units, e.Units)
			}
			if len(units) != 4 || units[0] != 100 || units[1] != 49 || units[2] != 48 || units[3] != 47 {
				t.Errorf("OutboundLearned reported %v, want 100, 49, 48, 47", units)
			}
			// The fraction comes back slowly: 2% in 20 time units.
			clk.Add(20 * time.Second)
			if l := learned(middleware.Evidence{Quotas: q(50)}); l.Fraction < 0.999 || l.Limits[0].Requests != 48 {
				t.Errorf("20 s after the cut: %+v; want the fraction back at 1, 48", l)
			}
			// A quota no longer announced lapses after a minute.
			clk.Add(61 * time.Second)
			if n := limitInForce(t, lim, "k"); n != 100 {
				t.Errorf("a minute after the last announcement: %d in force, want 100", n)
			}
			if got := lim.Learned(); len(got) != 1 || got[0].Key != "k" || len(got[0].Quotas) != 0 {
				t.Errorf("Learned() = %+v", got)
			}
			if !lim.Forget("up", "k") || lim.Forget("up", "k") || len(lim.Learned()) != 0 {
				t.Error("Forget")
			}
		})
	}
}

// TestLearnUnknown: an upstream that announces nothing and refuses half of
// what the fleet sends: the first counted refusal cuts the fraction to
// Beta × what it accepts, and it recovers along the cubic of package
// learn, to 2% below that, then slowly above.
func TestLearnUnknown(t *testing.T) {
	t.Parallel()
	clk := testclock.New(learnT0)
	lim, _ := learnLimiter(t, "memory", clk, middleware.Rule{Limits: []middleware.Limit{middleware.PerSecond(100)}})
	ctx := context.Background()
	clk.Add(time.Second)
	if _, err := lim.Learn(ctx, middleware.Evidence{Rule: "up", Key: "k", Admitted: clk.Now()}); err != nil {
		t.Fatal(err)
	}
	clk.Add(1100 * time.Millisecond)
	// Answers a time unit after the budget was first heard of, one in two
	// refused: the first refusal cuts, its share 1 refused of 2 answers,
	// 1/(2 + 4); the next ones are the same episode's.
	var l middleware.Learned
	for i := range 6 {
		var err error
		l, err = lim.Learn(ctx, middleware.Evidence{Rule: "up", Key: "k", Refused: i%2 == 1, Admitted: clk.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if cut := i == 1; l.Cut != cut || l.Cuts != min(int64(i), 1) {
			t.Fatalf("answer %d: %+v", i, l)
		}
	}
	p := learn.State{}.Cut(clk.Now().UnixMilli(), time.Second, 1.0/6, clk.Now().UnixMilli(), false)
	if l.Fraction < float64(p.Level)/learn.PPM-1e-9 || l.Fraction > float64(p.Level)/learn.PPM+1e-9 {
		t.Fatalf("after the cut: %+v; want the fraction at %v", l, float64(p.Level)/learn.PPM)
	}
	st := learn.State{Level: p.Level, Target: p.Target, At: clk.Now().UnixMilli(), Cuts: 1}
	cut := clk.Now()
	for _, d := range []time.Duration{500 * time.Millisecond, st.Recovered(time.Second), 10 * time.Second, time.Minute} {
		clk.Set(cut.Add(d))
		f := st.Fraction(clk.Now().UnixMilli(), time.Second)
		if n := limitInForce(t, lim, "k"); int64(n) != learn.Limit(100, f) {
			t.Errorf("%s after the cut: %d in force, want %d (f = %.3f)", d, n, learn.Limit(100, f), f)
		}
	}
}

// TestLearnFleet: three Limiters on one Redis share the learned fraction:
// a cut made by one applies in the others at their next read (at most
// every 250ms), and refusals of one episode seen by several cut once.
func TestLearnFleet(t *testing.T) {
	t.Parallel()
	store := redisStoreFor(t)
	clk := testclock.New(learnT0)
	var lims [3]*middleware.Limiter
	for i := range lims {
		lims[i], _ = learnLimiter(t, "", clk, middleware.Rule{Limits: []middleware.Limit{middleware.PerSecond(100)}}, middleware.WithStore(store))
	}
	ctx := context.Background()
	for _, lim := range lims {
		if _, err := lim.Learn(ctx, middleware.Evidence{Rule: "up", Key: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(3 * time.Second)
	// All three hear of refusals of the same episode at once.
	var wg sync.WaitGroup
	for _, lim := range lims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := lim.Learn(ctx, middleware.Evidence{Rule: "up", Key: "k", Refused: true, Admitted: clk.Now()}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	clk.Add(300 * time.Millisecond)
	for i, lim := range lims {
		l, err := lim.Learn(ctx, middleware.Evidence{Rule: "up", Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if l.Cuts != 1 || l.Fraction >= 1 || limitInForce(t, lim, "k") != l.Limits[0].Requests || l.Limits[0].Requests >= 100 {
			t.Errorf("limiter %d after one episode: %+v, in force %d; want one cut, shared", i, l, limitInForce(t, lim, "k"))
		}
	}
}

// TestLearnedDecidedExactly: a budget learned of an upstream is decided in
// Redis in lease mode, request by request, while the same rule's other
// keys lease slices. Redis's count (Peek) tells: a key decided exactly has
// counted what was admitted, one with slices more than that.
func TestLearnedDecidedExactly(t *testing.T) {
	t.Parallel()
	// Real time: decisions on Redis go by its clock.
	lim, err := middleware.NewRules([]middleware.Rule{{Name: "up", Key: keyfunc.Header("X-K"), Sync: middleware.SyncLease, Lease: 50,
		Limits: []middleware.Limit{middleware.PerMinute(600)}}}, middleware.WithStore(redisStoreFor(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	ctx := context.Background()
	decide := func(value string) string {
		t.Helper()
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-K", value)
		res, err := lim.Decide(keyfunc.FromHTTP(r))
		if err != nil || !res.Allowed {
			t.Fatalf("%s: %+v, %v", value, res, err)
		}
		return res.Key()
	}
	const n = 40
	keys := map[string]string{}
	for _, v := range []string{"learned", "leased"} {
		keys[v] = decide(v) // the first, cold: decided exactly either way
		if v == "learned" {
			l, err := lim.Learn(ctx, middleware.Evidence{Rule: "up", Key: keys[v], Quotas: []middleware.Quota{{Units: 300, Window: time.Minute}}})
			if err != nil || len(l.Limits) == 0 || l.Limits[0].Requests >= 300 {
				t.Fatalf("learned %+v, %v; want a limit below the quota of 300", l, err)
			}
		}
		for range n - 1 {
			decide(v)
		}
	}
	counted := func(v string) int {
		t.Helper()
		st, err := lim.Peek(ctx, "up", keys[v])
		if err != nil || len(st) == 0 {
			t.Fatalf("Peek %s: %v, %v", v, st, err)
		}
		return st[0].Limit.Requests - st[0].Remaining
	}
	if got := counted("learned"); got != n {
		t.Errorf("Redis counted %d of the learned key's %d admitted requests, want exactly %d: decided in Redis", got, n, n)
	}
	// The control: without a learned budget the rule leases (slices of 2,
	// 4, 8, ... units, counted in Redis before they are spent).
	if got := counted("leased"); got <= n {
		t.Errorf("Redis counted %d of the leased key's %d admitted requests, want more (slices reserved): the rule did not lease", got, n)
	}
}

// TestLearnUsage: a quota of tokens lowers a rule's usage limit (never
// below the most one request may use), and decisions charge against it.
func TestLearnUsage(t *testing.T) {
	t.Parallel()
	clk := testclock.New(learnT0)
	lim, ev := learnLimiter(t, "memory", clk, middleware.Rule{Limits: []middleware.Limit{middleware.PerSecond(100)},
		Usage: &middleware.Usage{Unit: "tokens", Limits: []middleware.Limit{middleware.PerSecond(10_000)}, Max: 1000}})
	ctx := context.Background()
	l, err := lim.Learn(ctx, middleware.Evidence{Rule: "up", Key: "k", Usage: true, Quotas: []middleware.Quota{{Units: 5000, Window: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	if l.Unit != "tokens" || l.Limits[0].Requests != 4999 {
		t.Fatalf("tokens: %+v; want 4999 tokens a second", l)
	}
	st, err := lim.Peek(ctx, "up", "k")
	if err != nil || len(st) != 2 || st[0].Limit.Requests != 100 || st[1].Limit.Requests != 4999 {
		t.Fatalf("Peek: %+v, %v; want requests 100, tokens 4999", st, err)
	}
	if e := ev.of(middleware.OutboundLearned); len(e) != 1 || e[0].Unit != "tokens" || e[0].Units != 4999 || e[0].Limit != 10_000 {
		t.Errorf("events %+v", e)
	}
	l, _ = lim.Learn(ctx, middleware.Evidence{Rule: "up", Key: "k", Usage: true, Quotas: []middleware.Quota{{Units: 10, Window: time.Second}}})
	if l.Limits[0].Requests != 1000 {
		t.Errorf("a quota below the usage's Max: %+v; want the Max, 1000", l)
	}
}

// TestLearnOverride: the learned limits lower a client's override, never
// raise it.
func TestLearnOverride(t *testing.T) {
	t.Parallel()
	clk := testclock.New(learnT0)
	lim, _ := learnLimiter(t, "memory", clk, middleware.Rule{Limits: []middleware.Limit{middleware.PerSecond(100)}})
	ctx := context.Background()
	if err := lim.SetOverride(ctx, middleware.Override{Rule: "up", Key: "k", Limits: []middleware.Limit{middleware.PerSecond(30)}}); err != nil {
		t.Fatal(err)
	}
	l, err := lim.Learn(ctx, middleware.Evidence{Rule: "up", Key: "k", Quotas: []middleware.Quota{{Units: 50, Window: time.Second}}})
	if err != nil || l.Limits[0].Requests != 30 || l.Configured[0].Requests != 30 || limitInForce(t, lim, "k") != 30 {
		t.Fatalf("a quota above the override: %+v, %v", l, err)
	}
	l, _ = lim.Learn(ctx, middleware.Evidence{Rule: "up", Key: "k", Quotas: []middleware.Quota{{Units: 20, Window: time.Second}}})
	if l.Limits[0].Requests != 19 || limitInForce(t, lim, "k") != 19 {
		t.Fatalf("a quota below the override: %+v", l)
	}
	if o, ok := lim.Override("up", "k"); !ok || o.Limits[0].Requests != 30 {
		t.Errorf("the override itself: %+v, %v; want it unchanged, 30", o, ok)
	}
	if _, err := lim.RemoveOverride(ctx, "up", "k"); err != nil {
		t.Fatal(err)
	}
	if n := limitInForce(t, lim, "k"); n != 19 {
		t.Errorf("without the override: %d, want 19 (the quota)", n)
	}
}

// TestLearnErrors: what cannot be learned is refused, and changes
// nothing.
func TestLearnErrors(t *testing.T) {
	t.Parallel()
	clk := testclock.New(learnT0)
	lim, _ := learnLimiter(t, "memory", clk, middleware.Rule{Limits: []middleware.Limit{middleware.PerSecond(100)}})
	dyn, _ := learnLimiter(t, "memory", clk, middleware.Rule{LimitsFunc: func(keyfunc.Request, string) []middleware.Limit {
		return []middleware.Limit{middleware.PerSecond(5)}
	}})
	ctx := context.Background()
	for _, tc := range []struct {
		lim  *middleware.Limiter
		e    middleware.Evidence
		want error
	}{
		{lim, middleware.Evidence{Rule: "nope", Key: "k"}, middleware.ErrUnknownRule},
		{lim, middleware.Evidence{Rule: "up"}, nil},
		{lim, middleware.Evidence{Rule: "up", Key: "k", Usage: true}, middleware.ErrNotLearnable},
		{dyn, middleware.Evidence{Rule: "up", Key: "k"}, middleware.ErrNotLearnable},
	} {
		if _, err := tc.lim.Learn(ctx, tc.e); err == nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.e, err, tc.want)
		}
	}
	if len(lim.Learned()) != 0 || len(dyn.Learned()) != 0 {
		t.Error("a refused evidence left a budget")
	}
}

// TestLogCut: LogObserver logs a cut of a learned limit, at most once a
// second per rule.
func TestLogCut(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	o := middleware.NewLogObserver(slog.New(slog.NewTextHandler(&buf, nil)))
	for range 3 {
		o.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundCut, Rule: "up", Unit: "requests", Units: 48, Limit: 100})
	}
	out := buf.String()
	if strings.Count(out, "learned limit cut") != 1 || !strings.Contains(out, "rule=up") || !strings.Contains(out, "limit=48") || !strings.Contains(out, "of=100") {
		t.Errorf("logged %q; want one line of the cut to 48 of 100", out)
	}
}

// TestAdminLearned: GET /overrides lists the budgets learned of upstreams
// beside the overrides, for the operator page.
func TestAdminLearned(t *testing.T) {
	t.Parallel()
	clk := testclock.New(learnT0)
	lim, _ := learnLimiter(t, "memory", clk, middleware.Rule{Limits: []middleware.Limit{middleware.PerSecond(100)}})
	ctx := context.Background()
	clk.Add(3 * time.Second)
	for _, e := range []middleware.Evidence{
		{Rule: "up", Key: "host:api.example", Quotas: []middleware.Quota{{Units: 50, Window: time.Second}}},
		{Rule: "up", Key: "host:api.example", Quotas: []middleware.Quota{{Units: 50, Window: time.Second}}, Refused: true, Admitted: clk.Now().Add(5 * time.Second)},
	} {
		if _, err := lim.Learn(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	admin := middleware.AdminHandler(lim, middleware.AdminConfig{Authorize: func(*http.Request) bool { return true }})
	rr := httptest.NewRecorder()
	admin.ServeHTTP(rr, httptest.NewRequest("GET", "/overrides", nil))
	var out struct {
		Overrides []any `json:"overrides"`
		Learned   []struct {
			Rule, Key, Unit string
			Limits          []struct{ Requests int }
			Configured      []struct{ Requests int }
			Pace            *struct{ Requests, Burst int }
			Quotas          []struct {
				Units  int64
				Window string
				Margin int64
			}
			Fraction float64
			Cuts     int64
			CutAt    string `json:"cut_at"`
		}
	}
	if err := json.Unmarshal(rr.Body.Bytes(), &out); err != nil || rr.Code != 200 {
		t.Fatalf("GET /overrides: %d %s %v", rr.Code, rr.Body, err)
	}
	if len(out.Overrides) != 0 || len(out.Learned) != 1 {
		t.Fatalf("GET /overrides: %s", rr.Body)
	}
	l := out.Learned[0]
	if l.Rule != "up" || l.Key != "host:api.example" || l.Unit != "requests" || l.Limits[0].Requests != 48 || l.Configured[0].Requests != 100 ||
		len(l.Quotas) != 1 || l.Quotas[0].Units != 50 || l.Quotas[0].Window != "1s" || l.Quotas[0].Margin != 1 || l.Fraction != 0.98 || l.Cuts != 1 ||
		l.CutAt == "" || l.Pace == nil || l.Pace.Requests != 96 || l.Pace.Burst != 2 {
		t.Errorf("learned %+v; want 48 of 100, paced 96 per 2s, the quota of 50 less 1, one cut", l)
	}
}
